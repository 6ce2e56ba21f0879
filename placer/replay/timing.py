"""Every step of every timeline timed by the evaluator, in one pass over the tokens.

:func:`time_timelines` walks the trace in chunks of whole steps.  Each step is one batch
of the evaluator, judged under the replay's regime with the placement the timeline
deploys at that step.  In the per-selection all-to-all modes with table-driven dispatch
(decode: low latency, ``round_robin`` or the static tables) a chunk is prepared once
(:class:`placer.evaluate.counted.Selections`) and each layer's expert ids turned into
dispatch keys once; every timeline then costs a lookup and a count per layer
(:mod:`placer.evaluate.counted`), and a (layer, steps) range that two timelines serve
with the same layer is timed once.  Other regimes go through
:func:`placer.evaluate.simulate.simulate` per run of one placement.  Both give the
figures ``placer evaluate`` gives on the same batches.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from placer import constants
from placer.errors import Param, PlacerWarning
from placer.evaluate.batches import Batches, sorted_batches
from placer.evaluate.costs import CostModel
from placer.evaluate.counted import (
    RunLoads,
    Selections,
    count_slots,
    slot_lookup,
    supports,
    times_of_loads,
)
from placer.evaluate.dispatch import STATIC_POLICIES, static_dispatch_table
from placer.evaluate.params import EvalParams, regime_params
from placer.evaluate.simulate import simulate
from placer.evaluate.traffic import Fabric
from placer.limits import check_allocation
from placer.placement import Placement
from placer.replay.steps import CHUNK_TOKENS, Chunk, StepSource
from placer.replay.timeline import Setting, Timeline

#: Memory the static dispatch tables of one replay may hold (per process).
TABLE_CACHE_BYTES = 256 << 20

#: Layers (or runs of steps of one layer) timed together by the traffic and phase models.
STACK_LAYERS = 16

#: Progress callback: ``(steps done, steps in all)``.
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Timed:
    """What the evaluator says of one timeline, step by step.

    Attributes
    ----------
    layer_time_us: ``[steps, layers]`` MoE-layer time of each step (max over GPUs of
        dispatch + compute + combine), µs; NaN where the step has no token in the layer.
    hot_shard: ``[steps, layers]`` hottest / mean GPU load of each step.
    """

    layer_time_us: np.ndarray
    hot_shard: np.ndarray


def time_timelines(source: StepSource, timelines: Sequence[Timeline], setting: Setting,
                   *, columns: Sequence[int] | None = None,
                   progress: Progress | None = None) -> list[Timed]:
    """Time every step of every timeline (module docstring); only the layer ``columns``
    given (default: all; the others stay NaN), so that layers can be timed apart."""
    steps, layers = source.num_steps, source.num_layers
    cols = list(range(layers)) if columns is None else [int(c) for c in columns]
    out = [Timed(np.full((steps, layers), np.nan), np.full((steps, layers), np.nan))
           for _ in timelines]
    params = regime_params(setting.regime, setting.num_gpus, dtype=setting.dtype)
    costs = CostModel.of(setting.topology, setting.model, params.mode, setting.dtype)
    _check_memory(source, setting, len(cols), supports(params.policy, params.mode))
    walk = _Walk(setting, params, costs.fabric, cols, costs)
    states = [_State(t) for t in timelines]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlacerWarning)  # said once by the caller
        for chunk in source.chunks(columns=cols):
            segments = [state.segments(chunk) for state in states]
            if supports(params.policy, params.mode):
                walk.counted(chunk, segments, out)
            else:
                walk.simulated(chunk, segments, out)
            if progress is not None:
                progress(chunk.first_step + chunk.num_steps, steps)
    return out


def _check_memory(source: StepSource, setting: Setting, layers: int, counted: bool) -> None:
    """Refuse a replay whose chunks would not fit in the memory free
    (:func:`placer.limits.check_allocation`).  A chunk holds whole steps, at least
    :data:`~placer.replay.steps.CHUNK_TOKENS` tokens: about 3 bytes a selection of the
    chunk and 12 a selection of its largest step (measured on DeepSeek-V3 shapes), and,
    timed by counting, per stack of :data:`STACK_LAYERS` layers a row of counts per slot
    for each (step, source) run."""
    tokens = source.num_tokens
    if not tokens:
        return
    per_step = np.bincount(source.step_of_token)
    biggest = int(per_step.max())
    chunk = min(tokens, CHUNK_TOKENS + biggest)
    k = source.top_k
    steps = chunk * layers * k * 3 + biggest * layers * k * 12
    runs = 0
    if counted:
        runs = min(chunk, chunk * min(setting.num_gpus, biggest) // max(1, int(per_step.mean())))
    counts = STACK_LAYERS * runs * 8 * (setting.slots_per_gpu * setting.num_gpus + 1)
    hint = ("a larger `tokens_per_gpu`: each (step, source GPU) keeps a count per slot, and"
            " steps of few tokens make many" if counts > steps else
            "a smaller `tokens_per_gpu`: a step is timed whole, every layer at once")
    check_allocation(steps + counts, f"replaying steps of up to {biggest:,} tokens x"
                     f" {layers:,} layers x top-{k}", hint, where=Param("tokens_per_gpu"))


def _digest(values: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(values).tobytes(), digest_size=16).digest()


@dataclass
class _Walk:
    """What timing the chunks keeps: the regime, and what was already worked out."""

    setting: Setting
    params: EvalParams
    fabric: Fabric
    columns: list[int]
    costs: CostModel | None = None
    lookups: dict[tuple[int, bytes], np.ndarray] = field(default_factory=dict)
    tables: dict[bytes, np.ndarray] = field(default_factory=dict)
    table_bytes: int = 0

    def __post_init__(self) -> None:
        s = self.setting
        self.table_bytes = 8 * s.layer_ids.size * s.num_gpus * s.model.num_experts

    def _table(self, placement: Placement) -> np.ndarray:
        """The placement's ``[layers, G, E]`` static dispatch table (static policies)."""
        key = _digest(placement.physical_to_logical)
        if key not in self.tables:
            # SGLang's exact table costs about a second to draw: each placement is drawn
            # once a replay, kept while the tables fit TABLE_CACHE_BYTES
            while self.tables and (len(self.tables) + 1) * self.table_bytes > TABLE_CACHE_BYTES:
                self.tables.pop(next(iter(self.tables)))
            self.tables[key] = static_dispatch_table(
                placement, self.params.seed, policy=self.params.policy,
                node_of_gpu=np.asarray(self.setting.topology.node_of_gpu, dtype=np.int64))
        return self.tables[key]

    def _layer_runs(self, segments: list[tuple[int, int, Placement]],
                    tables: list[np.ndarray | None],
                    col: int) -> list[tuple[int, int, bytes, Placement]]:
        """``(first, stop, layer key, placement)``: the segments merged where the layer
        ``col`` is dispatched the same way (its row, or its static table of ``tables``)."""
        runs: list[tuple[int, int, bytes, Placement]] = []
        for (first, stop, placement), table in zip(segments, tables, strict=True):
            if table is not None:
                key = _digest(table[col])
            else:
                key = _digest(placement.physical_to_logical[col])
            if runs and runs[-1][2] == key and runs[-1][1] == first:
                runs[-1] = (runs[-1][0], stop, key, runs[-1][3])
            else:
                runs.append((first, stop, key, placement))
        return runs

    def _lookup(self, sel: Selections, col: int, key: bytes,
                placement: Placement) -> np.ndarray:
        """The slot of every dispatch key of layer ``col`` (cached by the layer's key)."""
        cache_key = (col, key)
        lookup = self.lookups.get(cache_key)
        if lookup is None or lookup.size != sel.lookup_size:
            table = (self._table(placement)[col] if self.params.policy in STATIC_POLICIES
                     else None)
            layer = Placement(placement.physical_to_logical[col : col + 1],
                              placement.layer_ids[col : col + 1], placement.num_experts,
                              placement.num_gpus)
            lookup = slot_lookup(sel, layer.logical_to_physical[0], layer.replica_counts[0],
                                 table)
            if len(self.lookups) >= 4 * len(self.columns) + 64:
                self.lookups.pop(next(iter(self.lookups)))
            self.lookups[cache_key] = lookup
        return lookup

    def counted(self, chunk: Chunk, segments: list[list[tuple[int, int, Placement]]],
                out: list[Timed]) -> None:
        """Time a chunk by counting (:mod:`placer.evaluate.counted`)."""
        assert self.costs is not None
        first_step = chunk.first_step
        batches, order = _batches(chunk, self.setting)
        ids = chunk.topk_ids  # trace order: the selections follow it (steps stay whole)
        sel = Selections.of(batches, self.params.policy,
                            num_experts=self.setting.model.num_experts,
                            num_slots=self.setting.slots_per_gpu * self.setting.num_gpus,
                            top_k=ids.shape[2]).in_trace_order(order)
        static = self.params.policy in STATIC_POLICIES
        tables = [[self._table(p) if static else None for _, _, p in segs]
                  for segs in segments]  # each segment's table found once, not per layer
        # the loads of each (layer key, steps) once; timed in stacks of layers (one pass
        # of the traffic and phase models for many layers: they cost per call, not per row)
        pending: dict[tuple[int, int], list[tuple[RunLoads, list[tuple[int, int]]]]] = {}
        for at, col in enumerate(self.columns):
            keys = sel.keys(ids[:, at])
            done: dict[tuple[bytes, int, int], list[tuple[int, int]]] = {}
            for timeline, segs in enumerate(segments):
                for first, stop, key, placement in self._layer_runs(segs, tables[timeline],
                                                                    col):
                    part = (first - first_step, stop - first_step)
                    targets = done.get((key, *part))
                    if targets is None:
                        if placement.num_physical != sel.num_slots:
                            raise ValueError("every timeline of a replay has the same slots")
                        lookup = self._lookup(sel, col, key, placement)
                        counts = count_slots(sel, keys, lookup, part)
                        targets = done[(key, *part)] = []
                        stack = pending.setdefault(part, [])
                        stack.append((RunLoads.of(counts, sel.part_segments(*part),
                                                  self.fabric.num_gpus), targets))
                    targets.append((timeline, col))
            for part, stack in pending.items():  # every timeline of the layer is in
                if len(stack) >= STACK_LAYERS:
                    self._flush(stack, part, first_step, out)
                    stack.clear()
        for part, stack in pending.items():
            self._flush(stack, part, first_step, out)

    def _flush(self, stack: list[tuple[RunLoads, list[tuple[int, int]]]],
               part: tuple[int, int], first_step: int, out: list[Timed]) -> None:
        """Time the stacked loads of one range of steps; write them where they go."""
        assert self.costs is not None
        if not stack:
            return
        results = times_of_loads([loads for loads, _ in stack], self.costs)
        first, stop = first_step + part[0], first_step + part[1]
        for (_, targets), (times, hot) in zip(stack, results, strict=True):
            for timeline, col in targets:
                out[timeline].layer_time_us[first:stop, col] = times
                out[timeline].hot_shard[first:stop, col] = hot

    def simulated(self, chunk: Chunk, segments: list[list[tuple[int, int, Placement]]],
                  out: list[Timed]) -> None:
        """Time a chunk with :func:`~placer.evaluate.simulate.simulate`, a run of one
        placement at a time."""
        done: dict[tuple[bytes, int, int], tuple[np.ndarray, np.ndarray]] = {}
        cols = np.asarray(self.columns, dtype=np.int64)
        for timeline, segs in enumerate(segments):
            for first, stop, placement in segs:
                key = _digest(placement.physical_to_logical[cols])
                result = done.get((key, first, stop))
                if result is None:
                    result = done[(key, first, stop)] = self._simulate(chunk, first, stop,
                                                                       placement)
                out[timeline].layer_time_us[first:stop, cols] = result[0]
                out[timeline].hot_shard[first:stop, cols] = result[1]

    def _simulate(self, chunk: Chunk, first: int, stop: int,
                  placement: Placement) -> tuple[np.ndarray, np.ndarray]:
        """``([steps, columns], [steps, columns])`` layer times and hot shards of steps
        ``first:stop`` of ``chunk`` under ``placement``."""
        lo = int(np.searchsorted(chunk.step, first))
        hi = int(np.searchsorted(chunk.step, stop))
        setting = self.setting
        rank = None if chunk.rank is None else chunk.rank[lo:hi]
        batches, order = sorted_batches(hi - lo, setting.num_gpus,
                                        step=chunk.step[lo:hi] - first, rank=rank,
                                        batch_tokens=None,
                                        default_batch_tokens=constants.DEFAULT_BATCH_TOKENS)
        assert self.costs is not None
        cols = np.asarray(self.columns, dtype=np.int64)
        ids = chunk.topk_ids[lo:hi][order]  # the chunk holds the columns only
        part = Placement(placement.physical_to_logical[cols], placement.layer_ids[cols],
                         placement.num_experts, placement.num_gpus)
        table = self._table(placement)[cols] if self.params.policy in STATIC_POLICIES \
            else None

        def experts_of(row: int) -> np.ndarray:
            return ids[:, row].astype(np.int64)

        sim = simulate(part, batches, experts_of, self.costs, setting.model, self.params,
                       table)
        return sim.layer_time_us, sim.batch_hot_shard


