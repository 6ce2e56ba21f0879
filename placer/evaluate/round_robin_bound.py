"""Round robin's part of the time floor (:mod:`placer.evaluate.bound`): how many
selections round-robin dispatch can serve where they arise, and how much compute the
redundant replicas must add, over every placement with a given number of them.

Round robin sends the selection with code ``k`` (``rank position x top_k + k position``)
of an expert with ``c`` replicas to replica ``k mod c``: replica ``i`` serves the
selections of residue class ``i``, wherever they arise.  Counting per residue class
(``m[x, i]``: selections of class ``i`` from place ``x``, a GPU or a node) gives, for
each expert and replica count ``c``:

- **local selections**: at best replica ``i`` sits where most of its class arises,
  ``f(c) = sum_i max_x m[x, i]`` (``f(1)``: one replica, at the expert's busiest place);
- **compute**: every slot sits in the rotation, so replica ``i`` runs whenever its class
  has a selection, at ``max(w, m_i t)`` (``w``: weight read, ``t``: per-token time).

The ``extra`` replicas beyond one per expert are split over experts by two
multiple-choice knapsacks: the most local selections with at most ``extra`` replicas,
and the least added compute with exactly ``extra`` (every replica sits somewhere).
"""

from __future__ import annotations

import numpy as np

#: Round robin's floor counts replicas exactly for as many of the most loaded experts as
#: keep its ``[batches, experts, replicas, places]`` counts below this many cells (and at
#: least twice the redundant replicas); the others are bounded more loosely.
ROUND_ROBIN_CELLS = 1 << 22
#: Replica counts up to this are counted exactly per residue class; larger ones are
#: bounded from the selections' distinct codes (cheaper; the floor stays valid).
EXACT_REPLICAS = 12
#: ... except with this few places (nodes), where every count is counted exactly.
EXACT_ALL_PLACES = 16

