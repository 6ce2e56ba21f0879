"""Round robin's floor counted by hand on cases small enough to follow.

``round_robin_local`` returns, per batch, the most selections round robin can serve
where they arise and the least compute the redundant replicas add; every case below is
one batch, weight read ``w = 1`` us and ``t = 0.1`` us per token.
"""

from __future__ import annotations

import numpy as np

from placer.evaluate.round_robin_bound import round_robin_local

W, T = 1.0, 0.1


def selections(rows: list[tuple[int, int, int]]) -> tuple[np.ndarray, ...]:
    """``(batch, place, expert, code)`` arrays of one batch's ``(place, expert, code)``."""
    place, expert, code = (np.array(col, dtype=np.int64) for col in zip(*rows, strict=True))
    return np.zeros(place.size, dtype=np.int64), place, expert, code


def test_no_redundant_replica_keeps_each_expert_at_its_busiest_place() -> None:
    """Expert 0: 2 selections from place 0, 1 from place 1; expert 1: 1 from place 1."""
    at = selections([(0, 0, 0), (0, 0, 1), (1, 0, 2), (1, 1, 0)])
    local, added = round_robin_local(at, 1, 2, 2, 0, W, T)
    assert local.tolist() == [3.0]
    assert added.tolist() == [0.0]


def test_a_second_replica_serves_the_other_residue_class_where_it_arises() -> None:
    """Codes 0 and 1 come from places 0 and 1: two replicas serve both locally, and
    each runs once, ``2 max(w, t) - max(w, 2t) = 1`` us more than one replica."""
    at = selections([(0, 0, 0), (1, 0, 1)])
    local, added = round_robin_local(at, 1, 2, 1, 1, W, T)
    assert local.tolist() == [2.0]
    assert added.tolist() == [1.0]


def test_the_replica_goes_to_the_expert_that_gains_from_it() -> None:
    """Expert 0 gains one local selection from a second replica, expert 1 (all from
    place 0) none: the floor counts ``f_0(2) + f_1(1) = 2 + 3``."""
    at = selections([(0, 0, 0), (1, 0, 1), (0, 1, 0), (0, 1, 1), (0, 1, 2)])
    local, _ = round_robin_local(at, 1, 2, 2, 1, W, T)
    assert local.tolist() == [5.0]


def test_residue_classes_that_mix_places_gain_nothing_when_counted_exactly() -> None:
    """Codes 0, 1 from place 0 and 2, 3 from place 1: with two replicas each class holds
    one selection of each place, so ``f(2) = f(1) = 2``.  Not counted exactly
    (``exact=1``) the expert may gain all its ``n - f(1) = 2`` other selections."""
    at = selections([(0, 0, 0), (0, 0, 1), (1, 0, 2), (1, 0, 3)])
    exact, added = round_robin_local(at, 1, 2, 1, 1, W, T)
    loose, loose_added = round_robin_local(at, 1, 2, 1, 1, W, T, exact=1)
    assert exact.tolist() == [2.0]
    assert loose.tolist() == [4.0]
    # both replicas run twice: 2 max(w, 2t) - max(w, 4t) = 1 us, and the distinct codes
    # (4 over a range of 4) prove it without counting the classes
    assert added.tolist() == loose_added.tolist() == [1.0]
