"""Many batches of one layer timed from selection counts: the evaluator's fast path.

:func:`placer.evaluate.simulate.simulate` follows every selection through dispatch,
traffic and timing.  A replay times the same tokens under several placements (each
policy's, and each of its rebalances), so here the work that does not depend on the
placement is done once per layer and the rest is a lookup and a count:

1. :class:`Selections` holds the tokens of whole batches sorted by (batch, source rank),
   each selection's (batch, source) run, and a *dispatch key* from which the engine's
   replica choice follows: ``(expert, rank position x k + k position)`` for
   ``round_robin`` (:func:`placer.evaluate.dispatch.choose_slots`'s formula), ``(expert,
   rank position)`` for ``vllm_hash`` (its hash reads the token's index only), ``(source
   rank, expert)`` for the static tables of ``sglang`` and ``local_first``;
2. :func:`slot_lookup` asks :func:`~placer.evaluate.dispatch.choose_slots` itself for the
   slot of every possible key of one placement's layer (the engine's choice, not a copy
   of it), so the slot of every selection is one gather;
3. :func:`count_slots` counts the selections per (run, slot), one ``bincount``;
4. :func:`counted_times` turns the counts into each batch's loads, copies
   (:func:`~placer.evaluate.traffic.per_selection_traffic`) and phase times
   (:mod:`placer.evaluate.timing`), exactly as ``simulate`` does.

Only the per-selection all-to-all modes (low latency: one copy per selection served off
its source GPU) are counted this way; normal mode deduplicates each token's destinations
and ``random`` dispatch draws per selection: :func:`supports` says which regimes take the
fast path, the others go through ``simulate``.  ``tests/evaluate/test_counted.py`` checks
that both give the same figures.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from placer.evaluate.balance import ratio
from placer.evaluate.batches import Batches
from placer.evaluate.costs import CostModel
from placer.evaluate.dispatch import STATIC_POLICIES, choose_slots
from placer.evaluate.timing import comm_time_us, compute_time_us
from placer.evaluate.traffic import PER_SELECTION_MODES, Segments, per_selection_traffic

#: Dispatch policies whose slot is a function of (expert, rank position, k position)
#: (``trtllm_block`` also reads the other selections of the block: not counted here).
POSITION_POLICIES = ("round_robin", "vllm_hash")

#: Position rules whose code is a function of the token's position alone (vLLM hashes
#: the token's index; every selection of a token takes the same replica index): keyed
#: by (expert, rank position), a lookup ``k`` times smaller.
TOKEN_POLICIES = ("vllm_hash",)

#: Lookup tables above this many entries are not built (the selections' slots are chosen
#: one by one instead).
MAX_LOOKUP = 1 << 22


def supports(policy: str, mode: str) -> bool:
    """Whether batches dispatched by ``policy`` in all-to-all ``mode`` can be counted."""
    return mode in PER_SELECTION_MODES and (policy in POSITION_POLICIES
                                            or policy in STATIC_POLICIES)


@dataclass(frozen=True)
class Selections:
    """The tokens of whole batches, prepared once for every layer and placement.

    Attributes
    ----------
    batches: the tokens' batches, sorted by (batch, source rank).
    segments: their (batch, source) runs.
    policy: the dispatch policy the keys are for.
    num_experts, num_slots, top_k: the layer's shape.
    run_base: ``[tokens * k]`` int64 run of each selection times ``num_slots + 1``.
    position: ``[tokens * k]`` int64 rank position x k + k position (``round_robin``),
        the rank position (:data:`TOKEN_POLICIES`), or the source rank (static tables).
    width: keys per expert (position rules: the largest position + 1) or per source.
    token_start, run_start: ``[batches + 1]`` int64 first token and first run of each
        batch (and the end).
    """

    batches: Batches
    segments: Segments
    policy: str
    num_experts: int
    num_slots: int
    top_k: int
    run_base: np.ndarray
    position: np.ndarray
    width: int
    token_start: np.ndarray
    run_start: np.ndarray

    @classmethod
    def of(cls, batches: Batches, policy: str, *, num_experts: int, num_slots: int,
           top_k: int) -> Selections:
        """``batches`` (sorted by batch then source) prepared for ``policy``."""
        segments = Segments.of(batches.batch_of_token, batches.source, batches.num_batches)
        run_base = np.repeat(segments.of_token * (num_slots + 1), top_k)
        if policy in TOKEN_POLICIES:
            position = np.repeat(batches.rank_position, top_k)
            width = int(position.max()) + 1 if position.size else 1
        elif policy in POSITION_POLICIES:
            position = (batches.rank_position[:, None] * top_k
                        + np.arange(top_k)[None, :]).reshape(-1)
            width = int(position.max()) + 1 if position.size else 1
        else:
            position = np.repeat(batches.source, top_k)
            width = int(position.max()) + 1 if position.size else 1
        token_start = np.r_[0, np.cumsum(batches.tokens_per_batch)].astype(np.int64)
        run_start = np.searchsorted(segments.batch, np.arange(batches.num_batches + 1))
        return cls(batches, segments, policy, num_experts, num_slots, top_k, run_base,
                   position, width, token_start, run_start.astype(np.int64))

    def in_trace_order(self, order: np.ndarray) -> Selections:
        """The same selections with ``run_base`` and ``position`` in trace order, ``order``
        being the trace index of each sorted token (:func:`~placer.evaluate.batches.
        sorted_batches`): :meth:`keys` then takes the trace's expert ids as they are,
        without sorting them.  ``order`` must only permute tokens within their batch (a
        replay's steps), so that a range of batches is the same range of tokens."""
        inverse = np.empty_like(order)
        inverse[order] = np.arange(order.size)
        k = self.top_k

        def traced(values: np.ndarray) -> np.ndarray:
            return values.reshape(-1, k)[inverse].reshape(-1)

        return replace(self, run_base=traced(self.run_base), position=traced(self.position))

    @property
    def lookup_size(self) -> int:
        """Entries of one layer's slot lookup (:func:`slot_lookup`)."""
        return (self.num_experts + 1) * self.width

    def part_segments(self, first: int, last: int) -> Segments:
        """The (batch, source) runs of batches ``first:last``, batches numbered from 0
        (``of_token`` left whole)."""
        run_lo, run_hi = int(self.run_start[first]), int(self.run_start[last])
        every = self.segments
        return Segments(every.of_token, every.batch[run_lo:run_hi] - first,
                        every.source[run_lo:run_hi], last - first)

    def keys(self, ids: np.ndarray) -> np.ndarray:
        """``[tokens * k]`` int64 dispatch key of each selection of one layer's ``[tokens,
        k]`` expert ids (-1 = none: key of no slot)."""
        experts = np.empty(ids.size, dtype=np.int64)
        experts.reshape(ids.shape)[...] = ids  # one pass, whatever the strides
        if self.policy in POSITION_POLICIES:
            experts += 1
            experts *= self.width
            experts += self.position
            return experts
        experts += 1
        experts += self.position * (self.num_experts + 1)
        return experts


def slot_lookup(sel: Selections, logical_to_physical: np.ndarray, replica_counts: np.ndarray,
                static_table: np.ndarray | None) -> np.ndarray:
    """``[lookup_size]`` int64 slot of every dispatch key of one layer; the key of a
    missing selection (-1) maps to ``num_slots``, a column the counts drop.

    ``logical_to_physical`` ``[E, X]``, ``replica_counts`` ``[E]``: the layer's placement;
    ``static_table`` ``[G, E]``: its static dispatch table (static policies).
    """
    num_experts, width = sel.num_experts, sel.width
    if sel.policy in POSITION_POLICIES:
        experts = np.repeat(np.arange(num_experts, dtype=np.int64), width)
        position = np.tile(np.arange(width, dtype=np.int64), num_experts)
        if sel.policy in TOKEN_POLICIES:
            k_position, rank_position = np.zeros_like(position), position
        else:
            k_position, rank_position = position % sel.top_k, position // sel.top_k
        slots = choose_slots(sel.policy, experts, k_position, np.zeros_like(experts),
                             rank_position, top_k=sel.top_k,
                             logical_to_physical=logical_to_physical,
                             replica_counts=replica_counts, static_table=None, rng=None)
        return np.concatenate([np.full(width, sel.num_slots, dtype=np.int64), slots])
    assert static_table is not None
    out = np.full((width, num_experts + 1), sel.num_slots, dtype=np.int64)
    out[:, 1:] = static_table[:width]
    return out.reshape(-1)


def count_slots(sel: Selections, keys: np.ndarray, lookup: np.ndarray,
                part: tuple[int, int] | None = None) -> np.ndarray:
    """``[runs, P]`` int64 selections each slot serves in each (batch, source) run of the
    batches ``part`` (default: all); ``keys``: :meth:`Selections.keys` of all batches."""
    first, last = part if part is not None else (0, sel.batches.num_batches)
    k = sel.top_k
    lo, hi = int(sel.token_start[first]) * k, int(sel.token_start[last]) * k
    run_lo, run_hi = int(sel.run_start[first]), int(sel.run_start[last])
    width = sel.num_slots + 1
    index = lookup[keys[lo:hi]]
    index += sel.run_base[lo:hi]
    if run_lo:
        index -= run_lo * width
    runs = run_hi - run_lo
    counts = np.bincount(index, minlength=runs * width).reshape(runs, width)
    return counts[:, :-1]


def counted_times(sel: Selections, counts: np.ndarray, costs: CostModel,
                  part: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``([batches], [batches])`` MoE-layer time (µs, max over GPUs of dispatch + compute
    + combine) and hot-shard ratio (hottest / mean GPU load) of each batch of ``part``
    (default: all), from the ``[runs, P]`` counts of :func:`count_slots`; NaN for a
    batch without selections.  ``costs``: the cost model of a per-selection mode."""
    if costs.mode not in PER_SELECTION_MODES:
        raise ValueError(f"mode {costs.mode!r} is not counted per selection")
    first, last = part if part is not None else (0, sel.batches.num_batches)
    return times_from_counts(counts, sel.part_segments(first, last), sel.num_slots, costs)


def times_from_counts(counts: np.ndarray, segments: Segments, num_slots: int,
                      costs: CostModel) -> tuple[np.ndarray, np.ndarray]:
    """``([batches], [batches])`` MoE-layer time and hot-shard ratio of each batch from
    the ``[runs, P]`` selections each slot serves in each (batch, source) run of
    ``segments`` (per-selection all-to-all; whole counts, or expected ones as floats)."""
    return times_of_loads([RunLoads.of(counts, segments, costs.num_gpus)], costs)[0]


@dataclass(frozen=True)
class RunLoads:
    """What the times of one layer's batches are computed from: the selection counts of
    :func:`count_slots` summed per GPU and per batch (a few percent of their size, so
    that many layers are timed together, :func:`times_of_loads`).

    Attributes
    ----------
    segments: the (batch, source) runs.
    served: ``[runs, G]`` selections each GPU serves for each run.
    gpu_load: ``[batches, G]`` selections each GPU serves in each batch.
    slot_load: ``[batches, P]`` selections each slot serves in each batch.
    """

    segments: Segments
    served: np.ndarray
    gpu_load: np.ndarray
    slot_load: np.ndarray

    @classmethod
    def of(cls, counts: np.ndarray, segments: Segments, num_gpus: int) -> RunLoads:
        """The sums of ``[runs, P]`` counts over the runs of ``segments``."""
        nb, num_slots = segments.num_batches, counts.shape[1]
        served = counts.reshape(-1, num_gpus, num_slots // num_gpus).sum(axis=2)
        starts = np.flatnonzero(np.r_[True, segments.batch[1:] != segments.batch[:-1]]) \
            if segments.num_segments else np.zeros(0, dtype=np.int64)
        present = segments.batch[starts]
        gpu_load = np.zeros((nb, num_gpus), dtype=counts.dtype)
        slot_load = np.zeros((nb, num_slots), dtype=counts.dtype)
        if starts.size:
            gpu_load[present] = np.add.reduceat(served, starts, axis=0)
            slot_load[present] = np.add.reduceat(counts, starts, axis=0)
        return cls(segments, served, gpu_load, slot_load)


def times_of_loads(parts: list[RunLoads], costs: CostModel,
                   ) -> list[tuple[np.ndarray, np.ndarray]]:
    """``([batches], [batches])`` MoE-layer time and hot-shard ratio of each batch of
    each part (one layer's batches, same slots), the parts timed together: their batches
    stacked, one pass of the traffic and phase models for all."""
    fabric = costs.fabric
    num_gpus = fabric.num_gpus
    if not parts:
        return []
    num_slots = parts[0].slot_load.shape[1]
    offsets = np.cumsum([0] + [p.segments.num_batches for p in parts])
    segments = Segments(np.zeros(0, dtype=np.int64),
                        np.concatenate([p.segments.batch + off
                                        for p, off in zip(parts, offsets, strict=False)]),
                        np.concatenate([p.segments.source for p in parts]), int(offsets[-1]))
    served = np.concatenate([p.served for p in parts])
    gpu_load = np.concatenate([p.gpu_load for p in parts])
    slot_load = np.concatenate([p.slot_load for p in parts])
    traffic = per_selection_traffic(served, gpu_load, segments, fabric)
    dispatch = comm_time_us(traffic.copies, costs.activation_bytes, fabric)
    combine = comm_time_us(traffic.copies.transpose(0, 2, 1), costs.combine_bytes, fabric)
    compute = compute_time_us(slot_load, num_slots // num_gpus, costs.weight_us,
                              costs.token_us)
    empty = gpu_load.sum(axis=1) == 0
    layer_time = np.where(empty, np.nan, (dispatch + compute + combine).max(axis=1))
    load = gpu_load.astype(np.float64)
    hot = np.where(empty, np.nan, ratio(load.max(axis=1), load.mean(axis=1)))
    return [(layer_time[a:b], hot[a:b])
            for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)]
