"""Co-activation pairs and link costs: the inputs of the traffic objective.

Remote copies per token (DeepEP normal mode) are the distinct GPUs (and nodes) a
token's experts sit on, less the source's.  Placing two experts that the same tokens
select on one GPU saves a copy for every such token; on one node, it saves an
inter-node copy.  Pair variables cost memory and time, so the planner keeps only the
heaviest pairs: those carrying ``pair_mass`` of all pair counts, at most
``pairs_per_expert x E`` of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from placer import constants

if TYPE_CHECKING:
    from placer.topology import Topology


def select_pairs(
    coact: np.ndarray | None,
    tokens: float,
    mass: float = constants.CPSAT_PAIR_MASS,
    per_expert: int = constants.CPSAT_PAIRS_PER_EXPERT,
) -> tuple[np.ndarray, np.ndarray]:
    """The heaviest co-activated pairs of one layer.

    Parameters
    ----------
    coact: ``[E, E]`` symmetric same-token pair counts, or None.
    tokens: tokens of the layer (pair counts are divided by it).
    mass: share of the total pair count the kept pairs must reach.
    per_expert: at most ``per_expert * E`` pairs are kept.

    Returns
    -------
    ``pairs [M, 2]`` int64 with ``i < j``, heaviest first, and ``rate [M]`` float64
    (pair count per token).
    """
    if coact is None or tokens <= 0:
        return np.zeros((0, 2), dtype=np.int64), np.zeros(0)
    num_experts = coact.shape[0]
    i, j = np.triu_indices(num_experts, k=1)
    return select_pair_list(i, j, np.asarray(coact)[i, j], num_experts, tokens, mass,
                            per_expert)


def select_pair_list(
    i: np.ndarray,
    j: np.ndarray,
    counts: np.ndarray,
    num_experts: int,
    tokens: float,
    mass: float = constants.CPSAT_PAIR_MASS,
    per_expert: int = constants.CPSAT_PAIRS_PER_EXPERT,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`select_pairs` of the pairs ``(i, j)`` (``i < j``, in rising ``(i, j)``
    order, as :meth:`placer.stats.PairCounts.pairs` gives them) with ``counts``: the
    co-activation of a layer without its dense ``[E, E]`` matrix."""
    if tokens <= 0:
        return np.zeros((0, 2), dtype=np.int64), np.zeros(0)
    counts = np.asarray(counts, dtype=np.float64)
    keep = counts > 0
    i, j, counts = np.asarray(i)[keep], np.asarray(j)[keep], counts[keep]
    if counts.size == 0:
        return np.zeros((0, 2), dtype=np.int64), np.zeros(0)
    order = np.lexsort((j, i, -counts))  # heaviest first, ties by index: deterministic
    cumulative = np.cumsum(counts[order]) / counts.sum()
    needed = int(np.searchsorted(cumulative, mass - 1e-12)) + 1
    take = order[: min(needed, per_expert * num_experts, order.size)]
    pairs = np.stack([i[take], j[take]], axis=1).astype(np.int64)
    return pairs, counts[take] / tokens


def link_costs(topology: Topology | None, node_of_gpu: np.ndarray) -> tuple[float, float]:
    """``(gpu_cost, node_cost)``: cost of a copy to another GPU and to another node.

    A copy to another GPU costs 1.  A copy to another node costs the ratio of the
    intra-node to the inter-node bandwidth (median over GPU pairs of each link class,
    from the topology), or ``constants.CPSAT_INTER_NODE_COST`` without a topology.
    """
    if int(node_of_gpu.max()) == 0:
        return 1.0, 0.0
    if topology is None:
        return 1.0, constants.CPSAT_INTER_NODE_COST
    classes = np.asarray(topology.link_class)
    bandwidth = np.asarray(topology.bandwidth_gbps, dtype=np.float64)
    intra = bandwidth[classes == 1]
    inter = bandwidth[classes == 2]
    if intra.size == 0 or inter.size == 0:
        return 1.0, constants.CPSAT_INTER_NODE_COST
    return 1.0, float(np.median(intra) / np.median(inter))


def identical_gpus(topology: Topology | None, node_of_gpu: np.ndarray) -> bool:
    """Whether the GPUs of each node are interchangeable (same type, same links).

    Without a topology, GPUs are described only by their node: interchangeable.
    """
    if topology is None:
        return True
    bandwidth = np.asarray(topology.bandwidth_gbps, dtype=np.float64)
    types = [t.name for t in topology.gpu_type_of_gpu]
    for node in np.unique(node_of_gpu):
        members = np.flatnonzero(node_of_gpu == node)
        if len({types[g] for g in members}) > 1:
            return False
        block = bandwidth[np.ix_(members, members)]
        off = block[~np.eye(members.size, dtype=bool)]
        if off.size and not np.allclose(off, off[0]):
            return False
        outside = np.flatnonzero(node_of_gpu != node)
        if outside.size:
            rows = np.sort(bandwidth[np.ix_(members, outside)], axis=1)
            if not np.allclose(rows, rows[0]):
                return False
    return True
