"""A start for the balance pass: the hint's replicas packed again, window by window.

EPLB packs replicas by their load summed over the fitted windows; the balance pass
minimizes the hottest GPU of the *worst* window, which that packing ignores, and its
large-neighbourhood steps (two or three GPUs re-decided a step, some 25 ms each) climb
from EPLB's hot shard slowly: on the DeepSeek-V3 bench trace, 20 steps took the worst
window's hot shard from 1.47 to 1.19 on a sample layer.  :func:`window_packing` keeps
the hint's replica counts and packs its replicas again, largest first (by their share in
their worst window), each on the GPU where the worst window then stays lowest: a vector
bin packing that reaches 1.03-1.07 on the same layers in a few milliseconds, from which
the steps go on.  The search keeps whichever of the hint and the packing balances better.
"""

from __future__ import annotations

import numpy as np

from placer.planning.solvers.cpsat.layer import LayerData


def window_packing(data: LayerData, hint: np.ndarray) -> np.ndarray | None:
    """``[E, G]`` bool: the replicas of ``hint`` (its counts) packed largest first, each on
    the GPU with a free slot, without that expert and allowed for it, whose load over
    windows then peaks lowest (ties: the lowest GPU).  None when some replica finds no
    such GPU (tight allowed GPUs).

    A GPU that holds nothing yet peaks at the replica's own share, the same on every such
    GPU, so only the lowest of them is weighed beside the GPUs already holding some: a
    cluster of thousands of one-slot GPUs packs in time linear in its replicas, not
    quadratic."""
    counts = hint.sum(axis=1)
    share = data.effective_share(counts[None, :])  # [W, E] one replica's share
    replicas = np.repeat(np.arange(data.num_experts), counts)
    order = np.argsort(-share.max(axis=0)[replicas], kind="stable")
    load = np.zeros((share.shape[0], data.num_gpus))
    room = np.full(data.num_gpus, data.slots_per_gpu)
    used = np.zeros(data.num_gpus, dtype=bool)
    x = np.zeros_like(hint, dtype=bool)
    for e in replicas[order].tolist():
        free = (room > 0) & ~x[e]
        if data.allowed is not None:
            free &= data.allowed[e]
        if not free.any():
            return None
        candidates = np.flatnonzero(free & used)
        empty = free & ~used
        if empty.any():  # the lowest empty GPU stands for all of them
            first = int(np.argmax(empty))
            candidates = np.insert(candidates, np.searchsorted(candidates, first), first)
        peak = (load[:, candidates] + share[:, e, None]).max(axis=0)
        g = int(candidates[np.argmin(peak)])
        x[e, g] = True
        load[:, g] += share[:, e]
        room[g] -= 1
        used[g] = True
    return x
