"""Aggregated inputs of :class:`~placer.traces.accumulate.Accumulator`: load matrices
and counts per forward pass."""

from __future__ import annotations

import numpy as np

from placer import constants
from placer.errors import Param, TraceError, UsageError
from placer.stats import format_ranges
from placer.traces.limits import _LIMITS_HINT, check_counts
from placer.traces.results import _Results


class _AggregateInputs(_Results):
    """Load matrices and counts per forward pass."""

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
        where = where or self.source
        self._begin_kind("aggregate")
        self._begin_aggregate(by_step=False, where=where)
        w, nl, e = load.shape
        self._add_total(load, where)
        lid = np.arange(nl, dtype=np.int64) if layer_ids is None else layer_ids
        if self._layer_filter is not None:
            missing = [i for i in self._layer_filter.tolist() if i not in set(lid.tolist())]
            if missing:
                raise UsageError(
                    f"layer {missing[0]} is not in {where}",
                    where=Param("layers"),
                    hint=f"layers present: {format_ranges(lid)}",
                )
            cols = np.isin(lid, self._layer_filter)
            self.skip("layer not selected", int(w * (~cols).sum()))
            load, lid = load[:, cols], lid[cols]
            coact = None if coact is None else coact[cols]
            nl = lid.size
        if self._num_experts is not None and e != self._num_experts:
            raise TraceError(
                f"load has {e} experts but num_experts is {self._num_experts}"
                f" ({self._experts_from})",
                where=where, hint="check `num_experts` and `model` against the file",
            )
        if self._load.size == 0 and not self._layer_ids:
            self._layer_ids = [int(i) for i in lid]
            self._load = load.astype(np.int64)
            self._num_e = e
            self._agg_coact = None if coact is None else coact.astype(np.int64)
            self._agg_has_coact = coact is not None
            self._agg_window_starts = window_starts
        else:
            if self._layer_ids != [int(i) for i in lid] or self._load.shape != (w, nl, e):
                raise TraceError(
                    f"load [{w}, {nl}, {e}] with layers {format_ranges(lid)} does not match"
                    f" the first input's [{', '.join(map(str, self._load.shape))}] with layers"
                    f" {format_ranges(np.asarray(self._layer_ids))}",
                    where=where,
                    hint="aggregated files read together are summed: same windows, layers,"
                    " experts",
                )
            self._load = self._load + load
            if coact is None or self._agg_coact is None:
                self._agg_has_coact = False
                self._agg_coact = None
            else:
                self._agg_coact = self._agg_coact + coact
        self.rows_read += w * nl

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
        where = where or self.source
        self._begin_kind("aggregate")
        self._begin_aggregate(by_step=True, where=where)
        p, nl, e = load.shape
        lid = np.asarray(layer_ids, dtype=np.int64)
        steps = np.asarray(steps, dtype=np.int64)
        if steps.shape != (p,) or lid.shape != (nl,):
            raise TraceError(
                f"{p} passes with {steps.shape} steps and {nl} layers with {lid.shape} ids",
                where=where, hint="each pass needs one step and each layer one id",
            )
        if self._layer_filter is not None:
            self._all_layers.update(lid.tolist())
            cols = np.isin(lid, self._layer_filter)
            self.skip("layer not selected", int(p * (~cols).sum()))
            load, lid = load[:, cols], lid[cols]
            nl = lid.size
        if p == 0 or nl == 0:
            return
        if self._num_experts is not None and e > self._num_experts:
            raise TraceError(
                f"counts have {e} experts but num_experts is {self._num_experts}"
                f" ({self._experts_from})",
                where=where, hint="check `num_experts` and `model` against the file",
            )
        load = check_counts(load, "counts", where)
        self._add_total(load, where)
        rows = self._rows_of(lid, lambda i: where)
        if e > self._num_e:
            self._resize(num_e=e)
        self._max_expert = max(self._max_expert, e - 1)
        if self._window_mode is None:
            self._window_mode = "step"
        self._fit_windows(int(steps.min()), int(steps.max()))
        win = self._window_of(steps)
        np.add.at(
            self._load,
            (win[:, None, None], rows[None, :, None], np.arange(e)[None, None, :]),
            load.astype(np.int64, copy=False),
        )
        self.rows_read += p * nl

    def _add_total(self, load: np.ndarray, where: str) -> None:
        """Add an aggregated input's counts to the total, within MAX_TOTAL_COUNT."""
        self._count_total += float(load.sum(dtype=np.float64))
        if self._count_total > constants.MAX_TOTAL_COUNT:
            raise TraceError(
                f"the counts add up to {self._count_total:.4g} selections, more than placer"
                " counts (2^53)", where=where, hint=_LIMITS_HINT,
            )

    def _begin_aggregate(self, *, by_step: bool, where: str) -> None:
        if self._agg_by_step is None:
            self._agg_by_step = by_step
        elif self._agg_by_step != by_step:
            raise TraceError(
                "counts per forward pass and load matrices cannot be read together",
                where=where,
                hint="read them separately",
            )
