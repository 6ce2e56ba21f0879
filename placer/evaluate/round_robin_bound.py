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
#: Residue classes are summed from per-code counts (``[distinct codes, places x batches x
#: experts]``, int32) up to this many cells; past it, counted per replica count.
RESIDUE_CELLS = 1 << 25
#: ... and at most this many cells per selection (denser counts than that are summed
#: faster per replica count).
RESIDUE_SPARSE = 8

#: The knapsacks' tree of merges holds at most this many cells at once (``[batches,
#: pairs, replicas, replicas]``); past it (a redundancy of hundreds of replicas) each
#: expert's counts past a few are valued as their best (:func:`_saturated`), which keeps
#: the floor valid, looser, and the work ``batches x experts x replicas x few``.
KNAPSACK_CELLS = 1 << 24

#: ``(batch, place, expert, code)`` of each selection (:func:`round_robin_local`).
Selections = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def round_robin_local(
    at: Selections, num_batches: int, num_places: int, num_experts: int, extra: int,
    weight_us: float, token_us: float, exact: int | None = None,
    dense: tuple[np.ndarray, np.ndarray] | None = None,
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
    ``dense``: :func:`dense_codes` of ``at``'s codes when the caller has them.
    """
    batch, place, expert, code = at
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
    values, index = dense if dense is not None else dense_codes(code)
    span = int(values[-1]) + 1 if values.size else 1
    added = _running_replicas_compute(cell, index, values.size, span, totals, one,
                                      num_batches, num_experts, extra, weight_us,
                                      token_us)  # [B, E, c]
    gain = np.repeat(headroom[:, chosen, None].astype(np.float64), extra + 1, axis=2)
    gain[:, :, 0] = 0.0
    if exact is None:
        exact = extra + 1 if num_places <= EXACT_ALL_PLACES else EXACT_REPLICAS
    cap = _saturation(num_batches, num_experts, extra)
    if cap is not None:  # counts past ``cap`` are valued at their best: no need to count them
        exact = min(exact, cap)
    counts = range(2, min(extra + 1, exact) + 1)
    selected = _restricted((batch, place, expert, index), chosen, num_experts)
    for count, (best, spent) in zip(counts, _residue_classes(
            selected, values, counts, num_batches, chosen.size, num_places, weight_us,
            token_us), strict=True):
        gain[:, :, count - 1] = best - alone[:, chosen]
        added[:, chosen, count - 1] = spent - one[:, chosen]
    gain = np.maximum(gain, 0.0)
    added = np.maximum(added, 0.0)
    total = _most_gain(gain, headroom, chosen, extra, cap)
    return alone.sum(axis=1) + total, _least_added(added, extra, cap)


def _saturation(num_batches: int, num_items: int, extra: int) -> int | None:
    """The count past which the knapsacks value an item's replicas at their best
    (:func:`_saturated`), or None when the exact tree of merges fits
    :data:`KNAPSACK_CELLS`."""
    size = extra + 1
    if num_batches * ((num_items + 1) // 2) * size * size <= KNAPSACK_CELLS:
        return None
    return int(min(extra, max(2, KNAPSACK_CELLS // max(1, 4 * num_batches * num_items * size))))


def dense_codes(code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``([J], [n])``: the distinct codes, increasing, and each selection's index among
    them.  Codes are few (a rank's positions, times ``top_k`` at most) but may be spread
    over 32 bits (vLLM's hash): counting per residue class is then done per distinct
    code, once for every replica count."""
    if code.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    low, high = int(code.min()), int(code.max())
    if high - low <= max(4 * code.size, 1 << 16):  # a small range: counted, not sorted
        seen = np.zeros(high - low + 1, dtype=bool)
        seen[code - low] = True
        values = np.flatnonzero(seen)
        where = np.cumsum(seen) - 1
        return values + low, where[code - low]
    values, index = np.unique(code, return_inverse=True)
    return values, index.reshape(-1)


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
    renumbered = index[expert]
    if chosen.size == num_experts:  # every expert: every selection
        return batch, place, renumbered, code
    keep = renumbered >= 0
    return batch[keep], place[keep], renumbered[keep], code[keep]


def _running_replicas_compute(
    cell: np.ndarray, index: np.ndarray, num_codes: int, span: int, totals: np.ndarray,
    one: np.ndarray, num_batches: int, num_experts: int, extra: int, weight_us: float,
    token_us: float,
) -> np.ndarray:
    """``[B, E, extra + 1]`` least compute ``c`` replicas of each expert add over one
    (column ``c - 1``; column 0 is 0), from the replicas that surely run: at least
    ``ceil(D / ceil(K / c))`` of them, ``D`` the distinct codes of the expert's
    selections and ``K`` the codes' range ``span`` (a residue class holds at most
    ``ceil(K / c)`` codes).  Every expert, every count; counted exactly later for the
    chosen ones.  ``cell``: ``batch x E + expert`` of each selection; ``index``: its
    code among the ``num_codes`` distinct ones (:func:`dense_codes`)."""
    if num_batches * num_experts * num_codes <= ROUND_ROBIN_CELLS:
        seen = np.bincount(cell * num_codes + index,
                           minlength=num_batches * num_experts * num_codes)
        codes = (seen.reshape(num_batches, num_experts, num_codes) > 0).sum(axis=2)
    else:
        distinct = np.unique(cell * num_codes + index) // num_codes
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
    selected: Selections, values: np.ndarray, counts: range, num_batches: int, width: int,
    num_places: int, weight_us: float, token_us: float,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each replica count in ``counts``, ``([B, W], [B, W])`` with that many replicas
    of each of the ``width`` chosen experts: the most selections served where they arise
    (``f(count)``), and the compute of the replicas whose residue class has a selection,
    microseconds.  ``selected``'s codes index ``values`` (:func:`dense_codes`).

    The selections are counted once per (batch, expert, distinct code, place); each
    count's classes are then sums of those counts (:func:`_class_sums`, exact integers).
    When those counts would be sparse (more than :data:`RESIDUE_SPARSE` cells a
    selection, as with many places) or many, one pass over the selections per count."""
    b, x, e, j = selected
    cells = num_batches * width * values.size * num_places
    if not counts:
        return []
    if cells > min(RESIDUE_CELLS, RESIDUE_SPARSE * b.size) or b.size >= 1 << 24:
        base = b * width + e
        return [_residue_classes_of(base, x, (values % count)[j], count, (num_batches, width),
                                    num_places, weight_us, token_us) for count in counts]
    rows = num_batches * width
    # [codes, X x B x W]: the selections of each code from each place, each (batch, expert)
    per_code = np.bincount((j * num_places + x) * rows + b * width + e,
                           minlength=cells).astype(np.int32).reshape(values.size, num_places * rows)
    out = []
    for count, classes in zip(counts, _class_sums(per_code, values, counts), strict=True):
        classes = classes.reshape(count, num_places, rows)
        # [B, W, count] laid out as before, so the compute sums over classes alike
        runs = np.ascontiguousarray(classes.sum(axis=1).T).reshape(
            num_batches, width, count).astype(np.float64)
        spent = np.where(runs > 0, np.maximum(weight_us, runs * token_us), 0.0)
        best = classes.max(axis=1).sum(axis=0, dtype=np.int64).reshape(num_batches, width)
        out.append((best, spent.sum(axis=2)))
    return out


def _class_sums(per_code: np.ndarray, values: np.ndarray, counts: range) -> list[np.ndarray]:
    """For each count of ``counts``, ``[count, N]`` the rows of ``per_code`` (``[J, N]``,
    one per distinct code of ``values``) summed per residue class ``code mod count``:
    row by row (exact integer sums, no BLAS), each count's classes from those of a
    multiple already summed when there is one (``i mod c`` of classes ``mod m``)."""
    done: dict[int, np.ndarray] = {}
    for count in sorted(counts, reverse=True):
        multiple = min((m for m in done if m % count == 0), default=None)
        rows, residue = ((per_code, values % count) if multiple is None
                         else (done[multiple], np.arange(multiple) % count))
        sums = np.zeros((count, per_code.shape[1]), dtype=per_code.dtype)
        for row, r in zip(rows, residue.tolist(), strict=True):
            sums[r] += row
        done[count] = sums
    return [done[count] for count in counts]


def _residue_classes_of(
    base: np.ndarray, place: np.ndarray, residue: np.ndarray, count: int,
    shape: tuple[int, int], num_places: int, weight_us: float, token_us: float,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_residue_classes` of one ``count`` by one pass over the selections, each
    given as its (batch, expert) row ``base``, its place and its code's ``residue``;
    ``shape``: ``(B, W)``."""
    m = np.bincount((base * count + residue) * num_places + place,
                    minlength=shape[0] * shape[1] * count * num_places)
    m = m.reshape(*shape, count, num_places)
    runs = m.sum(axis=3)
    spent = np.where(runs > 0, np.maximum(weight_us, runs * token_us), 0.0)
    return m.max(axis=3).sum(axis=2), spent.sum(axis=2)


def _combined(items: np.ndarray, best: str) -> np.ndarray:
    """``[B, c]``: the ``[B, n, c]`` items' vectors (value of an item taking exactly
    ``u`` replicas) combined into the value of exactly ``j`` replicas over all items,
    ``best`` ``"max"`` or ``"min"`` of the sums: the knapsack's recurrence, done on pairs
    of items at once (a tree of merges; a sum of the same terms, so the same optimum)."""
    size = items.shape[2]
    empty = -np.inf if best == "max" else np.inf
    pick = np.maximum if best == "max" else np.minimum
    level = np.moveaxis(items, 2, 0)  # [c, B, n]: each count's values contiguous
    while level.shape[2] > 1:
        if level.shape[2] % 2:  # an item with no value: zero replicas, nothing else
            identity = np.full((size, level.shape[1], 1), empty)
            identity[0] = 0.0
            level = np.concatenate([level, identity], axis=2)
        first = np.ascontiguousarray(level[:, :, 0::2])
        second = np.ascontiguousarray(level[:, :, 1::2])
        # value of j = the best over u <= j of first[j - u] + second[u]: one shifted sum
        # per u, each the same two terms the recurrence adds (so the same optimum)
        merged = first + second[0]
        for u in range(1, size):
            pick(merged[u:], first[:size - u] + second[u], out=merged[u:])
        level = merged
    return np.ascontiguousarray(level[:, :, 0].T)


def _saturated(items: np.ndarray, best: str, cap: int) -> np.ndarray:
    """``[B, c]``: :func:`_combined` relaxed for large counts, each item's count ``cap``
    standing for ``cap`` *or more* replicas at the best of its values there (the most
    gain, the least compute: a floor built on it stays valid).  A merge of two such items
    is again one (its ``cap`` the sum of theirs: past it, every pair of shares is one
    the merge has already counted), so the tree of merges holds
    ``[B, pairs, c_a + c_b + 1, c_a + c_b + 1]`` cells, merged a few pairs at a time."""
    num_batches, _, size = items.shape
    pick = np.max if best == "max" else np.min
    tail = pick(items[:, :, cap:], axis=2)
    parts = np.concatenate([items[:, :, :cap], tail[:, :, None]], axis=2)  # [B, n, cap + 1]
    empty = -np.inf if best == "max" else np.inf
    while parts.shape[1] > 1:
        if parts.shape[1] % 2:  # an item with no value: zero replicas, nothing else
            identity = np.full((num_batches, 1, parts.shape[2]), empty)
            identity[:, :, 0] = 0.0
            parts = np.concatenate([parts, identity], axis=1)
        support = parts.shape[2] - 1  # every item of a level has the same cap
        top = min(2 * support, size - 1)
        j = np.arange(top + 1)[:, None]
        u = np.arange(top + 1)[None, :]
        first_at = np.minimum(j - u, support)  # [j, u]; u > j is no share
        second_at = np.minimum(u, support)
        valid = u <= j
        pairs = parts.shape[1] // 2
        merged = np.empty((num_batches, pairs, top + 1))
        step = max(1, KNAPSACK_CELLS // max(1, num_batches * (top + 1) ** 2))
        for start in range(0, pairs, step):
            a = parts[:, 2 * start:2 * (start + step):2]
            b = parts[:, 2 * start + 1:2 * (start + step):2]
            sums = a[:, :, np.where(valid, first_at, 0)] + b[:, :, second_at]
            sums = np.where(valid, sums, empty)
            merged[:, start:start + a.shape[1]] = pick(sums, axis=3)
        parts = merged
    out = parts[:, 0]
    if out.shape[1] < size:  # past the last cap every count is the cap's value
        out = np.concatenate([out, np.repeat(out[:, -1:], size - out.shape[1], axis=1)],
                             axis=1)
    result: np.ndarray = out
    return result


def _most_gain(gain: np.ndarray, headroom: np.ndarray, chosen: np.ndarray,
               extra: int, cap: int | None = None) -> np.ndarray:
    """``[B]`` the most local selections ``extra`` replicas add: a multiple-choice
    knapsack over the chosen experts (``gain``: ``[B, W, c]``, column 0 zero), the others
    gaining at most their ``headroom`` (``[B, E]``) each."""
    num_batches, num_experts = headroom.shape
    # best gain with <= j replicas (integer counts: the merges' sums are exact)
    combined = _combined(gain, "max") if cap is None else _saturated(gain, "max", cap)
    budget = np.maximum.accumulate(combined, axis=1)
    others = np.ones(num_experts, dtype=bool)
    others[chosen] = False
    rest = -np.sort(-headroom[:, others], axis=1)[:, :extra]
    prefix = np.concatenate([np.zeros((num_batches, 1)), rest.cumsum(axis=1)], axis=1)
    spent = np.arange(prefix.shape[1])
    return (budget[:, extra - spent] + prefix).max(axis=1)


def _least_added(added: np.ndarray, extra: int, cap: int | None = None) -> np.ndarray:
    """``[B]`` the least compute exactly ``extra`` replicas add over one per expert
    (``added``: ``[B, E, c]``, column 0 zero, a knapsack over every expert; past ``cap``
    replicas an expert's least added compute stands for every larger count)."""
    combined = _combined(added, "min") if cap is None else _saturated(added, "min", cap)
    return combined[:, extra]
