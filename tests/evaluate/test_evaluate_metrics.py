"""Metric definitions, window ranges and the exact static figures, against hand values."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from evaluate_fixtures import cluster, placement, random_routing, routing_of, tiny_model

from placer.errors import DataError, PlacementError, PlacerWarning, TraceWarning, UsageError
from placer.evaluate import (
    EvalParams,
    evaluate,
    expected_remote_copies,
    remote_copy_bounds,
    window_hot_shard,
)
from placer.evaluate.balance import sglang_balancedness, trtllm_imbalance, vllm_balancedness
from placer.evaluate.batches import group_position, make_batches
from placer.evaluate.timing import comm_time_us, compute_time_us
from placer.evaluate.traffic import Fabric
from placer.stats.windows import default_split, evaluation_parts, parse_window_range, token_windows


def test_engine_metrics_by_hand():
    """Two batches x two layers; GPU loads [[4, 0], [2, 2]] and [[3, 1], [1, 1]]."""
    batch_max = np.array([[4.0, 2.0], [3.0, 1.0]])
    batch_mean = np.array([[2.0, 2.0], [2.0, 1.0]])
    # vLLM: per batch sum(mean)/sum(max): 4/6 and 3/4 -> mean 0.708333
    assert vllm_balancedness(batch_max, batch_mean) == pytest.approx((4 / 6 + 3 / 4) / 2)
    # SGLang: per batch mean over layers of (mean+eps)/(max+eps)
    eps = 1e-5
    expected = ((2 + eps) / (4 + eps) + 1 + (2 + eps) / (3 + eps) + 1) / 4
    assert sglang_balancedness(batch_max, batch_mean) == pytest.approx(expected)
    # TensorRT-LLM: mean of max/mean - 1 = (1 + 0 + 0.5 + 0) / 4
    assert trtllm_imbalance(batch_max, batch_mean) == pytest.approx(0.375)


def test_empty_batch_layers_are_left_out():
    """vLLM and TensorRT-LLM leave a layer without tokens out; SGLang scores it 1 (its
    zero loads give (0 + eps) / (0 + eps))."""
    batch_max = np.array([[4.0, np.nan]])
    batch_mean = np.array([[2.0, np.nan]])
    assert vllm_balancedness(batch_max, batch_mean) == pytest.approx(0.5)
    assert sglang_balancedness(batch_max, batch_mean) == pytest.approx(
        ((2 + 1e-5) / (4 + 1e-5) + 1.0) / 2
    )
    assert trtllm_imbalance(batch_max, batch_mean) == pytest.approx(1.0)


def test_evaluation_metrics_follow_their_definitions():
    """The flat metrics are the documented reductions of the per-batch arrays."""
    topo = cluster((2,))
    pl = placement([[0, 1, 2, 3], [0, 2, 1, 3]], 2)
    routing = random_routing(64, batch=16, seed=2)
    ev = evaluate(pl, routing, topo, tiny_model(), EvalParams())
    m = ev.metrics
    ratio = ev.gpu_load.max(axis=1) / ev.gpu_load.mean(axis=1)
    assert m["hot_shard_ratio_median"] == pytest.approx(np.median(ratio))
    assert m["hot_shard_ratio_worst"] == pytest.approx(ratio.max())
    assert m["batch_hot_shard_p99"] == pytest.approx(np.percentile(ev.batch_hot_shard, 99))
    assert m["moe_layer_p50_us"] == pytest.approx(np.percentile(ev.layer_time_us, 50))
    assert m["p99_over_p50"] == pytest.approx(m["moe_layer_p99_us"] / m["moe_layer_p50_us"])
    steps = ev.layer_time_us.sum(axis=1)
    assert m["step_p99_us"] == pytest.approx(np.percentile(steps, 99))
    # expert memory: S slots x expert bytes x MoE layers
    model = tiny_model()
    assert m["expert_memory_gb"] == pytest.approx(2 * model.expert_bytes("bf16") * 2 / 1e9)
    assert m["num_batches"] == 4 and m["num_layers"] == 2


def test_comm_time_formula_by_hand():
    """GPU 0 sends 3 copies of 100 bytes to GPU 1 (same node, 40 GB/s pair, 100 GB/s port)
    and 1 copy to GPU 2 (other node, 10 GB/s NIC)."""
    topo = cluster((2, 2), pair_gbps=40.0)
    fabric = Fabric.from_topology(topo)
    copies = np.zeros((1, 4, 4), dtype=np.int64)
    copies[0, 0, 1] = 3
    copies[0, 0, 2] = 1
    t = comm_time_us(copies, 100.0, fabric)[0]
    # GPU 0: pair 300 B / 40 GB/s = 7.5 ns; NIC 100 B / 10 GB/s = 10 ns; latency max(1, 3)
    assert t[0] == pytest.approx(10.0 / 1e3 + 3.0)
    assert t[1] == pytest.approx(7.5 / 1e3 + 1.0)
    assert t[2] == pytest.approx(10.0 / 1e3 + 3.0)
    assert t[3] == 0.0


def test_compute_time_formula_by_hand():
    """One slot with 10 tokens: max(weights / HBM, 6 h f n / flops)."""
    slot_load = np.array([[10, 0, 1_000_000, 0]])
    # weights 1e6 B at 1000 GB/s; 6e6 flops a token at 100 TFLOPS
    t = compute_time_us(slot_load, 2, weight_us=np.array([1.0, 1.0]),
                        token_us=np.array([0.06, 0.06]))
    # GPU 0: max(1e6 / 1e12 s, 6e7 / 1e14 s) = 1 us; GPU 1: max(1 us, 6e12/1e14 s = 60000 us)
    assert t[0].tolist() == pytest.approx([1.0, 60000.0])


def test_window_ranges():
    assert parse_window_range("2:5") == (2, 5)
    assert parse_window_range("4:") == (4, None)
    with pytest.raises(UsageError) as e:
        parse_window_range("5", option="--eval")
    assert e.value.where == "--eval"
    assert default_split(8) == ((0, 6), (6, 8))
    assert default_split(2) == ((0, 1), (1, 2))
    assert default_split(1) is None
    assert evaluation_parts(1) == [("all", (0, 1))]
    assert evaluation_parts(8, fit=(0, 4)) == [("fit", (0, 4)), ("held-out", (4, 8))]
    assert evaluation_parts(8, held_out=(None, 3)) == [("held-out", (0, 3))]
    with pytest.raises(UsageError, match="window range 3:9 is outside the trace's 8 windows"):
        evaluation_parts(8, fit=(3, 9))


def test_token_windows_by_step_and_by_order():
    routing = random_routing(40, batch=8, seed=0)
    ids, trace = routing.trace.topk_ids, routing.trace
    split = routing_of(ids, trace.layer_ids, trace.step, trace.rank, 4, windows=2)
    # steps 0-2 and 3-4
    assert token_windows(split.trace, split.stats).tolist() == [0] * 24 + [1] * 16
    shuffled = split.trace.take(np.r_[np.arange(24, 40), np.arange(24)])
    assert token_windows(shuffled, split.stats).tolist() == [1] * 16 + [0] * 24


def test_held_out_evaluation_uses_only_its_windows():
    routing = random_routing(40, batch=8, seed=0)
    trace = routing.trace
    split = routing_of(trace.topk_ids, trace.layer_ids, trace.step, trace.rank, 4, windows=5)
    pl = placement([[0, 1, 2, 3], [0, 2, 1, 3]], 2)
    ev = evaluate(pl, split, cluster((2,)), tiny_model(), EvalParams(windows=(3, 5)))
    assert ev.windows == (3, 5) and ev.metrics["num_tokens"] == 16
    alone = routing_of(trace.topk_ids[24:], trace.layer_ids, trace.step[24:], trace.rank[24:], 4)
    ref = evaluate(pl, alone, cluster((2,)), tiny_model(), EvalParams())
    np.testing.assert_array_equal(ev.gpu_load, ref.gpu_load)


def test_window_hot_shard_is_the_even_split_maximum():
    stats = routing_of(np.array([[[0, 1]], [[0, 2]], [[0, 3]], [[1, 2]]], dtype=np.int32),
                       np.array([0]), np.array([0, 0, 1, 1]), -np.ones(4, np.int64), 4,
                       windows=2).stats
    # expert 0 on both GPUs; GPU 0 holds {0, 1, 2}, GPU 1 holds {0, 3, ...}
    pl = placement([[0, 1, 2, 0, 3, 1]], 2, layer_ids=(0,))
    hot = window_hot_shard(pl, stats)
    # window 0: loads e0=2, e1=1, e2=1 -> GPU0 = 1 + 0.5 + 1 = 2.5, GPU1 = 1 + 0 + 0.5 = 1.5
    # window 1: e0=1, e1=1, e2=1, e3=1 -> GPU0 = 0.5 + 0.5 + 1 = 2, GPU1 = 0.5 + 1 + 0.5 = 2
    assert hot.tolist() == [[2.5], [2.0]]
    ev = evaluate(pl, routing_of(np.array([[[0, 1]], [[0, 2]], [[0, 3]], [[1, 2]]],
                                          dtype=np.int32), np.array([0]), np.array([0, 0, 1, 1]),
                                 -np.ones(4, np.int64), 4, windows=2),
                  cluster((2,)), tiny_model(layers=(0,)), EvalParams())
    assert ev.per_layer["window_hot_shard_max"].tolist() == [2.5]


def test_expected_remote_copies_matches_enumeration_for_top2():
    """Exact for top-2: enumerate every source GPU and replica choice of every token."""
    topo = cluster((2, 2))
    pl = placement([[0, 1, 2, 3, 0, 2, 1, 3]], 4, layer_ids=(0,))
    routing = random_routing(30, layer_ids=(0,), seed=7, holes=False)
    expected = expected_remote_copies(pl, routing.stats, topo)
    node = topo.node_of_gpu
    replicas = {e: [s // 2 for s in range(8) if pl.physical_to_logical[0, s] == e]
                for e in range(4)}
    gpu_total = node_total = 0.0
    for t in range(30):
        a, b = (int(x) for x in routing.trace.topk_ids[t, 0])
        for src in range(4):
            for ga, gb in itertools.product(replicas[a], replicas[b]):
                weight = 1 / (4 * len(replicas[a]) * len(replicas[b]))
                gpu_total += weight * len({ga, gb} - {src})
                node_total += weight * len({node[ga], node[gb]} - {node[src]})
    assert expected[0].tolist() == pytest.approx([gpu_total / 30, node_total / 30])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_remote_copy_bounds_bracket_the_exact_figure_for_top4(seed):
    """Top-4 of 8 experts, clustered tokens; enumerate every source GPU and replica choice:
    the exact remote GPUs and nodes per token lie between the two bounds."""
    rng = np.random.default_rng(seed)
    topo = cluster((2, 2))
    pl = placement([[0, 1, 4, 2, 3, 5, 4, 5, 0, 6, 7, 1]], 4, num_experts=8,
                   layer_ids=(0,))  # 3 slots per GPU, experts 0, 1, 4, 5 twice
    groups = [[0, 1, 2, 3], [4, 5, 6, 7]]
    ids = np.array([rng.choice(groups[rng.integers(2)] if rng.random() < 0.7 else range(8),
                               size=4, replace=False) for _ in range(40)])
    routing = routing_of(ids[:, None, :].astype(np.int32), np.array([0]), np.arange(40),
                         np.full(40, -1), num_experts=8)
    stats = routing.stats
    if seed == 3:  # thresholded counts, as published statistics often are: drop light pairs
        coact = stats.coact.to_dense()
        coact[coact < 4] = 0
        from dataclasses import replace

        stats = replace(stats, coact=coact)
        assert coact.sum() < routing.stats.coact.to_dense().sum()
    bounds = remote_copy_bounds(pl, stats, topo)[0]  # [gpu|node, lower|upper]
    node = topo.node_of_gpu
    replicas = {e: [s // 3 for s in range(12) if pl.physical_to_logical[0, s] == e]
                for e in range(8)}
    gpu_total = node_total = 0.0
    for token in ids.tolist():
        choices = list(itertools.product(*(replicas[e] for e in token)))
        for src in range(4):
            for gpus in choices:
                weight = 1 / (4 * len(choices))
                gpu_total += weight * len(set(gpus) - {src})
                node_total += weight * len({node[g] for g in gpus} - {node[src]})
    exact = np.array([gpu_total, node_total]) / 40
    assert (bounds[:, 0] <= exact + 1e-12).all() and (exact <= bounds[:, 1] + 1e-12).all()
    assert (bounds[:, 0] < bounds[:, 1]).any()  # top-4: triples meet, the bounds differ
    # at least the closed form when the counts are complete (also the likeliest expert)
    if seed != 3:
        assert (bounds[:, 0] >= expected_remote_copies(pl, stats, topo)[0] - 1e-12).all()


def test_expected_remote_copies_needs_coactivation():
    routing = random_routing(10, layer_ids=(0,), holes=False)
    from dataclasses import replace

    stats = replace(routing.stats, coact=None)
    pl = placement([[0, 1, 2, 3]], 2, layer_ids=(0,))
    with pytest.raises(DataError, match="no co-activation counts"):
        expected_remote_copies(pl, stats, cluster((2,)))


def test_group_positions_and_batches():
    assert group_position(np.array([0, 1, 0, 0, 1])).tolist() == [0, 0, 1, 2, 1]
    with pytest.warns(TraceWarning, match="ranks go up to 3 but the topology has 2 GPUs"):
        b = make_batches(6, 2, step=np.array([5, 5, 7, 7, 7, 9]),
                         rank=np.array([1, -1, 0, 0, -1, 3]), default_batch_tokens=4)
    assert b.batch_of_token.tolist() == [0, 0, 1, 1, 1, 2]
    # unknown ranks: position in batch mod 2; rank 3 -> 3 mod 2 with a warning
    assert b.source.tolist() == [1, 1, 0, 0, 0, 1]
    assert b.rank_position.tolist() == [0, 1, 0, 1, 2, 0]


def test_bad_inputs_name_the_problem():
    routing = random_routing(16)
    pl = placement([[0, 1, 2, 3], [0, 2, 1, 3]], 2)
    with pytest.raises(PlacementError, match="the placement is for 2 GPUs, topology toy has 4"):
        evaluate(pl, routing, cluster((2, 2)), tiny_model(), EvalParams())
    with pytest.raises(PlacementError, match="the placement has no layer 1 of the routing data"):
        evaluate(placement([[0, 1, 2, 3]], 2, layer_ids=(0,)), routing, cluster((2,)),
                 tiny_model(), EvalParams())
    with pytest.raises(PlacementError, match="layer 5 of the placement is not a MoE layer of tiny"):
        evaluate(placement([[0, 1, 2, 3], [0, 1, 2, 3]], 2, layer_ids=(0, 5)), routing,
                 cluster((2,)), tiny_model(), EvalParams())
    with pytest.raises(UsageError, match="unknown all-to-all mode 'fast'"):
        EvalParams(mode="fast")
    with pytest.raises(UsageError, match="window range 0:3 is outside"):
        evaluate(pl, routing, cluster((2,)), tiny_model(), EvalParams(windows=(0, 3)))


def test_placement_layers_without_routing_are_skipped_with_a_warning():
    routing = random_routing(16, layer_ids=(0,))
    pl = placement([[0, 1, 2, 3], [0, 2, 1, 3]], 2)
    with pytest.warns(PlacerWarning, match="placement layer 1 has no routing data"):
        ev = evaluate(pl, routing, cluster((2,)), tiny_model(), EvalParams())
    assert ev.layer_ids.tolist() == [0]
    assert ev.per_layer["hot_shard_ratio"].shape == (1,)
