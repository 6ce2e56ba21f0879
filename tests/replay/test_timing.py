"""Timing a replay's timelines: the counted fast path (loads counted once per layer key
and steps, layers timed in stacks) gives, for every timeline, what the evaluator's
``simulate`` gives on the same steps and placements, whatever timelines share."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from placer.model import load_model
from placer.regime import Regime
from placer.replay import parse_policy
from placer.replay import timing as timing_mod
from placer.replay.steps import StepSource, step_loads
from placer.replay.timeline import Setting, Timeline, default_placement, plan_timeline
from placer.replay.timing import time_timelines
from placer.stats import RoutingTrace
from placer.topology import load_topology

TRACE = Path(__file__).resolve().parents[2] / "traces" / "synthetic-dsv3-drift.npz"


@pytest.fixture(scope="module")
def case() -> tuple[StepSource, Setting, list[Timeline]]:
    data = np.load(TRACE)
    ids = data["topk_ids"][:16_384, :3].astype(np.int32)  # 16 steps of 1,024 tokens
    layers = data["layer_ids"][:3]
    rank = data["rank"][:16_384]
    step = np.arange(ids.shape[0], dtype=np.int64) // 1024
    source = StepSource("drift", layers, 8, step, rank,
                        trace=RoutingTrace(ids, layers, data["step"][:16_384], rank, None))
    setting = Setting(load_topology("4x-dgx-h100"), load_model("deepseek-v3"),
                      Regime("vllm", "decode", tokens_per_gpu=32), 9, "fp8", layers)
    loads = step_loads(source, 256)
    static = Timeline("static:default", default_placement(setting))
    moving = plan_timeline(parse_policy("eplb:window=3,interval=3"), loads, setting, None)
    assert len(moving.changes) >= 6  # rebalances inside chunks too
    return source, setting, [static, moving]


def _times(source: StepSource, setting: Setting, lines: list[Timeline]) -> list[np.ndarray]:
    return [t.layer_time_us for t in time_timelines(source, lines, setting)]


@pytest.mark.parametrize("stack", [1, 2, 64])
def test_shared_layers_are_written_to_every_timeline(case, stack, monkeypatch) -> None:
    source, setting, (static, moving) = case
    monkeypatch.setattr(timing_mod, "STACK_LAYERS", stack)
    alone = [_times(source, setting, [line])[0] for line in (static, moving)]
    together = _times(source, setting, [static, moving, static])
    for got, want in zip(together, [alone[0], alone[1], alone[0]], strict=True):
        assert np.isfinite(got).all()
        np.testing.assert_array_equal(got, want)


def test_counted_path_equals_the_simulator(case, monkeypatch) -> None:
    source, setting, lines = case
    monkeypatch.setattr("placer.replay.steps.CHUNK_TOKENS", 5000)  # chunks cut rebalances
    counted = _times(source, setting, lines)
    monkeypatch.setattr(timing_mod, "supports", lambda policy, mode: False)
    simulated = _times(source, setting, lines)
    for got, want in zip(counted, simulated, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)
