"""Atomic writes: all or nothing, with ordinary file permissions."""

from __future__ import annotations

import os
import stat

import pytest

from placer.io.fileio import atomic_path, write_text_atomic


def test_write_replaces_target_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "out" / "plan.json"
    write_text_atomic(target, "one")
    write_text_atomic(target, "two")
    assert target.read_text() == "two"
    assert sorted(p.name for p in target.parent.iterdir()) == ["plan.json"]


def test_failure_keeps_previous_content(tmp_path):
    target = tmp_path / "plan.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_output_mode_follows_umask_not_mkstemp(tmp_path):
    old = os.umask(0o022)
    try:
        target = tmp_path / "engine.json"
        write_text_atomic(target, "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


# -- what may be replaced, and outputs that land together --------------------------------------
def test_a_device_is_written_into_not_replaced(tmp_path) -> None:
    import stat as stat_module

    from placer.io.fileio import atomic_path

    with atomic_path("/dev/null") as tmp:
        tmp.write_text("x")
    assert stat_module.S_ISCHR(os.stat("/dev/null").st_mode)
    assert not tmp.exists()


def test_directory_and_file_parent_are_usage_errors(tmp_path) -> None:
    from placer.errors import UsageError
    from placer.io.fileio import check_output_path

    with pytest.raises(UsageError, match="is a directory"):
        check_output_path(tmp_path)
    (tmp_path / "f").write_text("")
    with pytest.raises(UsageError, match="is not a directory"):
        check_output_path(tmp_path / "f" / "out.json")


def test_outputs_land_together_or_not_at_all(tmp_path) -> None:
    from placer.io.fileio import all_or_nothing, write_text_atomic

    with all_or_nothing():
        write_text_atomic(tmp_path / "a.txt", "a")
        assert not (tmp_path / "a.txt").exists()  # held back until the block ends
        write_text_atomic(tmp_path / "b.txt", "b")
    assert (tmp_path / "a.txt").read_text() == "a" and (tmp_path / "b.txt").read_text() == "b"
    with pytest.raises(RuntimeError), all_or_nothing():
        write_text_atomic(tmp_path / "c.txt", "c")
        raise RuntimeError("the second output failed")
    assert not (tmp_path / "c.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]  # no .tmp left


def test_an_output_that_is_an_input_is_refused(tmp_path) -> None:
    from placer.errors import UsageError
    from placer.io.fileio import check_not_inputs

    source = tmp_path / "trace.jsonl"
    source.write_text("{}")
    with pytest.raises(UsageError, match="is an input of this command") as caught:
        check_not_inputs([("--output", tmp_path / "." / "trace.jsonl")], [source])
    assert caught.value.where == "--output"
    check_not_inputs([("--output", tmp_path / "other.json")], [source])  # fine
    check_not_inputs([("--output", "/dev/null")], ["/dev/null"])  # streams are not files
