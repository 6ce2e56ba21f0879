"""Aggregated inputs of :class:`~placer.traces.accumulate.Accumulator`: load matrices
and counts per forward pass, and the statistics they make.

:class:`AggregateBuilder` is a part the accumulator holds and delegates to: it owns
what only aggregated inputs have (summed co-activation, window starts, which kind of
aggregated input came first, the running total of counts) and adds the load into the
accumulator's shared statistics (layers, experts, windows)."""

from __future__ import annotations

import numpy as np

from placer import constants
from placer.errors import Param, TraceError, UsageError
from placer.stats import ExpertStats, PairCounts, RoutingData, format_ranges
from placer.traces.accumulate.checks import Checks
from placer.traces.accumulate.counting import Counts
from placer.traces.accumulate.grid import Windows
from placer.traces.accumulate.limits import LIMITS_HINT, check_counts
from placer.traces.accumulate.results import top_k_from_coact, warn_all
from placer.traces.accumulate.state import TraceState


class AggregateBuilder:
    """Load matrices and counts per forward pass, added into the accumulator's counts
    (``counts.load``) and shared state, with its windows and checks."""

    def __init__(
        self, state: TraceState, counts: Counts, windows: Windows, checks: Checks
    ) -> None:
        self.state = state
        self.counts = counts
        self.windows = windows
        self.checks = checks
        self.coact: np.ndarray | None = None  # [layers, E, E] summed over the files
        self.window_starts: np.ndarray | None = None
        self.by_step: bool | None = None  # add_step_counts (True) or add_aggregate
        self.count_total = 0.0  # counts so far (MAX_TOTAL_COUNT)

    def add_aggregate(
        self,
        load: np.ndarray,
        *,
        layer_ids: np.ndarray | None = None,
        coact: np.ndarray | None = None,
        window_starts: np.ndarray | None = None,
        where: str | None = None,
    ) -> None:
        """Accumulate an aggregated load ``[windows, layers, experts]`` (summed over files).

        ``coact``: ``[layers, experts, experts]`` symmetric pair counts, or None.
        """
        s = self.state
        where = where or s.source
        s.begin_kind("aggregate")
        self._begin(by_step=False, where=where)
        w, nl, e = load.shape
        self._add_total(load, where)
        lid = np.arange(nl, dtype=np.int64) if layer_ids is None else layer_ids
        if s.layer_filter is not None:
            missing = [i for i in s.layer_filter.tolist() if i not in set(lid.tolist())]
            if missing:
                raise UsageError(
                    f"layer {missing[0]} is not in {where}",
                    where=Param("layers"),
                    hint=f"layers present: {format_ranges(lid)}",
                )
            cols = np.isin(lid, s.layer_filter)
            s.skip("layer not selected", int(w * (~cols).sum()))
            load, lid = load[:, cols], lid[cols]
            coact = None if coact is None else coact[cols]
            nl = lid.size
        if s.num_experts is not None and e != s.num_experts:
            _raise_beyond(load, lid, s.num_experts, s.experts_from, "load", where)
            raise TraceError(
                f"load has {e} experts but num_experts is {s.num_experts}"
                f" ({s.experts_from})",
                where=f"{where}: load", hint="check `num_experts` and `model` against the file",
            )
        if self.counts.load.size == 0 and not s.layer_ids:
            s.layer_ids = [int(i) for i in lid]
            self.counts.load = load.astype(np.int64)
            s.num_e = e
            self.coact = None if coact is None else coact.astype(np.int64)
            self.window_starts = window_starts
        else:
            first = self.counts.load.shape
            if s.layer_ids != [int(i) for i in lid] or first != (w, nl, e):
                raise TraceError(
                    f"load [{w}, {nl}, {e}] with layers {format_ranges(lid)} does not match"
                    f" the first input's [{', '.join(map(str, first))}] with layers"
                    f" {format_ranges(np.asarray(s.layer_ids))}",
                    where=where,
                    hint="aggregated files read together are summed: same windows, layers,"
                    " experts",
                )
            self.counts.load = self.counts.load + load
            # co-activation only while every file gives it
            self.coact = None if coact is None or self.coact is None else self.coact + coact
        s.rows_read += w * nl

    def add_step_counts(
        self,
        load: np.ndarray,
        steps: np.ndarray,
        *,
        layer_ids: np.ndarray,
        where: str | None = None,
    ) -> None:
        """Accumulate counts of forward passes: ``load [passes, layers, experts]`` int,
        pass ``i`` taken at step ``steps[i]`` (any order; passes of one step add up).

        Windows follow the steps as a per-token trace's do (aligned ranges of steps,
        merged pairwise past ``constants.MAX_WINDOWS``), so files read together (one per
        rank) add up step by step; layers and experts are the union of the files'.
        """
        s = self.state
        where = where or s.source
        s.begin_kind("aggregate")
        self._begin(by_step=True, where=where)
        p, nl, e = load.shape
        lid = np.asarray(layer_ids, dtype=np.int64)
        steps = np.asarray(steps, dtype=np.int64)
        if steps.shape != (p,) or lid.shape != (nl,):
            raise TraceError(
                f"{p} passes with {steps.shape} steps and {nl} layers with {lid.shape} ids",
                where=where, hint="each pass needs one step and each layer one id",
            )
        if s.layer_filter is not None:
            s.all_layers.update(lid.tolist())
            cols = np.isin(lid, s.layer_filter)
            s.skip("layer not selected", int(p * (~cols).sum()))
            load, lid = load[:, cols], lid[cols]
            nl = lid.size
        if p == 0 or nl == 0:
            return
        if s.num_experts is not None and e > s.num_experts:
            _raise_beyond(load, lid, s.num_experts, s.experts_from, "counts", where)
            raise TraceError(
                f"counts have {e} experts but num_experts is {s.num_experts}"
                f" ({s.experts_from})",
                where=where, hint="check `num_experts` and `model` against the file",
            )
        load = check_counts(load, "counts", where)
        self._add_total(load, where)
        rows, added = s.rows_of(lid, lambda i: where)
        if added:
            self.counts.resize()
        if e > s.num_e:
            self.counts.resize(num_e=e)
        s.max_expert = max(s.max_expert, e - 1)
        if self.windows.mode is None:
            self.windows.mode = "step"
        self.counts.fit_windows(int(steps.min()), int(steps.max()))
        win = self.windows.index(steps)
        np.add.at(
            self.counts.load,
            (win[:, None, None], rows[None, :, None], np.arange(e)[None, None, :]),
            load.astype(np.int64, copy=False),
        )
        s.rows_read += p * nl

    def _add_total(self, load: np.ndarray, where: str) -> None:
        """Add an aggregated input's counts to the total, within MAX_TOTAL_COUNT."""
        self.count_total += float(load.sum(dtype=np.float64))
        if self.count_total > constants.MAX_TOTAL_COUNT:
            raise TraceError(
                f"the counts add up to {self.count_total:.4g} selections, more than placer"
                " counts (2^53)", where=where, hint=LIMITS_HINT,
            )

    def _begin(self, *, by_step: bool, where: str) -> None:
        if self.by_step is None:
            self.by_step = by_step
        elif self.by_step != by_step:
            raise TraceError(
                "counts per forward pass and load matrices cannot be read together",
                where=where,
                hint="read them separately",
            )

    def result(self) -> RoutingData:
        """The statistics of the aggregated inputs added so far."""
        s = self.state
        load = self.counts.load
        if self.by_step:
            num_e = s.num_experts if s.num_experts is not None else s.num_e
            load = load[:, :, :num_e]
            self.window_starts = self.windows.grid.starts()
        w, nl, _ = load.shape
        lid = np.asarray(s.layer_ids, dtype=np.int64)
        order = np.argsort(lid)
        load, lid = load[:, order], lid[order]
        if self.by_step:
            self.checks.selected_layers(lid)
        coact = None if self.coact is None else PairCounts.from_dense(self.coact[order])
        top_k = s.top_k
        if top_k is None:
            top_k = top_k_from_coact(load.sum(axis=0), coact)
            if top_k is None:
                raise TraceError(
                    "top_k is unknown: the file does not give it and co-activation cannot"
                    " tell it",
                    where=", ".join(s.sources),
                    hint="pass `top_k`, or add a top_k entry to the file",
                )
            s.notes.append(f"top_k {top_k} inferred from complete co-activation counts")
        self.checks.top_k(top_k, load.shape[2], ", ".join(s.sources))
        tokens = np.rint(load.sum(axis=(1, 2)) / (top_k * nl)).astype(np.int64)
        starts = (
            np.arange(w, dtype=np.int64)
            if self.window_starts is None
            else np.asarray(self.window_starts, dtype=np.int64)
        )
        warn = self.checks.warnings(load, lid)
        stats = ExpertStats(
            load=load,
            tokens=tokens,
            layer_ids=lid,
            top_k=top_k,
            coact=coact,
            layer_affinity=None,
            window_starts=starts,
            provenance=s.provenance(),
            warnings=tuple(warn),
        )
        warn_all(warn)
        return RoutingData(stats=stats, trace=None)


def _raise_beyond(load: np.ndarray, layer_ids: np.ndarray, num_experts: int, source: str,
                  name: str, where: str) -> None:
    """Raise for the first count of ``load [windows or passes, layers, experts]`` (layers
    ``layer_ids``) at an expert id of ``num_experts`` or more, naming its layer and
    window; nothing when every such count is 0."""
    beyond = np.asarray(load)[..., num_experts:]
    if beyond.size == 0 or not beyond.any():
        return
    w, lay, col = (int(i) for i in np.argwhere(beyond != 0)[0])
    e = num_experts + col
    unit = "window" if name == "load" else "pass"
    raise TraceError(
        f"expert id {e} is out of range [0, {num_experts}): {name} has"
        f" {int(load[w, lay, e])} selections of it in layer {int(layer_ids[lay])}, {unit} {w}",
        where=f"{where}: {name}",
        hint=f"num_experts is {num_experts} ({source}); check the model against the file",
    )
