"""Plackett-Luce sampling of each token's top-k experts, vectorized over tokens.

Picking ``k`` experts one after another without replacement, each with probability
proportional to its weight among those left, is the same law as keeping the first ``k``
distinct ids of i.i.d. draws with replacement.  :func:`route` draws with replacement
through an inverse-CDF guide table (:func:`inverse_cdf`), keeps the first distinct ids
(:func:`first_distinct`), and finishes the few tokens whose draws held too few with an
exact exponential race (:func:`finish_race`).  Group-limited routing (DeepSeek-V3) reads
its groups from the same draws.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from placer.traces.synth.params import SynthParams

__all__ = ["MAX_DRAWS", "finish_race", "first_distinct", "first_mask", "inverse_cdf", "route"]

#: Guide-table bins per distribution entry (more bins: fewer correction passes).
GUIDE_BINS_PER_ENTRY = 2
#: Draw positions are packed in 6 bits next to the id when removing duplicates.
MAX_DRAWS = 64


def route(
    w: np.ndarray, dist: np.ndarray, params: SynthParams, rng: np.random.Generator
) -> np.ndarray:
    """Top-k experts ``[tokens, k]`` of each token under group-limited Plackett-Luce.

    One sequence of i.i.d. draws from ``w[dist]`` per token serves both stages: the
    first ``top_groups`` distinct groups of the sequence are a Plackett-Luce draw of
    groups by total weight; the draws after the one that completed the groups are
    i.i.d. again, and those inside the chosen groups are draws from the restricted law,
    whose first ``k`` distinct ids are the token's experts.
    """
    n, e = dist.size, params.num_experts
    n_groups, m, k = params.num_groups, params.top_groups, params.top_k
    per_group = e // n_groups
    grouped = n_groups > 1
    n_draws = min(2 * k + 8 + (3 * m if grouped else 0), MAX_DRAWS)
    u = rng.random((n, n_draws))
    draws = inverse_cdf(w, np.broadcast_to(dist[:, None], u.shape), u)
    allowed = np.ones((n, n_groups), dtype=bool)
    valid = None
    groups_found = np.full(n, m)
    if grouped:
        # Step 3: the first m distinct groups, and the draw that completed them.
        group_of = draws // per_group
        group_first = first_mask(group_of, n_groups)
        seen = np.cumsum(group_first, axis=1)
        groups_found = np.minimum(seen[:, -1], m)
        done_at = np.argmax(seen >= m, axis=1)
        allowed = np.zeros((n, n_groups), dtype=bool)
        r_idx, c_idx = np.nonzero(group_first & (seen <= m))
        allowed[r_idx, group_of[r_idx, c_idx]] = True
        after = np.arange(n_draws)[None, :] > done_at[:, None]
        valid = after & np.take_along_axis(allowed, group_of, axis=1)
        valid &= (groups_found == m)[:, None]
        short_groups = np.flatnonzero(groups_found < m)
        if short_groups.size:
            # Rare: the draws held fewer than m groups; finish the groups by a race.
            group_w = w[dist[short_groups]].reshape(-1, n_groups, per_group).sum(axis=2)
            # The groups found so far come first (ascending id); the rest is ignored.
            have = np.argsort(~allowed[short_groups], axis=1, kind="stable")[:, :m]
            full = finish_race(
                group_w, np.ones_like(group_w, dtype=bool), have, groups_found[short_groups], rng
            )
            sub = np.zeros((short_groups.size, n_groups), dtype=bool)
            np.put_along_axis(sub, full, True, axis=1)
            allowed[short_groups] = sub
    # Step 4: the first k distinct experts among the valid draws.
    chosen, found = first_distinct(draws, k, e, valid)
    # Step 5: tokens short of k experts finish with an exact exponential race.
    short = np.flatnonzero(found < k)
    if short.size:
        allowed_e = np.repeat(allowed[short], per_group, axis=1)
        chosen[short] = finish_race(w[dist[short]], allowed_e, chosen[short], found[short], rng)
    return chosen


def first_mask(ids: np.ndarray, size: int, valid: np.ndarray | None = None) -> np.ndarray:
    """``[N, M]`` bool: True where a row's id (in ``0..size-1``) first appears, in row order.

    Draws where ``valid`` is False are ignored (never first, and do not hide later copies).
    """
    n, m = ids.shape
    if valid is not None:
        # Ignored draws get ids no real draw has, one per position.
        ids = np.where(valid, ids, size + np.arange(m))
    pos_bits = 6
    # Sorting (id, position) pairs puts each id's first occurrence first among its copies.
    packed = (ids.astype(np.int64) << pos_bits) | np.arange(m)
    packed.sort(axis=1)
    sorted_ids = packed >> pos_bits
    first_sorted = np.ones((n, m), dtype=bool)
    first_sorted[:, 1:] = sorted_ids[:, 1:] != sorted_ids[:, :-1]
    first = np.empty((n, m), dtype=bool)
    np.put_along_axis(first, packed & ((1 << pos_bits) - 1), first_sorted, axis=1)
    if valid is not None:
        first &= valid
    return first


def first_distinct(
    draws: np.ndarray, k: int, size: int, valid: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The first ``k`` distinct ids of each row of ``draws: [N, M]``, in draw order.

    Draws where ``valid`` is False are ignored.  Returns ``chosen [N, k]`` int64
    (-1 padded) and ``found [N]``, how many were found.
    """
    n = draws.shape[0]
    first = first_mask(draws, size, valid)
    seen = np.cumsum(first, axis=1)
    keep = first & (seen <= k)
    found = np.minimum(seen[:, -1], k)
    chosen = np.full((n, k), -1, dtype=np.int64)
    r_idx, c_idx = np.nonzero(keep)
    chosen[r_idx, seen[r_idx, c_idx] - 1] = draws[r_idx, c_idx]
    return chosen, found


