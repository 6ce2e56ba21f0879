"""Exact figures of a placement on aggregated statistics (no batches, no sampling).

These are the closed forms planners optimise; the evaluator reports them too, so a
solver's objective can be checked against the specification for the same placement.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from placer.errors import DataError, PlacementError
from placer.placement import Placement, gpu_loads
from placer.stats import ExpertStats, format_ranges

if TYPE_CHECKING:
    from placer.topology import Topology


def stats_rows(placement: Placement, stats: ExpertStats) -> np.ndarray:
    """``[placement layers]`` int64 row of ``stats`` holding each placement layer.

    Raises PlacementError when the expert counts differ or a layer is missing.
    """
    if placement.num_experts != stats.num_experts:
        raise PlacementError(
            f"the placement is for {placement.num_experts} experts per layer, the routing"
            f" data has {stats.num_experts}",
            hint="use a placement planned for this model",
        )
    index = {int(layer): row for row, layer in enumerate(stats.layer_ids.tolist())}
    missing = [int(i) for i in placement.layer_ids if int(i) not in index]
    if missing:
        raise PlacementError(
            f"the routing data has no layer {format_ranges(np.array(missing))} of the placement",
            hint=f"layers in the routing data: {format_ranges(stats.layer_ids)}",
        )
    return np.array([index[int(i)] for i in placement.layer_ids], dtype=np.int64)


def window_hot_shard(placement: Placement, stats: ExpertStats) -> np.ndarray:
    """Hottest GPU's load per window and layer, each expert's load split evenly over
    its replicas.

    Returns
    -------
    ``[windows, layers]`` float64, tokens: ``max over GPUs of gpu_loads(placement,
    stats.load[w])``, layer columns in the placement's order.  The robust balance
    objective of the planners is ``max`` (or ``mean``) of this over windows, per layer.
    """
    rows = stats_rows(placement, stats)
    load = stats.load[:, rows]
    out: np.ndarray = gpu_loads(placement, load).max(axis=2)
    return out


def expected_remote_copies(
    placement: Placement, stats: ExpertStats, topology: Topology
) -> np.ndarray:
    """Expected deliveries per token off the source GPU and off the source node, in the
    ``normal`` communication mode, from loads and co-activation.

    Assumptions: the source rank is uniform over the GPUs and independent of routing;
    each selection picks one of its expert's replicas uniformly and independently (the
    ``random`` policy; ``round_robin`` in expectation).  With ``f[e, g] = 1 / r_e`` when
    GPU g holds a replica of expert e (``r_e`` replicas), ``F[e, n] = sum of f[e, g]
    over GPUs g of node n``, ``G_n`` GPUs in node n and ``T`` tokens::

        gpu  = [(1 - 1/G) * (sum_e load_e  -  sum_{i<j} coact_ij * sum_g f_ig f_jg)] / T
        node = [sum_e load_e sum_n F_en w_n  -  sum_{i<j} coact_ij sum_n F_in F_jn w_n] / T
        w_n  = 1 - G_n / G

    That is inclusion-exclusion truncated after pairs: exact when a token selects at
    most two experts per layer (``top_k <= 2``), a lower bound otherwise (Bonferroni),
    close when three experts of one token rarely share a GPU.  Loads and co-activation
    are taken over all windows.

    Returns
    -------
    ``[layers, 2]`` float64: column 0 remote GPUs per token, column 1 remote nodes per
    token, layers in the placement's order.

    Raises DataError when the statistics carry no co-activation.
    """
    shares = _dispatch_shares(placement, stats, topology)
    return _pairwise(shares, max(stats.total_tokens, 1), placement.num_gpus)


def _pairwise(shares: tuple[np.ndarray, ...], tokens: int, num_gpus: int) -> np.ndarray:
    """``[layers, 2]`` the closed form of :func:`expected_remote_copies` from
    :func:`_dispatch_shares`."""
    load, coact, f, f_node, w = shares
    shared_gpu = np.einsum("lig,ljg->lij", f, f)
    pairs_gpu = 0.5 * (coact * shared_gpu).sum(axis=(1, 2))
    gpu = (1.0 - 1.0 / num_gpus) * (load.sum(axis=1) - pairs_gpu) / tokens

    singles_node = (load * (f_node @ w)).sum(axis=1)
    shared_node = np.einsum("lin,ljn,n->lij", f_node, f_node, w)
    pairs_node = 0.5 * (coact * shared_node).sum(axis=(1, 2))
    node = (singles_node - pairs_node) / tokens
    return np.stack([gpu, node], axis=1)


def remote_copy_bounds(
    placement: Placement, stats: ExpertStats, topology: Topology
) -> np.ndarray:
    """Lower and upper bounds on the deliveries per token off the source GPU and node
    (``normal`` mode), valid for every routing that has these loads and pair counts.

    Aggregated statistics give single and pair frequencies only; how often three or more
    experts of one token meet on one GPU is unknown, so the expected number of GPUs (or
    nodes) a token touches is only bracketed.  With ``A_i`` the event "the token selects
    expert ``i`` and sends it to this GPU" (``P = load_i f_ig / T``, pairs
    ``coact_ij f_ig f_jg / T``, replicas chosen independently):

    - lower: ``sum P(A_i) - sum_{i<j} P(A_i A_j)`` (Bonferroni; the closed form of
      :func:`expected_remote_copies`), less the pair mass the counts miss (partial,
      thresholded counts: ``top_k (top_k - 1) / 2`` pairs per token minus those counted,
      any of which could share a GPU), and never below the likeliest single expert per
      GPU;
    - upper: ``sum P(A_i) - sum over the edges of a maximum-weight spanning tree of the
      pair probabilities`` (Hunter's bound, the tightest of the tree bounds), at most 1
      per GPU or node.

    Both are weighted as in :func:`expected_remote_copies` (``1 - 1/G`` per GPU,
    ``1 - G_n / G`` per node).  The lower bound is exact when no three experts of a
    token share a GPU (always for ``top_k <= 2``); the upper one is exact when, besides,
    the co-activated pairs on each GPU form a forest.

    Returns
    -------
    ``[layers, 2, 2]`` float64: ``[layer, gpu|node, lower|upper]``, layers in the
    placement's order.

    Raises DataError when the statistics carry no co-activation.
    """
    tokens = max(stats.total_tokens, 1)
    num_gpus = placement.num_gpus
    shares = _dispatch_shares(placement, stats, topology)
    load, coact, f, f_node, w = shares
    lower = _pairwise(shares, tokens, num_gpus)
    upper = np.zeros_like(lower)
    k = max(stats.top_k, 1)
    counted = np.triu(coact, k=1).sum(axis=(1, 2))  # [L]
    missing = np.maximum(load.sum(axis=1) / k * (k * (k - 1) / 2) - counted, 0.0) / tokens
    lower[:, 0] -= (1.0 - 1.0 / num_gpus) * missing
    lower[:, 1] -= w.max() * missing
    single = load[:, :, None] * f  # [L, E, G]
    single_node = load[:, :, None] * f_node  # [L, E, N]
    lower[:, 0] = np.maximum(lower[:, 0],
                             (1.0 - 1.0 / num_gpus) * single.max(axis=1).sum(axis=1) / tokens)
    lower[:, 1] = np.maximum(lower[:, 1], (single_node.max(axis=1) @ w) / tokens)
    for layer in range(placement.num_layers):
        touched = sum(  # P(token touches g), at most 1
            min(float(single[layer, :, g].sum()) - _max_spanning_tree(coact[layer],
                                                                       f[layer, :, g]),
                float(tokens))
            for g in range(num_gpus))
        upper[layer, 0] = (1.0 - 1.0 / num_gpus) * touched / tokens
        node_sum = 0.0
        for n in range(w.size):
            if w[n] <= 0:
                continue
            share = f_node[layer, :, n]
            node_sum += w[n] * min(float(single_node[layer, :, n].sum())
                                   - _max_spanning_tree(coact[layer], share), float(tokens))
        upper[layer, 1] = node_sum / tokens
    return np.stack([lower, upper], axis=2)


def _dispatch_shares(
    placement: Placement, stats: ExpertStats, topology: Topology
) -> tuple[np.ndarray, ...]:
    """``load [L, E]``, ``coact [L, E, E]`` (float64, placement's layers), the share of
    each expert's selections sent to each GPU ``f [L, E, G]`` and node
    ``f_node [L, E, N]``, and each node's chance of not being the source ``w [N]``.

    Raises DataError when the statistics carry no co-activation."""
    rows = stats_rows(placement, stats)  # a placement that does not fit is reported first
    if stats.coact is None:
        raise DataError(
            "the routing data has no co-activation counts",
            hint="read a per-token trace (co-activation is counted by default)",
        )
    load = stats.mean_load[rows].astype(np.float64)
    coact = stats.coact[rows].astype(np.float64)
    f = placement.expert_gpu_mask / placement.replica_counts[:, :, None]
    node_of_gpu = np.asarray(topology.node_of_gpu, dtype=np.int64)
    onehot = np.eye(int(node_of_gpu.max()) + 1)[node_of_gpu]  # [G, N]
    w = 1.0 - onehot.sum(axis=0) / placement.num_gpus
    return load, coact, f, f @ onehot, w


def _max_spanning_tree(coact: np.ndarray, share: np.ndarray) -> float:
    """Weight of a maximum spanning tree (Prim) of ``coact[i, j] share_i share_j`` over
    the experts with ``share > 0``."""
    members = np.flatnonzero(share > 0)
    if members.size < 2:
        return 0.0
    weight = coact[np.ix_(members, members)] * np.outer(share[members], share[members])
    best = weight[0].copy()
    in_tree = np.zeros(members.size, dtype=bool)
    in_tree[0] = True
    total = 0.0
    for _ in range(members.size - 1):
        candidates = np.where(in_tree, -np.inf, best)
        nxt = int(np.argmax(candidates))
        total += float(candidates[nxt])
        in_tree[nxt] = True
        best = np.maximum(best, weight[nxt])
    return total
