"""A new layout of a layer, moved as little as possible from the deployed one.

A layout produced without regard to what is deployed (EPLB's, a fresh plan's) numbers its
GPUs arbitrarily: which GPU serves a given set of experts is a free choice among GPUs that
are alike.  :func:`align_row` renumbers the new layout's GPUs to keep as many (expert, GPU)
pairs of the deployed layout as it can: nodes matched to nodes first (when every node is
alike), then the GPUs within each node, each an assignment problem on the experts both
share.  GPUs are alike when they have the same GPU type and the same links; the layout
each GPU serves is unchanged, only where it lives.  Within a GPU, an expert it keeps keeps
its slot (:func:`keep_slots`, as vLLM's default policy preserves intra-GPU slots): only the
slots of experts a GPU gains are written.
"""

from __future__ import annotations

import numpy as np
from ortools.graph.python import linear_sum_assignment

from placer.topology import Topology


def align_row(new_row: np.ndarray, current_row: np.ndarray, num_experts: int,
              topology: Topology) -> np.ndarray:
    """``new_row`` (``[P]`` physical_to_logical of one layer) with its GPUs renumbered
    to keep most of ``current_row``'s (expert, GPU) pairs (module docstring)."""
    num_gpus = topology.num_gpus
    slots = new_row.size // num_gpus
    new_bins = np.asarray(new_row, dtype=np.int64).reshape(num_gpus, slots)
    on_new = _holds(new_bins, num_experts)
    on_cur = _holds(np.asarray(current_row, dtype=np.int64).reshape(num_gpus, slots),
                    num_experts)
    kind = _kinds(topology)
    node = np.asarray(topology.node_of_gpu, dtype=np.int64)
    members = [np.flatnonzero(node == n) for n in range(int(node.max()) + 1)]
    signature = [sorted(kind[m].tolist()) for m in members]
    pairs = [(n, n) for n in range(len(members))]
    if all(s == signature[0] for s in signature):
        node_new = np.stack([on_new[:, m].any(axis=1) for m in members], axis=1)
        node_cur = np.stack([on_cur[:, m].any(axis=1) for m in members], axis=1)
        pairs = _assign(node_new.T.astype(np.int64) @ node_cur.astype(np.int64))
    out = new_bins.copy()
    for a, b in pairs:
        src, dst = members[a], members[b]
        for k in np.unique(kind[src]):
            g_new, g_cur = src[kind[src] == k], dst[kind[dst] == k]
            overlap = on_new[:, g_new].T.astype(np.int64) @ on_cur[:, g_cur].astype(np.int64)
            for i, j in _assign(overlap):
                out[g_cur[j]] = new_bins[g_new[i]]
    # nodes matched on what they share as nodes: keep the numbering as given when that
    # keeps more pairs
    kept = int((_holds(out, num_experts) & on_cur).sum())
    best = out.reshape(-1) if kept >= int((on_new & on_cur).sum()) else new_bins.reshape(-1)
    return keep_slots(best, current_row, num_gpus)


def keep_slots(new_row: np.ndarray, current_row: np.ndarray, num_gpus: int) -> np.ndarray:
    """``new_row`` (``[P]``) with each GPU's slots reordered so that an expert the GPU
    holds in ``current_row`` too keeps the slot it had (as many of its replicas on that
    GPU as both hold); the GPU's other experts fill its remaining slots in their order.

    The same experts on the same GPUs, so the same layout and the same moves; only the
    slots whose expert changes need new weights.

    >>> keep_slots(np.array([5, 1, 2, 3]), np.array([1, 9, 3, 4]), 2).tolist()
    [1, 5, 3, 2]
    """
    new = np.asarray(new_row, dtype=np.int64).reshape(num_gpus, -1)
    current = np.asarray(current_row, dtype=np.int64).reshape(num_gpus, -1)
    # each slot's key: (GPU, expert, which of the GPU's replicas of it), so duplicates
    # match one for one
    top = int(max(new.max(), current.max())) + 1
    new_key, cur_key = _replica_keys(new, top), _replica_keys(current, top)
    kept = np.isin(cur_key, new_key)  # [G, S] slots whose expert stays
    fresh = ~np.isin(new_key, cur_key)  # [G, S] the experts each GPU gains, in order
    out = np.where(kept, current, -1)
    out[~kept] = new[fresh]  # row-major: each GPU's free slots, its gains in order
    return out.reshape(-1)


def _replica_keys(bins: np.ndarray, top: int) -> np.ndarray:
    """``[G, S]`` int64: a key per slot naming its GPU, its expert (below ``top``) and
    which of the GPU's replicas of that expert it is (0 for the first slot holding it, 1
    for the second)."""
    gpus, slots = bins.shape
    flat = (np.arange(gpus)[:, None] * top + bins).reshape(-1)
    order = np.argsort(flat, kind="stable")
    ranked = flat[order]
    start = np.r_[0, np.flatnonzero(ranked[1:] != ranked[:-1]) + 1]
    nth = np.arange(flat.size) - np.repeat(start, np.diff(np.r_[start, flat.size]))
    rank = np.empty_like(nth)
    rank[order] = nth
    return (flat * slots + rank).reshape(gpus, slots)


def _holds(bins: np.ndarray, num_experts: int) -> np.ndarray:
    """``[E, G]`` bool: GPU g holds expert e."""
    on = np.zeros((num_experts, bins.shape[0]), dtype=bool)
    on[bins, np.arange(bins.shape[0])[:, None]] = True
    return on


def _kinds(topology: Topology) -> np.ndarray:
    """``[G]`` int64: GPUs with the same number are alike (GPU type and own links)."""
    keys = [(t.name, tuple(np.round(topology.injection_gbps[g], 6).tolist()),
             tuple(topology.link_kind[g].tolist()) if topology.link_kind.size else ())
            for g, t in enumerate(topology.gpu_type_of_gpu)]
    index = {key: i for i, key in enumerate(dict.fromkeys(keys))}
    return np.array([index[key] for key in keys], dtype=np.int64)


def _assign(overlap: np.ndarray) -> list[tuple[int, int]]:
    """``(row, column)`` pairs of a square ``overlap`` matrix with the largest total."""
    n = overlap.shape[0]
    if n == 1:
        return [(0, 0)]
    solver = linear_sum_assignment.SimpleLinearSumAssignment()
    top = int(overlap.max()) if overlap.size else 0
    for i in range(n):
        for j in range(n):
            solver.add_arc_with_cost(i, j, top - int(overlap[i, j]))
    if solver.solve() != solver.OPTIMAL:
        return [(i, i) for i in range(n)]
    return [(i, int(solver.right_mate(i))) for i in range(n)]
