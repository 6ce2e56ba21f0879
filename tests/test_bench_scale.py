"""bench/scale.py: the command it times is the user's ``placer plan``, its table says what
the summary judged, and its idle-core estimate adds up the phases the command reports."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the bench package
import bench.scale as scale
from placer.traces import write_npz_trace


def test_the_judged_column_states_the_sample() -> None:
    sampled = {"judged": {"num_batches": 16, "num_tokens": 65536, "of_tokens": 1_000_000,
                          "source": "trace", "sample": {"per_window": 1}}}
    assert scale._judged(sampled, 0) == ("16 batches, 65,536 of 1,000,000 tokens (sample, 1"
                                         " batch per window)")
    whole = {"judged": {"num_batches": 16, "num_tokens": 65536, "of_tokens": 65536,
                        "source": "trace", "sample": None}}
    assert scale._judged(whole, 0) == "16 batches, 65,536 tokens"
    assert scale._judged({}, 2) == "exit 2"


def test_the_verdict_names_the_targets_and_the_growth() -> None:
    small = scale.Timed(30.0, 30.0, 400.0, 0, (1.0, 1.0))
    large = scale.Timed(29.0, 36.0, 600.0, 0, (1.0, 1.0))
    path = {"total": 28.5, "start": 1, "read": 5, "plan": 13, "judge": 2, "summary": 7,
            "rest": 0.5}
    lines = scale._verdict([("a", 65_536, small, {}, path), ("b", 1_000_000, large, {}, path)])
    assert lines[0].startswith("1,000,000 tokens: wall 29.0 s here (target <= 30 s: met),"
                               " 28.5 s estimated on 2 idle cores (met: start 1.0, read 5.0")
    assert "peak 600 MB (target <= 1,024 MB: met)" in lines[0]
    assert lines[1] == ("Cost growth from 65,536 to 1,000,000 tokens (15.3x): CPU x1.20,"
                        " peak memory x1.50 (sub-linear: yes).")


@pytest.mark.slow
def test_the_critical_path_reads_the_phases_of_a_real_plan(tmp_path, monkeypatch) -> None:
    """A small trace through the command: every phase has a figure, and they add up."""
    rng = np.random.default_rng(0)
    topk = np.argsort(rng.random((400, 4, 8)), axis=2)[:, :, :2]
    trace = tmp_path / "t.npz"
    write_npz_trace(trace, topk, layer_ids=[0, 1, 2, 3], step=np.arange(400) // 50,
                    meta={"model": "mixtral-8x7b", "num_experts": 8, "top_k": 2})
    monkeypatch.setattr(scale, "OUT", tmp_path)
    command = scale._command(trace, ("-m", "mixtral-8x7b", "-t", "dgx-h100", "-r", "8"), "t")
    path = scale.critical_path(command)
    parts = ("start", "read", "plan", "judge", "summary", "rest")
    assert all(path[k] >= 0 for k in parts)
    assert path["total"] == pytest.approx(sum(path[k] for k in parts))
    assert json.loads((tmp_path / "scale-t.json").read_text())["layers"]  # written
