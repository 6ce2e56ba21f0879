"""One layer's moves, greedily, and the moves of all layers within a budget.

A *move* loads one expert's weights onto one GPU: a swap of two experts between two GPUs
is two moves, giving a hot expert a replica in the slot of an expert that keeps another
is one.  :func:`improve_layer` takes, from the deployed layout of one layer, the move
worth most on the window's load (what it takes off the hottest GPU, in µs of serving
over the policy's horizon, less what its copy costs: :class:`MoveWorth`), repeated while
the hottest GPU gets cooler; :func:`allocate` then takes the moves of all layers best
gain per move first within the budget.  A move rewrites one slot (a replica) or two (a
swap): every other slot keeps its expert.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

#: A move must lower the hottest GPU's load by at least this share of the mean GPU load.
MIN_GAIN = 1e-3
#: Coldest GPUs a hot GPU's experts are tried against, per move.
COLD_CANDIDATES = 4


@dataclass(frozen=True)
class LayerPlan:
    """One layer's proposed moves, cumulatively: after the ``i``-th, the row is
    ``rows[i]``, the moves made ``moves[i]``, the hottest GPU's load ``peak[i]``
    (``peak[0]``, ``moves[0] = 0``, ``rows[0]``: as deployed)."""

    rows: list[np.ndarray]
    moves: list[int]
    peak: list[float]
    mean: float


@dataclass(frozen=True)
class MoveWorth:
    """What a move of one layer is worth and what it costs, in µs of serving, so that
    the greedy takes the move that pays most rather than the one that evens most.

    Attributes
    ----------
    us_per_load: µs of serving saved over the policy's horizon per selection taken off
        the hottest GPU (the layer's time is about proportional to its hottest GPU).
    copy_us: ``[E, G]`` µs the copy of expert ``e`` onto GPU ``g`` costs the serving: over
        the node's fabric when a GPU of ``g``'s node holds ``e``, else over its NIC.
    """

    us_per_load: float
    copy_us: np.ndarray


def improve_layer(row: np.ndarray, weight: np.ndarray, num_gpus: int,
                  max_moves: int | None = None, worth: MoveWorth | None = None) -> LayerPlan:
    """Moves that lower the hottest GPU's load of one layer, greedily (module docstring).

    ``row``: ``[P]`` the deployed physical_to_logical; ``weight``: ``[E]`` the window's
    load.  A GPU's load is the sum over its slots of the expert's load over its replica
    count (round robin's even split).  ``worth``: each step takes the move whose saving
    minus its copy is largest, and stops when none pays; None: the move that lowers the
    hottest GPU most (moves free).
    """
    experts = row.astype(np.int64).copy()
    num_experts = weight.size
    slots = experts.size // num_gpus
    gpu_of_slot = np.arange(experts.size) // slots
    count = np.bincount(experts, minlength=num_experts).astype(np.float64)
    plan = LayerPlan([experts.copy()], [0], [], float(weight.sum()) / num_gpus)
    load = np.bincount(gpu_of_slot, weights=weight[experts] / count[experts],
                       minlength=num_gpus)
    plan.peak.append(float(load.max()))
    eps = MIN_GAIN * max(plan.mean, 1e-12)
    moves = 0
    budget = max_moves if max_moves is not None else 8 * experts.size
    while moves < budget:
        step = _best_step(experts, weight, count, load, gpu_of_slot, num_gpus, slots, eps,
                          budget - moves, worth)
        if step is None:
            break
        experts, count, load, cost = step
        moves += cost
        plan.rows.append(experts.copy())
        plan.moves.append(moves)
        plan.peak.append(float(load.max()))
    return plan


def _best_step(experts: np.ndarray, weight: np.ndarray, count: np.ndarray, load: np.ndarray,
               gpu_of_slot: np.ndarray, num_gpus: int, slots: int, eps: float,
               left: int, worth: MoveWorth | None,
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
    """The candidate move worth most (:func:`improve_layer`; None when none helps): the
    swaps of the hottest GPU's experts with those of the coldest GPUs, and a replica of
    its hottest expert in a cold GPU's slot of an expert that keeps another, all scored
    at once."""
    hot = int(np.argmax(load))
    by_load = np.argsort(load, kind="stable")
    cold = by_load[by_load != hot][:COLD_CANDIDATES]
    if cold.size == 0:
        return None
    share = weight / count
    on = np.zeros((weight.size, num_gpus), dtype=bool)
    on[experts, gpu_of_slot] = True
    scale = worth.us_per_load if worth is not None else 1.0
    hot_slots = hot * slots + np.arange(slots)
    cold_slots = cold[:, None] * slots + np.arange(slots)[None, :]  # [C, S]
    ex, ey = experts[hot_slots], experts[cold_slots]  # [S], [C, S]
    # the highest load of the GPUs other than the hot one and each cold one
    top = by_load[::-1][:3]
    rest = np.array([float(load[next((g for g in top if g not in (hot, c)), hot)])
                     if num_gpus > 2 else 0.0 for c in cold])
    best_swap = best_rep = (-np.inf, 0.0, (0, 0), cold.size)
    if left >= 2:
        diff = share[ex][None, :, None] - share[ey][:, None, :]  # [C, S, S] hot loses
        ok = (~on[ex][:, cold].T)[:, :, None] & (~on[ey, hot])[:, None, :] & (diff > 0)
        if ok.any():
            peak = np.maximum(np.maximum(load[hot] - diff, load[cold][:, None, None] + diff),
                              rest[:, None, None])
            copy = 0.0 if worth is None else np.maximum(
                worth.copy_us[ex][:, cold].T[:, :, None], worth.copy_us[ey, hot][:, None, :])
            score = np.where(ok, (load[hot] - peak) * scale - copy, -np.inf)
            c, i, j = np.unravel_index(int(np.argmax(score)), score.shape)
            best_swap = (float(score[c, i, j]), float(peak[c, i, j]),
                         (int(hot_slots[i]), int(cold_slots[c, j])), int(c))
    # a replica of the hot GPU's hottest expert, in a slot of an expert that keeps another
    x = int(ex[np.argmax(share[ex])])
    spare = (count[ey] >= 2) & ~on[x, cold][:, None]  # [C, S]
    if spare.any():
        c_idx, j_idx = np.nonzero(spare)
        new = _replicated_loads(load, on, weight, count, x, cold[c_idx], ey[c_idx, j_idx])
        peaks = new.max(axis=1)
        copy_x = 0.0 if worth is None else worth.copy_us[x, cold[c_idx]]
        scores = (load[hot] - peaks) * scale - copy_x
        k = int(np.argmax(scores))
        best_rep = (float(scores[k]), float(peaks[k]),
                    (int(cold_slots[c_idx[k], j_idx[k]]), x), int(c_idx[k]))
    # the better of both; on a tie, the move of the colder GPU, a swap before a replica
    swap = best_swap[0] > best_rep[0] or (best_swap[0] == best_rep[0]
                                          and best_swap[3] <= best_rep[3])
    score_, peak_, where, _ = best_swap if swap else best_rep
    rest_peak = float(np.delete(load, hot).max()) if num_gpus > 1 else 0.0
    if not np.isfinite(score_) or peak_ > load[hot] - eps or peak_ > max(load[hot], rest_peak):
        return None
    experts = experts.copy()
    if swap:
        a, b = where
        experts[a], experts[b] = experts[b], experts[a]
    else:
        experts[where[0]] = where[1]
    count = np.bincount(experts, minlength=weight.size).astype(np.float64)
    load = np.bincount(gpu_of_slot, weights=weight[experts] / count[experts],
                       minlength=num_gpus)
    return experts, count, load, 2 if swap else 1


def _replicated_loads(load: np.ndarray, on: np.ndarray, weight: np.ndarray,
                      count: np.ndarray, x: int, c: np.ndarray, z: np.ndarray) -> np.ndarray:
    """``[candidates, G]`` GPU loads after each GPU ``c`` gives a slot of its expert ``z``
    (each holding another replica) to expert ``x`` (``on``: ``[E, G]`` which GPUs hold
    which experts)."""
    base = load - on[x] * (weight[x] / count[x] - weight[x] / (count[x] + 1))
    wz, cz = weight[z], count[z]
    new = base[None, :] + on[z] * (wz / (cz - 1) - wz / cz)[:, None]
    new[np.arange(z.size), c] += weight[x] / (count[x] + 1) - wz / (cz - 1)
    return new


def allocate(plans: list[LayerPlan], max_moves: int | None) -> list[int]:
    """How many of each layer's moves to take: best gain per move first, within the
    budget (``None``: all of every layer).  Returns ``[layers]`` an index into each
    plan's steps."""
    if max_moves is None:
        return [len(p.rows) - 1 for p in plans]
    taken = [0] * len(plans)
    heap: list[tuple[float, int]] = []
    for layer, p in enumerate(plans):
        if len(p.rows) > 1:
            heapq.heappush(heap, (-_rate(p, 0), layer))
    left = max_moves
    while heap:
        _, layer = heapq.heappop(heap)
        p, i = plans[layer], taken[layer]
        cost = p.moves[i + 1] - p.moves[i]
        if cost > left:
            continue  # this layer's next step does not fit; others may
        left -= cost
        taken[layer] = i + 1
        if i + 2 < len(p.rows):
            heapq.heappush(heap, (-_rate(p, i + 1), layer))
    return taken


def _rate(plan: LayerPlan, i: int) -> float:
    """Gain per move of a layer's ``i``-th step: the hottest GPU's drop over the mean
    GPU load (comparable across layers), per move."""
    return (plan.peak[i] - plan.peak[i + 1]) / max(plan.mean, 1e-12) / (
        plan.moves[i + 1] - plan.moves[i])


