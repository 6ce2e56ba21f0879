"""Candidates without two replicas of one expert on one GPU.

CP-SAT's model decides whether GPU ``g`` holds expert ``e`` (a boolean), so its plan
never holds an expert twice on a GPU.  The candidates it is judged against -- the
hint, EPLB's reference layout and its spread variant -- may: DeepSeek's reference
packs replicas by load alone.  A second replica on one GPU takes a slot of memory but
adds no dispatch bandwidth, so before such a layer competes its duplicates are removed
by swaps between GPUs (:func:`placer.planning.solvers.eplb.valid.repair_layer`; where
the swaps corner themselves, the layer's replicas are dealt afresh), which keep every
expert's replica count.  A layer no repair can fix (an expert with more replicas than
there are GPUs) takes the plan's row instead, so the candidate does not compete there.
"""

from __future__ import annotations

import numpy as np

from placer.placement import Placement
from placer.planning.solvers.eplb.valid import repair_layer

__all__ = ["without_duplicates"]


def without_duplicates(candidate: Placement, plan: Placement, load: np.ndarray,
                       gpus_per_node: int) -> tuple[Placement, int]:
    """``candidate`` with its duplicate replicas swapped away, and the layers repaired.

    Parameters
    ----------
    candidate: the placement to repair (returned as is when it has no duplicate).
    plan: the plan it competes with (same layers and shape); its row replaces a layer
        that cannot be repaired.
    load: ``[layers, E]`` expert load per layer, rows in ``candidate``'s layer order.
    gpus_per_node: GPUs of a node (swaps stay in a node when they can).
    """
    dup = candidate.duplicate_gpus.any(axis=1)
    if not dup.any():
        return candidate, 0
    rows = candidate.physical_to_logical.copy()
    for layer in np.flatnonzero(dup).tolist():
        row = rows[layer].copy()
        if repair_layer(row, load[layer], candidate.num_gpus, gpus_per_node) is None:
            row = plan.physical_to_logical[plan.layer_row(int(candidate.layer_ids[layer]))]
        rows[layer] = row
    repaired = Placement(rows, candidate.layer_ids.copy(), candidate.num_experts,
                         candidate.num_gpus, meta=dict(candidate.meta))
    return repaired, int(dup.sum())
