"""Batches of tokens, their source ranks, and each token's position on its rank.

A *batch* is what one forward step processes: the trace's ``step`` when it has one,
else ``batch_tokens`` consecutive tokens.  Each token has a *source rank*, the GPU
where its attention ran (trace ``rank``; unknown ranks are spread round-robin over
the GPUs by position in the batch, as attention data-parallel ranks take requests).
A trace recorded on fewer ranks than the cluster has GPUs (a smaller cluster, or one
rank's dump) says nothing of where this cluster's attention ranks would run its
tokens: :func:`attention_ranks` deals them round-robin over every GPU instead.
A token's *rank position* is its index among the batch's tokens on the same source
rank: engines number the tokens of a forward pass per rank, and round-robin replica
choice uses that number.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from placer.errors import TraceWarning


@dataclass(frozen=True)
class Batches:
    """Batch membership of tokens.

    Attributes
    ----------
    batch_of_token: ``[tokens]`` int64 in ``0..num_batches-1``.
    source: ``[tokens]`` int64, source rank (GPU) of each token.
    rank_position: ``[tokens]`` int64, index of the token among the tokens of its batch
        on the same source rank, in token order.
    num_batches: number of batches.
    """

    batch_of_token: np.ndarray
    source: np.ndarray
    rank_position: np.ndarray
    num_batches: int

    @property
    def tokens_per_batch(self) -> np.ndarray:
        """``[batches]`` int64, tokens in each batch."""
        return np.bincount(self.batch_of_token, minlength=self.num_batches).astype(np.int64)


def group_position(group: np.ndarray) -> np.ndarray:
    """``[n]`` int64: index of each element among the elements of its group, in order.

    ``group_position([0, 1, 0, 0, 1]) == [0, 0, 1, 2, 1]``.
    """
    group = np.asarray(group, dtype=np.int64)
    if group.size == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(group, kind="stable")
    sorted_groups = group[order]
    starts = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
    run_start = np.repeat(starts, np.diff(np.r_[starts, group.size]))
    pos = np.empty(group.size, dtype=np.int64)
    pos[order] = np.arange(group.size, dtype=np.int64) - run_start
    return pos


def make_batches(
    num_tokens: int,
    num_gpus: int,
    *,
    step: np.ndarray | None = None,
    rank: np.ndarray | None = None,
    batch_tokens: int | None = None,
    default_batch_tokens: int,
) -> Batches:
    """Cut ``num_tokens`` tokens (in trace order) into batches and give them source ranks.

    Parameters
    ----------
    step: ``[tokens]`` int64 forward step of each token, or None; used when
        ``batch_tokens`` is None and every step is known (batches in increasing step).
    rank: ``[tokens]`` int64 source rank, -1 where unknown, or None.  Ranks at or above
        ``num_gpus`` are taken modulo ``num_gpus`` with a TraceWarning.  Callers pass the
        ranks :func:`attention_ranks` chose for the whole trace (a batch may have tokens
        on fewer ranks than the trace has).
    batch_tokens: tokens per batch (consecutive tokens); the last batch may be shorter.
    default_batch_tokens: batch size when neither ``batch_tokens`` nor steps are given.
    """
    if batch_tokens is None and step is not None and num_tokens and (step >= 0).all():
        _, batch = np.unique(step, return_inverse=True)
        batch = batch.astype(np.int64).reshape(-1)
    else:
        size = batch_tokens or default_batch_tokens
        batch = np.arange(num_tokens, dtype=np.int64) // size
    num_batches = int(batch.max()) + 1 if num_tokens else 0
    position = group_position(batch)
    source = position % num_gpus
    if rank is not None and num_tokens:
        rank = np.asarray(rank, dtype=np.int64)
        known = rank >= 0
        if known.any():
            top = int(rank[known].max())
            if top >= num_gpus:
                warnings.warn(
                    f"the trace's source ranks go up to {top} but the topology has {num_gpus}"
                    f" GPUs; ranks are taken modulo {num_gpus}",
                    TraceWarning, stacklevel=2,
                )
            source = np.where(known, rank % num_gpus, source)
    rank_position = group_position(batch * num_gpus + source)
    return Batches(batch, source.astype(np.int64), rank_position, num_batches)


def attention_ranks(rank: np.ndarray | None, num_gpus: int) -> tuple[np.ndarray | None, int]:
    """The source ranks to judge a trace's tokens from on ``num_gpus`` GPUs, and how many
    ranks the trace recorded when they are not used.

    ``rank``: ``[tokens]`` int64 of the whole trace (-1 unknown), or None.  When every
    token's rank is known and they are fewer distinct ranks than GPUs, the trace was
    recorded on fewer attention ranks than this cluster has (a smaller cluster, one rank's
    dump): starting every dispatch on those few GPUs would judge a deployment no one runs.
    Its tokens are then dealt round-robin over the ``num_gpus`` GPUs by position in their
    batch, as tokens of unknown rank are: ``(None, recorded ranks)``.  Otherwise
    ``(rank, 0)``: the recorded ranks are used (:func:`make_batches`).

    >>> attention_ranks(np.array([0, 1, 2, 3, 0]), 8)
    (None, 4)
    >>> attention_ranks(np.array([0, 1, -1]), 8)[1]
    0
    """
    if rank is None or rank.size == 0:
        return rank, 0
    rank = np.asarray(rank, dtype=np.int64)
    if int(rank.min()) < 0 or int(rank.max()) >= num_gpus:
        return rank, 0
    recorded = int(np.count_nonzero(np.bincount(rank, minlength=num_gpus)))
    return (None, recorded) if recorded < num_gpus else (rank, 0)


def dealt_note(recorded: int, num_gpus: int) -> str:
    """What :func:`attention_ranks` did, in words (``recorded`` ranks dealt over
    ``num_gpus`` GPUs), for the line that says how a plan was judged."""
    return f"tokens dealt over the {num_gpus} GPUs, not the trace's {recorded} source ranks"


def reordered(batches: Batches, order: np.ndarray) -> Batches:
    """``batches`` with its tokens taken in ``order``."""
    return Batches(batches.batch_of_token[order], batches.source[order],
                   batches.rank_position[order], batches.num_batches)


def sorted_batches(
    num_tokens: int, num_gpus: int, *, step: np.ndarray | None, rank: np.ndarray | None,
    batch_tokens: int | None, default_batch_tokens: int,
) -> tuple[Batches, np.ndarray]:
    """:func:`make_batches` of tokens in trace order, then the tokens sorted by (batch,
    source rank) as the evaluator processes them: ``(batches, order)``, ``order`` the trace
    index of each sorted token (stable: trace order within a (batch, source))."""
    batches = make_batches(num_tokens, num_gpus, step=step, rank=rank,
                           batch_tokens=batch_tokens, default_batch_tokens=default_batch_tokens)
    order = np.lexsort((batches.source, batches.batch_of_token))
    return reordered(batches, order), order
