"""The layer-time floor (placer.evaluate.bound): never above any placement's estimate."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from evaluate_fixtures import cluster, random_routing, routing_of, tiny_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placer.evaluate import EvalParams, evaluate
from placer.evaluate.bound import _Copies, _water_level, time_bound
from placer.evaluate.costs import CostModel
from placer.placement import Placement
from placer.regime import MODES, POLICIES
from placer.topology import load_topology

CLUSTERS: dict[str, tuple[int, ...] | str] = {
    "one node": (4,),
    "two nodes": (2, 2),
    "uneven nodes": (3, 1),
    "four nodes": (1, 1, 1, 1),
    # presets: calibrated links, with a fixed cost per phase on NVLink and InfiniBand
    "dgx-h100": "dgx-h100",
    "2x-dgx-h100": "2x-dgx-h100",
}


def _cluster(shape: str):
    sizes = CLUSTERS[shape]
    return load_topology(sizes) if isinstance(sizes, str) else cluster(sizes)


def random_placement(rng: np.random.Generator, num_experts: int, num_gpus: int,
                     slots_per_gpu: int, layers: int = 2) -> Placement:
    """Every expert at least once, the other slots drawn at random (duplicates on one GPU
    allowed, as DeepSeek's EPLB makes them), shuffled over the slots."""
    rows = []
    for _ in range(layers):
        extra = rng.integers(0, num_experts, num_gpus * slots_per_gpu - num_experts)
        rows.append(rng.permutation(np.r_[np.arange(num_experts), extra]))
    return Placement(np.array(rows), np.arange(layers), num_experts, num_gpus)


def local_placement(routing, num_gpus: int, slots_per_gpu: int, batch: int) -> Placement:
    """Each GPU holds the experts its own tokens select most (the placement that serves
    most selections where they arise, the case the floor's copy counts are tight for),
    then missing experts replace the least useful slots."""
    ids = routing.trace.topk_ids
    num_tokens, layers, _ = ids.shape
    num_experts = routing.stats.num_experts
    position = np.arange(num_tokens) % batch
    source = np.where(routing.trace.rank >= 0, routing.trace.rank, position % num_gpus)
    rows = []
    for layer in range(layers):
        counts = np.zeros((num_gpus, num_experts))
        valid = ids[:, layer] >= 0
        tok, k = np.nonzero(valid)
        np.add.at(counts, (source[tok], ids[tok, layer, k]), 1)
        order = np.argsort(-counts, axis=1, kind="stable")[:, :slots_per_gpu]
        row = order.reshape(-1).copy()
        value = np.take_along_axis(counts, order, axis=1).reshape(-1)
        for expert in range(num_experts):
            if expert not in row:
                held = np.bincount(row, minlength=num_experts)
                spare = np.flatnonzero(held[row] > 1)
                slot = spare[np.argmin(value[spare])]
                row[slot], value[slot] = expert, 0
        rows.append(row)
    return Placement(np.array(rows), np.arange(layers), num_experts, num_gpus)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    shape=st.sampled_from(sorted(CLUSTERS)),
    mode=st.sampled_from(MODES),
    policy=st.sampled_from(POLICIES),
    slots=st.integers(2, 4),
    top_k=st.integers(1, 3),
    batch=st.sampled_from([4, 8, 32]),
    wide=st.booleans(),
)
def test_no_placement_beats_the_floor(seed: int, shape: str, mode: str, policy: str,
                                      slots: int, top_k: int, batch: int, wide: bool) -> None:
    rng = np.random.default_rng(seed)
    topology = _cluster(shape)
    num_gpus = topology.num_gpus
    num_experts = 6 if num_gpus <= 4 else 12
    model = tiny_model(num_experts=num_experts, top_k=top_k)
    if wide:  # experts large enough for their weight reads to dominate
        model = replace(model, hidden_size=4096, moe_intermediate_size=8192)
    routing = random_routing(96, num_experts=num_experts, top_k=top_k, batch=batch, seed=seed,
                             ranks=num_gpus)
    params = EvalParams(policy=policy, mode=mode, batch_tokens=batch, seed=seed % 7)
    floor = time_bound(routing, topology, model, params, slots)
    candidates = [random_placement(rng, num_experts, num_gpus, slots) for _ in range(2)]
    candidates.append(local_placement(routing, num_gpus, slots, batch))
    for placement in candidates:
        evaluation = evaluate(placement, routing, topology, model, params)
        for key, least in floor.copies_per_token().items():
            assert least <= evaluation.metrics[key] * (1 + 1e-12), (key, mode, shape)
        estimate = evaluation.layer_time_us
        assert np.array_equal(np.isnan(estimate), np.isnan(floor.layer_time_us))
        finite = np.isfinite(estimate)
        slack = estimate[finite] - floor.layer_time_us[finite]
        assert slack.min() >= -1e-9 * estimate[finite].max(), (slack.min(), placement)


