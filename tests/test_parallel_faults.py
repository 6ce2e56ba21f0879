"""Faults of the machine while pieces run on local processes (placer.parallel).

A worker killed mid-piece (SIGKILL, as the out-of-memory killer does) must not lose the
run: the piece runs again and the answer equals the fault-free one; a piece whose worker
always dies ends the run with WorkerLostError naming it; and no worker outlives the
process that started it, whatever killed that process.  The faults are real: a piece
kills its own worker with SIGKILL, and the parent is killed with SIGKILL or SIGHUP.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from placer.parallel import Backend, WorkerLostError, WorkerWarning, exit_reason

ROOT = Path(__file__).resolve().parents[1]
TRACE = str(ROOT / "traces" / "synthetic-small.jsonl.gz")
#: Seconds within which a worker must be gone once its parent is.
GONE_WITHIN_S = 5.0


def _square_dying_once(folder: str, x: int) -> int:
    """x * x; the first time it runs item 2 it kills its own worker (a marker file says
    it did)."""
    marker = Path(folder) / f"{x}.died"
    if x == 2 and not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return x * x


def _square_always_dying(folder: str, x: int) -> int:
    """x * x, but the worker running item 2 always dies; each death leaves a marker."""
    if x == 2:
        count = len(list(Path(folder).glob("death-*")))
        (Path(folder) / f"death-{count}").touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return x * x


def _fails_on_three(x: int) -> int:
    if x == 3:
        raise ValueError("three is not allowed")
    time.sleep(0.05)
    return x


def test_a_worker_killed_mid_piece_is_replaced_and_the_answer_is_the_fault_free_one(
        tmp_path) -> None:
    items = [0, 1, 2, 3, 4, 5]
    spent = tmp_path / "spent"  # its marker says the fault happened: the fault-free run
    spent.mkdir()
    (spent / "2.died").touch()
    clean = Backend(jobs=2).run(_square_dying_once, items, shared=str(spent))
    assert clean == [0, 1, 4, 9, 16, 25]
    finished: list[int] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = Backend(jobs=2).run(_square_dying_once, items, shared=str(tmp_path),
                                  on_done=lambda i, r: finished.append(i),
                                  names=[f"layer {x}" for x in items])
    assert got == [0, 1, 4, 9, 16, 25]
    assert sorted(finished) == items  # each piece reported once, the retried one too
    assert (tmp_path / "2.died").exists()  # the fault did happen
    messages = [str(w.message) for w in caught if issubclass(w.category, WorkerWarning)]
    assert messages == ["the worker running layer 2 died (killed by SIGKILL (out of memory,"
                        " or kill -9)); layer 2 runs again (retry 1 of 2)"]


def test_a_piece_whose_worker_always_dies_is_lost_after_the_retries(tmp_path) -> None:
    with warnings.catch_warnings(record=True), pytest.raises(WorkerLostError) as caught:
        warnings.simplefilter("always")
        Backend(jobs=2).run(_square_always_dying, [0, 1, 2, 3], shared=str(tmp_path),
                            names=["layer 0", "layer 1", "layer 7", "layer 3"])
    error = caught.value
    assert error.exit_code == 1
    assert error.where == "2 local processes"
    assert error.message == ("layer 7 was lost: its worker died 3 times (killed by SIGKILL"
                             " (out of memory, or kill -9)); nothing was written")
    assert "`jobs`" in (error.hint or "")
    assert len(list(tmp_path.glob("death-*"))) == 3  # 1 try + RETRIES (2)
    with pytest.raises(WorkerLostError, match="died once"):
        Backend(jobs=2, retries=0).run(_square_always_dying, [2, 0], shared=str(tmp_path))


def test_what_a_piece_raises_is_raised_and_the_other_workers_stop() -> None:
    with pytest.raises(ValueError, match="three is not allowed"):
        Backend(jobs=2).run(_fails_on_three, [1, 2, 3, 4, 5, 6, 7, 8])
    assert _children(os.getpid()) == []


def test_exit_reasons_in_words() -> None:
    assert exit_reason(-9) == "killed by SIGKILL (out of memory, or kill -9)"
    assert exit_reason(-15) == "killed by SIGTERM"
    assert exit_reason(3) == "exit code 3"
    assert exit_reason(None) == "it stopped answering"


def _children(pid: int) -> list[int]:
    """Live child processes of ``pid`` (Linux /proc), zombies left out."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return [p for p in found if _alive(p)]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _wait_gone(pids: list[int], within: float = GONE_WITHIN_S) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _sleepy(x: float) -> float:
    time.sleep(x)
    return x


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl: Linux")
def test_workers_die_with_a_parent_killed_by_sigkill(tmp_path) -> None:
    """The library alone (no CLI cleanup): the parent gets SIGKILL mid-run."""
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})
        from placer.parallel import Backend
        from test_parallel_faults import _sleepy
        print("started", flush=True)
        Backend(jobs=2).run(_sleepy, [60.0, 60.0, 60.0])
    """)
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None and parent.stdout.readline() == "started\n"
    workers = _await_children(parent.pid, 2)
    parent.kill()
    parent.wait(timeout=10)
    assert _wait_gone(workers) == [], "workers outlived their parent"


def _await_children(pid: int, count: int, within: float = 30.0) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = _children(pid)
        if len(found) >= count:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{pid} did not start {count} workers in {within} s")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl: Linux")
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGKILL], ids=["SIGHUP", "SIGKILL"])
def test_a_plan_on_local_workers_ends_with_its_workers(tmp_path, sig) -> None:
    """``placer plan --jobs 2`` losing its terminal (SIGHUP) ends like SIGTERM: exit 130,
    nothing written; killed by SIGKILL it cannot clean up, and its workers die anyway."""
    out = tmp_path / "plan.json"
    command = [sys.executable, "-m", "placer.cli.main", "plan", TRACE, "-m", "gpt-oss-20b",
               "-t", "2x-dgx-h100", "-r", "16", "--jobs", "2", "-o", str(out)]
    process = subprocess.Popen(  # under nohup SIGHUP would be ignored: reset it
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    assert process.stderr is not None
    workers = _await_children(process.pid, 2, within=60)
    process.send_signal(sig)
    rest = process.stderr.read()
    code = process.wait(timeout=60)
    assert _wait_gone(workers) == [], f"workers outlived the plan: {rest}"
    if sig == signal.SIGHUP:
        assert code == 130, rest
        assert "interrupted: nothing was written" in rest
        assert "Traceback" not in rest
    else:
        assert code == -signal.SIGKILL
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] in ([], [p.name for p in tmp_path.glob(
        ".plan.json.placer-tmp-*")])  # at most a recognisable leftover (none is written
    # before the plan ends)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc: Linux")
def test_a_plan_whose_worker_is_killed_writes_the_fault_free_placement(tmp_path) -> None:
    """``placer plan --jobs 2``, one of its workers killed by SIGKILL mid-plan: the layer is
    solved again and the placement is the one a run without the fault writes (generous
    wall limits: the deterministic limits decide)."""
    command = [sys.executable, "-m", "placer.cli.main", "plan", TRACE, "-m", "gpt-oss-20b",
               "-t", "2x-dgx-h100", "-r", "16", "--jobs", "2", "--time-limit", "600",
               "--layer-time-limit", "300", "--option", "balance_iterations=3",
               "--option", "cost_iterations=3"]
    clean = subprocess.run([*command, "-o", str(tmp_path / "clean.json")], capture_output=True,
                           text=True, timeout=300)
    assert clean.returncode == 0, clean.stderr
    faulty = subprocess.Popen([*command, "-o", str(tmp_path / "faulty.json")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert faulty.stderr is not None
    victim = _await_children(faulty.pid, 2, within=60)[0]
    os.kill(victim, signal.SIGKILL)
    stderr = faulty.stderr.read()
    assert faulty.wait(timeout=300) == 0, stderr
    assert "warning: the worker running layer " in stderr
    assert "runs again (retry 1 of 2)" in stderr

    def layers(name: str) -> list:
        return json.loads((tmp_path / name).read_text())["layers"]

    assert layers("faulty.json") == layers("clean.json")
