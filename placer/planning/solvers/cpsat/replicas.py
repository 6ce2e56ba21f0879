"""Replica counts: EPLB's greedy rule, and the range of counts the CP-SAT models may use.

The even split ``load[e] / replicas[e]`` makes a GPU's load non-linear in the
replica count.  The models keep it linear by letting each expert choose its count
from a short list ``c in [low_e, high_e]`` with one boolean per choice; this module
picks those lists around the counts a greedy would give, on the mean load and on the
worst window, so the lists stay short (three or four choices) without leaving out
the counts a balanced placement uses.
"""

from __future__ import annotations

import numpy as np


def replicate_counts(share: np.ndarray, num_physical: int, max_replicas: int) -> np.ndarray:
    """``[E]`` int64 replica counts by EPLB's rule, capped at ``max_replicas``.

    Every expert starts with one replica; each further slot goes to the expert with
    the highest load per replica (the lowest index on ties) that is below the cap.

    >>> replicate_counts(np.array([6.0, 3.0, 1.0]), 5, 2).tolist()
    [2, 2, 1]
    """
    share = np.asarray(share, dtype=np.float64)
    counts = np.ones(share.size, dtype=np.int64)
    for _ in range(num_physical - share.size):
        per_replica = np.where(counts < max_replicas, share / counts, -np.inf)
        expert = int(np.argmax(per_replica))
        if not np.isfinite(per_replica[expert]):
            break
        counts[expert] += 1
    return counts


def replica_range(
    shares: np.ndarray,
    num_gpus: int,
    num_physical: int,
    fixed_counts: list[np.ndarray],
    spread: int = 1,
) -> np.ndarray:
    """``[E, 2]`` int64: the fewest and most replicas each expert may get.

    The range covers, widened by ``spread`` on both sides: the greedy counts on the
    mean share and on each expert's worst-window share, and every count in
    ``fixed_counts`` (the hint's and the current placement's, so that both stay
    feasible).  It is clipped to ``[1, min(G, 1 + R)]``.

    Parameters
    ----------
    shares: ``[windows, E]`` load shares per window (rows sum to 1).
    fixed_counts: ``[E]`` count vectors that must lie inside the range.
    """
    most = min(num_gpus, 1 + num_physical - shares.shape[1])
    mean = replicate_counts(shares.mean(axis=0), num_physical, most)
    worst = replicate_counts(shares.max(axis=0), num_physical, most)
    stack = np.stack([mean, worst, *fixed_counts])
    low = np.clip(stack.min(axis=0) - spread, 1, most)
    high = np.clip(stack.max(axis=0) + spread, 1, most)
    return np.stack([low, high], axis=1).astype(np.int64)
