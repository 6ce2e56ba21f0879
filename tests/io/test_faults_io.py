"""Faults of the machine while placer writes (placer.io.fileio): a full disk, an I/O error,
two runs writing one output, a run killed by SIGKILL mid-write.

The promises: nothing half-written, no temporary file left by a run that could clean up,
an error that names the file and says the disk is full, and leftovers of a killed run
recognisably named and removed by the next run that writes there.  The faults are real
where a test can make them so: ``/dev/full`` (ENOSPC), a file-size limit (EFBIG), two
processes, SIGKILL; a disk that fills at one exact file is an injected ``OSError``.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from placer.io import fileio
from placer.io.fileio import (
    TMP_MARK,
    OutputError,
    all_or_nothing,
    atomic_path,
    remove_leftovers,
    write_text_atomic,
)

ROOT = Path(__file__).resolve().parents[2]
TRACE = str(ROOT / "traces" / "synthetic-small.jsonl.gz")
PLAN = ["plan", TRACE, "-m", "gpt-oss-20b", "-t", "dgx-h100", "--solver", "eplb", "-q"]


def _disk_full() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_mid_write_names_the_file_and_keeps_the_old_one(tmp_path) -> None:
    target = tmp_path / "plan.json"
    target.write_text("old")
    with pytest.raises(OutputError) as caught, atomic_path(target) as tmp:
        tmp.write_text("half of the ne")
        raise _disk_full()
    error = caught.value
    assert error.exit_code == 1 and error.where == str(target)
    assert error.message == ("cannot write the file: the disk is full (no space left on"
                             " device); nothing was written")
    assert error.hint == (f"free space on the disk that holds {tmp_path}, or write elsewhere"
                          " (an earlier version of the file is unchanged)")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_other_errors_of_the_writing_code_pass_unchanged(tmp_path) -> None:
    with pytest.raises(FileNotFoundError), atomic_path(tmp_path / "a.json"):
        (tmp_path / "missing-input.json").read_text()  # an input it reads: not our fault
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_removes_the_folders_it_made(tmp_path) -> None:
    with pytest.raises(OutputError), atomic_path(tmp_path / "new" / "deeper" / "a.png"):
        raise OSError(errno.EIO, "Input/output error")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OutputError, match="I/O error"), all_or_nothing():
        write_text_atomic(tmp_path / "page.html", "page")
        with atomic_path(tmp_path / "pics" / "a.png") as tmp:
            tmp.write_bytes(b"png")
        with atomic_path(tmp_path / "pics" / "b.png"):
            raise OSError(errno.EIO, "Input/output error")
    assert list(tmp_path.iterdir()) == []  # no page, no pictures, no folder, no temporary


def test_a_report_on_a_disk_that_fills_at_its_first_picture_writes_nothing(
        tmp_path, monkeypatch) -> None:
    """``placer report -o page.html --png-dir pics``: the HTML is written, then the disk
    is full at the first PNG: neither the page nor any picture nor the folder is left."""
    from typer.testing import CliRunner

    from placer.cli.main import app

    runner = CliRunner()
    plan = tmp_path / "p.json"
    assert runner.invoke(app, [*PLAN, "-o", str(plan)]).exit_code == 0
    synced: list[str] = []
    real_sync = fileio._sync

    def sync(path: Path) -> None:  # the second file of the report (its first PNG) fails
        synced.append(path.name)
        if len(synced) == 2:
            raise _disk_full()
        real_sync(path)

    monkeypatch.setattr(fileio, "_sync", sync)
    out = tmp_path / "out"
    out.mkdir()
    (out / "pics").mkdir()
    result = runner.invoke(app, ["report", TRACE, "-p", str(plan), "-o", str(out / "r.html"),
                                 "--png-dir", str(out / "pics"), "--dpi", "20", "-q"])
    assert result.exit_code == 1, result.output
    assert synced[0].startswith(".r.html" + TMP_MARK)
    assert synced[1].startswith(".") and (".png" + TMP_MARK) in synced[1]
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"error: {out / 'pics'}/") and lines[0].endswith(
        ".png: cannot write the file: the disk is full (no space left on device); nothing"
        " was written")
    assert lines[1].startswith(f"hint: free space on the disk that holds {out / 'pics'}")
    assert [p for p in out.rglob("*") if p.is_file()] == []  # all or nothing


def test_a_plan_written_to_dev_full_fails_cleanly(tmp_path) -> None:
    """A real ENOSPC: ``/dev/full`` refuses every write."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # where the temporary file goes
    result = subprocess.run([sys.executable, "-m", "placer.cli.main", *PLAN, "-o", "/dev/full"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(
        "error: /dev/full: cannot write the file: the disk is full (no space left on device);"
        " nothing was written\nhint: ")
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_file_size_limit_mid_write_leaves_no_half_file(tmp_path) -> None:
    """A real write that stops part-way: the process may write files of 1,000 bytes at
    most (RLIMIT_FSIZE), the placement is longer: EFBIG, the old placement stays."""
    out = tmp_path / "plan.json"
    out.write_text("old")

    def limit() -> None:
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an error, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))

    result = subprocess.run([sys.executable, "-m", "placer.cli.main", *PLAN, "-o", str(out)],
                            capture_output=True, text=True, timeout=120, preexec_fn=limit)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(f"error: {out}: cannot write the file: the file is too"
                                    " large for the file system; nothing was written\n")
    assert out.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


