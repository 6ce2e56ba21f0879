"""Engine-exact dispatch and metrics: each rule and figure against numbers worked by hand.

Sources (see docs/evaluate.md, "Engine dispatch" and "Metrics"):

- SGLang static dispatch: ``compute_logical_to_rank_dispatch_physical_map`` and
  ``_find_nearest_expert`` in python/sglang/srt/eplb/expert_location.py;
- SGLang balancedness: ``compute_utilization_rate`` in sglang/srt/eplb/expert_distribution.py;
- TensorRT-LLM imbalance: examples/wide_ep/ep_load_balancer/report_load_statistics.py;
- vLLM balancedness: ``_compute_eplb_load_stats`` in vllm/distributed/eplb/eplb_state.py.
"""

from __future__ import annotations

import json
import random
import warnings

import numpy as np
import pytest
from evaluate_fixtures import cluster, placement, routing_of, tiny_model

from placer.errors import PlacerWarning
from placer.evaluate import EvalParams, evaluate, static_dispatch_table
from placer.evaluate.dispatch import round_robin_order_bias
from placer.model import ModelSpec
from placer.placement import Placement

# -- SGLang's static dispatch ------------------------------------------------------------

# 2 nodes x 2 GPUs, 2 slots per GPU (node 0: GPUs 0, 1; node 1: GPUs 2, 3):
#   GPU 0: slots 0, 1 = experts 0, 1      GPU 2: slots 4, 5 = experts 3, 1
#   GPU 1: slots 2, 3 = experts 2, 0      GPU 3: slots 6, 7 = experts 2, 1
SGL_ROW = [0, 1, 2, 0, 3, 1, 2, 1]


def test_sglang_table_by_hand():
    """Expert 1 (slots 1, 5, 7): ranks 0, 2, 3 hold a replica and use it; rank 1 has none,
    but its node holds slot 1 and not every replica: it uses slot 1 (``local_first``
    would draw among all three).  Expert 2 (slots 2, 6): rank 0 takes slot 2 on its
    node, rank 2 slot 6.  Expert 3 has one replica: everyone uses slot 4.  Expert 0
    (slots 0, 3, both on node 0): ranks 2 and 3 have nothing on their node and fall to
    the fair draw; each replays SGLang's ``random.Random(42)`` stream, and this is the
    first entry either draws for: two ranks over two replicas is one of each, then a
    shuffle of ``[0, 3]``, one ``_randbelow(2)`` call, which is 0 for seed 42, so the
    two swap: rank 2 gets slot 3, rank 3 slot 0."""
    pl = placement([SGL_ROW], 4, layer_ids=(0,))
    table = static_dispatch_table(pl, policy="sglang", node_of_gpu=np.array([0, 0, 1, 1]))
    assert random.Random(42)._randbelow(2) == 0  # the shuffle's only draw
    assert table[0, :, 0].tolist() == [0, 3, 3, 0]
    assert table[0, :, 1].tolist() == [1, 1, 5, 7]
    assert table[0, :, 2].tolist() == [2, 2, 6, 6]
    assert table[0, :, 3].tolist() == [4, 4, 4, 4]
    # the earlier rule draws for rank 1 among all of expert 1's replicas
    old = static_dispatch_table(pl, seed=0)
    assert old[0, [0, 2, 3], 1].tolist() == [1, 5, 7]


def test_sglang_skips_the_node_step_when_every_replica_is_on_the_node():
    """SGLang prefers the node only when that narrows the candidates: on one node, a
    rank without its own replica draws among all of them (``local_first`` behaviour)."""
    pl = placement([SGL_ROW], 4, layer_ids=(0,))
    table = static_dispatch_table(pl, policy="sglang", node_of_gpu=np.zeros(4, np.int64))
    # expert 1: rank 1 holds no replica and every replica is on its node: a draw
    assert table[0, 1, 1] in (1, 5, 7)
    # expert 2 (slots 2, 6): ranks 0 and 2 have no own replica: one draw each
    assert table[0, 0, 2] in (2, 6) and table[0, 2, 2] in (2, 6)
    assert table[0, 1, 2] == 2 and table[0, 3, 2] == 6


