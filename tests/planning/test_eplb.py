"""DeepSeek EPLB: the published example, golden data from the reference, a loop
re-implementation of the reference, the steps against brute force, the solvers."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placer.errors import UsageError
from placer.placement import Placement, gpu_loads
from placer.planning.solvers import solve
from placer.planning.solvers.baselines import linear_layout
from placer.planning.solvers.eplb import (
    balanced_packing,
    eplb_placement,
    eplb_valid_placement,
    rebalance_experts,
    replicate_experts,
    replicate_experts_capped,
)
from placer.problem import PlacementProblem
from placer.stats import ExpertStats

# The worked example of the deepseek-ai/EPLB README (MIT): 2 layers x 12 experts,
# 16 physical experts, 4 groups, 2 nodes, 8 GPUs.  Published figures, copied.
EXAMPLE_WEIGHT = np.array(
    [
        [90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
        [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27],
    ]
)
EXAMPLE_PHY2LOG = [
    [5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
    [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1],
]
EXAMPLE_LOGCNT = [
    [1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1],
    [1, 2, 1, 1, 1, 2, 2, 1, 2, 1, 1, 1],
]


def _stats(load: np.ndarray, layer_ids=None) -> ExpertStats:
    """Statistics of one window holding ``load`` ``[layers, experts]``."""
    load = np.asarray(load, dtype=np.int64)
    return ExpertStats(
        load=load[None],
        tokens=np.array([int(load.sum())]),
        layer_ids=np.arange(load.shape[0]) if layer_ids is None else np.asarray(layer_ids),
        top_k=1,
    )


# -- the published example ------------------------------------------------------------


def test_published_example_phy2log_and_logcnt():
    phy2log, log2phy, logcnt = rebalance_experts(EXAMPLE_WEIGHT, 16, 4, 2, 8)
    assert phy2log.tolist() == EXAMPLE_PHY2LOG
    assert logcnt.tolist() == EXAMPLE_LOGCNT
    assert log2phy.shape == (2, 12, 2)


def test_module_doctest_runs_the_published_example():
    import doctest

    import placer.planning.solvers.eplb.reference as module

    result = doctest.testmod(module)
    assert result.attempted >= 3 and result.failed == 0


def test_published_example_hottest_gpu_loads():
    phy2log, _, _ = rebalance_experts(EXAMPLE_WEIGHT, 16, 4, 2, 8)
    placement = Placement(phy2log, np.array([0, 1]), num_experts=12, num_gpus=8)
    hottest = gpu_loads(placement, EXAMPLE_WEIGHT).max(axis=1)
    assert hottest.tolist() == [156.0, 179.5]


def test_log2phy_lists_each_experts_slots_by_replica_rank():
    phy2log, log2phy, logcnt = rebalance_experts(EXAMPLE_WEIGHT, 16, 4, 2, 8)
    for layer in range(2):
        for expert in range(12):
            slots = log2phy[layer, expert]
            valid = slots[slots >= 0]
            assert len(valid) == logcnt[layer, expert]
            assert (phy2log[layer, valid] == expert).all()
            assert (slots[len(valid):] == -1).all()
    # expert 5 of layer 0: the original replica (rank 0) is in slot 0, the copy in slot 2
    assert log2phy[0, 5].tolist() == [0, 2]


def test_eplb_solver_reproduces_the_published_example():
    problem = PlacementProblem(
        stats=_stats(EXAMPLE_WEIGHT),
        num_gpus=8,
        slots_per_gpu=2,
        node_of_gpu=np.repeat([0, 1], 4),
        num_groups=4,
    )
    result = solve(problem, "eplb")
    assert result.placement.physical_to_logical.tolist() == EXAMPLE_PHY2LOG
    assert result.status == "HEURISTIC"
    assert result.objective == 179.5
    assert result.details["hottest_gpu_load"].tolist() == [156.0, 179.5]
    assert result.details["policy"] == "hierarchical"
    assert result.details["duplicate_gpus"] == 0


def test_global_policy_is_hierarchical_with_one_node_and_one_group():
    """4 groups do not split over 3 nodes: EPLB ignores nodes and groups."""
    phy2log, _, logcnt = rebalance_experts(EXAMPLE_WEIGHT, 18, 4, 3, 6)
    expected, _, expected_cnt = rebalance_experts(EXAMPLE_WEIGHT, 18, 1, 1, 6)
    assert phy2log.tolist() == expected.tolist()
    assert logcnt.tolist() == expected_cnt.tolist()


def test_global_policy_on_one_node_keeps_replicas_apart_in_eplb_valid():
    """Layer 0 of the example on 4 GPUs, global policy (figures derived by hand).

    Replicas go to experts 10, 5, 1, 4 (183, 165, 132, 104).  Packing replica loads
    91.5, 91.5, 90, 86, 82.5, 82.5, 73, 66, 66, ... the reference puts both replicas
    of expert 1 (66 each) on GPU 1, and so does the ``eplb`` solver; ``eplb-valid``
    sends the second to the lightest GPU without expert 1 instead, and otherwise packs
    identically.
    """
    weight = EXAMPLE_WEIGHT[:1]
    reference, _, logcnt = rebalance_experts(weight, 16, 1, 1, 4)
    assert logcnt.tolist() == [[1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1]]
    assert reference.tolist() == [[10, 8, 3, 7, 10, 1, 1, 4, 0, 5, 4, 2, 11, 5, 9, 6]]
    placement, report = eplb_placement(weight, np.array([0]), num_gpus=4, slots_per_gpu=4)
    assert placement.physical_to_logical.tolist() == reference.tolist()
    assert report == {"policy": "global", "duplicate_gpus": 1}
    assert placement.duplicate_gpus.tolist() == [[False, True, False, False]]
    assert gpu_loads(placement, weight)[0].tolist() == [229.5, 275.5, 264.5, 263.5]
    placement, report = eplb_valid_placement(
        weight, np.array([0]), num_gpus=4, slots_per_gpu=4
    )
    assert placement.physical_to_logical.tolist() == [
        [10, 8, 1, 7, 10, 1, 3, 4, 0, 5, 4, 2, 11, 5, 9, 6]
    ]
    assert report == {"policy": "global", "repaired_slots": 0}
    assert gpu_loads(placement, weight)[0].tolist() == [234.5, 270.5, 264.5, 263.5]


# -- the reference: golden data and a loop re-implementation -----------------------------

REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "eplb" / "reference.json"


def _same_slot_sets(log2phy: np.ndarray, expected: list) -> bool:
    """Each expert's slots agree as a set (their order among equal replicas is the torch
    build's; see tests/fixtures/eplb/make_reference.py)."""
    expected = np.asarray(expected)
    if log2phy.shape != expected.shape:
        return False
    ours = np.sort(log2phy, axis=2)
    theirs = np.sort(expected, axis=2)
    return bool(np.array_equal(ours, theirs))


