"""A replay against figures worked out by hand: what a rebalance costs, and foresight.

The toy cluster (tests/evaluate_fixtures.py) has 2 nodes of 2 GPUs, 100 GB/s of fabric
and 10 GB/s of NIC per GPU, at full efficiency; the model has 8 experts (top-2, two slots
a GPU, the engines' layout ``[0 1 | 2 3 | 4 5 | 6 7]``), each ``3 x 4096 x 2048`` bf16
weights, 50,331,648 bytes.  The reference EPLB packs experts heaviest first onto the
lightest GPU with a free slot, so a load ordered ``a > b > ... > h`` gives GPU 0
``{a, h}``, GPU 1 ``{b, g}``, GPU 2 ``{c, f}``, GPU 3 ``{d, e}``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from evaluate_fixtures import cluster

from placer.model import ModelSpec
from placer.regime import Regime
from placer.replay import ReplayParams, StepSource, parse_policy, replay
from placer.replay.policies import EPLB_MS_PER_LAYER
from placer.stats import RoutingTrace
from placer.topology.calibration import Calibration, RebalanceCalibration

EXPERT_BYTES = 3 * 4096 * 2048 * 2
NIC = 10e9  # bytes/s per GPU
FABRIC = 100e9


def _model() -> ModelSpec:
    return ModelSpec(
        name="toy-4096", num_hidden_layers=1, moe_layer_ids=(0,), num_experts=8, top_k=2,
        num_groups=1, top_groups=1, num_shared_experts=0, hidden_size=4096,
        moe_intermediate_size=2048, non_expert_params=1_000_000, default_dtype="bf16")


def _step(order: list[int]) -> list[tuple[int, int]]:
    """Tokens of one step whose load orders the experts as ``order`` (heaviest first:
    8, 7, ..., 1 selections), two distinct experts a token."""
    flat = [e for count, e in zip(range(8, 0, -1), order, strict=True) for _ in range(count)]
    half = len(flat) // 2
    return list(zip(flat[:half], flat[half:], strict=True))


def _source(steps: list[list[tuple[int, int]]]) -> StepSource:
    """One layer; each step a list of tokens' selections, from source ranks 0, 1, 2, 3
    in turn."""
    ids = np.array([pair for step in steps for pair in step], dtype=np.int32)[:, None, :]
    step = np.repeat(np.arange(len(steps)), [len(s) for s in steps]).astype(np.int64)
    rank = np.concatenate([np.arange(len(s)) % 4 for s in steps]).astype(np.int64)
    trace = RoutingTrace(ids, np.array([0]), step, rank, None)
    return StepSource("toy", np.array([0]), 2, step, rank, trace=trace)


def _cluster(host_ms: float = 0.0, layer_ms: float = 0.0, async_share: float = 1.0):
    topology = cluster((2, 2), intra_gbps=FABRIC / 1e9, inter_gbps=NIC / 1e9)
    return topology.with_calibration(Calibration(
        rebalance=RebalanceCalibration(host_ms, layer_ms, async_share)))


#: 7 > 6 > ... > 0: EPLB's [7 0 | 6 1 | 5 2 | 4 3]: GPU 0 loads 7 and GPU 1 loads 6 from
#: node 1, GPU 2 loads 2 and GPU 3 loads 3 from node 0 (GPU 1 loads 1 and GPU 3 loads 4
#: over the fabric meanwhile): each GPU one expert over its NIC, 6 moves.
ACROSS = _step([7, 6, 5, 4, 3, 2, 1, 0])
#: 0 > 1 > 4 > 5 > 7 > 6 > 3 > 2: EPLB's [0 2 | 1 3 | 4 6 | 5 7]: experts 2 and 1 swap
#: within node 0, 6 and 5 within node 1: each GPU one expert over the fabric, 4 moves.
WITHIN = _step([0, 1, 4, 5, 7, 6, 3, 2])
CALM = [(0, 1), (2, 3), (4, 5), (6, 7)]


def _replay(steps, policies, topology, regime=None):
    params = ReplayParams(regime or Regime("sglang", "decode", tokens_per_gpu=1))
    return replay(_source(steps), [parse_policy(p) for p in policies], _model(), topology,
                  params)


@pytest.mark.parametrize(("first", "expected_row", "moves", "link"), [
    (ACROSS, [7, 0, 6, 1, 5, 2, 4, 3], 6, NIC), (WITHIN, [0, 2, 1, 3, 4, 6, 5, 7], 4, FABRIC)])
def test_a_synchronous_rebalance_stalls_for_its_bytes_over_the_link(first, expected_row,
                                                                   moves, link):
    result = _replay([first, CALM], ["eplb:window=1,interval=1"], _cluster())
    (policy,) = result.policies
    (rebalance,) = policy.rebalances
    # the slowest GPU loads one expert (50.3 MB) over the link, all GPUs in parallel
    copy_s = EXPERT_BYTES / link
    # serving also stops while EPLB decides: its reference figure for the one layer
    decide_s = EPLB_MS_PER_LAYER / 1e3
    assert rebalance.step == 1 and rebalance.moves == moves and rebalance.layers == 1
    assert rebalance.copy_s == pytest.approx(copy_s, rel=1e-12)
    assert rebalance.stall_s == pytest.approx(copy_s, rel=1e-12)
    assert rebalance.decision_s == pytest.approx(decide_s, rel=1e-12)
    assert rebalance.gb == pytest.approx(moves * EXPERT_BYTES / 1e9)
    np.testing.assert_allclose(policy.stall_us, [0.0, (copy_s + decide_s) * 1e6], rtol=1e-12)
    np.testing.assert_array_equal(policy.extra_us, [0.0, 0.0])
    # the step the rebalance interrupts pays it, on top of its own serving time
    assert policy.step_us[1] == pytest.approx(policy.serving_us[1] + (copy_s + decide_s) * 1e6)
    assert policy.figures()["stall_s"] == pytest.approx(copy_s + decide_s)
    static = _replay([first, CALM], [f"static:{_placement_file(expected_row)}"], _cluster())
    # from step 1 on, the new layout serves: step 1 is timed as the static layout is
    assert policy.serving_us[1] == pytest.approx(static.policies[0].serving_us[1], rel=1e-12)


def test_host_and_per_layer_work_add_to_the_stall():
    result = _replay([ACROSS, CALM], ["eplb:window=1,interval=1"],
                     _cluster(host_ms=50.0, layer_ms=15.0))
    (rebalance,) = result.policies[0].rebalances
    assert rebalance.stall_s == pytest.approx(0.050 + 0.015 + EXPERT_BYTES / NIC, rel=1e-12)


@pytest.mark.parametrize("share", [1.0, 0.5, 0.0])
def test_a_background_copy_slows_the_step_it_overlaps_by_its_share(share):
    steps = [ACROSS, ACROSS, ACROSS]  # step 2's window asks for the layout of step 1's
    result = _replay(steps, ["eplb:window=1,interval=1,async,decide-ms=0"],
                     _cluster(async_share=share))
    (policy,) = result.policies
    (rebalance,) = policy.rebalances
    copy_us = EXPERT_BYTES / NIC * 1e6
    assert rebalance.stall_s == 0.0 and rebalance.done_step == 2
    np.testing.assert_allclose(policy.extra_us, [0.0, share * copy_us, 0.0], rtol=1e-12)
    np.testing.assert_array_equal(policy.stall_us, [0.0, 0.0, 0.0])
    # the old layout serves step 1 (the copy is under way), the new one from step 2
    sync = _replay(steps, ["eplb:window=1,interval=1"], _cluster())
    static = _replay(steps, ["static:default"], _cluster())
    assert policy.serving_us[1] == pytest.approx(static.policies[0].serving_us[1], rel=1e-12)
    assert policy.serving_us[2] == pytest.approx(sync.policies[0].serving_us[2], rel=1e-12)


def test_a_rebalance_due_while_a_copy_moves_is_skipped():
    # two layers, moved one a step: the rebalance of step 1 copies during steps 1 and 2,
    # so the one due at step 2 (whose window, step 1, asks for another layout) is skipped;
    # at step 3 the window (step 2) asks for the layout already deployed
    model = replace(_model(), num_hidden_layers=2, moe_layer_ids=(0, 1))
    ids = np.array([[p, p] for step in [ACROSS, WITHIN, ACROSS, ACROSS] for p in step],
                   dtype=np.int32)
    step = np.repeat(np.arange(4), [len(ACROSS), len(WITHIN), len(ACROSS), len(ACROSS)])
    rank = np.arange(step.size) % 4
    source = StepSource("toy", np.array([0, 1]), 2, step, rank,
                        trace=RoutingTrace(ids, np.array([0, 1]), step, rank, None))
    result = replay(source, [parse_policy("eplb:window=1,interval=1,async,decide-ms=0")], model,
                    _cluster(), ReplayParams(Regime("sglang", "decode", tokens_per_gpu=1)))
    (policy,) = result.policies
    assert [(r.step, r.layers, r.done_step) for r in policy.rebalances] == [(1, 2, 3)]
    copy_us = EXPERT_BYTES / NIC * 1e6
    np.testing.assert_allclose(policy.extra_us, [0.0, copy_us, copy_us, 0.0], rtol=1e-12)


def test_the_oracle_moves_for_free_and_reports_what_it_moved():
    result = _replay([ACROSS, ACROSS], ["oracle:interval=2"], _cluster())
    (oracle,) = result.policies
    (rebalance,) = oracle.rebalances
    assert rebalance.step == 0 and rebalance.stall_s == 0.0 and rebalance.moves > 0
    assert rebalance.gb == pytest.approx(rebalance.moves * EXPERT_BYTES / 1e9)
    assert oracle.figures()["stall_s"] == 0.0


def test_placer_declines_moves_that_cannot_pay_for_their_copy():
    # a one-step horizon: a 5 ms copy cannot pay back in one step of well under 1 ms
    result = _replay([ACROSS, ACROSS, ACROSS],
                     ["placer:window=1,interval=1,horizon=1,decide-ms=0", "static:default"],
                     _cluster())
    placer, static = result.policies
    assert placer.rebalances == ()
    np.testing.assert_allclose(placer.step_us, static.step_us)


_FILES: dict[tuple[int, ...], Path] = {}


def _placement_file(row: list[int]) -> Path:
    """A placement JSON of one layer (``row``: expert of each GPU's slot)."""
    import tempfile

    from placer.placement import Placement
    from placer.placement.document import write_placement

    key = tuple(row)
    if key not in _FILES:
        path = Path(tempfile.mkdtemp()) / "placement.json"
        write_placement(path, Placement(np.array([row]), np.array([0]), 8, 4),
                        model_name="toy-4096")
        _FILES[key] = path
    return _FILES[key]


def test_foresight_is_not_slower_than_any_engine_setting_of_its_interval():
    # the bundled drifting trace, two of its layers, 64 tokens a GPU: 32 steps of 2,048
    data = np.load(Path(__file__).resolve().parents[2] / "traces" / "synthetic-dsv3-drift.npz")
    ids = data["topk_ids"][:, :2].astype(np.int32)
    layers = data["layer_ids"][:2]
    rank = data["rank"]
    step = np.arange(ids.shape[0], dtype=np.int64) // 2048
    source = StepSource("drift", layers, 8, step, rank,
                        trace=RoutingTrace(ids, layers, data["step"], rank, None))
    from placer.model import load_model
    from placer.topology import load_topology

    policies = ["eplb:window=4,interval=4", "eplb:window=16,interval=4",
                "eplb:window=2,interval=4,async", "oracle:interval=4"]
    result = replay(source, [parse_policy(p) for p in policies], load_model("deepseek-v3"),
                    load_topology("4x-dgx-h100"),
                    ReplayParams(Regime("vllm", "decode", tokens_per_gpu=64), redundant=32))
    oracle = result.oracle
    assert oracle is not None and oracle.rebalances
    for policy in result.policies[:-1]:
        assert policy.rebalances  # the engines' settings did move
        # the oracle's layouts serve faster (it moves for free: its steps pay no stall)
        assert oracle.figures()["serving_mean_us"] <= \
            policy.figures()["serving_mean_us"] * 1.005, policy.label
        assert oracle.figures()["step_mean_us"] <= policy.figures()["step_mean_us"] * 1.005
        assert result.versus_oracle(policy) > 0