def _sglang_reference(p2l_by_layer: dict[int, list[int]], num_layers: int, num_experts: int,
                      num_slots: int, num_gpus: int, gpus_per_node: int) -> np.ndarray:
    """SGLang's procedure as plain loops, one process per rank: narrow each (layer,
    expert) to the rank's nearest replica, then build the whole table with a fresh
    ``random.Random(42)`` and keep the rank's row.  Layers without a row are trivial."""
    per_gpu = num_slots // num_gpus
    per_node = per_gpu * gpus_per_node
    rows = [p2l_by_layer.get(i, [s % num_experts for s in range(num_slots)])
            for i in range(num_layers)]

    def nearest(cands: list[int], rank: int) -> int:
        if len(cands) == 1:
            return cands[0]
        mine = [c for c in cands if c // per_gpu == rank]
        if mine:
            return mine[0]
        node = [c for c in cands if c // per_node == rank // gpus_per_node]
        if 0 < len(node) < len(cands):
            return node[0]
        return -1

    out = np.full((num_layers, num_gpus, num_experts), -1)
    for me in range(num_gpus):
        lists = [[[s for s in range(num_slots) if rows[i][s] == e] for e in range(num_experts)]
                 for i in range(num_layers)]
        for i in range(num_layers):
            for e in range(num_experts):
                near = nearest(lists[i][e], me)
                if near >= 0:
                    lists[i][e] = [near]
        rnd = random.Random(42)
        for i in range(num_layers):
            for e in range(num_experts):
                cands = lists[i][e]
                picked = [nearest(cands, r) for r in range(num_gpus)]
                left = [r for r in range(num_gpus) if picked[r] < 0]
                if left:
                    q, extra = divmod(len(left), len(cands))
                    shares = cands * q + rnd.sample(cands, extra)
                    rnd.shuffle(shares)
                    for r, s in zip(left, shares, strict=True):
                        picked[r] = s
                out[i, me, e] = picked[me]
    return out


def test_sglang_table_equals_sglang_procedure_replayed_per_rank():
    """Random 3-layer placements on 3 nodes x 2 GPUs, with a dense layer (trivial row)
    before them: the vectorised table equals the plain per-rank replay, draws included."""
    rng = np.random.default_rng(7)
    num_gpus, per_gpu, num_experts = 6, 3, 12
    num_slots = num_gpus * per_gpu
    rows = {}
    for layer in (1, 2, 4):
        while True:
            row = np.concatenate([np.arange(num_experts),
                                  rng.choice(num_experts, num_slots - num_experts)])
            rng.shuffle(row)
            by_gpu = row.reshape(num_gpus, per_gpu)
            if all(len(set(g.tolist())) == per_gpu for g in by_gpu):
                break
        rows[layer] = row.tolist()
    layer_ids = (1, 2, 4)
    pl = Placement(np.array([rows[i] for i in layer_ids]), np.array(layer_ids),
                   num_experts, num_gpus)
    table = static_dispatch_table(pl, policy="sglang",
                                  node_of_gpu=np.repeat(np.arange(3), 2))
    ref = _sglang_reference(rows, 5, num_experts, num_slots, num_gpus, 2)
    for row, layer in enumerate(layer_ids):
        np.testing.assert_array_equal(table[row], ref[layer], err_msg=f"layer {layer}")


def test_sglang_policy_keeps_copies_on_the_node():
    """Expert 0 has one replica per node (GPU 0 and GPU 2).  Every token, from every
    rank, picks expert 0 only (top-1).  With SGLang's node step no copy leaves its node;
    ``local_first`` sends half of the ranks without a replica to the other node."""
    topo = cluster((2, 2))
    model = tiny_model(top_k=1, layers=(0,))
    pl = placement([[0, 1, 2, 3, 0, 1, 2, 3]], 4, layer_ids=(0,))
    num_tokens = 64
    ids = np.zeros((num_tokens, 1, 1), dtype=np.int32)
    rank = np.arange(num_tokens, dtype=np.int64) % 4
    routing = routing_of(ids, np.array([0]), np.arange(num_tokens) // 16, rank, 4)
    sgl = evaluate(pl, routing, topo, model, EvalParams(policy="sglang"))
    assert sgl.metrics["remote_copies_per_token_node"] == 0.0
    assert sgl.gpu_load[0].tolist() == [32.0, 0.0, 32.0, 0.0]
    # local_first: ranks 1 and 3 share the two replicas, one each, blind to nodes: both
    # stay home or both cross (a quarter of the tokens each), by the seed's draw
    crossing = [evaluate(pl, routing, topo, model, EvalParams(policy="local_first", seed=s))
                .metrics["remote_copies_per_token_node"] for s in range(12)]
    assert set(crossing) == {0.0, 0.5}


def test_sglang_table_is_built_on_the_whole_placement():
    """SGLang builds its table over every layer, so a layer's draws depend on the layers
    before it: evaluating some layers uses those rows of the whole placement's table,
    not a table built on the evaluated rows alone."""
    from placer.evaluate.core import _static_table

    rows = [[0, 1, 2, 3, 0, 1, 2, 3], [0, 1, 2, 3, 0, 1, 2, 3]]
    pl = placement(rows, 4, layer_ids=(0, 1))
    topo = cluster((4,))  # one node: every rank without a replica draws
    full = static_dispatch_table(pl, policy="sglang", node_of_gpu=topo.node_of_gpu)
    second = Placement(pl.physical_to_logical[1:], pl.layer_ids[1:], 4, 4)
    used = _static_table(pl, second, topo, EvalParams(policy="sglang"))
    np.testing.assert_array_equal(used, full[1:])
    alone = static_dispatch_table(second, policy="sglang", node_of_gpu=topo.node_of_gpu)
    # alone, layer 1 follows layer 0's trivial row [0, 1, 2, 3, 0, 1, 2, 3]: the same
    # candidates, so the same draws; with a different layer 0 the streams part
    np.testing.assert_array_equal(alone[0], full[1])
    # expert 0 on 3 GPUs: rank 3 draws among 3, ranks 0 and 1 draw once, rank 2 twice
    other = placement([[0, 1, 0, 2, 0, 3, 1, 2], rows[1]], 4, layer_ids=(0, 1))
    shifted = static_dispatch_table(other, policy="sglang", node_of_gpu=topo.node_of_gpu)
    assert not np.array_equal(shifted[1], full[1])


# -- round robin and the order of top-k lists -------------------------------------------


def _pairs(num_tokens: int, rng: np.random.Generator, *, shuffle: bool) -> np.ndarray:
    """``[tokens, 1, 2]`` uniform pairs of distinct experts out of 8, listed by expert id
    (as a trace sorted by id would be) or in random order."""
    ids = np.argsort(rng.random((num_tokens, 8)), axis=1)[:, :2]
    ids = np.sort(ids, axis=1)
    if shuffle:
        flip = rng.random(num_tokens) < 0.5
        ids[flip] = ids[flip, ::-1]
    return ids[:, None, :].astype(np.int32)


# every expert twice: replica 0 of experts 0-3 on GPU 0, of 4-7 on GPU 1; replica 1 of
# experts 0-3 on GPU 2, of 4-7 on GPU 3
EPLB_LIKE = [[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7]]


def test_round_robin_warns_when_sorted_top_k_lists_pick_the_replica():
    """top_k = 2 and 2 replicas: round robin's replica is ``(2 j + k) mod 2 = k``, the k
    position alone.  With pairs sorted by id the smaller expert is always at k = 0: a
    pair's smaller id is in 0-3 with probability 1 - C(4,2)/C(8,2) = 22/28, so GPU 0
    (replica 0 of experts 0-3) serves 22/28 of the tokens against a mean of 2/4: hot
    shard 1.571.  A shuffled order splits every expert evenly (about 1.0, no warning)."""
    topo = cluster((4,))
    model = tiny_model(num_experts=8, top_k=2, layers=(0,))
    pl = placement(EPLB_LIKE, 4, num_experts=8, layer_ids=(0,))
    rng = np.random.default_rng(3)
    n = 8192
    step = np.arange(n) // 512
    rank = np.full(n, -1, dtype=np.int64)
    sorted_routing = routing_of(_pairs(n, rng, shuffle=False), np.array([0]), step, rank, 8)
    with pytest.warns(PlacerWarning, match="round_robin results depend on the order") as rec:
        ev = evaluate(pl, sorted_routing, topo, model, EvalParams())
    text = str(rec[0].message)
    assert "`policy` random" in text and "shuffle" in text and "top_k=2" in text
    assert ev.metrics["hot_shard_ratio_median"] == pytest.approx(22 / 28 / 0.5, rel=0.03)
    shuffled = routing_of(_pairs(n, rng, shuffle=True), np.array([0]), step, rank, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlacerWarning)
        even = evaluate(pl, shuffled, topo, model, EvalParams())
    assert even.metrics["hot_shard_ratio_median"] < 1.05
    # the order-free policy agrees with the shuffled trace, not with the sorted one
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlacerWarning)
        rnd = evaluate(pl, sorted_routing, topo, model, EvalParams(policy="random"))
    assert rnd.metrics["hot_shard_ratio_median"] < 1.05


def test_order_bias_ignores_replica_counts_prime_to_top_k():
    """3 replicas and top_k = 2: ``(2 j + k) mod 3`` cycles with the rank position, so
    even a fully sorted list spreads evenly: nothing to flag."""
    kpos = np.zeros((1, 2, 2), dtype=np.int64)
    kpos[0, 0] = [1000, 0]  # expert 0 always first
    p2l = np.array([[0, 1, 0, 1, 0, 1]])  # expert 0: 3 replicas
    slot = np.array([[334.0, 0, 333, 0, 333, 0]])
    assert round_robin_order_bias(kpos, slot, p2l, 3, np.array([0])) is None


def test_order_bias_needs_more_than_chance():
    """Class counts 520 / 480 out of 1000 (2 replicas): 1.04x an even share and 1.3
    standard deviations, what a shuffled list gives by chance: not flagged."""
    kpos = np.array([[[520, 480], [500, 500]]], dtype=np.int64)
    p2l = np.array([[0, 1, 0, 1]])
    slot = np.array([[520.0, 500, 480, 500]])
    assert round_robin_order_bias(kpos, slot, p2l, 2, np.array([0])) is None


# -- engine metrics by hand ---------------------------------------------------------------


def _one_layer_trace(ids: list[list[int]], steps: list[int]) -> object:
    arr = np.array(ids, dtype=np.int32)[:, None, :]
    n = arr.shape[0]
    return routing_of(arr, np.array([0]), np.array(steps, dtype=np.int64),
                      np.full(n, -1, dtype=np.int64), 4)


def test_trtllm_imbalance_splits_each_expert_evenly_over_its_replicas():
    """2 GPUs x 3 slots: GPU 0 = experts 0, 1, 2; GPU 1 = experts 0, 3, 1.  Top-1.

    Batch 0: tokens pick experts 0, 0, 0, 2.  TensorRT-LLM's projection splits expert 0's
    3 tokens over its 2 replicas: GPU 0 = 1.5 + 1 (expert 2) = 2.5, GPU 1 = 1.5; mean 2,
    imbalance 2.5 / 2 - 1 = 0.25.  (Round robin actually sends tokens 0 and 1 to GPU 0,
    each being first on its rank, token 2 to GPU 1: GPU 0 serves 3 and GPU 1 one, a
    served imbalance of 0.5, which is what placer reported before.)
    Batch 1: experts 3, 3: GPU 1 = 2, GPU 0 = 0; imbalance 2 / 1 - 1 = 1.
    One layer: mean over the two iterations = 0.625."""
    topo = cluster((2,))
    model = tiny_model(top_k=1, layers=(0,))
    pl = placement([[0, 1, 2, 0, 3, 1]], 2, layer_ids=(0,))
    routing = _one_layer_trace([[0], [0], [0], [2], [3], [3]], [0, 0, 0, 0, 1, 1])
    ev = evaluate(pl, routing, topo, model, EvalParams())
    assert ev.metrics["trtllm_imbalance"] == pytest.approx(0.625)
    assert ev.per_layer["trtllm_imbalance"].tolist() == pytest.approx([0.625])
    # the served loads of batch 0 are [3, 1]: the hot shard keeps using them
    assert ev.batch_hot_shard[0, 0] == pytest.approx(1.5)


def test_trtllm_imbalance_averages_iterations_then_layers():
    """Two layers; layer 1 has no token in batch 1 (left out).  Linear placement, top-1,
    2 GPUs x 2 slots (GPU 0: experts 0, 1; GPU 1: experts 2, 3).
    Layer 0: batch 0 experts 0, 0 -> loads [2, 0], imbalance 1; batch 1 experts 0, 2 ->
    [1, 1], 0; mean 0.5.  Layer 1: batch 0 experts 0, 1 -> [2, 0], 1; mean 1.
    TensorRT-LLM: (0.5 + 1) / 2 = 0.75 (a flat mean over the three cells would be 2/3)."""
    topo = cluster((2,))
    model = tiny_model(top_k=1)
    pl = placement([[0, 1, 2, 3], [0, 1, 2, 3]], 2)
    ids = np.array([[[0], [0]], [[0], [1]], [[0], [-1]], [[2], [-1]]], dtype=np.int32)
    routing = routing_of(ids, np.array([0, 1]), np.array([0, 0, 1, 1]),
                         np.full(4, -1, dtype=np.int64), 4)
    ev = evaluate(pl, routing, topo, model, EvalParams())
    assert ev.metrics["trtllm_imbalance"] == pytest.approx(0.75)


def test_sglang_balancedness_counts_dense_layers_as_one():
    """A 4-layer model whose MoE layers are 1 and 3 (0 and 2 dense).  One batch, top-1,
    2 GPUs x 2 slots, linear (GPU 0: experts 0, 1).  Layer 1: experts 0, 0, 1, 2 ->
    GPU loads [3, 1], rate (2 + eps) / (3 + eps); layer 3: experts 0, 2, 2, 3 -> [1, 3],
    the same.  SGLang averages over all 4 hidden layers: (2 x 2/3 + 1 + 1) / 4 = 0.8333,
    where the MoE layers alone give 0.6667.  vLLM sums over the MoE layers:
    (2 + 2) / (3 + 3) = 0.6667."""
    model = ModelSpec(
        name="tiny4", num_hidden_layers=4, moe_layer_ids=(1, 3), num_experts=4, top_k=1,
        num_groups=1, top_groups=1, num_shared_experts=0, hidden_size=64,
        moe_intermediate_size=32, non_expert_params=1_000_000, default_dtype="bf16",
    )
    pl = placement([[0, 1, 2, 3], [0, 1, 2, 3]], 2, layer_ids=(1, 3))
    ids = np.array([[[0], [0]], [[0], [2]], [[1], [2]], [[2], [3]]], dtype=np.int32)
    routing = routing_of(ids, np.array([1, 3]), np.zeros(4, dtype=np.int64),
                         np.full(4, -1, dtype=np.int64), 4)
    ev = evaluate(pl, routing, cluster((2,)), model, EvalParams())
    eps = 1e-5
    rate = (2 + eps) / (3 + eps)
    assert ev.metrics["sglang_balancedness"] == pytest.approx((2 * rate + 2) / 4)
    assert ev.metrics["vllm_balancedness"] == pytest.approx(4 / 6)


def test_vllm_balancedness_sums_over_layers_before_dividing():
    """vLLM: per pass, sum over layers of the mean rank load over the sum over layers of
    the max (``_compute_eplb_load_stats``), then placer averages the passes.
    Linear placement, top-1, 2 GPUs (GPU 0: experts 0, 1; GPU 1: experts 2, 3).
    Batch 0: layer 0 experts 0, 0, 0, 2 -> [3, 1]; layer 1 experts 2, 3, 0, 1 -> [2, 2];
    (2 + 2) / (3 + 2) = 0.8.  Batch 1: layer 0 experts 0, 1 -> [2, 0]; layer 1 experts
    2, 2 -> [0, 2]: (1 + 1) / (2 + 2) = 0.5.  Mean 0.65 (a per-layer mean of ratios
    would give 0.6875 and 0.5)."""
    topo = cluster((2,))
    model = tiny_model(top_k=1)
    pl = placement([[0, 1, 2, 3], [0, 1, 2, 3]], 2)
    ids = np.array([[[0], [2]], [[0], [3]], [[0], [0]], [[2], [1]],
                    [[0], [2]], [[1], [2]]], dtype=np.int32)
    routing = routing_of(ids, np.array([0, 1]), np.array([0, 0, 0, 0, 1, 1]),
                         np.full(6, -1, dtype=np.int64), 4)
    ev = evaluate(pl, routing, topo, model, EvalParams())
    assert ev.metrics["vllm_balancedness"] == pytest.approx((0.8 + 0.5) / 2)


def test_sglang_table_above_the_draw_budget_keeps_the_rule(monkeypatch):
    """Past ``SGLANG_EXACT_DRAW_BUDGET`` the fair draws come from the same distribution
    (each rank uniform over the replicas) instead of SGLang's streams: the own-GPU and
    node steps are unchanged and every drawn slot holds the expert."""
    import placer.evaluate.dispatch as dispatch

    monkeypatch.setattr(dispatch, "SGLANG_EXACT_DRAW_BUDGET", 0)
    dispatch._SGLANG_TABLES.clear()
    pl = placement([SGL_ROW], 4, layer_ids=(0,))
    table = static_dispatch_table(pl, policy="sglang", node_of_gpu=np.array([0, 0, 1, 1]))
    dispatch._SGLANG_TABLES.clear()
    assert table[0, :, 1].tolist() == [1, 1, 5, 7]
    assert table[0, :, 2].tolist() == [2, 2, 6, 6]
    assert table[0, 0, 0] == 0 and table[0, 1, 0] == 3
    assert set(table[0, 2:, 0].tolist()) <= {0, 3}


def test_cli_lists_and_runs_the_sglang_policy(tmp_path):
    """``placer evaluate --dispatch sglang``: Mixtral on 2 nodes x 8 GPUs, every token picks
    experts 0 and 1.  Expert 0 is on GPUs 0-8 (GPU 8 is on node 1), expert 1 on GPUs 0,
    7 and 14.  With SGLang's node step every rank finds both on its own node: no copy
    crosses nodes.  ``local_first`` draws node 1's ranks among all of expert 0's
    replicas, mostly on node 0."""
    from typer.testing import CliRunner

    from placer.cli.main import app
    from placer.placement.document import write_placement

    runner = CliRunner()
    help_text = runner.invoke(app, ["evaluate", "--help"]).stdout
    assert "sglang" in help_text and "local_first" in help_text
    n = 512
    ids = np.zeros((n, 32, 2), dtype=np.int32)
    ids[:, :, 1] = 1
    trace = tmp_path / "trace.npz"
    np.savez(trace, topk_ids=ids, step=np.arange(n) // 64, rank=np.arange(n) % 16,
             layer_ids=np.arange(32), num_experts=8, top_k=2)
    row = []
    for g in range(16):
        row += [0, 1 + g % 7] if g < 9 else [1 + g % 7, 2 + g % 6]
    pl = tmp_path / "p.json"
    write_placement(pl, Placement(np.tile(row, (32, 1)), np.arange(32), 8, 16),
                    model_name="mixtral-8x7b")
    node_copies = {}
    for policy in ("sglang", "local_first"):
        result = runner.invoke(app, ["evaluate", str(trace), "-p", str(pl), "-t",
                                     "2x-dgx-h100", "--dispatch", policy, "--eval", "0:",
                                     "--json"])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        assert doc["regime"]["policy"] == policy
        metrics = doc["parts"][0]["placements"][0]["metrics"]
        node_copies[policy] = metrics["remote_copies_per_token_node"]
    assert node_copies["sglang"] == 0.0
    assert node_copies["local_first"] > 0.3


def test_static_table_input_errors_name_the_problem():
    from placer.errors import PlacementError, UsageError

    pl = placement([SGL_ROW], 4, layer_ids=(0,))
    with pytest.raises(UsageError) as info:
        static_dispatch_table(pl, policy="round_robin")
    assert info.value.where == "policy" and "sglang" in info.value.hint
    with pytest.raises(PlacementError) as info:
        static_dispatch_table(pl, policy="sglang", node_of_gpu=np.zeros(8, np.int64))
    assert "4 GPUs" in str(info.value) and info.value.hint


def test_cli_says_the_order_warning_once_for_all_columns_and_parts(tmp_path):
    """Mixtral (top-2) with every expert twice on 8 GPUs and pairs sorted by expert id:
    every (placement, part) evaluation finds the bias; ``placer evaluate`` prints one
    warning naming each of them."""
    from typer.testing import CliRunner

    from placer.cli.main import app
    from placer.placement.document import write_placement

    rng = np.random.default_rng(0)
    n = 1024
    ids = np.sort(np.argsort(rng.random((n, 32, 8)), axis=2)[:, :, :2], axis=2)
    trace = tmp_path / "sorted.npz"
    np.savez(trace, topk_ids=ids.astype(np.int32), step=np.arange(n) // 128,
             rank=np.full(n, -1), layer_ids=np.arange(32), num_experts=8, top_k=2)
    row = [0, 4, 1, 5, 2, 6, 3, 7, 4, 0, 5, 1, 6, 2, 7, 3]  # GPU g: experts g, g + 4 mod 8
    paths = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.json"
        write_placement(path, Placement(np.tile(row, (32, 1)), np.arange(32), 8, 8),
                        model_name="mixtral-8x7b")
        paths += ["-p", str(path)]
    result = CliRunner().invoke(app, ["evaluate", str(trace), *paths, "-t", "dgx-h100",
                                      "--dispatch", "round_robin"])
    assert result.exit_code == 0, result.output
    lines = [x for x in result.stderr.splitlines() if "round_robin results depend" in x]
    assert len(lines) == 1
    for label in ("a on fit", "b on fit", "a on held-out", "b on held-out"):
        assert label in lines[0]
