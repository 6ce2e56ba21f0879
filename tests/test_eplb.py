"""DeepSeek EPLB: the published example, the steps against brute force, the solver."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placer.errors import UsageError
from placer.placement import Placement, gpu_loads
from placer.problem import PlacementProblem, solve
from placer.solvers.baselines import linear_layout
from placer.solvers.eplb import (
    balanced_packing,
    eplb_placement,
    rebalance_experts,
    replicate_experts,
)
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
    assert result.details["repaired_slots"] == 0


def test_global_policy_is_hierarchical_with_one_node_and_one_group():
    """4 groups do not split over 3 nodes: EPLB ignores nodes and groups."""
    phy2log, _, logcnt = rebalance_experts(EXAMPLE_WEIGHT, 18, 4, 3, 6)
    expected, _, expected_cnt = rebalance_experts(EXAMPLE_WEIGHT, 18, 1, 1, 6)
    assert phy2log.tolist() == expected.tolist()
    assert logcnt.tolist() == expected_cnt.tolist()


def test_global_policy_on_one_node_keeps_replicas_apart():
    """Layer 0 of the example on 4 GPUs, global policy (figures derived by hand).

    Replicas go to experts 10, 5, 1, 4 (183, 165, 132, 104).  Packing replica loads
    91.5, 91.5, 90, 86, 82.5, 82.5, 73, 66, 66, ... the reference puts both replicas
    of expert 1 (66 each) on GPU 1; placer's solver sends the second to the lightest
    GPU without expert 1 instead, and otherwise packs identically.
    """
    weight = EXAMPLE_WEIGHT[:1]
    reference, _, logcnt = rebalance_experts(weight, 16, 1, 1, 4)
    assert logcnt.tolist() == [[1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1]]
    assert reference.tolist() == [[10, 8, 3, 7, 10, 1, 1, 4, 0, 5, 4, 2, 11, 5, 9, 6]]
    placement, report = eplb_placement(weight, np.array([0]), num_gpus=4, slots_per_gpu=4)
    assert placement.physical_to_logical.tolist() == [
        [10, 8, 1, 7, 10, 1, 3, 4, 0, 5, 4, 2, 11, 5, 9, 6]
    ]
    assert report == {"policy": "global", "repaired_slots": 0}
    assert gpu_loads(placement, weight)[0].tolist() == [234.5, 270.5, 264.5, 263.5]


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
    _, _, counts = replicate_experts(np.array([[100.0, 1.0, 1.0, 1.0]]), 6, max_replicas=2)
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


# -- the solver: valid where the reference is not -----------------------------------------


def test_eplb_caps_replicas_at_the_number_of_gpus():
    """One very hot expert: the reference gives it 3 replicas on 2 GPUs; placer caps at 2."""
    weight = np.array([[100, 1, 1, 1]])
    _, _, logcnt = rebalance_experts(weight, 6, 1, 1, 2)
    assert logcnt.tolist() == [[3, 1, 1, 1]]
    placement, report = eplb_placement(weight, np.array([0]), num_gpus=2, slots_per_gpu=3)
    assert placement.replica_counts.tolist() == [[2, 2, 1, 1]]
    assert report == {"policy": "global", "repaired_slots": 0}


def test_eplb_repairs_two_replicas_on_one_gpu():
    """A dense case (8 slots per GPU, 9 experts) where the packing alone cannot avoid it."""
    weight = np.array([[13, 9, 5, 5, 15, 7, 8, 5, 19]])
    reference, _, _ = rebalance_experts(weight, 24, 1, 1, 3)
    grid = reference.reshape(3, 8)
    assert any(len(set(row.tolist())) < 8 for row in grid)  # the reference's answer is invalid
    placement, report = eplb_placement(weight, np.array([7]), num_gpus=3, slots_per_gpu=8)
    assert report["repaired_slots"] == 1
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
def test_eplb_placement_equals_reference_whenever_the_reference_is_valid(case):
    weight, num_gpus, slots, groups, nodes = case
    layer_ids = np.arange(weight.shape[0]) + 3
    placement, _ = eplb_placement(weight, layer_ids, num_gpus, slots, groups, nodes)
    reference, _, logcnt = rebalance_experts(weight, num_gpus * slots, groups, nodes, num_gpus)
    if logcnt.max() <= num_gpus // nodes and _reference_is_valid(reference, num_gpus):
        assert placement.physical_to_logical.tolist() == reference.tolist()
    assert placement.replica_counts.sum(axis=1).tolist() == [num_gpus * slots] * weight.shape[0]


@given(eplb_cases())
@settings(max_examples=60, deadline=None)
def test_eplb_replica_loads_are_load_over_count(case):
    weight, num_gpus, slots, groups, nodes = case
    ids = np.arange(weight.shape[0])
    placement, _ = eplb_placement(weight, ids, num_gpus, slots, groups, nodes)
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
    """Replication is min-max optimal, and linear's replica counts are one feasible choice."""
    weight, num_gpus, slots, _, _ = case
    ids = np.arange(weight.shape[0])
    placement, _ = eplb_placement(weight, ids, num_gpus, slots)  # global policy
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
