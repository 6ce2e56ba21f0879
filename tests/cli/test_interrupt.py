"""Ctrl-C and SIGTERM stop a plan with exit 130, a message, and nothing written."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

TRACE = str(Path(__file__).resolve().parents[2] / "traces" / "synthetic-small.jsonl.gz")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_the_solve_exits_130_and_writes_nothing(tmp_path, sig) -> None:
    out = tmp_path / "plan.json"
    command = [sys.executable, "-m", "placer.cli.main", "plan", TRACE, "-m", "gpt-oss-20b",
               "-t", "2x-dgx-h100", "-r", "16", "--jobs", "1", "-o", str(out)]
    process = subprocess.Popen(  # a shell's background job would ignore SIGINT: reset it
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert process.stderr is not None
    lines = []
    for line in process.stderr:  # wait until the first layer is planned: mid-solve
        lines.append(line)
        if line.startswith("[1/"):
            break
    process.send_signal(sig)
    rest = process.stderr.read()
    assert process.wait(timeout=120) == 130, "".join(lines) + rest
    assert "interrupted: nothing was written" in rest
    assert "Traceback" not in rest
    assert list(tmp_path.iterdir()) == []  # no placement, no temporary file
