"""A new layout of a layer, moved as little as possible from the deployed one.

A layout produced without regard to what is deployed (EPLB's, a fresh plan's) numbers its
GPUs arbitrarily: which GPU serves a given set of experts is a free choice among GPUs that
are alike.  :func:`align_row` renumbers the new layout's GPUs to keep as many (expert, GPU)
pairs of the deployed layout as it can: nodes matched to nodes first (when every node is
alike), then the GPUs within each node, each an assignment problem on the experts both
share.  GPUs are alike when they have the same GPU type and the same links; the layout
each GPU serves is unchanged, only where it lives.
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
    return out.reshape(-1) if kept >= int((on_new & on_cur).sum()) else new_bins.reshape(-1)


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
