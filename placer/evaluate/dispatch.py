"""Dispatch policies: which replica of an expert serves a (token, expert) selection.

Glossary: a token selects ``top_k`` logical experts per layer; the *k position* of a
selection is its index ``0..top_k-1`` in the token's top-k list; an expert with ``r``
replicas has slots ``logical_to_physical[layer, e, 0..r-1]`` (increasing slot order).

Policies
--------
``round_robin`` (vLLM, TensorRT-LLM)
    replica ``(rank_position * top_k + k_position) mod r``: the selections of a forward
    pass on one rank are numbered in row-major (token, k position) order, as vLLM's
    ``pos_indices % replica_count`` does, so replicas are used in turn: an even split.
``local_first`` (SGLang ``static`` dispatch)
    a fixed table ``[source rank, expert] -> slot`` built once per layer: a rank that
    holds a replica uses its own; the other ranks share the replicas fairly (each
    replica gets ``n // r`` of the ``n`` remaining ranks, ``n mod r`` replicas drawn
    without replacement get one more) in a seeded shuffled order.
``random``
    a uniform, seeded choice among the replicas for each selection.
"""

from __future__ import annotations

import numpy as np

from placer.placement import Placement

POLICIES = ("round_robin", "local_first", "random")

#: Added to the seed of the ``random`` policy's generator, so it does not share draws
#: with the ``local_first`` table built from the same seed.
_RANDOM_STREAM = 1
_STATIC_STREAM = 2


def static_dispatch_table(placement: Placement, seed: int = 0) -> np.ndarray:
    """SGLang-style static dispatch: ``[layers, G, E]`` int64 slot used by each source rank.

    Ranks holding a replica of expert ``e`` use it; the remaining ranks are assigned the
    replicas fairly in a shuffled order drawn from ``numpy.random.default_rng((seed,
    layer_id, 2))`` (reproducible per layer; not bit-identical with SGLang's Python
    ``random``, whose default seed is 42).
    """
    num_gpus = placement.num_gpus
    l2p = placement.logical_to_physical
    counts = placement.replica_counts
    slots_per_gpu = placement.slots_per_gpu
    table = np.repeat(l2p[:, None, :, 0], num_gpus, axis=1)  # [L, G, E]
    for row in range(placement.num_layers):
        replicated = np.flatnonzero(counts[row] > 1)
        if replicated.size == 0:
            continue
        rng = np.random.default_rng((seed, int(placement.layer_ids[row]), _STATIC_STREAM))
        for expert in replicated:
            candidates = l2p[row, expert, : counts[row, expert]]
            holders = candidates // slots_per_gpu
            column = np.full(num_gpus, -1, dtype=np.int64)
            column[holders] = candidates
            remaining = np.flatnonzero(column < 0)
            if remaining.size:
                q, rem = divmod(remaining.size, candidates.size)
                extra = rng.choice(candidates, size=rem, replace=False)
                choices = np.concatenate([np.tile(candidates, q), extra])
                rng.shuffle(choices)
                column[remaining] = choices
            table[row, :, expert] = column
    return table


def choose_slots(
    policy: str,
    experts: np.ndarray,
    k_position: np.ndarray,
    source: np.ndarray,
    rank_position: np.ndarray,
    *,
    top_k: int,
    logical_to_physical: np.ndarray,
    replica_counts: np.ndarray,
    static_table: np.ndarray | None,
    rng: np.random.Generator | None,
) -> np.ndarray:
    """Slot serving each selection of one layer.

    Parameters
    ----------
    experts: ``[n]`` int64 logical expert of each selection (all valid).
    k_position: ``[n]`` int64 index of the selection in its token's top-k list.
    source: ``[n]`` int64 source rank of the selection's token.
    rank_position: ``[n]`` int64 the token's position on its source rank in its batch.
    logical_to_physical: ``[E, X]`` this layer's slots per expert, -1 padded.
    replica_counts: ``[E]`` this layer's replicas per expert.
    static_table: ``[G, E]`` this layer's ``local_first`` table (that policy only).
    rng: generator for the ``random`` policy.

    Returns
    -------
    ``[n]`` int64 slot of each selection.
    """
    if policy == "local_first":
        if static_table is None:
            raise ValueError("the local_first policy needs its static table")
        return static_table[source, experts]
    if policy not in ("round_robin", "random"):
        raise ValueError(f"unknown policy {policy!r}")
    if policy == "random" and rng is None:
        raise ValueError("the random policy needs a generator")
    if int(replica_counts.max()) == 1:  # no replicas in this layer: nothing to choose
        return logical_to_physical[:, 0][experts]
    count = replica_counts[experts]
    if policy == "round_robin":
        replica = (rank_position * top_k + k_position) % count
    else:
        assert rng is not None
        replica = np.minimum((rng.random(experts.size) * count).astype(np.int64), count - 1)
    width = logical_to_physical.shape[1]
    slots: np.ndarray = logical_to_physical.reshape(-1)[experts * width + replica]
    return slots


def random_generator(seed: int, layer_id: int) -> np.random.Generator:
    """The ``random`` policy's generator for one layer (reproducible per layer)."""
    return np.random.default_rng((seed, layer_id, _RANDOM_STREAM))
