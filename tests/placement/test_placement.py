"""Placement: validation with exact messages, derived views, GPU loads."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from placer.errors import PlacementError, PlacerWarning
from placer.placement import Placement, gpu_loads, hot_shard_ratio
from placer.placement.migration import moves_from


@pytest.fixture
def docstring_example() -> Placement:
    """The module docstring's example: 4 experts, 2 GPUs x 3 slots, layer 3."""
    return Placement(np.array([[0, 1, 3, 2, 3, 0]]), np.array([3]), num_experts=4, num_gpus=2)


def test_derived_views(docstring_example):
    p = docstring_example
    assert (p.num_layers, p.num_physical, p.slots_per_gpu, p.num_redundant) == (1, 6, 3, 2)
    assert p.gpu_of_slot.tolist() == [0, 0, 0, 1, 1, 1]
    assert p.replica_counts.tolist() == [[2, 1, 1, 2]]
    assert p.logical_to_physical.tolist() == [[[0, 5], [1, -1], [3, -1], [2, 4]]]
    assert p.experts_on_gpu(0, 0).tolist() == [0, 1, 3]
    assert p.experts_on_gpu(0, 1).tolist() == [2, 3, 0]
    mask = [[True, True], [True, False], [False, True], [True, True]]
    assert p.expert_gpu_mask[0].tolist() == mask
    assert p.layer_row(3) == 0


def test_gpu_loads_split_evenly_over_replicas(docstring_example):
    load = np.array([[10, 4, 6, 8]])
    # GPU 0: 10/2 + 4 + 8/2 = 13; GPU 1: 6 + 8/2 + 10/2 = 15
    assert gpu_loads(docstring_example, load).tolist() == [[13.0, 15.0]]
    windows = np.stack([load, 2 * load])
    assert gpu_loads(docstring_example, windows).tolist() == [[[13.0, 15.0]], [[26.0, 30.0]]]
    assert hot_shard_ratio(np.array([[13.0, 15.0]])).tolist() == [15 / 14]
    assert hot_shard_ratio(np.zeros((1, 2))).tolist() == [1.0]


