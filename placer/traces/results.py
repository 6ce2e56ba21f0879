"""The result of :class:`~placer.traces.accumulate.Accumulator`: statistics,
provenance, warnings and the kept-token trace."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from placer import constants
from placer.errors import TraceError, TraceWarning
from placer.stats import (
    ExpertStats,
    PairCounts,
    Provenance,
    RoutingData,
    RoutingTrace,
)
from placer.traces.checks import Checks
from placer.traces.counting import _Counting
from placer.traces.limits import _SPARSE_TRACE_RATIO, _mib


class _Results(_Counting):
    """Builds the :class:`~placer.stats.RoutingData`."""

    _checks: Checks

    def _finish_meta(self) -> tuple[int, int]:
        s = self._state
        num_e = s.num_experts if s.num_experts is not None else s.max_expert + 1
        top_k = s.top_k if s.top_k is not None else s.max_valid
        return num_e, top_k

    def _provenance(self) -> Provenance:
        return Provenance(
            sources=tuple(self._state.sources),
            format="+".join(self._state.formats),
            rows_read=self._state.rows_read,
            rows_skipped=tuple(sorted(self._state.skipped.items())),
            synthetic=self._state.synthetic,
            model=self._state.model,
        )

    def _result_tokens(self) -> RoutingData:
        num_e, top_k = self._finish_meta()
        self._checks.top_k(top_k, num_e, ", ".join(self._state.sources))
        lid = np.asarray(self._state.layer_ids, dtype=np.int64)
        order = np.argsort(lid)
        layer_ids = lid[order]
        self._checks.selected_layers(layer_ids)
        same = bool((order == np.arange(order.size)).all())
        load = self._load[:, order, :num_e]
        coact = aff = None
        self._check_sparse_size(final=True)
        if self._state.options.coact:
            pairs = [
                self._aff_pairs.get((int(layer_ids[r]), int(layer_ids[r + 1])))
                for r in range(layer_ids.size - 1)
            ]
            coact, aff = (self._sparse_result if self._sparse else self._dense_result)(
                order, same, pairs, num_e)
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
            provenance=self._provenance(),
            warnings=tuple(warn),
        )
        _emit(warn)
        trace = self._build_trace(layer_ids) if self._keep is not None else None
        return RoutingData(stats=stats, trace=trace)

    def _dense_result(
        self, order: np.ndarray, same: bool, pairs: list[int | None], num_e: int
    ) -> tuple[PairCounts, PairCounts | None]:
        """Co-activation and layer affinity of dense counts (rows in ``order``; ``pairs``
        the affinity index of each consecutive layer pair, None when never seen)."""
        # pairs were counted in either order (positions i < j of a row): the counts
        # plus their transpose, made in place layer by layer (the accumulation ends here)
        full = self._coact if same else self._coact[order]
        for r in range(full.shape[0]):
            full[r] += full[r].T
        coact = _nonzero_rows(full, list(range(full.shape[0])), num_e, symmetric=True)
        aff = _nonzero_rows(self._aff, pairs, num_e, symmetric=False) if pairs else None
        return coact, aff

    def _sparse_result(
        self, order: np.ndarray, same: bool, pairs: list[int | None], num_e: int
    ) -> tuple[PairCounts, PairCounts | None]:
        """As :meth:`_dense_result`, from the sparse counts (each row handed over in
        turn, so the counts are held about once, not twice)."""
        coact = self._sp_coact.take_rows([int(r) for r in order], num_e, symmetric=True)
        aff = self._sp_aff.take_rows(pairs, num_e, symmetric=False) if pairs else None
        return coact, aff

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


def _nonzero_rows(
    dense: np.ndarray, rows: Sequence[int | None], num_e: int, *, symmetric: bool
) -> PairCounts:
    """Pair counts of the rows ``rows`` (None: no pairs) of dense ``[R, W, W]`` counts
    (``W >= num_e``; cells of experts ``>= num_e`` are left out); ``symmetric``: only
    ``i < j``.  The nonzero cells of ``[:num_e, :num_e]`` in C order are the keys
    ``i * num_e + j`` in rising order, and boolean indexing reads their counts in the
    same order."""
    upper = np.triu(np.ones((num_e, num_e), dtype=bool), k=1) if symmetric else None
    keys: list[np.ndarray] = []
    counts: list[np.ndarray] = []
    sizes = np.zeros(len(rows), dtype=np.int64)
    for n, r in enumerate(rows):
        if r is None:
            continue
        cells = dense[r, :num_e, :num_e]
        hit = cells != 0
        if upper is not None:
            hit &= upper
        keys.append(np.flatnonzero(hit))
        counts.append(cells[hit])
        sizes[n] = keys[-1].size
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(sizes, out=indptr[1:])
    empty = np.zeros(0, dtype=np.int64)
    return PairCounts(num_e, indptr, np.concatenate(keys) if keys else empty,
                      np.concatenate(counts) if counts else empty, symmetric)


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
