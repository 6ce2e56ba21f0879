"""Placement: validation with exact messages, derived views, GPU loads."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from placer.errors import PlacementError
from placer.placement import Placement, gpu_loads, hot_shard_ratio


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
        ([[0, 0, 1, 2, 3, 1]], [7], 4, 2, "GPU 0 holds two replicas of one expert in layer 7"),
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


def test_check_model_accepts_matching_model(docstring_example):
    model = SimpleNamespace(name="toy", num_experts=4, moe_layer_ids=(1, 2, 3))
    docstring_example.check_model(model)  # raises on mismatch


def test_check_model_rejects_other_experts_or_layers(docstring_example):
    other_experts = SimpleNamespace(name="toy", num_experts=8, moe_layer_ids=(3,))
    with pytest.raises(PlacementError) as info:
        docstring_example.check_model(other_experts, where="plan.json")
    assert str(info.value) == "plan.json: placement has 4 experts per layer, toy has 8"

    other_layers = SimpleNamespace(name="toy", num_experts=4, moe_layer_ids=(4, 5, 6, 9))
    with pytest.raises(PlacementError) as info:
        docstring_example.check_model(other_layers)
    assert str(info.value) == "layer 3 is not an MoE layer of toy"
    assert info.value.hint == "toy's MoE layers are 4-6, 9"


def test_moves_count_new_expert_copies_per_gpu(docstring_example):
    moved = Placement(np.array([[1, 0, 2, 3, 2, 0]]), np.array([3]), 4, 2)
    # GPU 0 {0, 1, 3} -> {1, 0, 2}: loads 2; GPU 1 {2, 3, 0} -> {3, 2, 0}: nothing
    assert moved.moves_from(docstring_example) == 1
    assert docstring_example.moves_from(docstring_example) == 0