def test_gpu_loads_brute_force():
    rng = np.random.default_rng(3)
    p2l = np.array([[0, 5, 2, 1, 3, 4, 5, 0], [1, 2, 3, 0, 4, 5, 3, 2]])
    placement = Placement(p2l, np.array([0, 1]), num_experts=6, num_gpus=4)
    load = rng.integers(0, 100, size=(2, 6))
    expected = np.zeros((2, 4))
    for layer in range(2):
        for slot, expert in enumerate(p2l[layer]):
            count = (p2l[layer] == expert).sum()
            expected[layer, slot // 2] += load[layer, expert] / count
    np.testing.assert_allclose(gpu_loads(placement, load), expected)


@pytest.mark.parametrize(
    "p2l,layer_ids,num_experts,num_gpus,message",
    [
        ([0, 1, 2, 3], [0], 4, 2, "physical_to_logical must be [layers, slots], got shape (4,)"),
        ([[0, 1, 2, 3]], [0, 1], 4, 2, "2 layer ids for 1 layers"),
        ([[0, 1, 2, 3], [0, 1, 2, 3]], [5, 5], 4, 2, "layer ids repeat"),
        ([[0, 1, 2, 3, 0]], [0], 4, 2, "5 slots per layer do not split evenly over 2 GPUs"),
        ([[0, 1, 2]], [0], 4, 1, "3 slots cannot hold 4 experts"),
        ([[0, 1, 2, 4]], [7], 4, 2, "slot 3 of layer 7 holds expert 4, outside [0, 4)"),
        ([[0, 1, 2, -1]], [7], 4, 2, "slot 3 of layer 7 holds expert -1, outside [0, 4)"),
        ([[0, 1, 2, 2]], [7], 4, 2, "expert 3 of layer 7 has no replica"),
    ],
)
def test_invalid_placements_are_rejected(p2l, layer_ids, num_experts, num_gpus, message):
    with pytest.raises(PlacementError) as info:
        Placement(np.array(p2l), np.array(layer_ids), num_experts, num_gpus)
    assert str(info.value) == message


def test_equality_ignores_meta_and_hash_is_consistent(docstring_example):
    twin = Placement(
        docstring_example.physical_to_logical.copy(), np.array([3]), 4, 2, meta={"x": 1}
    )
    other = Placement(np.array([[0, 1, 3, 2, 0, 3]]), np.array([3]), 4, 2)
    assert twin == docstring_example
    assert hash(twin) == hash(docstring_example)
    assert other != docstring_example
    assert len({twin, docstring_example, other}) == 2


def _toy_model(num_experts: int, moe_layer_ids: tuple[int, ...]) -> SimpleNamespace:
    """What ``Placement.check_model`` reads of a model (``placement.ModelLayers``)."""
    return SimpleNamespace(name="toy", num_experts=num_experts, moe_layer_ids=moe_layer_ids,
                           mtp_layer_ids=())


def test_check_model_accepts_matching_model(docstring_example):
    model = _toy_model(4, (1, 2, 3))
    docstring_example.check_model(model)  # raises on mismatch


def test_check_model_rejects_other_experts_or_layers(docstring_example):
    other_experts = _toy_model(8, (3,))
    with pytest.raises(PlacementError) as info:
        docstring_example.check_model(other_experts, where="plan.json")
    assert str(info.value) == "plan.json: the placement has 4 experts per layer but toy has 8"

    other_layers = _toy_model(4, (4, 5, 6, 9))
    with pytest.raises(PlacementError) as info:
        docstring_example.check_model(other_layers)
    assert str(info.value) == "layer 3 of the placement is not a MoE layer of toy"
    assert info.value.hint == "toy's MoE layers are 4-6, 9"


def test_moves_count_new_expert_copies_per_gpu(docstring_example):
    moved = Placement(np.array([[1, 0, 2, 3, 2, 0]]), np.array([3]), 4, 2)
    # GPU 0 {0, 1, 3} -> {1, 0, 2}: loads 2; GPU 1 {2, 3, 0} -> {3, 2, 0}: nothing
    assert moves_from(moved, docstring_example) == 1
    assert moves_from(docstring_example, docstring_example) == 0


# -- two replicas of one expert on one GPU ---------------------------------------------------


@pytest.fixture
def duplicated() -> Placement:
    """4 experts, 2 GPUs x 3 slots: GPU 0 holds expert 0 twice, {0, 0, 1} and {2, 3, 0}."""
    return Placement(np.array([[0, 0, 1, 2, 3, 0]]), np.array([7]), 4, 2)


def test_two_replicas_on_one_gpu_are_valid(duplicated):
    assert duplicated.replica_counts.tolist() == [[3, 1, 1, 1]]
    assert duplicated.duplicate_gpus.tolist() == [[True, False]]
    # every slot listed, both of GPU 0's
    assert duplicated.logical_to_physical.tolist() == [
        [[0, 1, 5], [2, -1, -1], [3, -1, -1], [4, -1, -1]]
    ]
    # presence: GPU 0 holds expert 0 (once in the mask), replicas: twice
    assert duplicated.expert_gpu_mask[0, 0].tolist() == [True, True]
    assert duplicated.replicas_on_gpu[0, 0].tolist() == [2, 1]
    assert duplicated.replicas_on_gpu.sum(axis=2).tolist() == duplicated.replica_counts.tolist()


def test_gpu_loads_count_each_replica_of_a_duplicate(duplicated):
    """Expert 0's 90 tokens split over its 3 replicas: GPU 0 serves two shares."""
    load = np.array([[90, 10, 20, 30]])
    assert gpu_loads(duplicated, load).tolist() == [[70.0, 80.0]]


def test_duplicate_warning_names_the_first_one():
    avoidable = Placement(np.array([[0, 0, 1, 2, 3, 3]]), np.array([7]), 4, 2)
    message = avoidable.duplicate_warning("plan.json")
    assert message is not None
    assert message.startswith("plan.json: GPU 0 holds 2 replicas of expert 0 in layer 7"
                              " (and 1 more (layer, GPU) pairs): ")
    assert "vLLM-Ascend" in message
    with pytest.warns(PlacerWarning, match="GPU 0 holds 2 replicas of expert 0"):
        avoidable.warn_duplicates()
    single = Placement(np.array([[0, 1, 2, 3]]), np.array([0]), 4, 2)
    assert single.duplicate_warning() is None
    assert not single.duplicate_gpus.any()


def test_duplicates_the_replica_counts_force_are_said_to_be_forced(duplicated):
    """Expert 0 has 3 replicas on 2 GPUs: one GPU must hold two of them."""
    assert duplicated.forced_duplicates
    message = duplicated.duplicate_warning("plan.json") or ""
    assert message.startswith(
        "plan.json: GPU 0 holds 2 replicas of expert 0 in layer 7, forced by the replica"
        " counts (expert 0 of layer 7 has 3 replicas for 2 GPUs): ")


def test_duplicate_warning_counts_the_others():
    p2l = np.array([[0, 0, 1, 2, 3, 3], [1, 2, 0, 3, 0, 1]])
    placement = Placement(p2l, np.array([3, 4]), 4, 2)
    assert placement.duplicate_gpus.tolist() == [[True, True], [False, False]]
    assert "(and 1 more (layer, GPU) pairs)" in (placement.duplicate_warning() or "")


def test_moves_ignore_a_second_copy_on_the_same_gpu(duplicated):
    """A second replica on a GPU that holds the expert is copied there, not moved."""
    before = Placement(np.array([[0, 1, 3, 2, 3, 0]]), np.array([7]), 4, 2)
    # GPU 0 {0, 1, 3} -> {0, 0, 1}: nothing new; GPU 1 {2, 3, 0} -> {2, 3, 0}: nothing
    assert moves_from(duplicated, before) == 0
    assert moves_from(before, duplicated) == 1  # GPU 0 loads expert 3
