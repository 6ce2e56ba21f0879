"""Exact figures of a placement on aggregated statistics (no batches, no sampling).

These are the closed forms planners optimise; the evaluator reports them too, so a
solver's objective can be checked against the specification for the same placement.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from placer.errors import DataError, PlacementError
from placer.placement import Placement, gpu_loads
from placer.stats import ExpertStats, PairCounts, format_ranges

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
    ``normal`` communication mode, from loads and co-activation: the pairwise closed form.

    Assumptions: the source rank is uniform over the GPUs and independent of routing;
    each selection picks one of its expert's replicas uniformly and independently (the
    ``random`` policy; ``round_robin`` in expectation).  With ``f[e, g] = c / r_e`` when
    GPU g holds ``c`` of the ``r_e`` replicas of expert e, ``F[e, n] = sum of f[e, g]
    over GPUs g of node n``, ``G_n`` GPUs in node n and ``T`` tokens::

        gpu  = [(1 - 1/G) * (sum_e load_e  -  sum_{i<j} coact_ij * sum_g f_ig f_jg)] / T
        node = [sum_e load_e sum_n F_en w_n  -  sum_{i<j} coact_ij sum_n F_in F_jn w_n] / T
        w_n  = 1 - G_n / G

    That is inclusion-exclusion truncated after pairs.  It is the expected figure only
    when :func:`pairwise_is_exact` holds (``top_k <= 2`` and every pair counted).  For
    ``top_k > 2`` it counts a triple on one GPU as three saved copies and can fall below
    the truth, even below zero; with partial (thresholded) pair counts it can exceed the
    truth, even the ``G - 1`` (``N - 1``) other GPUs (nodes) there are.  Outside its
    range, show :func:`remote_copy_bounds` instead.  Loads and co-activation are taken
    over all windows of ``stats``; they must cover the same tokens (see
    :func:`remote_copy_bounds`).

    Returns
    -------
    ``[layers, 2]`` float64: column 0 remote GPUs per token, column 1 remote nodes per
    token, layers in the placement's order.

    Raises DataError when the statistics carry no co-activation, or pair counts the
    loads cannot hold.
    """
    shares = _dispatch_shares(placement, stats, topology)
    return _pairwise(shares, placement.num_gpus)


def missing_pairs(stats: ExpertStats) -> np.ndarray:
    """``[layers]`` float64: same-token pairs per layer that the co-activation counts may
    lack, at most (tokens).

    A layer's ``S`` selections, at most ``top_k`` per token, make at most
    ``S (top_k - 1) / 2`` pairs; what the counts hold less than that could be pairs the
    counts left out (thresholded lists) or tokens that selected fewer experts.  Zero when
    every pair is counted.  Raises DataError without co-activation counts.
    """
    k = max(int(stats.top_k), 1)
    counted = _pairs_of(stats).totals().astype(np.float64)
    possible = stats.mean_load.sum(axis=1).astype(np.float64) * (k - 1) / 2
    out: np.ndarray = np.maximum(possible - counted, 0.0)
    return out


def pairwise_is_exact(stats: ExpertStats) -> bool:
    """Whether :func:`expected_remote_copies` is the expected figure (not a bound):
    a token selects at most two experts per layer and no pair is missing from the counts.

    Raises DataError without co-activation counts."""
    if stats.top_k > 2:
        return False
    return bool((missing_pairs(stats) < 0.5).all())


def _pairwise(shares: _Shares, num_gpus: int) -> np.ndarray:
    """``[layers, 2]`` the closed form of :func:`expected_remote_copies` from
    :func:`_dispatch_shares`."""
    tokens = shares.tokens
    shared_gpu = np.einsum("lig,ljg->lij", shares.f, shares.f)
    pairs_gpu = 0.5 * (shares.coact * shared_gpu).sum(axis=(1, 2))
    gpu = (1.0 - 1.0 / num_gpus) * (shares.load.sum(axis=1) - pairs_gpu) / tokens

    singles_node = (shares.load * (shares.f_node @ shares.w)).sum(axis=1)
    shared_node = np.einsum("lin,ljn,n->lij", shares.f_node, shares.f_node, shares.w)
    pairs_node = 0.5 * (shares.coact * shared_node).sum(axis=(1, 2))
    node = (singles_node - pairs_node) / tokens
    return np.stack([gpu, node], axis=1)