# -- two writers, and a reader meanwhile ---------------------------------------------------------
def _write_many(path: str, letter: str, times: int) -> None:
    for _ in range(times):
        write_text_atomic(path, letter * 200_000)


def test_two_runs_writing_one_output_never_mix_and_a_reader_sees_whole_files(tmp_path) -> None:
    target = tmp_path / "plan.json"
    write_text_atomic(target, "A" * 200_000)
    ctx = multiprocessing.get_context("fork")
    writers = [ctx.Process(target=_write_many, args=(str(target), letter, 40))
               for letter in "AB"]
    for w in writers:
        w.start()
    reads = 0
    while any(w.is_alive() for w in writers):
        text = target.read_text()  # what `--current` does while another run replaces it
        assert text in ("A" * 200_000, "B" * 200_000), f"a mixed or partial read: {len(text)}"
        reads += 1
    assert reads >= 10  # the reader did read while the two wrote
    for w in writers:
        w.join()
        assert w.exitcode == 0
    assert target.read_text() in ("A" * 200_000, "B" * 200_000)
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_a_placement_read_while_another_run_replaces_it_is_the_old_or_the_new(
        tmp_path) -> None:
    import numpy as np

    from placer.placement import Placement
    from placer.placement.document import read_placement, write_placement

    def placement(slots_per_gpu: int) -> Placement:  # 4 layers, 32 experts on 8 GPUs
        row = np.arange(8 * slots_per_gpu) % 32
        return Placement(np.tile(row, (4, 1)), np.arange(4), num_experts=32, num_gpus=8)

    first, second = placement(4), placement(5)
    current = tmp_path / "current.json"
    write_placement(current, first)

    def rewrite() -> None:
        for i in range(60):
            write_placement(current, (first, second)[i % 2])

    writer = multiprocessing.get_context("fork").Process(target=rewrite)
    writer.start()
    slots = set()
    while writer.is_alive():
        slots.add(read_placement(current).slots_per_gpu)  # never a PlacementError
    writer.join()
    assert writer.exitcode == 0
    assert slots <= {4, 5}


# -- SIGKILL mid-write, then the next run -------------------------------------------------------
def test_a_write_killed_by_sigkill_leaves_the_output_and_a_named_leftover_the_next_run_removes(
        tmp_path) -> None:
    target = tmp_path / "plan.json"
    target.write_text("old")
    code = textwrap.dedent(f"""
        import sys, time
        from placer.io.fileio import atomic_path
        with atomic_path({str(target)!r}) as tmp:
            with open(tmp, "w") as f:
                f.write("half of the new")
                f.flush()
                print("writing", flush=True)
                time.sleep(60)
    """)
    writer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None and writer.stdout.readline() == "writing\n"
    writer.kill()
    writer.wait(timeout=10)
    assert target.read_text() == "old"
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "plan.json"]
    assert len(leftovers) == 1
    assert leftovers[0].startswith(f".plan.json{TMP_MARK}{fileio._HOST}-{writer.pid}-")
    # another run, started after the kill, writes a different file into the folder
    rerun = subprocess.run([sys.executable, "-c", "from placer.io.fileio import"
                            f" write_text_atomic; write_text_atomic({str(tmp_path / 'b')!r},"
                            " 'b')"], timeout=60)
    assert rerun.returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "plan.json"]
    assert target.read_text() == "old"


def test_only_dead_older_leftovers_of_this_host_are_removed(tmp_path, monkeypatch) -> None:
    dead = _dead_pid()
    names = {
        "dead": f".a.json{TMP_MARK}{fileio._HOST}-{dead}-abcdefgh",
        "alive": f".a.json{TMP_MARK}{fileio._HOST}-{os.getpid()}-abcdefgh",
        "other host": f".a.json{TMP_MARK}otherhost{fileio._HOST}-{dead}-abcdefgh",
        "new": f".b.json{TMP_MARK}{fileio._HOST}-{dead}-ijklmnop",
        "not ours": f".a.json.{dead}.tmp",
    }
    for name in names.values():
        (tmp_path / name).write_text("x")
    old = time.time() - 3600
    for key in ("dead", "alive", "other host", "not ours"):
        os.utime(tmp_path / names[key], (old, old))
    monkeypatch.setattr(fileio, "_STARTED", time.time() - 60)  # "new" is newer than this run
    monkeypatch.setattr(fileio, "_CLEARED", set())
    assert remove_leftovers(tmp_path) == [tmp_path / names["dead"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        v for k, v in names.items() if k != "dead")
    assert remove_leftovers(tmp_path) == []  # once per folder and process


def _dead_pid() -> int:
    """The id of a process that has ended (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid
