"""placer's online moves: the greedy evens the hottest GPU, and with what moves are worth
it takes the move that pays most once its copy is paid (a node peer's copy over the
node's fabric rather than one over the NIC, when both even the GPUs about as well)."""

from __future__ import annotations

import numpy as np
import pytest

from placer.model import load_model
from placer.online.moves import MoveWorth, improve_layer
from placer.online.value import CopyCosts, expected_layer_times, move_worth
from placer.placement import Placement
from placer.placement.align import align_row
from placer.placement.migration import copy_bytes, copy_seconds, layer_moves
from placer.regime import Regime
from placer.topology import load_topology

# 4 GPUs of 2 slots on 2 nodes (GPUs 0, 1 | 2, 3); GPU 0 is hot
ROW = np.arange(8)
WEIGHT = np.array([5, 5, 2, 2.2, 1.5, 2, 2, 2.1])
NODE = np.array([0, 0, 1, 1])


def _copy_us(fabric: float, nic: float) -> np.ndarray:
    """[E, G] µs: an expert's copy onto a GPU of the node holding it, else over the NIC."""
    node_of_expert = NODE[ROW // 2]
    return np.where(node_of_expert[:, None] == NODE[None, :], fabric, nic)


def _first_move_gpu(plan) -> int:
    changed = np.flatnonzero(plan.rows[1] != plan.rows[0])
    return int(sorted({int(s) // 2 for s in changed} - {0})[0])


def test_moves_free_even_the_hottest_gpu_most() -> None:
    plan = improve_layer(ROW, WEIGHT, 4)
    # swapping a 5-expert with GPU 2's evens GPUs 0 and 2 at 7; GPU 1's at 7.2
    assert _first_move_gpu(plan) == 2
    assert plan.peak[1] == pytest.approx(7.0)
    assert all(a > b for a, b in zip(plan.peak, plan.peak[1:], strict=False))
    assert plan.peak[-1] >= plan.mean - 1e-9


def test_a_costly_copy_makes_the_node_peer_the_better_move() -> None:
    worth = MoveWorth(us_per_load=1.0, copy_us=_copy_us(fabric=0.1, nic=1.0))
    plan = improve_layer(ROW, WEIGHT, 4, worth=worth)
    # GPU 1 evens to 7.2 (saves 2.8 - 0.1), GPU 2 to 7 (saves 3.0 - 1.0)
    assert _first_move_gpu(plan) == 1
    assert plan.peak[1] == pytest.approx(7.2)
    # copies as cheap on every link: the evener move again
    same = improve_layer(ROW, WEIGHT, 4, worth=MoveWorth(1.0, _copy_us(0.1, 0.1)))
    assert _first_move_gpu(same) == 2


def test_a_move_is_priced_as_the_replay_copies_it() -> None:
    # the copy each (expert, GPU) is priced at is what the replay's migration model
    # charges for that one move from the deployed placement
    topology, model = load_topology("2x-dgx-h100"), load_model("qwen3-30b-a3b")
    rng = np.random.default_rng(0)
    rows = np.stack([rng.permutation(np.r_[np.arange(128), rng.choice(128, 16)])
                     for _ in range(2)])
    current = Placement(rows, np.array([0, 1]), 128, 16)
    load = rng.integers(1, 50, size=(2, 128)).astype(np.float64)
    costs = CopyCosts(0.0, 0.0, 0.5)
    times = expected_layer_times(current, load, topology, model, Regime("vllm", "decode"),
                                 "bf16")
    worth = move_worth(current, load, times, topology=topology, model=model, dtype="bf16",
                       interval=100, costs=costs)
    assert worth is not None and len(worth) == 2
    expert_bytes = float(model.expert_bytes("bf16"))
    checked = 0
    for layer, expert in [(0, 3), (0, 77), (1, 120), (1, 5)]:
        row = current.physical_to_logical[layer]
        count = np.bincount(row, minlength=128)
        held = set((np.flatnonzero(row == expert) // current.slots_per_gpu).tolist())
        # a slot of another GPU whose expert keeps a replica elsewhere takes the expert
        for slot in np.flatnonzero(count[row] >= 2)[:3]:
            gpu = int(slot) // current.slots_per_gpu
            if gpu in held:
                continue
            moved = current.physical_to_logical.copy()
            moved[layer, slot] = expert
            new = Placement(moved, current.layer_ids, 128, 16)
            local, remote = copy_bytes(new, current, expert_bytes, topology.node_of_gpu)
            charged = copy_seconds(local, remote, topology)[layer].max() * 1e6
            assert worth[layer].copy_us[expert, gpu] == pytest.approx(charged * 0.5)
            checked += 1
        assert worth[layer].us_per_load > 0
    assert checked >= 8


def _burst() -> tuple[Placement, np.ndarray]:
    """Qwen3 on 2 nodes: the deployed layout fitted to yesterday's load, today's hot
    experts all on GPU 0 (a burst single moves cannot spread)."""
    rng = np.random.default_rng(3)
    row = np.r_[np.arange(128), np.arange(16)]  # the engines' layout, 9 slots a GPU
    current = Placement(np.stack([row, row]), np.array([0, 1]), 128, 16)
    load = rng.integers(5, 15, size=(2, 128)).astype(np.float64)
    load[:, :9] = 2_000.0  # GPU 0's nine experts
    return current, load


def test_a_burst_takes_eplb_whole_layer_when_it_pays() -> None:
    from placer.replay.decide import eplb_layout, placer_moves

    topology, model = load_topology("2x-dgx-h100"), load_model("qwen3-30b-a3b")
    current, load = _burst()
    args = dict(topology=topology, model=model, regime=Regime("vllm", "decode"),
                dtype="bf16", interval=400, costs=CopyCosts(0.0, 0.0, 1.0))
    free = placer_moves(current, load, max_moves=None, **args).placement
    full = eplb_layout(load, current.layer_ids, 16, 9, model, topology)
    for row in range(2):  # EPLB's layout, its GPUs renumbered to move least
        want = align_row(full.physical_to_logical[row], current.physical_to_logical[row],
                         128, topology)
        assert (free.physical_to_logical[row] == want).all()
        assert sorted(map(sorted, want.reshape(16, 9).tolist())) == \
            sorted(map(sorted, full.physical_to_logical[row].reshape(16, 9).tolist()))
    full_moves = int(layer_moves(full, current).sum())
    assert int(layer_moves(free, current).sum()) <= full_moves
    # within a budget smaller than a layer's re-placement: single moves only
    tight = placer_moves(current, load, max_moves=20, **args).placement
    moved = int(layer_moves(tight, current).sum())
    assert 0 < moved <= 20
    assert moved < full_moves
    # a copy that cannot pay within the horizon: nothing moves
    short = placer_moves(current, load, max_moves=None,
                         **{**args, "interval": 1, "costs": CopyCosts(1e9, 0.0, 1.0)})
    assert (short.placement.physical_to_logical == current.physical_to_logical).all()