def remote_copy_bounds(
    placement: Placement, stats: ExpertStats, topology: Topology
) -> np.ndarray:
    """Lower and upper bounds on the deliveries per token off the source GPU and node
    (``normal`` mode), valid for every routing that has these loads and pair counts.

    Aggregated statistics give single and pair frequencies only; how often three or more
    experts of one token meet on one GPU is unknown, so the expected number of GPUs (or
    nodes) a token touches is only bracketed.  Per GPU ``g`` (node alike), with ``A_i``
    the event "the token selects expert ``i`` and sends it to ``g``" (``P = load_i f_ig /
    T``, pairs ``coact_ij f_ig f_jg / T``, replicas chosen independently) and ``u_g =
    P(union of the A_i)``, the chance that the token touches ``g``:

    - upper ``U_g = min(1, sum_i P(A_i) - a maximum-weight spanning tree of the pair
      probabilities)`` (Hunter's bound, the tightest of the tree bounds; pairs the counts
      lack only lower the tree, so it stays valid for partial counts);
    - floor ``max_i P(A_i)`` (the likeliest expert alone);
    - Bonferroni ``B_g = sum_i P(A_i) - sum_{i<j} P(A_i A_j)``, over the counted pairs
      (the closed form of :func:`expected_remote_copies`), and ``u_g >= min(B_g, U_g) -
      m_g`` where ``m_g`` is the share of the missing pairs (:func:`missing_pairs`) that
      meets on ``g``; the ``m_g`` sum to at most the missing pairs per token ``M``.

    Summed over GPUs, the lower bound is ``max(sum_g floor_g, sum_g max(floor_g,
    min(B_g, U_g)) - M)``, the upper ``sum_g U_g``; both are weighted as in
    :func:`expected_remote_copies` (``1 - 1/G`` per GPU; ``1 - G_n / G`` per node, with
    the largest weight on ``M``).  Pair counts at most the loads (checked) make
    ``floor_g <= U_g``, so every layer's ``0 <= lower <= upper <= G - 1`` (``N - 1``
    for nodes), and the upper bound is at most the selections per token (``top_k``) as
    well.  The lower bound is the closed form when no three experts of a token share a
    GPU and every pair is counted (always exact for complete ``top_k <= 2`` counts); the
    upper one is exact when, besides, the co-activated pairs on each GPU form a forest.

    Loads and pairs must cover the same tokens: ``ExpertStats.select_windows`` keeps the
    co-activation of every window, so pass statistics of all windows, not of a fitted
    subset (a DataError says when the pair counts exceed what the loads can hold).

    Returns
    -------
    ``[layers, 2, 2]`` float64: ``[layer, gpu|node, lower|upper]``, layers in the
    placement's order.

    Raises DataError when the statistics carry no co-activation, or pair counts the
    loads cannot hold.
    """
    num_gpus = placement.num_gpus
    shares = _dispatch_shares(placement, stats, topology)
    tokens = shares.tokens  # [L]
    rows = stats_rows(placement, stats)
    missing = missing_pairs(stats)[rows] / tokens  # [L] pairs per token, at most
    gpu_weight = np.full(num_gpus, 1.0 - 1.0 / num_gpus)
    out = np.zeros((placement.num_layers, 2, 2))
    for column, (share, weight) in enumerate(((shares.f, gpu_weight),
                                              (shares.f_node, shares.w))):
        for layer in range(placement.num_layers):
            lower, upper = _bracket(shares.load[layer], shares.coact[layer], share[layer],
                                    weight, float(tokens[layer]), float(missing[layer]))
            out[layer, column] = (lower, upper)
    return out


def _bracket(load: np.ndarray, coact: np.ndarray, share: np.ndarray, weight: np.ndarray,
             tokens: float, missing: float) -> tuple[float, float]:
    """``(lower, upper)`` of ``sum_d weight_d u_d`` over the destinations ``d`` (GPUs or
    nodes) for one layer (see :func:`remote_copy_bounds`).

    ``load [E]`` and ``coact [E, E]`` in tokens, ``share [E, D]`` the share of each
    expert's selections sent to each destination, ``missing`` pairs per token."""
    single = load[:, None] * share / tokens  # [E, D] P(A_i) at each destination
    pair = np.einsum("ij,id,jd->d", coact, share, share) / (2.0 * tokens)  # counted pairs
    floor = single.max(axis=0)  # [D]
    upper = np.array([min(1.0, float(single[:, d].sum())
                          - _max_spanning_tree(coact, share[:, d]) / tokens)
                      for d in range(share.shape[1])])
    upper = np.maximum(upper, floor)  # equal up to rounding when the pairs fit the loads
    bonferroni = np.minimum(single.sum(axis=0) - pair, upper)
    lower = max(float(weight @ floor),
                float(weight @ np.maximum(floor, bonferroni)) - float(weight.max()) * missing)
    return lower, float(weight @ upper)


