"""Atomic writes: all or nothing, with ordinary file permissions."""

from __future__ import annotations

import os
import stat

import pytest

from placer.fileio import atomic_path, write_text_atomic


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