#: ``(batch, place, expert, code)`` of each selection (:func:`round_robin_local`).
Selections = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def round_robin_local(
    at: Selections, num_batches: int, num_places: int, num_experts: int, extra: int,
    weight_us: float, token_us: float, exact: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``([B], [B])``: the most selections round-robin dispatch can serve where they
    arise, and the least compute the ``extra`` replicas add, over every placement with
    ``extra`` replicas beyond one per expert (see the module docstring).

    ``at``: ``(batch, place, expert, code)`` of each selection.  ``weight_us``,
    ``token_us``: a slot's weight read and per-token time, microseconds.  The knapsack
    counts replicas exactly for the most loaded experts, as many as
    :data:`ROUND_ROBIN_CELLS` allows, every count over a few places and counts up to
    ``exact`` (default :data:`EXACT_REPLICAS`) over many; past those an expert gains at
    most ``n_e - f(1)`` however many replicas it gets, and runs at least
    ``ceil(D / ceil(K / c))`` replicas (``D`` distinct codes of its selections, ``K`` the
    codes' range).  The least compute is exact when every expert is counted exactly;
    otherwise the others may take replicas at no cost, which only lowers it.
    """
    batch, place, expert, _ = at
    cell = batch * num_experts + expert
    per_place = np.bincount(cell * num_places + place,
                            minlength=num_batches * num_experts * num_places)
    per_place = per_place.reshape(num_batches, num_experts, num_places)
    alone = per_place.max(axis=2).astype(np.float64)  # f(1) [B, E]
    if extra <= 0:
        return alone.sum(axis=1), np.zeros(num_batches)
    headroom = per_place.sum(axis=2) - alone  # the most one expert can still gain
    chosen = _exactly_counted(per_place, extra)
    totals = per_place.sum(axis=2).astype(np.float64)  # [B, E] selections of each expert
    one = np.where(totals > 0, np.maximum(weight_us, totals * token_us), 0.0)
    added = _running_replicas_compute(at, totals, one, num_batches, num_experts, extra,
                                      weight_us, token_us)  # [B, E, c]
    gain = np.repeat(headroom[:, chosen, None].astype(np.float64), extra + 1, axis=2)
    gain[:, :, 0] = 0.0
    if exact is None:
        exact = extra + 1 if num_places <= EXACT_ALL_PLACES else EXACT_REPLICAS
    selected = _restricted(at, chosen, num_experts)
    for count in range(2, min(extra + 1, exact) + 1):
        best, spent = _residue_classes(selected, count, num_batches, chosen.size,
                                       num_places, weight_us, token_us)
        gain[:, :, count - 1] = best - alone[:, chosen]
        added[:, chosen, count - 1] = spent - one[:, chosen]
    gain = np.maximum(gain, 0.0)
    added = np.maximum(added, 0.0)
    total = _most_gain(gain, headroom, chosen, extra)
    return alone.sum(axis=1) + total, _least_added(added, extra)


def _exactly_counted(per_place: np.ndarray, extra: int) -> np.ndarray:
    """``[W]`` the experts counted exactly: the most loaded, as many as keep the
    ``[batches, W, replicas, places]`` counts under :data:`ROUND_ROBIN_CELLS` (at least
    ``2 x extra``); ``per_place``: ``[B, E, X]`` selections of each expert per place."""
    num_batches, num_experts, num_places = per_place.shape
    width = max(2 * extra, ROUND_ROBIN_CELLS // ((extra + 1) * num_places * num_batches))
    return np.argsort(-per_place.sum(axis=(0, 2)), kind="stable")[: min(num_experts, width)]


def _restricted(at: Selections, chosen: np.ndarray, num_experts: int) -> Selections:
    """The selections of the ``chosen`` experts, experts renumbered by their position."""
    batch, place, expert, code = at
    index = np.full(num_experts, -1)
    index[chosen] = np.arange(chosen.size)
    keep = index[expert] >= 0
    return batch[keep], place[keep], index[expert[keep]], code[keep]


def _running_replicas_compute(
    at: Selections, totals: np.ndarray, one: np.ndarray, num_batches: int, num_experts: int,
    extra: int, weight_us: float, token_us: float,
) -> np.ndarray:
    """``[B, E, extra + 1]`` least compute ``c`` replicas of each expert add over one
    (column ``c - 1``; column 0 is 0), from the replicas that surely run: at least
    ``ceil(D / ceil(K / c))`` of them, ``D`` the distinct codes of the expert's
    selections and ``K`` the codes' range (a residue class holds at most ``ceil(K / c)``
    codes).  Every expert, every count; counted exactly later for the chosen ones."""
    batch, _, expert, code = at
    cell = batch * num_experts + expert
    span = int(code.max()) + 1 if code.size else 1
    if num_batches * num_experts * span <= ROUND_ROBIN_CELLS:
        seen = np.bincount(cell * span + code, minlength=num_batches * num_experts * span)
        codes = (seen.reshape(num_batches, num_experts, span) > 0).sum(axis=2)
    else:
        distinct = np.unique(cell * span + code) // span
        codes = np.bincount(distinct, minlength=num_batches * num_experts).reshape(
            num_batches, num_experts)
    codes = codes.astype(np.float64)
    counts = np.arange(1, extra + 2, dtype=np.float64)  # c = 1 .. extra + 1
    running = np.ceil(codes[:, :, None] / np.ceil(span / counts)[None, None, :])
    added = np.maximum(np.maximum(running * weight_us, totals[:, :, None]
                                  * token_us) - one[:, :, None], 0.0)  # [B, E, c]
    added[:, :, 0] = 0.0
    return added


def _residue_classes(
    selected: Selections, count: int, num_batches: int, width: int, num_places: int,
    weight_us: float, token_us: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``([B, W], [B, W])`` with ``count`` replicas of each of the ``width`` chosen
    experts: the most selections served where they arise (``f(count)``), and the
    compute of the replicas whose residue class has a selection, microseconds."""
    b, x, e, k = selected
    key = ((b * width + e) * count + k % count) * num_places + x
    m = np.bincount(key, minlength=num_batches * width * count * num_places)
    m = m.reshape(num_batches, width, count, num_places)
    runs = m.sum(axis=3)
    spent = np.where(runs > 0, np.maximum(weight_us, runs * token_us), 0.0)
    return m.max(axis=3).sum(axis=2), spent.sum(axis=2)


def _knapsack_steps(extra: int) -> tuple[np.ndarray, np.ndarray]:
    """``([j, used], [j, used])``: the budget left before an item taking ``used`` of
    ``j`` replicas (0 where it cannot), and whether it can."""
    steps = np.arange(extra + 1)
    before = steps[:, None] - steps[None, :]
    allowed = before >= 0
    return np.where(allowed, before, 0), allowed


def _most_gain(gain: np.ndarray, headroom: np.ndarray, chosen: np.ndarray,
               extra: int) -> np.ndarray:
    """``[B]`` the most local selections ``extra`` replicas add: a multiple-choice
    knapsack over the chosen experts (``gain``: ``[B, W, c]``), the others gaining at
    most their ``headroom`` (``[B, E]``) each."""
    num_batches, num_experts = headroom.shape
    before, allowed = _knapsack_steps(extra)
    budget = np.zeros((num_batches, extra + 1))  # best gain with <= j replicas
    for item in range(chosen.size):
        options = budget[:, before] + gain[:, item][:, None, :]  # [B, j, used]
        budget = np.where(allowed[None], options, -np.inf).max(axis=2)
    others = np.ones(num_experts, dtype=bool)
    others[chosen] = False
    rest = -np.sort(-headroom[:, others], axis=1)[:, :extra]
    prefix = np.concatenate([np.zeros((num_batches, 1)), rest.cumsum(axis=1)], axis=1)
    spent = np.arange(prefix.shape[1])
    return (budget[:, extra - spent] + prefix).max(axis=1)


def _least_added(added: np.ndarray, extra: int) -> np.ndarray:
    """``[B]`` the least compute exactly ``extra`` replicas add over one per expert
    (``added``: ``[B, E, c]``, a knapsack over every expert)."""
    num_batches, num_experts, _ = added.shape
    before, allowed = _knapsack_steps(extra)
    least = np.full((num_batches, extra + 1), np.inf)
    least[:, 0] = 0.0
    for item in range(num_experts):
        options = least[:, before] + added[:, item][:, None, :]
        least = np.where(allowed[None], options, np.inf).min(axis=2)
    return least[:, extra]
