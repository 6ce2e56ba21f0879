"""The result of :class:`~placer.traces.accumulate.Accumulator` for per-token inputs:
:func:`token_result` reads the accumulator's parts (the shared state, the counts, the
windows and the checks) and builds the :class:`~placer.stats.RoutingData`: statistics,
provenance, warnings and, with ``keep_tokens``, the per-token trace from the rows kept
in :class:`KeptRows`.  Aggregated inputs make theirs in
:mod:`placer.traces.accumulate.aggregate` with the helpers here (:func:`warn_all`,
:func:`top_k_from_coact`)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from placer import constants
from placer.errors import TraceError, TraceWarning
from placer.stats import ExpertStats, PairCounts, RoutingData, RoutingTrace
from placer.traces.accumulate.checks import Checks
from placer.traces.accumulate.counting import Counts
from placer.traces.accumulate.estimates import fit_pairs
from placer.traces.accumulate.grid import Windows
from placer.traces.accumulate.limits import SPARSE_TRACE_RATIO, mib_text
from placer.traces.accumulate.sample import TokenSampler
from placer.traces.accumulate.state import TraceState
from placer.traces.chunks import RowChunk


@dataclass
class KeptRows:
    """Rows kept for ``keep_tokens``, in the order counted."""

    tokens: list[np.ndarray] = field(default_factory=list)  # [rows] global token
    layers: list[np.ndarray] = field(default_factory=list)  # [rows] layer id
    experts: list[np.ndarray] = field(default_factory=list)  # [rows, k]
    weights: list[np.ndarray | None] = field(default_factory=list)
    step: list[np.ndarray] = field(default_factory=list)  # per token, in token order
    rank: list[np.ndarray] = field(default_factory=list)

    def add_rows(
        self, glob: np.ndarray, layer: np.ndarray, experts: np.ndarray,
        weights: np.ndarray | None, new_step: np.ndarray, new_rank: np.ndarray,
    ) -> None:
        """Counted rows (``glob``: their tokens) and, for the tokens first seen in
        them, in token order, their step and rank."""
        self.tokens.append(glob)
        self.layers.append(layer.astype(np.int64))
        self.experts.append(experts)
        self.weights.append(weights)
        self.step.append(new_step)
        self.rank.append(new_rank)

    def add_whole_tokens(
        self,
        glob: np.ndarray,
        lid: np.ndarray,
        ids: np.ndarray,
        weights: Any,
        step: np.ndarray | None,
        rank: np.ndarray | None,
        present: np.ndarray | None,
    ) -> None:
        """Counted whole tokens ``ids [tokens, layers, k]``, as layer-major rows
        (``present``: ``[layers, tokens]`` rows with an expert, None when all have)."""
        t, _, k = ids.shape
        kept = slice(None) if present is None else present.ravel()  # layer-major
        self.tokens.append(np.tile(glob, lid.size)[kept])
        self.layers.append(np.repeat(lid, t)[kept])
        # copies: readers may reuse the chunk's arrays for the next chunk
        original = np.array(ids.transpose(1, 0, 2)).reshape(-1, k)
        self.experts.append(original[kept])
        self.weights.append(
            None if weights is None
            else np.array(
                np.asarray(weights, dtype=np.float32).transpose(1, 0, 2)
            ).reshape(-1, k)[kept]
        )
        self.step.append(step if step is not None else np.full(t, -1, np.int64))
        self.rank.append(rank if rank is not None else np.full(t, -1, np.int64))

    def _have_weights(self) -> bool:
        return bool(self.weights) and all(w is not None for w in self.weights)

    def check_size(self, state: TraceState, num_layers: int) -> None:
        """Refuse a per-token trace whose dense ``[tokens, layers, k]`` array would dwarf
        the rows read (tokens with rows in few of many layers) past MAX_LOAD_BYTES."""
        check_dense(state, state.num_tokens, state.rows_read, num_layers,
                    8 if self._have_weights() else 4)

    def trace(self, layer_ids: np.ndarray, num_tokens: int, k: int) -> RoutingTrace:
        """The dense per-token trace of ``num_tokens`` tokens over ``layer_ids``
        (ascending), ``k`` experts a row, -1 where a token has no row."""
        t = num_tokens
        topk = np.full((t, layer_ids.size, k), -1, dtype=np.int32)
        weights = (
            np.zeros((t, layer_ids.size, k), dtype=np.float32) if self._have_weights() else None
        )
        for i, (tok, lay, ex) in enumerate(zip(self.tokens, self.layers, self.experts,
                                               strict=True)):
            col = np.searchsorted(layer_ids, lay)
            topk[tok, col] = ex
            if weights is not None:
                w = self.weights[i]
                assert w is not None
                weights[tok, col] = w
        step = np.concatenate(self.step) if self.step else np.zeros(0, np.int64)
        rank = np.concatenate(self.rank) if self.rank else np.zeros(0, np.int64)
        return RoutingTrace(
            topk_ids=topk,
            layer_ids=layer_ids.copy(),
            step=step.astype(np.int64),
            rank=rank.astype(np.int64),
            topk_weights=weights,
        )


def check_dense(state: TraceState, tokens: int, rows: int, num_layers: int,
                item_bytes: int) -> None:
    """Refuse a dense ``[tokens, layers, k]`` per-token array (``item_bytes`` per entry)
    that would dwarf the ``rows`` read into it past MAX_LOAD_BYTES: every token kept
    (``keep_tokens``) or the tokens a sample holds."""
    k = state.k or 1
    need = tokens * num_layers * k * item_bytes
    if need > constants.MAX_LOAD_BYTES and need > SPARSE_TRACE_RATIO * rows * k * 4:
        raise TraceError(
            f"the per-token trace would take {mib_text(need)} MiB for {rows} rows:"
            f" its {tokens} tokens have rows in few of its {num_layers} layers",
            where=", ".join(state.sources),
            hint="a token has a row in each MoE layer it passed through; read the layers"
            " apart (layers=) or the trace in parts (limits: docs/limits.md)",
        )


def hand_rows(keep: KeptRows | None, sampler: TokenSampler | None, chunk: RowChunk,
              glob: np.ndarray, experts: np.ndarray, new_first: np.ndarray,
              win_key_new: np.ndarray, step_rows: np.ndarray) -> None:
    """Hand counted rows (``glob``: their tokens) to ``keep_tokens``' rows and to the
    sample, with the step, rank and window key of the tokens first seen in them (rows
    ``new_first``)."""
    if keep is None and sampler is None:
        return
    rank = chunk.rank if chunk.rank is not None else np.full(glob.size, -1)
    if keep is not None:
        order = np.argsort(glob[new_first], kind="stable")
        keep.add_rows(glob, chunk.layer, experts, chunk.weights,
                      step_rows[new_first][order], rank[new_first][order])
    if sampler is not None:
        sampler.add_rows(glob, chunk.layer, experts, glob[new_first], win_key_new,
                         step_rows[new_first], rank[new_first])


def token_result(
    state: TraceState, counts: Counts, windows: Windows, checks: Checks,
    keep: KeptRows | None, sampler: TokenSampler | None = None,
) -> RoutingData:
    """The statistics of per-token rows counted (and the trace of the rows ``keep``
    kept, or of the tokens ``sampler`` kept); ends the counting (see :meth:`Counts.take_pairs
    <placer.traces.accumulate.counting.Counts.take_pairs>`) and gives the warnings."""
    num_e = state.num_experts if state.num_experts is not None else state.max_expert + 1
    top_k = state.top_k if state.top_k is not None else state.max_valid
    checks.top_k(top_k, num_e, ", ".join(state.sources))
    lid = np.asarray(state.layer_ids, dtype=np.int64)
    order = np.argsort(lid)
    layer_ids = lid[order]
    checks.selected_layers(layer_ids)
    load = counts.load[:, order, :num_e]
    coact, aff = counts.take_pairs(order, layer_ids, num_e)
    if state.pairs_sampled:  # estimates from a sample: fitted to the loads, exact
        coact, aff = fit_pairs(coact, aff, load.sum(axis=0), state.k or 1, state.num_tokens)
    if keep is not None:
        keep.check_size(state, layer_ids.size)
    if sampler is not None:
        check_dense(state, *sampler.held(), layer_ids.size, sampler.itemsize(num_e))
    starts = windows.grid.starts()
    warn = checks.warnings(load, layer_ids)
    stats = ExpertStats(
        load=load,
        tokens=windows.tokens.copy(),
        layer_ids=layer_ids,
        top_k=top_k,
        coact=coact,
        layer_affinity=aff,
        window_starts=starts,
        provenance=state.provenance(),
        warnings=tuple(warn),
    )
    warn_all(warn)
    trace = None if keep is None else keep.trace(layer_ids, state.num_tokens, state.k or 1)
    if sampler is not None:
        trace = sampler.trace(layer_ids, state.num_tokens, state.k or 1, num_e)
    return RoutingData(stats=stats, trace=trace)


def top_k_from_coact(load: np.ndarray, coact: PairCounts | None) -> int | None:
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


def warn_all(messages: list[str]) -> None:
    for m in messages:
        warnings.warn(m, TraceWarning, stacklevel=5)  # the caller of read_routing
