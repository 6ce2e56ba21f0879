"""bench/online.py: the inputs are a rearrangement as vLLM holds it, and the section renders
the library's figures when the engine's environment is absent (saying so)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the bench package
import bench.online as online


def test_the_inputs_are_a_deepseek_v3_rearrangement(tmp_path) -> None:
    path = tmp_path / "window.npz"
    online._inputs(59, path)
    data = np.load(path)
    load, deployed = data["load"], data["deployed"]
    assert load.shape == (59, 256) and deployed.shape == (59, 288)
    assert (load >= 0).all() and load.sum() > 0
    for row in deployed:  # the reference EPLB's map: every expert held, 9 slots a GPU
        assert (np.bincount(row, minlength=256) >= 1).all()


@pytest.mark.slow
def test_without_the_engine_env_the_library_is_still_timed(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(online, "ENGINE_VENV", tmp_path / "absent")
    table = online.run()
    rows = [line for line in table.splitlines() if line.startswith(("| 58 ", "| 59 "))]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[3] == cells[4] == "(no engine env)" and cells[7] == "not measured"
        assert 0 < int(cells[5]) <= 256  # moves within the budget
        assert float(cells[1].split()[0]) > 0
    assert "(absent)" in table