def _every_placement(num_experts: int, num_gpus: int, slots: int) -> list[Placement]:
    """Every placement of one layer, up to the order of slots inside a GPU (which no
    dispatch rule reads: a replica's index is its rank among the expert's slots)."""
    shelves = list(itertools.combinations_with_replacement(range(num_experts), slots))
    rows = [np.concatenate(gpus) for gpus in itertools.product(shelves, repeat=num_gpus)]
    return [Placement(row[None], np.array([0]), num_experts, num_gpus) for row in rows
            if np.unique(row).size == num_experts]


@pytest.mark.parametrize("policy", POLICIES)
def test_no_placement_beats_the_normal_mode_floor_brute_force(policy: str) -> None:
    """Prefill's kernels (copies per token and node): 4 experts on 3 GPUs over 2 nodes x
    2 slots, every placement (one layer)."""
    model = replace(tiny_model(num_experts=4, top_k=2, layers=(0,)), hidden_size=2048,
                    moe_intermediate_size=4096)
    routing = random_routing(96, num_experts=4, top_k=2, layer_ids=(0,), batch=16, seed=4,
                             ranks=3)
    topology = cluster((2, 1))
    params = EvalParams(policy=policy, mode="normal", batch_tokens=16)
    floor = time_bound(routing, topology, model, params, 2).layer_time_us
    placements = _every_placement(4, 3, 2)
    assert len(placements) == 294
    best = np.full(floor.shape, np.inf)
    for placement in placements:
        best = np.fmin(best, evaluate(placement, routing, topology, model,
                                      params).layer_time_us)
    assert np.all(floor <= best * (1 + 1e-12))
    assert np.all(floor >= 0.5 * best), (floor / best).min()


@pytest.mark.parametrize("policy", ["sglang", "vllm_hash"])
def test_normal_mode_counts_one_home_per_expert(policy: str) -> None:
    """Every token of both nodes selects experts 0 and 1 and no slot is spare: each node
    alone could hold both and keep its tokens home, but only one node can, so at least
    half the tokens cross (the count over all nodes together, and round robin's)."""
    topology = cluster((2, 2))
    model = tiny_model(num_experts=4, top_k=2, layers=(0,))
    n = np.zeros((1, 4, 4))
    n[0, :, :2] = 16  # [batch, GPU, expert]: 16 tokens a GPU, each selecting 0 and 1
    tokens, k_min = np.full((1, 4), 16.0), np.full((1, 4), 2)
    source = np.repeat(np.arange(4), 32)
    experts = np.tile([0, 1], 64)
    code = np.repeat(np.arange(64), 2) * 2 + np.tile([0, 1], 64)
    at = (np.zeros(128, dtype=np.int64), source, experts, code)
    copies = _Copies(1, 4, policy, CostModel.of(topology, model, "normal", "bf16"))
    out, inter, _ = copies.totals(n, tokens, k_min, at, 1)
    assert inter[0] >= 32  # of 64 tokens; each node's own count alone lets all stay
    assert out[0] >= 48  # likewise per GPU: 32 selections served at home at most


def test_floor_is_exact_on_one_gpu() -> None:
    """One GPU holding every expert: no copies, and compute is every selected expert
    once, which is what the floor counts."""
    model = tiny_model(num_experts=4, top_k=2)
    routing = random_routing(64, num_experts=4, top_k=2, batch=16, seed=3)
    topology = cluster((1,))
    placement = Placement(np.array([[0, 1, 2, 3], [3, 2, 1, 0]]), np.arange(2), 4, 1)
    params = EvalParams(mode="low_latency", batch_tokens=16)
    estimate = evaluate(placement, routing, topology, model, params)
    floor = time_bound(routing, topology, model, params, 4)
    np.testing.assert_allclose(floor.layer_time_us, estimate.layer_time_us, rtol=1e-12)
    assert floor.metrics()["step_p99_us"] == pytest.approx(estimate.metrics["step_p99_us"])


def test_round_robin_floor_is_at_least_the_general_one() -> None:
    """Round robin's own rule only adds to what every policy must pay."""
    model = tiny_model(num_experts=6, top_k=2)
    routing = random_routing(256, num_experts=6, top_k=2, batch=32, seed=5, ranks=4)
    topology = cluster((2, 2))
    general = time_bound(routing, topology, model,
                         EvalParams(policy="sglang", mode="low_latency", batch_tokens=32), 2)
    rr = time_bound(routing, topology, model,
                    EvalParams(policy="round_robin", mode="low_latency", batch_tokens=32), 2)
    assert (rr.layer_time_us >= general.layer_time_us - 1e-12).all()
    assert (rr.layer_time_us > general.layer_time_us + 1e-9).any()


