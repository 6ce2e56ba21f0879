"""Aligning a new layout to the deployed one: the same layout (each GPU's experts kept
together, GPUs renumbered only among alike GPUs), never more moves than as given, none
for a renumbered copy of the deployed layout; an expert that stays on its GPU keeps its
slot."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placer.placement import Placement
from placer.placement.align import align_row, keep_slots
from placer.placement.migration import layer_moves
from placer.topology import load_topology

E, SLOTS = 144, 9


def _moves(row: np.ndarray, current: np.ndarray) -> int:
    def one(r: np.ndarray) -> Placement:
        return Placement(r[None], np.array([0]), E, 16)

    return int(layer_moves(one(row), one(current))[0])


def _bins(row: np.ndarray) -> list[tuple[int, ...]]:
    return sorted(tuple(sorted(b)) for b in row.reshape(16, SLOTS).tolist())


@pytest.fixture(scope="module")
def topology():
    return load_topology("2x-dgx-h100")  # 2 nodes of 8 alike GPUs


def _layout(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.permutation(np.r_[np.arange(E), rng.choice(E, 16 * SLOTS - E)])


def test_a_renumbered_copy_of_the_deployed_layout_moves_nothing(topology) -> None:
    current = _layout(0)
    rng = np.random.default_rng(1)
    # swap the two nodes and shuffle the GPUs within each
    order = np.r_[8 + rng.permutation(8), rng.permutation(8)]
    renumbered = current.reshape(16, SLOTS)[order].reshape(-1)
    assert _moves(renumbered, current) > 0
    aligned = align_row(renumbered, current, E, topology)
    assert _moves(aligned, current) == 0
    assert _bins(aligned) == _bins(renumbered)


@pytest.mark.parametrize("seed", range(5))
def test_alignment_keeps_the_layout_and_never_adds_moves(topology, seed) -> None:
    current = _layout(100 + seed)
    rng = np.random.default_rng(seed)
    # the deployed layout renumbered (nodes swapped, GPUs shuffled within each), then
    # 20 slots swapped between GPUs
    order = np.r_[8 + rng.permutation(8), rng.permutation(8)]
    new = current.reshape(16, SLOTS)[order].reshape(-1).copy()
    for _ in range(20):
        a, b = rng.choice(new.size, 2, replace=False)
        new[a], new[b] = new[b], new[a]
    aligned = align_row(new, current, E, topology)
    assert _bins(aligned) == _bins(new)
    assert _moves(aligned, current) <= min(_moves(new, current), 2 * 20)
    # unrelated layouts: never more moves than as given
    other = _layout(200 + seed)
    assert _moves(align_row(other, current, E, topology), current) <= _moves(other, current)


def _kept_by_hand(new: np.ndarray, current: np.ndarray, gpus: int) -> np.ndarray:
    """keep_slots written plainly: each slot of a GPU keeps its expert when the GPU's new
    experts still hold one of it (one replica for one slot); the rest, in order, fill the
    slots left."""
    slots = new.size // gpus
    out = new.copy()
    for g in range(gpus):
        part = slice(g * slots, (g + 1) * slots)
        left, placed = new[part].tolist(), [None] * slots
        for s, expert in enumerate(current[part].tolist()):
            if expert in left:
                left.remove(expert)
                placed[s] = expert
        rest = iter(left)
        out[part] = [e if e is not None else next(rest) for e in placed]
    return out


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.integers(1, 5), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_keep_slots_keeps_each_staying_expert_in_its_slot(gpus, slots, experts, seed) -> None:
    rng = np.random.default_rng(seed)
    new = rng.integers(0, experts, gpus * slots)
    current = rng.integers(0, experts, gpus * slots)
    kept = keep_slots(new, current, gpus)
    assert (kept == _kept_by_hand(new, current, gpus)).all()
    for g in range(gpus):  # the same experts on each GPU, only their slots reordered
        part = slice(g * slots, (g + 1) * slots)
        assert sorted(kept[part].tolist()) == sorted(new[part].tolist())
        # and as many slots keep their expert as the GPU keeps replicas
        both = sum(min(new[part].tolist().count(e), current[part].tolist().count(e))
                   for e in set(new[part].tolist()))
        assert int((kept[part] == current[part]).sum()) == both
