"""bench/tuning.py: the tuning source is distinct from the reported one, and its verdict."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the bench package
import bench.latency as latency
import bench.replay as replay
import bench.tuning as tuning


def test_the_tuning_traces_are_fitted_to_measured_files_on_their_own_seed(tmp_path) -> None:
    found = tuning.sources()
    assert found and found[0].file.exists()  # the bundled Qwen3 statistics, always
    for source in found:
        command = tuning.fitted_command(source, tmp_path / "t.npz")
        assert command[command.index("--from") + 1] == str(source.file)
        assert "--skew" not in command and "--zipf" not in command
        assert command[command.index("--seed") + 1] == str(tuning.SEED)
    reported = {o["seed"] for _, _, o in latency.SYNTH.values()}
    reported.add(int(replay.SYNTH_ARGS[replay.SYNTH_ARGS.index("--seed") + 1]))
    assert tuning.SEED not in reported
    assert tuning.SETTINGS["default"] is None and len(tuning.SETTINGS) >= 3


def _row(change: float) -> latency.Row:
    return latency.Row(config="c", engine="vllm", judged="", eplb_step_p99=100.0,
                       eplb_layer_p99=1.0, cpsat_step_p99=100.0 * (1 + change),
                       cpsat_layer_p99=1.0, change=change, verdict="", seconds=0.0)


def test_score_is_the_geometric_mean_and_the_verdict_keeps_close_defaults() -> None:
    assert tuning.score([_row(-0.19), _row(0.0)]) == pytest.approx(0.9)
    assert "the defaults hold" in tuning.verdict({"default": 0.95, "b": 0.948})
    assert "the defaults hold" in tuning.verdict({"default": 0.95, "b": 0.96})
    moved = tuning.verdict({"default": 0.95, "b": 0.90})
    assert moved.startswith("**b beats the defaults by 5.26%**")
    table = tuning.render({"default": [_row(-0.1), _row(0.0)], "b": [_row(0.0), _row(0.0)]})
    assert table[0] == "| setting | c vllm | c vllm | score |"
    assert table[2].startswith("| default | -10.00% | +0.00% | 0.9487 |")