def _batches(chunk: Chunk, setting: Setting) -> tuple[Batches, np.ndarray]:
    """The chunk's steps as the evaluator's batches, tokens sorted by (step, source)."""
    return sorted_batches(chunk.hi - chunk.lo, setting.num_gpus,
                          step=chunk.step - chunk.first_step, rank=chunk.rank,
                          batch_tokens=None,
                          default_batch_tokens=constants.DEFAULT_BATCH_TOKENS)


class _State:
    """A timeline's placement as the replay walks its steps in order."""

    def __init__(self, timeline: Timeline) -> None:
        self.rows = timeline.initial.physical_to_logical.copy()
        self.initial = timeline.initial
        self.changes = timeline.changes
        self.next = 0

    def segments(self, chunk: Chunk) -> list[tuple[int, int, Placement]]:
        """``(first step, stop step, placement)`` of the chunk's runs of one placement."""
        start, stop = chunk.first_step, chunk.first_step + chunk.num_steps
        out = []
        at = start
        while at < stop:
            while self.next < len(self.changes) and self.changes[self.next][0] <= at:
                _, row, values = self.changes[self.next]
                self.rows[row] = values
                self.next += 1
            end = stop
            if self.next < len(self.changes):
                end = min(stop, max(at + 1, self.changes[self.next][0]))
            out.append((at, end, Placement(self.rows.copy(), self.initial.layer_ids,
                                           self.initial.num_experts, self.initial.num_gpus)))
            at = end
        return out
