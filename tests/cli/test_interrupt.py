"""Ctrl-C and SIGTERM end any long command within 2 s, with exit 130, a message, and
nothing written: a plan mid-solve (inside one CP-SAT solve that would run for minutes: the
stop hook of :mod:`placer.planning.solvers.cpsat.stop`), a plan whose layers run in
worker processes, a large synthetic trace, a replay, a comparison of several rows.

Each command runs in a real process; the signal is sent once it is well into its work (a
line it says on stderr, or the CP-SAT stop watcher's thread, which starts with the first
solve), and the time from the signal to the exit is measured.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRACE = str(ROOT / "traces" / "synthetic-small.jsonl.gz")
DSV3 = str(ROOT / "traces" / "synthetic-dsv3-drift.npz")
#: Seconds from the signal to the process's exit that a command may take.
STOP_S = 2.0
#: Seconds a command may take to reach the point where it is signalled.
START_S = 120.0

#: A CP-SAT plan whose every solve would run for minutes: one full model, no early stop.
LONG_SOLVE = ["--time-limit", "3000", "--layer-time-limit", "1000",
              "--option", "full_model_dtime=1000", "--option", "full_model_max_vars=100000",
              "--option", "submodel_dtime=1000"]


def _solving(process: subprocess.Popen[str], lines: list[str]) -> bool:
    """The process started its first CP-SAT solve (its stop watcher's thread is there)."""
    try:
        names = [(task / "comm").read_text().strip()
                 for task in Path(f"/proc/{process.pid}/task").iterdir()]
    except OSError:
        return False
    return any(name.startswith("placer-cpsat") for name in names)


def _said(text: str) -> Callable[[subprocess.Popen[str], list[str]], bool]:
    return lambda process, lines: any(text in line for line in lines)


def _interrupt(argv: list[str], ready: Callable[[subprocess.Popen[str], list[str]], bool],
               sig: int, folder: Path, settle: float = 1.0) -> tuple[int, float, str]:
    """Run ``placer ARGV`` in ``folder``, send ``sig`` once ``ready`` holds (and ``settle``
    seconds more), and return ``(exit code, seconds from the signal to the exit, stderr)``."""
    process = subprocess.Popen(  # a shell's background job would ignore SIGINT: reset it
        [sys.executable, "-m", "placer.cli.main", *argv], cwd=folder, text=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "160", "NO_COLOR": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert process.stderr is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr or []), daemon=True)
    reader.start()
    deadline = time.monotonic() + START_S
    while not ready(process, lines):
        assert process.poll() is None, f"ended before the signal: {''.join(lines)}"
        assert time.monotonic() < deadline, f"not ready in {START_S:g} s: {''.join(lines)}"
        time.sleep(0.05)
    time.sleep(settle)
    assert process.poll() is None, f"ended before the signal: {''.join(lines)}"
    sent = time.monotonic()
    process.send_signal(sig)
    try:
        code = process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        code = process.wait()
    took = time.monotonic() - sent
    reader.join(5)
    return code, took, "".join(lines)


def _check(code: int, took: float, stderr: str, folder: Path, inputs: set[str]) -> None:
    assert code == 130, stderr
    assert took < STOP_S, f"exit {took:.2f} s after the signal: {stderr}"
    assert "interrupted: nothing was written" in stderr
    assert "Traceback" not in stderr
    assert {p.name for p in folder.iterdir()} == inputs  # no output, no temporary file


SIGNALS = [signal.SIGINT, signal.SIGTERM]


@pytest.mark.parametrize("sig", SIGNALS, ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_the_solve_exits_130_and_writes_nothing(tmp_path, sig) -> None:
    code, took, stderr = _interrupt(
        ["plan", TRACE, "-m", "gpt-oss-20b", "-t", "2x-dgx-h100", "-r", "16", "--jobs", "1",
         "-o", "plan.json"], _said("[1/"), sig, tmp_path, settle=0)
    _check(code, took, stderr, tmp_path, set())


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
@pytest.mark.parametrize("sig", SIGNALS, ids=["SIGINT", "SIGTERM"])
def test_a_signal_inside_one_long_cpsat_solve_stops_it(tmp_path, sig) -> None:
    """Without the stop hook the solve runs to its own limit (minutes) before Python can
    see the signal."""
    code, took, stderr = _interrupt(
        ["plan", TRACE, "-m", "gpt-oss-20b", "-t", "2x-dgx-h100", "-r", "16", "--jobs", "1",
         "-s", "cpsat", "-o", "plan.json", *LONG_SOLVE], _solving, sig, tmp_path)
    _check(code, took, stderr, tmp_path, set())


@pytest.mark.parametrize("sig", SIGNALS, ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_the_worker_processes(tmp_path, sig) -> None:
    code, took, stderr = _interrupt(
        ["plan", TRACE, "-m", "gpt-oss-20b", "-t", "2x-dgx-h100", "-r", "16", "--jobs", "2",
         "-s", "cpsat", "-o", "plan.json", "--export", "sglang:engine.json", *LONG_SOLVE],
        lambda process, lines: _children(process.pid) >= 2, sig, tmp_path, settle=3.0)
    _check(code, took, stderr, tmp_path, set())


def _children(pid: int) -> int:
    """Processes whose parent is ``pid`` (Linux /proc)."""
    count = 0
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = status.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        count += fields[1] == str(pid)
    return count


@pytest.mark.parametrize("sig", SIGNALS, ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_a_large_synthetic_trace(tmp_path, sig) -> None:
    code, took, stderr = _interrupt(
        ["synth", "big.npz", "--experts", "256", "--top-k", "8", "--layers", "58", "--zipf",
         "1.0", "--tokens", "5000000"],
        _said(" / 5,000,000 tokens"), sig, tmp_path, settle=1.0)  # its first progress line
    _check(code, took, stderr, tmp_path, set())


@pytest.mark.parametrize("sig", SIGNALS, ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_a_replay(tmp_path, sig) -> None:
    code, took, stderr = _interrupt(
        ["replay", DSV3, "-m", "deepseek-v3", "-t", "4x-dgx-h100", "-r", "32",
         # a step per 32 tokens and a re-plan every step: tens of seconds of replay (the
         # default cadence replays this trace in under a second on a fast machine)
         "--tokens-per-gpu", "1", "-P", "placer:window=4,interval=1",
         "-P", "eplb:window=4,interval=1", "--report", "replay.html"],
        _said("replaying"), sig, tmp_path, settle=1.0)
    _check(code, took, stderr, tmp_path, set())


@pytest.mark.parametrize("sig", SIGNALS, ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_a_comparison_of_several_rows(tmp_path, sig) -> None:
    code, took, stderr = _interrupt(
        ["compare", TRACE, "-m", "gpt-oss-20b", "-t", "2x-dgx-h100", "-t", "dgx-h100",
         "-r", "0,16,32", "-s", "cpsat", "--jobs", "2", "--time-limit", "600",
         "--report", "compare.html"], _said("judged as"), sig, tmp_path, settle=3.0)
    _check(code, took, stderr, tmp_path, set())
