"""An operator's first day: the stumbles newcomers reported, each driven through the
command line as they typed it, with the answer a user should get."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
QWEN3 = REPO / "traces" / "qwen3-30b-a3b.npz"


def _limit_memory(limit_bytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    return apply


@pytest.mark.slow
def test_a_plan_with_the_redundancy_placer_suggests_finishes_in_bounded_memory(
        tmp_path: Path) -> None:
    """``-r 992`` (what placer's own hint suggests for ``-r 1000`` on 16 GPUs) once grew
    the floor's knapsack to replicas squared (7.5 GiB for one array): it must finish
    within 60 s and 2 GB of address space, with the floor printed."""
    out = tmp_path / "plan.json"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "placer.cli.main", "plan", str(QWEN3), "-m", "qwen3-30b-a3b",
         "-t", "2x-dgx-h100", "-r", "992", "--solver", "eplb", "-o", str(out), "-q"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        preexec_fn=_limit_memory(2 << 30))
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.exists()
    assert "floor: no placement with 70 slots per GPU" in done.stdout
    assert took < 60, f"{took:.1f} s"
