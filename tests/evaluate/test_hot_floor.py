"""The per-batch floor for one plan's replica counts (placer.evaluate.hot_floor): never
above the replayed layer time of any placement with those counts, checked against every
such placement where they can be enumerated and on random ones otherwise."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from evaluate_fixtures import cluster, random_routing, tiny_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placer.errors import UsageError
from placer.evaluate import EvalParams, evaluate, time_bound
from placer.evaluate.dispatch import CODE_POLICIES
from placer.evaluate.hot_floor import _packing_floor, counts_floor, counts_floors
from placer.placement import Placement
from placer.regime import MODES
from placer.topology import load_topology


def _arrangements(counts: list[int]) -> list[tuple[int, ...]]:
    """Every distinct slot row holding expert ``e`` ``counts[e]`` times."""
    multiset = [e for e, c in enumerate(counts) for _ in range(c)]
    return sorted(set(itertools.permutations(multiset)))


@pytest.mark.parametrize("policy", CODE_POLICIES)
@pytest.mark.parametrize("mode", ["low_latency", "normal"])
def test_no_placement_with_the_counts_beats_the_floor_brute_force(policy: str, mode: str):
    """4 experts with counts 2, 2, 1, 1 on 3 GPUs x 2 slots: all 180 rows (one layer)."""
    model = tiny_model(num_experts=4, top_k=2, layers=(0,))
    model = replace(model, hidden_size=2048, moe_intermediate_size=4096)
    routing = random_routing(96, num_experts=4, top_k=2, layer_ids=(0,), batch=16, seed=4,
                             ranks=3)
    topology = cluster((2, 1))
    params = EvalParams(policy=policy, mode=mode, batch_tokens=16)
    rows = _arrangements([2, 2, 1, 1])
    assert len(rows) == 180
    first = Placement(np.array([rows[0]]), np.array([0]), 4, 3)
    floor = counts_floor(first, routing, topology, model, params).layer_time_us
    best = np.full(floor.shape, np.inf)
    for row in rows:
        pl = Placement(np.array([row]), np.array([0]), 4, 3)
        best = np.minimum(best, evaluate(pl, routing, topology, model, params).layer_time_us)
    assert np.all(floor <= best * (1 + 1e-12))
    assert np.all(floor > 0)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(CODE_POLICIES),
       mode=st.sampled_from(MODES),
       shape=st.sampled_from([(4,), (2, 2), (1, 1, 1), "2x-dgx-h100"]),
       slots=st.integers(2, 3), top_k=st.integers(1, 3), batch=st.sampled_from([4, 16, 64]),
       wide=st.booleans())
def test_no_placement_with_the_counts_beats_the_floor(seed, policy, mode, shape, slots, top_k,
                                                      batch, wide):
    """Random counts, random placements with them (two layers), the general floor under;
    the preset's links carry a fixed cost per phase (the pieces' share of it)."""
    rng = np.random.default_rng(seed)
    topology = load_topology(shape) if isinstance(shape, str) else cluster(shape)
    num_gpus = topology.num_gpus
    num_slots = num_gpus * slots
    num_experts = max(top_k + 1, num_slots - int(rng.integers(0, num_gpus + 1)))
    model = tiny_model(num_experts=num_experts, top_k=top_k)
    if wide:
        model = replace(model, hidden_size=4096, moe_intermediate_size=8192)
    routing = random_routing(128, num_experts=num_experts, top_k=top_k, batch=batch,
                             seed=seed, ranks=num_gpus)
    params = EvalParams(policy=policy, mode=mode, batch_tokens=batch)
    counts = np.ones((2, num_experts), dtype=np.int64)
    for layer in range(2):
        np.add.at(counts[layer], rng.integers(0, num_experts, num_slots - num_experts), 1)
    rows = [np.repeat(np.arange(num_experts), counts[layer]) for layer in range(2)]
    general = time_bound(routing, topology, model, params, slots)
    base = Placement(np.array(rows), np.arange(2), num_experts, num_gpus)
    floor = counts_floor(base, routing, topology, model, params, general=general)
    assert np.all(floor.layer_time_us[np.isfinite(floor.layer_time_us)]
                  >= general.layer_time_us[np.isfinite(floor.layer_time_us)])
    for _ in range(3):
        shuffled = np.array([rng.permutation(r) for r in rows])
        pl = Placement(shuffled, np.arange(2), num_experts, num_gpus)
        estimate = evaluate(pl, routing, topology, model, params).layer_time_us
        assert np.array_equal(np.isnan(estimate), np.isnan(floor.layer_time_us))
        finite = np.isfinite(estimate)
        assert np.all(floor.layer_time_us[finite] <= estimate[finite] * (1 + 1e-12))
    steps = floor.metrics()
    assert steps["step_mean_us"] <= evaluate(base, routing, topology, model,
                                             params).metrics["step_mean_us"] * (1 + 1e-12)


def test_packing_floor_by_hand():
    """2 GPUs x 2 slots, pieces 10, 6, 3, 1: mean 10; largest 10; 3 largest on 2 GPUs:
    one holds two of them, at least 6 + 3 = 9; the largest with the smallest: 11."""
    assert _packing_floor(np.array([[10.0, 6.0, 3.0, 1.0]]), 2, 2).tolist() == [11.0]
    # 3 GPUs x 2 slots, pieces 5, 5, 5, 5, 0, 0: four fives on three GPUs -> 10
    assert _packing_floor(np.array([[5.0, 5, 5, 5, 0, 0]]), 3, 2).tolist() == [10.0]


def test_static_dispatch_has_no_counts_floor():
    model = tiny_model(num_experts=4, top_k=2)
    routing = random_routing(32, num_experts=4, top_k=2, seed=1)
    pl = Placement(np.array([[0, 1, 2, 3], [0, 1, 2, 3]]), np.arange(2), 4, 2)
    with pytest.raises(UsageError) as info:
        counts_floor(pl, routing, cluster((2,)), model, EvalParams(policy="sglang"))
    assert info.value.where == "policy"


@pytest.mark.parametrize("policy", CODE_POLICIES)
def test_plans_floored_together_equal_each_floored_alone(policy: str) -> None:
    """``counts_floors`` draws each layer's tokens and codes once for every plan: each
    plan's floor is the one ``counts_floor`` gives it alone, to the last bit."""
    model = tiny_model(num_experts=4, top_k=2, layers=(0, 1))
    routing = random_routing(192, num_experts=4, top_k=2, layer_ids=(0, 1), batch=16,
                             seed=9, ranks=3)
    topology = cluster((2, 1))
    params = EvalParams(policy=policy, mode="low_latency", batch_tokens=16)
    rows = [np.array([[0, 0, 1, 1, 2, 3], [0, 1, 2, 3, 3, 3]]),
            np.array([[0, 1, 2, 3, 0, 2], [1, 1, 1, 0, 2, 3]])]
    plans = [Placement(r, np.array([0, 1]), 4, 3) for r in rows]
    general = time_bound(routing, topology, model, params, plans[0].slots_per_gpu)
    together = counts_floors(plans, routing, topology, model, params, general=general)
    for plan, floor in zip(plans, together, strict=True):
        alone = counts_floor(plan, routing, topology, model, params, general=general)
        assert np.array_equal(floor.layer_time_us, alone.layer_time_us, equal_nan=True)
        assert np.array_equal(floor.hottest_piece_us, alone.hottest_piece_us, equal_nan=True)
    assert not np.array_equal(together[0].hottest_piece_us, together[1].hottest_piece_us,
                              equal_nan=True)
