"""The result of :class:`~placer.traces.accumulate.Accumulator`: statistics,
provenance, warnings and the kept-token trace."""

from __future__ import annotations

import warnings

import numpy as np

from placer import constants
from placer.errors import TraceError, TraceWarning
from placer.stats import (
    ExpertStats,
    PairCounts,
    RoutingData,
    RoutingTrace,
)
from placer.traces.checks import Checks
from placer.traces.counting import Counts
from placer.traces.limits import _SPARSE_TRACE_RATIO, _mib
from placer.traces.state import TraceState, _Keep
from placer.traces.windows import Windows


class _Results:
    """Builds the :class:`~placer.stats.RoutingData`."""

    _state: TraceState
    _windows: Windows
    _counts: Counts
    _checks: Checks
    _keep: _Keep | None

    def _finish_meta(self) -> tuple[int, int]:
        s = self._state
        num_e = s.num_experts if s.num_experts is not None else s.max_expert + 1
        top_k = s.top_k if s.top_k is not None else s.max_valid
        return num_e, top_k

    def _result_tokens(self) -> RoutingData:
        num_e, top_k = self._finish_meta()
        self._checks.top_k(top_k, num_e, ", ".join(self._state.sources))
        lid = np.asarray(self._state.layer_ids, dtype=np.int64)
        order = np.argsort(lid)
        layer_ids = lid[order]
        self._checks.selected_layers(layer_ids)
        load = self._counts.load[:, order, :num_e]
        coact, aff = self._counts.take_pairs(order, layer_ids, num_e)
        if self._keep is not None:
            self._check_trace_size(layer_ids.size)
        starts = self._windows.grid.starts()
        warn = self._checks.warnings(load, layer_ids)
        stats = ExpertStats(
            load=load,
            tokens=self._windows.tokens.copy(),
            layer_ids=layer_ids,
            top_k=top_k,
            coact=coact,
            layer_affinity=aff,
            window_starts=starts,
            provenance=self._state.provenance(),
            warnings=tuple(warn),
        )
        _emit(warn)
        trace = self._build_trace(layer_ids) if self._keep is not None else None
        return RoutingData(stats=stats, trace=trace)

    def _check_trace_size(self, num_layers: int) -> None:
        """Refuse a per-token trace whose dense ``[tokens, layers, k]`` array would dwarf
        the rows read (tokens with rows in few of many layers) past MAX_LOAD_BYTES."""
        assert self._keep is not None
        k = self._state.k or 1
        have_w = bool(self._keep.weights) and all(w is not None for w in self._keep.weights)
        need = self._state.num_tokens * num_layers * k * (8 if have_w else 4)
        if (
            need > constants.MAX_LOAD_BYTES
            and need > _SPARSE_TRACE_RATIO * self._state.rows_read * k * 4
        ):
            raise TraceError(
                f"the per-token trace would take {_mib(need)} MiB for {self._state.rows_read} rows:"
                f" its {self._state.num_tokens} tokens have rows in few of its {num_layers} layers",
                where=", ".join(self._state.sources),
                hint="a token has a row in each MoE layer it passed through; read the layers"
                " apart (layers=) or the trace in parts (limits: docs/limits.md)",
            )

    def _build_trace(self, layer_ids: np.ndarray) -> RoutingTrace:
        keep = self._keep
        assert keep is not None
        k = self._state.k or 1
        t = self._state.num_tokens
        have_w = bool(keep.weights) and all(w is not None for w in keep.weights)
        topk = np.full((t, layer_ids.size, k), -1, dtype=np.int32)
        weights = np.zeros((t, layer_ids.size, k), dtype=np.float32) if have_w else None
        for i, (tok, lay, ex) in enumerate(zip(keep.tokens, keep.layers, keep.experts,
                                               strict=True)):
            col = np.searchsorted(layer_ids, lay)
            topk[tok, col] = ex
            if weights is not None:
                w = keep.weights[i]
                assert w is not None
                weights[tok, col] = w
        step = np.concatenate(keep.step) if keep.step else np.zeros(0, np.int64)
        rank = np.concatenate(keep.rank) if keep.rank else np.zeros(0, np.int64)
        return RoutingTrace(
            topk_ids=topk,
            layer_ids=layer_ids.copy(),
            step=step.astype(np.int64),
            rank=rank.astype(np.int64),
            topk_weights=weights,
        )


def _top_k_from_coact(load: np.ndarray, coact: PairCounts | None) -> int | None:
    """k when co-activation is complete: each row sums to ``(k - 1) x load``."""
    if coact is None:
        return None
    rows = coact.partner_sums()
    used = load > 0
    if not used.any():
        return None
    ratio = rows[used] / load[used]
    k1 = round(float(ratio[0]))
    if np.all(rows[used] == k1 * load[used]):
        return k1 + 1
    return None


def _emit(messages: list[str]) -> None:
    for m in messages:
        warnings.warn(m, TraceWarning, stacklevel=5)  # the caller of read_routing