@pytest.mark.parametrize(
    "case", json.loads(REFERENCE.read_text())["cases"], ids=lambda case: case["name"]
)
def test_equals_the_reference_run_by_torch(case):
    """deepseek-ai/EPLB's own output (torch, float32) on seeded inputs: identical."""
    args = (case["num_replicas"], case["num_groups"], case["num_nodes"], case["num_gpus"])
    phy2log, log2phy, logcnt = rebalance_experts(np.array(case["weight"]), *args)
    assert phy2log.tolist() == case["phy2log"]
    assert logcnt.tolist() == case["logcnt"]
    assert _same_slot_sets(log2phy, case["log2phy"])


def test_golden_data_covers_duplicates_and_both_policies():
    cases = json.loads(REFERENCE.read_text())["cases"]
    with_duplicates = 0
    for case in cases:
        grid = np.array(case["phy2log"]).reshape(len(case["phy2log"]), case["num_gpus"], -1)
        ordered = np.sort(grid, axis=2)
        with_duplicates += bool((ordered[:, :, 1:] == ordered[:, :, :-1]).any())
    assert with_duplicates >= 20
    assert any(c["num_groups"] % c["num_nodes"] == 0 and c["num_nodes"] > 1 for c in cases)
    assert any(c["num_groups"] % c["num_nodes"] for c in cases)