def inverse_cdf(weights: np.ndarray, table: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Ids ``i`` with ``cdf[table, i-1] <= u < cdf[table, i]``, through a guide table.

    Parameters
    ----------
    weights: ``[tables, size]`` positive weights of each distribution.
    table: int array, which distribution each draw uses.
    u: uniforms in ``[0, 1)``, same shape as ``table``.
    """
    n_tables, size = weights.shape
    cdf = np.cumsum(weights, axis=1)
    cdf /= cdf[:, -1:]
    cdf[:, -1] = 1.5  # above every u < 1: the last entry catches rounding
    bins = GUIDE_BINS_PER_ENTRY * size
    edges = np.arange(bins) / bins
    # guide[t, b]: first id whose cdf exceeds b / bins (one sorted search over all tables,
    # each shifted by 2 t so the tables stay apart).
    shift = 2.0 * np.arange(n_tables)[:, None]
    guide = np.searchsorted((cdf + shift).ravel(), (edges[None, :] + shift).ravel(), "right")
    guide = guide.reshape(n_tables, bins) - np.arange(n_tables)[:, None] * size
    flat_t = table.ravel()
    flat_u = u.ravel()
    idx = guide[flat_t, np.minimum((flat_u * bins).astype(np.int64), bins - 1)]
    cdf_flat = cdf.ravel()
    base = flat_t * size
    todo = np.flatnonzero(cdf_flat[base + idx] <= flat_u)
    while todo.size:
        idx[todo] += 1
        todo = todo[cdf_flat[base[todo] + idx[todo]] <= flat_u[todo]]
    return idx.reshape(u.shape)


def finish_race(
    weights: np.ndarray,
    allowed: np.ndarray,
    chosen: np.ndarray,
    found: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """Complete rows of ``chosen`` after ``found`` ids by an exponential race.

    Keys ``Exp(1) / w`` in increasing order give a Plackett-Luce order; ids already
    chosen and ids not ``allowed`` get an infinite key.
    """
    keys = rng.standard_exponential(weights.shape) / weights
    keys[~allowed] = np.inf
    rows = np.arange(chosen.shape[0])
    for slot in range(chosen.shape[1]):
        have = found > slot
        keys[rows[have], chosen[have, slot]] = np.inf
    need = min(chosen.shape[1], keys.shape[1])
    order = np.argpartition(keys, np.arange(need), axis=1)[:, :need]
    slot = np.arange(chosen.shape[1])[None, :] - found[:, None]
    fill = np.take_along_axis(order, np.maximum(slot, 0), axis=1)
    return np.where(slot >= 0, fill, chosen)
