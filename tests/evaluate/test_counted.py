"""The counted fast path (placer.evaluate.counted) gives simulate's figures exactly."""

from __future__ import annotations

import numpy as np
import pytest
from evaluate_fixtures import cluster, tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st

from placer import constants
from placer.evaluate.batches import sorted_batches
from placer.evaluate.costs import CostModel
from placer.evaluate.counted import (
    Selections,
    count_slots,
    counted_times,
    slot_lookup,
    supports,
)
from placer.evaluate.dispatch import static_dispatch_table
from placer.evaluate.params import EvalParams
from placer.evaluate.simulate import simulate
from placer.placement import Placement


def _placement(rng: np.random.Generator, experts: int, gpus: int, slots: int,
               layers: int) -> Placement:
    rows = []
    for _ in range(layers):
        extra = rng.choice(experts, size=gpus * slots - experts, p=None)
        row = np.concatenate([rng.permutation(experts), extra])
        rng.shuffle(row)
        rows.append(row)
    return Placement(np.array(rows), np.arange(layers), experts, gpus)


def _both(seed: int, policy: str, mode: str, tokens: int, holes: bool,
          part: tuple[int, int] | None = None) -> tuple[tuple[np.ndarray, np.ndarray],
                                                         tuple[np.ndarray, np.ndarray]]:
    """(counted, simulated) ``([batches, layers] times, hot shards)`` of a random case."""
    rng = np.random.default_rng(seed)
    experts, top_k, gpus, slots, layers = 6, 2, 4, 3, 2
    model = tiny_model(num_experts=experts, top_k=top_k, layers=tuple(range(layers)))
    topology = cluster((2, 2))
    placement = _placement(rng, experts, gpus, slots, layers)
    ids = np.argsort(rng.random((tokens, layers, experts)), axis=2)[:, :, :top_k]
    if holes:
        ids[rng.random(ids.shape) < 0.2] = -1
    step = np.sort(rng.integers(0, 5, tokens))
    rank = rng.integers(-1, gpus, tokens)
    batches, order = sorted_batches(tokens, gpus, step=step, rank=rank, batch_tokens=None,
                                    default_batch_tokens=constants.DEFAULT_BATCH_TOKENS)
    ids = ids[order]
    costs = CostModel.of(topology, model, mode, "bf16")
    params = EvalParams(policy=policy, mode=mode, seed=0)
    table = None
    if policy in ("sglang", "local_first"):
        table = static_dispatch_table(placement, 0, policy=policy,
                                      node_of_gpu=np.asarray(topology.node_of_gpu))
    sim = simulate(placement, batches, lambda row: ids[:, row].astype(np.int64), costs,
                   model, params, table)
    sel = Selections.of(batches, policy, num_experts=experts, num_slots=gpus * slots,
                        top_k=top_k)
    first, last = part if part is not None else (0, batches.num_batches)
    times = np.full((last - first, layers), np.nan)
    hot = np.full((last - first, layers), np.nan)
    for row in range(layers):
        lookup = slot_lookup(sel, placement.logical_to_physical[row],
                             placement.replica_counts[row],
                             None if table is None else table[row])
        counts = count_slots(sel, sel.keys(ids[:, row]), lookup, part)
        times[:, row], hot[:, row] = counted_times(sel, counts, costs, part)
    return (times, hot), (sim.layer_time_us[first:last], sim.batch_hot_shard[first:last])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(["round_robin", "vllm_hash",
                                                           "sglang", "local_first"]),
       mode=st.sampled_from(["low_latency", "low_latency_rdma"]),
       tokens=st.integers(1, 60), holes=st.booleans())
def test_counted_equals_simulate(seed, policy, mode, tokens, holes):
    (times, hot), (sim_times, sim_hot) = _both(seed, policy, mode, tokens, holes)
    np.testing.assert_allclose(times, sim_times, rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(hot, sim_hot, rtol=1e-12, equal_nan=True)


def test_a_part_of_the_batches_is_timed_as_in_the_whole():
    (times, hot), (sim_times, sim_hot) = _both(3, "round_robin", "low_latency", 80, True,
                                               part=(1, 4))
    assert times.shape == (3, 2)
    np.testing.assert_allclose(times, sim_times, rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(hot, sim_hot, rtol=1e-12, equal_nan=True)


def test_only_per_selection_modes_and_table_driven_dispatch_are_counted():
    assert supports("round_robin", "low_latency")
    assert supports("sglang", "low_latency_rdma")
    assert not supports("round_robin", "normal")  # each token's destinations deduplicated
    assert not supports("random", "low_latency")  # drawn per selection
    with pytest.raises(ValueError, match="not counted"):
        sel = Selections.of(sorted_batches(4, 2, step=None, rank=None, batch_tokens=4,
                                           default_batch_tokens=4)[0], "round_robin",
                            num_experts=2, num_slots=2, top_k=1)
        counted_times(sel, np.zeros((2, 2), dtype=np.int64),
                      CostModel.of(cluster((2,)), tiny_model(num_experts=2, top_k=1)))