def _f32(x: float) -> float:
    return float(np.float32(x))


def reference_loop(weight, num_replicas, num_groups, num_nodes, num_gpus):
    """deepseek-ai/EPLB's ``rebalance_experts`` written out with loops over plain floats.

    Follows the reference line by line (``eplb.py``): float32 weights, float32 sums and
    quotients (a float64 result rounded to float32 is the float32 result for one + or /),
    items packed heaviest first with equal weights in index order, the lightest pack with
    room taken (``min``: the first on ties), redundant slots to the first expert with the
    largest load per replica (``max``: the first on ties), ``log2phy`` by replica rank
    and as wide as the largest count.
    """
    weight = np.asarray(weight, dtype=np.float32).astype(np.float64).tolist()
    if num_groups % num_nodes:
        num_groups, num_nodes = 1, 1
    num_layers, num_logical = len(weight), len(weight[0])
    group_size = num_logical // num_groups
    groups_per_node = num_groups // num_nodes
    gpus_per_node = num_gpus // num_nodes
    per_gpu = num_replicas // num_gpus
    logical_per_node = num_logical // num_nodes
    physical_per_node = num_replicas // num_nodes

    def pack(values, num_packs):
        per_pack = len(values) // num_packs
        if per_pack == 1:
            return list(range(len(values))), [0] * len(values)
        order = sorted(range(len(values)), key=lambda i: -values[i])  # stable
        weights, items = [0.0] * num_packs, [0] * num_packs
        where, rank = [-1] * len(values), [-1] * len(values)
        for i in order:
            p = min((j for j in range(num_packs) if items[j] < per_pack), key=lambda j: weights[j])
            where[i], rank[i] = p, items[p]
            weights[p] = _f32(weights[p] + values[i])
            items[p] += 1
        return where, rank

    def replicate(values, num_phy):
        count = [1] * len(values)
        phy, rank = list(range(len(values))), [0] * len(values)
        for _ in range(len(values), num_phy):
            best = max(range(len(values)), key=lambda e: _f32(values[e] / count[e]))
            phy.append(best)
            rank.append(count[best])
            count[best] += 1
        return phy, rank, count

    phy2log = np.zeros((num_layers, num_replicas), dtype=np.int64)
    phyrank = np.zeros((num_layers, num_replicas), dtype=np.int64)
    logcnt = np.zeros((num_layers, num_logical), dtype=np.int64)
    for layer, row in enumerate(weight):
        group_load = [
            _f32(sum(row[g * group_size : (g + 1) * group_size])) for g in range(num_groups)
        ]
        group_pack, group_rank = pack(group_load, num_nodes)
        mlog2log = [0] * num_logical
        for expert in range(num_logical):
            g = expert // group_size
            start = (group_pack[g] * groups_per_node + group_rank[g]) * group_size
            mlog2log[start + expert % group_size] = expert
        for node in range(num_nodes):
            local = mlog2log[node * logical_per_node : (node + 1) * logical_per_node]
            values = [row[e] for e in local]
            phy, rank, count = replicate(values, physical_per_node)
            for i, e in enumerate(local):
                logcnt[layer, e] = count[i]
            loads = [_f32(values[m] / count[m]) for m in phy]
            gpu, pos = pack(loads, gpus_per_node)
            for k, m in enumerate(phy):
                slot = node * physical_per_node + gpu[k] * per_gpu + pos[k]
                phy2log[layer, slot] = local[m]
                phyrank[layer, slot] = rank[k]
    width = int(logcnt.max())
    log2phy = np.full((num_layers, num_logical, width), -1, dtype=np.int64)
    for layer in range(num_layers):
        for slot in range(num_replicas):
            log2phy[layer, phy2log[layer, slot], phyrank[layer, slot]] = slot
    return phy2log, log2phy, logcnt


