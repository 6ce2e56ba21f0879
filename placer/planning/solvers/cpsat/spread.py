"""Replicas spread over nodes, for dispatch that prefers a replica on the token's node.

SGLang's static dispatch serves a selection from a replica on the source GPU, else one
on the source's node, else a fair draw.  An expert with two replicas on one node and
none on the other serves every token of the other node across the network; with one
replica per node, none.  EPLB and the balance pass place replicas for load alone, so
they often put an expert's replicas on one node.

:func:`spread_replicas` moves replicas between nodes without changing any GPU's load by
much: it swaps a replica of an expert that has two on one node (and none on some other
node) with the replica on another node whose load is closest, so both GPUs keep almost
the load they had.  The judge (``judge.py``) then times the result like any candidate,
so a spread that does not pay is not kept.
"""

from __future__ import annotations

import numpy as np

from placer.placement import Placement

#: Most swaps per layer (each removes one node an expert is missing from).
MAX_SWAPS_PER_LAYER = 256


def spread_replicas(placement: Placement, node_of_gpu: np.ndarray,
                    load: np.ndarray) -> Placement:
    """``placement`` with replicas of each expert spread over as many nodes as they can.

    Parameters
    ----------
    placement: the placement to improve (any solver's).
    node_of_gpu: ``[G]`` int64 node of each GPU.
    load: ``[layers, E]`` float64 expert load per layer (rows in ``placement``'s layer
        order); a replica carries ``load / replicas``.
    """
    num_nodes = int(node_of_gpu.max()) + 1
    if num_nodes < 2:
        return placement
    rows = placement.physical_to_logical.copy()
    gpu_of_slot = placement.gpu_of_slot
    node_of_slot = node_of_gpu[gpu_of_slot]
    for row in range(rows.shape[0]):
        _spread_layer(rows[row], gpu_of_slot, node_of_slot, num_nodes,
                      np.asarray(load[row], dtype=np.float64))
    return Placement(rows, placement.layer_ids.copy(), placement.num_experts,
                     placement.num_gpus, meta=dict(placement.meta))


def _spread_layer(row: np.ndarray, gpu_of_slot: np.ndarray, node_of_slot: np.ndarray,
                  num_nodes: int, load: np.ndarray) -> None:
    """Spread one layer's replicas in place (``row``: ``[P]`` expert of each slot)."""
    num_experts = load.size
    counts = np.bincount(row, minlength=num_experts)
    share = load / np.maximum(counts, 1)  # load of one replica
    for _ in range(MAX_SWAPS_PER_LAYER):
        per_node = np.zeros((num_experts, num_nodes), dtype=np.int64)
        np.add.at(per_node, (row, node_of_slot), 1)
        # experts missing from a node while doubled on another, hottest replicas first
        crowded = [e for e in np.argsort(-share).tolist()
                   if counts[e] > 1 and per_node[e].max() > 1 and per_node[e].min() == 0]
        moved = False
        for e in crowded:
            src_node = int(np.argmax(per_node[e]))
            dst_node = int(np.argmin(per_node[e]))
            src_slots = np.flatnonzero((row == e) & (node_of_slot == src_node))
            # a replica on the destination node to trade: its expert must not lose its
            # only replica there, nor land on a GPU that already holds it
            best, best_gap = None, np.inf
            for s in src_slots.tolist():
                gpu_s = gpu_of_slot[s]
                for t in np.flatnonzero(node_of_slot == dst_node).tolist():
                    f = int(row[t])
                    if f == e or (per_node[f, dst_node] == 1 and per_node[f, src_node] > 0):
                        continue  # f would leave the destination node for one it is on
                    if (row[gpu_of_slot == gpu_s] == f).any():
                        continue
                    if (row[gpu_of_slot == gpu_of_slot[t]] == e).any():
                        continue
                    gap = abs(share[f] - share[e])
                    if gap < best_gap:
                        best, best_gap = (s, t), gap
            if best is not None:
                s, t = best
                row[s], row[t] = row[t], row[s]
                moved = True
                break
        if not moved:
            return