class _Shares(NamedTuple):
    """What both remote-copy figures read (see :func:`_dispatch_shares`)."""

    load: np.ndarray  # [L, E] float64 selections per expert, placement's layers
    coact: np.ndarray  # [L, E, E] float64 pair counts, zero diagonal
    f: np.ndarray  # [L, E, G] share of each expert's selections sent to each GPU
    f_node: np.ndarray  # [L, E, N] ... to each node
    w: np.ndarray  # [N] each node's chance of not holding the source rank
    tokens: np.ndarray  # [L] tokens per layer: T, or the hottest expert's load if more


def _dispatch_shares(placement: Placement, stats: ExpertStats, topology: Topology) -> _Shares:
    """Loads, pair counts and dispatch shares of ``placement``'s layers (:class:`_Shares`).

    Tokens per layer are ``T = stats.total_tokens``, raised to the hottest expert's load
    where a rounded token count of aggregated inputs falls short of it (a token selects an
    expert at most once), so no GPU is touched by more than every token.

    Raises DataError when the statistics carry no co-activation, or when a pair is
    counted more often than either expert is selected, or an expert's pairs exceed
    ``top_k - 1`` per selection (loads and pairs not over the same tokens)."""
    rows = stats_rows(placement, stats)  # a placement that does not fit is reported first
    coact = _coact_of(stats, rows)
    load = stats.mean_load[rows].astype(np.float64)
    _check_pairs(load, coact, stats, rows)
    tokens = np.maximum(float(max(stats.total_tokens, 1)), load.max(axis=1))
    f = placement.replicas_on_gpu / placement.replica_counts[:, :, None]  # 2/r for a duplicate
    node_of_gpu = np.asarray(topology.node_of_gpu, dtype=np.int64)
    onehot = np.eye(int(node_of_gpu.max()) + 1)[node_of_gpu]  # [G, N]
    w = 1.0 - onehot.sum(axis=0) / placement.num_gpus
    return _Shares(load, coact, f, f @ onehot, w, tokens)


def _pairs_of(stats: ExpertStats) -> PairCounts:
    """The co-activation pair counts; DataError without."""
    if stats.coact is None:
        raise DataError(
            "the routing data has no co-activation counts",
            hint="read a per-token trace (co-activation is counted by default)",
        )
    return stats.coact


def _coact_of(stats: ExpertStats, rows: np.ndarray) -> np.ndarray:
    """``[len(rows), E, E]`` float64 dense pair counts of layer rows ``rows`` (symmetric,
    zero diagonal); DataError without, or past ``constants.MAX_COACT_BYTES``."""
    return _pairs_of(stats).take(rows).to_dense().astype(np.float64)


def _check_pairs(load: np.ndarray, coact: np.ndarray, stats: ExpertStats,
                 rows: np.ndarray) -> None:
    """DataError when the pair counts do not fit the loads (see :func:`_dispatch_shares`)."""
    k = max(int(stats.top_k), 1)
    slack = 1e-9 * max(float(load.max(initial=0.0)), 1.0)
    over_pair = coact - np.minimum(load[:, :, None], load[:, None, :])  # [L, E, E]
    over_row = coact.sum(axis=2) - (k - 1) * load  # [L, E]
    if over_pair.max(initial=0.0) <= slack and over_row.max(initial=0.0) <= slack:
        return
    if over_pair.max(initial=0.0) > slack:
        layer, i, j = np.unravel_index(int(np.argmax(over_pair)), over_pair.shape)
        what = (f"experts {i} and {j} are counted together {coact[layer, i, j]:.0f} times"
                f" but selected {load[layer, i]:.0f} and {load[layer, j]:.0f} times")
    else:
        layer, i = np.unravel_index(int(np.argmax(over_row)), over_row.shape)
        what = (f"expert {i} is counted in {coact[layer, i].sum():.0f} pairs but selected"
                f" {load[layer, i]:.0f} times, at most {k - 1} partners each")
    raise DataError(
        f"the co-activation counts do not fit the loads: in layer"
        f" {int(stats.layer_ids[rows[layer]])}, {what}",
        hint="loads and pair counts must cover the same tokens; statistics restricted to"
        " some windows (`fit`) keep the pair counts of every window, so use all windows",
    )


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