def test_reference_loop_reproduces_the_golden_data():
    """The loop re-implementation is itself the reference (so the random tests below are)."""
    for case in json.loads(REFERENCE.read_text())["cases"][:8]:
        args = (case["num_replicas"], case["num_groups"], case["num_nodes"], case["num_gpus"])
        phy2log, log2phy, logcnt = reference_loop(np.array(case["weight"]), *args)
        assert phy2log.tolist() == case["phy2log"]
        assert logcnt.tolist() == case["logcnt"]
        assert _same_slot_sets(log2phy, case["log2phy"])


def _assert_equals_loop(weight, *args):
    ours = rebalance_experts(weight, *args)
    theirs = reference_loop(weight, *args)
    for a, b in zip(ours, theirs, strict=True):
        assert a.tolist() == b.tolist()
    return ours[0]


def test_duplicates_on_one_gpu_as_the_reference():
    """The hot expert's three replicas on two GPUs: GPU 0 holds it twice."""
    phy2log = _assert_equals_loop(np.array([[100, 1, 1, 1]]), 6, 1, 1, 2)
    assert phy2log.tolist() == [[0, 0, 3, 0, 1, 2]]


@pytest.mark.parametrize("seed", range(4))
def test_equals_the_loop_on_the_gpt_oss_20b_shape(seed):
    """24 layers x 32 experts, 8 GPUs x 5 slots, skewed integer loads (ties included)."""
    rng = np.random.default_rng(seed)
    weight = np.stack([
        (2e5 / np.arange(1, 33) ** rng.uniform(0.5, 1.8))[rng.permutation(32)] for _ in range(24)
    ]).round().astype(np.int64)
    phy2log = _assert_equals_loop(weight, 40, 1, 1, 8)
    assert Placement(phy2log, np.arange(24), 32, 8).duplicate_gpus.any()


def test_equals_the_loop_on_a_deepseek_v3_shape():
    """256 experts in 8 groups, 4 nodes x 8 GPUs, 288 slots (hierarchical), 2 layers."""
    rng = np.random.default_rng(3)
    weight = (rng.pareto(1.2, (2, 256)) * 5000).astype(np.int64)
    _assert_equals_loop(weight, 288, 8, 4, 32)
    _assert_equals_loop(weight, 288, 8, 1, 32)