def test_metrics_are_floors_of_the_evaluator_metrics() -> None:
    rng = np.random.default_rng(11)
    model = tiny_model(num_experts=6, top_k=2)
    routing = random_routing(256, num_experts=6, top_k=2, batch=32, seed=11, ranks=4)
    topology = cluster((2, 2))
    params = EvalParams(policy="round_robin", mode="low_latency", batch_tokens=32)
    floor = time_bound(routing, topology, model, params, 3).metrics()
    for _ in range(5):
        metrics = evaluate(random_placement(rng, 6, 4, 3), routing, topology, model,
                           params).metrics
        for key, value in floor.items():
            assert value <= metrics[key] + 1e-9, key


def test_sampled_floor_uses_the_evaluator_draws() -> None:
    """With the same draws the floor bounds the same sampled tokens."""
    rng = np.random.default_rng(2)
    model = tiny_model(num_experts=6, top_k=2)
    routing = random_routing(512, num_experts=6, top_k=2, batch=32, seed=2)
    topology = cluster((2, 2))
    params = EvalParams(policy="random", mode="low_latency", batch_tokens=32, sample=True)
    draws: dict[tuple[int, ...], np.ndarray] = {}
    floor = time_bound(routing.stats, topology, model, params, 3, draws=draws)
    assert floor.source == "sampled" and draws
    estimate = evaluate(random_placement(rng, 6, 4, 3), routing.stats, topology, model, params,
                        draws=draws)
    assert (estimate.layer_time_us >= floor.layer_time_us - 1e-9).all()


def test_water_level() -> None:
    # floors 1, 2, 7 with work 4: fill the first two to 3.5 (2.5 + 1.5 = 4), below 7
    assert _water_level(np.array([[1.0, 2.0, 7.0]]), np.array([4.0]))[0] == 7.0
    # work 10: level L with (L-1) + (L-2) = 10 is 6.5 < 7; 7 is the floor anyway
    assert _water_level(np.array([[1.0, 2.0, 7.0]]), np.array([14.0]))[0] == pytest.approx(8.0)
    assert _water_level(np.array([[0.0, 0.0]]), np.array([3.0]))[0] == pytest.approx(1.5)


def test_round_robin_floor_counts_every_replicas_weight_read() -> None:
    """Memory-bound experts (Mixtral-sized on a slow-HBM toy GPU): round robin uses
    every replica that has a selection, so each GPU reads its 3 slots' weights and the
    floor says so (a floor that counted each expert once would allow 2 reads per GPU)."""
    from placer.model import ModelSpec

    model = ModelSpec(
        name="wide", num_hidden_layers=2, moe_layer_ids=(0, 1), num_experts=8, top_k=2,
        num_groups=1, top_groups=1, num_shared_experts=0, hidden_size=4096,
        moe_intermediate_size=14336, non_expert_params=1_000_000, default_dtype="bf16",
    )
    ordered = random_routing(512, num_experts=8, top_k=2, batch=128, seed=4, holes=False)
    ids = ordered.trace.topk_ids.copy()  # top-k lists in no systematic order: no order bias
    flip = np.random.default_rng(4).random(ids.shape[:2]) < 0.5
    ids[flip] = ids[flip][:, ::-1]
    routing = routing_of(ids, ordered.trace.layer_ids, ordered.trace.step, ordered.trace.rank, 8)
    topology = cluster((4,))
    params = EvalParams(policy="round_robin", mode="low_latency", batch_tokens=128)
    floor = time_bound(routing, topology, model, params, 3)
    weight_us = model.expert_bytes("bf16") / (1000.0 * topology.hbm_efficiency) / 1e3
    # a batch may leave one replica without a selection (its residue class empty): the
    # floor then allows that, but most batches use all 12 slots
    assert np.nanmedian(floor.layer_time_us) >= 3 * weight_us
    assert np.nanmin(floor.layer_time_us) >= 2.5 * weight_us
    rng = np.random.default_rng(4)
    for _ in range(3):
        estimate = evaluate(random_placement(rng, 8, 4, 3), routing, topology, model, params)
        assert (estimate.layer_time_us >= floor.layer_time_us - 1e-9).all()
    general = time_bound(routing, topology, model,
                         EvalParams(policy="sglang", mode="low_latency", batch_tokens=128), 3)
    assert np.nanmax(general.layer_time_us) < 3 * weight_us  # each expert once: 2 reads