@st.composite
def reference_cases(draw):
    """Any shape the reference accepts, loads with many ties (small integers) or none."""
    nodes = draw(st.sampled_from([1, 2, 4]))
    num_gpus = nodes * draw(st.integers(1, 4))
    groups = draw(st.sampled_from([1, nodes, 2 * nodes, 3]))
    num_experts = groups * draw(st.integers(1, 6))
    if num_experts < num_gpus:
        num_experts = groups * -(-num_gpus // groups)
    low = -(-num_experts // num_gpus)
    slots = draw(st.integers(low, low + 4))
    layers = draw(st.integers(1, 3))
    high = draw(st.sampled_from([3, 50, 10**6]))
    weight = draw(st.lists(
        st.lists(st.integers(0, high), min_size=num_experts, max_size=num_experts),
        min_size=layers, max_size=layers,
    ))
    return np.array(weight), (num_gpus * slots, groups, nodes, num_gpus)


@given(reference_cases())
@settings(max_examples=150, deadline=None)
def test_equals_the_loop_on_random_inputs(case):
    weight, args = case
    _assert_equals_loop(weight, *args)
    _assert_equals_loop(weight / 7.0, *args)  # non-integer figures


# -- the steps ---------------------------------------------------------------------------


def test_replicate_gives_redundant_slots_to_most_loaded_per_replica():
    phy2log, rank, counts = replicate_experts(np.array([[10.0, 4.0, 6.0]]), 6)
    # per replica [10, 4, 6] -> expert 0; [5, 4, 6] -> expert 2; [5, 4, 3] -> expert 0
    assert phy2log.tolist() == [[0, 1, 2, 0, 2, 0]]
    assert rank.tolist() == [[0, 0, 0, 1, 1, 2]]
    assert counts.tolist() == [[3, 1, 2]]


def test_replicate_ties_go_to_the_first_expert():
    phy2log, _, _ = replicate_experts(np.array([[5.0, 5.0, 5.0]]), 4)
    assert phy2log.tolist() == [[0, 1, 2, 0]]


@pytest.mark.parametrize("num_experts,num_physical", [(3, 5), (4, 7), (5, 9)])
def test_replicate_minimizes_the_largest_replica_load_brute_force(num_experts, num_physical):
    rng = np.random.default_rng(num_experts)
    weight = rng.integers(1, 100, size=(4, num_experts)).astype(float)
    _, _, counts = replicate_experts(weight, num_physical)
    for row in range(weight.shape[0]):
        best = min(
            max(weight[row] / np.array(c))
            for c in itertools.product(range(1, num_physical + 1), repeat=num_experts)
            if sum(c) == num_physical
        )
        assert max(weight[row] / counts[row]) == pytest.approx(best)


def test_replicate_respects_the_cap():
    _, _, counts = replicate_experts_capped(np.array([[100.0, 1.0, 1.0, 1.0]]), 6, max_replicas=2)
    assert counts.tolist() == [[2, 2, 1, 1]]


def test_balanced_packing_puts_heaviest_on_lightest_pack_with_room():
    weight = np.array([[3.0, 3.0, 0.0, 2.0, 2.0, 2.0]])
    pack, rank = balanced_packing(weight, 2)
    # order 0, 1, 3, 4, 5, 2: 0->A, 1->B, 3->A (tie), 4->B, 5->A (tie, A now full), 2->B
    assert pack.tolist() == [[0, 1, 1, 0, 1, 0]]
    assert rank.tolist() == [[0, 0, 2, 1, 1, 2]]


def test_balanced_packing_one_item_per_pack_is_identity():
    pack, rank = balanced_packing(np.array([[1.0, 9.0, 5.0]]), 3)
    assert pack.tolist() == [[0, 1, 2]]
    assert rank.tolist() == [[0, 0, 0]]


@given(
    st.integers(1, 4).flatmap(
        lambda packs: st.tuples(
            st.just(packs),
            st.lists(st.integers(0, 50), min_size=packs, max_size=packs * 4).filter(
                lambda w: len(w) % packs == 0
            ),
        )
    )
)
@settings(max_examples=60, deadline=None)
def test_balanced_packing_fills_every_pack_exactly(case):
    packs, weights = case
    pack, rank = balanced_packing(np.array([weights], dtype=float), packs)
    per_pack = len(weights) // packs
    assert np.bincount(pack[0], minlength=packs).tolist() == [per_pack] * packs
    for p in range(packs):
        assert sorted(rank[0][pack[0] == p].tolist()) == list(range(per_pack))


# -- eplb-valid: no GPU holds an expert twice ------------------------------------------------


def test_eplb_valid_caps_replicas_at_the_number_of_gpus():
    """One very hot expert: the reference gives it 3 replicas on 2 GPUs; eplb-valid caps at 2."""
    weight = np.array([[100, 1, 1, 1]])
    _, _, logcnt = rebalance_experts(weight, 6, 1, 1, 2)
    assert logcnt.tolist() == [[3, 1, 1, 1]]
    placement, _ = eplb_placement(weight, np.array([0]), num_gpus=2, slots_per_gpu=3)
    assert placement.replica_counts.tolist() == [[3, 1, 1, 1]]  # eplb: as the reference
    placement, report = eplb_valid_placement(
        weight, np.array([0]), num_gpus=2, slots_per_gpu=3
    )
    assert placement.replica_counts.tolist() == [[2, 2, 1, 1]]
    assert report == {"policy": "global", "repaired_slots": 0}


def test_eplb_valid_repairs_two_replicas_on_one_gpu():
    """A dense case (8 slots per GPU, 9 experts) where the packing alone cannot avoid it."""
    weight = np.array([[13, 9, 5, 5, 15, 7, 8, 5, 19]])
    reference, _, _ = rebalance_experts(weight, 24, 1, 1, 3)
    grid = reference.reshape(3, 8)
    assert any(len(set(row.tolist())) < 8 for row in grid)  # the reference's answer is invalid
    placement, report = eplb_valid_placement(
        weight, np.array([7]), num_gpus=3, slots_per_gpu=8
    )
    assert report["repaired_slots"] == 1
    assert not placement.duplicate_gpus.any()
    assert placement.replica_counts.sum() == 24  # and Placement validated it


def _reference_is_valid(phy2log: np.ndarray, num_gpus: int) -> bool:
    grid = phy2log.reshape(phy2log.shape[0], num_gpus, -1)
    return all(len(set(g.tolist())) == grid.shape[2] for layer in grid for g in layer)


@st.composite
def eplb_cases(draw):
    """(weight [layers, E], G, S, groups, nodes) with the shapes EPLB accepts."""
    nodes = draw(st.sampled_from([1, 2]))
    gpus_per_node = draw(st.integers(1, 3))
    num_gpus = nodes * gpus_per_node
    groups = nodes * draw(st.integers(1, 2))
    num_experts = groups * draw(st.integers(1, 3))
    if num_experts < num_gpus:
        num_experts = groups * -(-num_gpus // groups)
    low = -(-num_experts // num_gpus)
    slots = draw(st.integers(low, min(num_experts, low + 3)))
    layers = draw(st.integers(1, 2))
    weight = draw(
        st.lists(
            st.lists(st.integers(0, 200), min_size=num_experts, max_size=num_experts),
            min_size=layers, max_size=layers,
        )
    )
    return np.array(weight), num_gpus, slots, groups, nodes


@given(eplb_cases())
@settings(max_examples=80, deadline=None)
def test_eplb_valid_equals_reference_whenever_the_reference_has_no_duplicate(case):
    weight, num_gpus, slots, groups, nodes = case
    layer_ids = np.arange(weight.shape[0]) + 3
    placement, _ = eplb_valid_placement(weight, layer_ids, num_gpus, slots, groups, nodes)
    assert not placement.duplicate_gpus.any()
    reference, _, logcnt = rebalance_experts(weight, num_gpus * slots, groups, nodes, num_gpus)
    if logcnt.max() <= num_gpus // nodes and _reference_is_valid(reference, num_gpus):
        assert placement.physical_to_logical.tolist() == reference.tolist()
    assert placement.replica_counts.sum(axis=1).tolist() == [num_gpus * slots] * weight.shape[0]


@given(case=eplb_cases())
@settings(max_examples=60, deadline=None)
@pytest.mark.parametrize("method", [eplb_placement, eplb_valid_placement])
def test_eplb_replica_loads_are_load_over_count(case, method):
    weight, num_gpus, slots, groups, nodes = case
    ids = np.arange(weight.shape[0])
    placement, _ = method(weight, ids, num_gpus, slots, groups, nodes)
    counts = placement.replica_counts
    per_gpu = gpu_loads(placement, weight)
    for layer in range(weight.shape[0]):
        brute = np.zeros(num_gpus)
        for slot, expert in enumerate(placement.physical_to_logical[layer]):
            brute[slot // slots] += weight[layer, expert] / counts[layer, expert]
        np.testing.assert_allclose(per_gpu[layer], brute)
        np.testing.assert_allclose(per_gpu[layer].sum(), weight[layer].sum())


@given(eplb_cases())
@settings(max_examples=60, deadline=None)
def test_eplb_largest_replica_load_is_at_most_linears(case):
    """Replication is min-max optimal, and linear's replica counts are one feasible choice
    (the reference's: uncapped; eplb-valid's cap still admits linear's counts)."""
    weight, num_gpus, slots, _, _ = case
    ids = np.arange(weight.shape[0])
    for method in (eplb_placement, eplb_valid_placement):
        placement, _ = method(weight, ids, num_gpus, slots)  # global policy
        _assert_replicas_beat_linear(placement, weight, ids, num_gpus, slots)


def _assert_replicas_beat_linear(placement, weight, ids, num_gpus, slots):
    linear = Placement(
        np.tile(linear_layout(weight.shape[1], num_gpus, slots), (len(ids), 1)), ids,
        weight.shape[1], num_gpus,
    )
    eplb_max = (weight / placement.replica_counts).max(axis=1)
    linear_max = (weight / linear.replica_counts).max(axis=1)
    assert (eplb_max <= linear_max + 1e-9).all()


def test_eplb_is_not_always_better_than_linear():
    """Greedy packing is a heuristic: here linear's layout happens to be perfect.

    Loads [3, 3, 0, 2, 2, 2] on 2 GPUs x 3 slots: linear puts {3, 3, 0} and {2, 2, 2}
    (6 and 6); EPLB packs 3, 3, 2, 2, 2, 0 greedily into {3, 2, 2} and {3, 2, 0} (7, 5).
    """
    weight = np.array([[3, 3, 0, 2, 2, 2]])
    placement, _ = eplb_placement(weight, np.array([0]), num_gpus=2, slots_per_gpu=3)
    linear = Placement(linear_layout(6, 2, 3)[None], np.array([0]), 6, 2)
    assert gpu_loads(placement, weight)[0].tolist() == [7.0, 5.0]
    assert gpu_loads(linear, weight)[0].tolist() == [6.0, 6.0]


def test_eplb_beats_linear_on_a_skewed_layer():
    """64 experts with Zipf-like load on 8 GPUs, 8 redundant slots (seeded)."""
    rng = np.random.default_rng(7)
    weight = (1000 / np.arange(1, 65) ** 1.1)[rng.permutation(64)][None].round()
    placement, _ = eplb_placement(weight, np.array([0]), num_gpus=8, slots_per_gpu=9)
    linear = Placement(linear_layout(64, 8, 9)[None], np.array([0]), 64, 8)
    eplb_ratio = gpu_loads(placement, weight).max() / (weight.sum() / 8)
    linear_ratio = gpu_loads(linear, weight).max() / (weight.sum() / 8)
    assert eplb_ratio < 1.01 < 1.5 < linear_ratio


# -- input checks --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,message",
    [
        ((np.ones((1, 4)), 3, 1, 1, 1), "3 physical experts cannot hold 4 experts"),
        ((np.ones((1, 4)), 6, 1, 1, 4), "6 physical experts do not split evenly over 4 GPUs"),
        ((np.ones((1, 6)), 8, 4, 2, 4), "6 experts do not split into 4 equal groups"),
        ((np.ones((1, 4)), 6, 2, 2, 3), "3 GPUs do not split evenly over 2 nodes"),
        ((np.ones(4), 4, 1, 1, 1), "weight must be [layers, experts], got shape (4,)"),
        ((-np.ones((1, 4)), 4, 1, 1, 1), "expert loads must be finite and non-negative"),
    ],
)
def test_bad_arguments_raise_usage_errors(args, message):
    with pytest.raises(UsageError) as info:
        rebalance_experts(*args)
    assert str(info.value) == message
