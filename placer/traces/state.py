"""The bookkeeping every part of an :class:`~placer.traces.accumulate.Accumulator`
shares, in one explicit object (:class:`TraceState`): where the rows come from
(provenance), the declared metadata, the layer rows and the expert capacity, the kind
of input.  The accumulator makes one and hands it to the parts that read or record it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from placer import constants
from placer.errors import TraceError, UsageError
from placer.stats import Provenance, RoutingData
from placer.traces.chunks import ReadOptions, RowChunk, _HeldTokens
from placer.traces.identity import TokenIdentity
from placer.traces.limits import _coact_bytes, _mib
from placer.traces.occurrences import _WORD_BITS, _grow
from placer.traces.pairs import _KEY_BITS, _KEY_DTYPE, _SparsePairs
from placer.traces.warmup import WarmupDetector
from placer.traces.windows import Windows

#: How messages name figures the caller declared (read_routing's arguments, which the
#: CLI fills from --top-k / --num-experts or the model).
_DECLARED_EXPERTS = "the declared num_experts"
_DECLARED_TOP_K = "the declared top_k"


class TraceState:
    """What the parts of one accumulator share (each part reads and records here, so
    no part reaches into another).

    Attributes
    ----------
    options: what ``read_routing`` was asked for (``coact`` turns off when co-activation
        is left out, see :meth:`~placer.traces.counting.Counts.drop_coact`).
    sources, formats, source, skipped, rows_read, synthetic, model, notes: provenance
        and messages; ``source`` is the file read now.
    num_experts, experts_from, top_k, top_k_from, num_layers_declared: declared
        metadata (None: not declared) and where it came from.
    layer_filter, all_layers: the selected layer ids (``layers``), and every layer id of
        the input, selected or not.
    layer_ids, row_of_layer: row ``r`` of the counts holds absolute layer
        ``layer_ids[r]``; ``row_of_layer[layer id]`` is its row (-1: none yet).
    k, max_valid, num_e, max_expert: width of expert arrays (None: no row yet), most
        valid experts in one row, expert capacity of the counts, largest id read.
    kind: ``"tokens"`` or ``"aggregate"`` (None: nothing read).
    num_tokens: tokens numbered so far.
    """

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.sources: list[str] = []
        self.formats: list[str] = []
        self.source = ""
        self.skipped: Counter[str] = Counter()
        self.rows_read = 0
        self.synthetic = False
        self.model: str | None = None
        self.notes: list[str] = []
        self.num_experts: int | None = options.num_experts
        self.experts_from = _DECLARED_EXPERTS if self.num_experts else ""
        self.top_k: int | None = options.top_k
        self.top_k_from = _DECLARED_TOP_K if self.top_k else ""
        self.num_layers_declared: int | None = None
        self.layer_filter = (
            None if options.layers is None else np.unique(np.asarray(options.layers))
        )
        self.all_layers: set[int] = set()
        self.layer_ids: list[int] = []
        self.row_of_layer = np.full(0, -1, dtype=np.int64)
        self.k: int | None = None
        self.max_valid = 0
        self.num_e = self.num_experts or 0
        self.max_expert = -1
        self.kind: str | None = None
        self.num_tokens = 0

    def skip(self, reason: str, count: int = 1) -> None:
        """Count ``count`` rows left out on purpose because of ``reason``."""
        if count:
            self.skipped[reason] += count

    def begin_kind(self, kind: str) -> None:
        """Per-token rows and aggregated inputs do not mix."""
        if self.kind is None:
            self.kind = kind
        elif self.kind != kind:
            raise UsageError(
                "per-token traces and aggregated load files cannot be read together",
                where=self.source,
                hint="read them separately",
            )

    def filter_layers(self, layer: np.ndarray) -> np.ndarray | None:
        """Which rows of ``layer`` ids are selected (``layers``), counting the others as
        skipped; None when all are."""
        if self.layer_filter is None:
            return None
        self.all_layers.update(np.unique(layer).tolist())
        keep = np.isin(layer, self.layer_filter)
        if keep.all():
            return None
        self.skip("layer not selected", int((~keep).sum()))
        return keep

    def words(self) -> int:
        """64-bit words of a bit set over the layer rows."""
        return max(1, -(-len(self.layer_ids) // _WORD_BITS))

    def rows_of(self, layer: np.ndarray, where: Callable[[int], str]) -> tuple[np.ndarray, bool]:
        """Row of each absolute layer id, adding new layers; and whether some were added
        (the caller grows what is sized by layers)."""
        top = int(layer.max())
        if top >= self.row_of_layer.size:
            self.row_of_layer = _grow(self.row_of_layer, (top + 1,), -1)
        rows = self.row_of_layer[layer]
        if not (rows < 0).any():
            return rows, False
        new = np.unique(layer[rows < 0])
        if len(self.layer_ids) + new.size > constants.MAX_LAYERS:
            raise TraceError(
                f"the input names more than {constants.MAX_LAYERS} layers, the most placer"
                " handles", where=where(int(np.flatnonzero(rows < 0)[0])),
                hint="layer is the model's absolute layer index (limits:"
                " docs/limits.md)",
            )
        for lid in new.tolist():
            self.row_of_layer[lid] = len(self.layer_ids)
            self.layer_ids.append(int(lid))
        return self.row_of_layer[layer], True

    def provenance(self) -> Provenance:
        return Provenance(
            sources=tuple(self.sources),
            format="+".join(self.formats),
            rows_read=self.rows_read,
            rows_skipped=tuple(sorted(self.skipped.items())),
            synthetic=self.synthetic,
            model=self.model,
        )


@dataclass
class _Keep:
    """Rows kept for ``keep_tokens``."""

    tokens: list[np.ndarray] = field(default_factory=list)  # [rows] global token
    layers: list[np.ndarray] = field(default_factory=list)  # [rows] layer id
    experts: list[np.ndarray] = field(default_factory=list)  # [rows, k]
    weights: list[np.ndarray | None] = field(default_factory=list)
    step: list[np.ndarray] = field(default_factory=list)  # per token, in token order
    rank: list[np.ndarray] = field(default_factory=list)


class _AccumulatorState:
    """What an :class:`~placer.traces.accumulate.Accumulator` holds, and its shared
    bookkeeping."""

    def __init__(self, options: ReadOptions | None = None) -> None:
        self._state = TraceState(options or ReadOptions())
        self._load = np.zeros((0, 0, 0), dtype=np.int64)  # [windows, layers, experts]
        self._coact = np.zeros((0, 0, 0), dtype=np.int64)  # upper triangle [L, E, E]
        self._aff = np.zeros((0, 0, 0), dtype=np.int64)  # [pairs, E, E]
        self._aff_pairs: dict[tuple[int, int], int] = {}  # (layer id a, layer id b) -> index
        self._pair_of_rows = np.zeros((0, 0), dtype=np.int64)  # same, by accumulator rows
        # past MAX_COACT_BYTES of dense counts, pairs are counted sparsely (_go_sparse)
        self._sparse = False
        self._sp_coact = _SparsePairs()  # by accumulator row
        self._sp_aff = _SparsePairs()  # by affinity index
        # windows
        self._windows = Windows(self._state.options.window_tokens)
        # tokens
        self._tokens = TokenIdentity()
        # warm-up passes, and rows held back while their run may still grow into one
        self._warmup = WarmupDetector(self._state.options.keep_warmup, self._state.skip)
        self._held_rows: RowChunk | None = None
        self._held_tokens: _HeldTokens | None = None
        self._keep = _Keep() if self._state.options.keep_tokens else None
        self._result: RoutingData | None = None
        self._scratch_buf: np.ndarray | None = None
        self._columns: np.ndarray | None = None
        self._hot: np.ndarray | None = None

    def skip(self, reason: str, count: int = 1) -> None:
        """Count ``count`` rows left out on purpose because of ``reason``."""
        self._state.skip(reason, count)

    def _rows_of(self, layer: np.ndarray, where: Callable[[int], str]) -> np.ndarray:
        """Accumulator row of each absolute layer id, adding new layers."""
        rows, added = self._state.rows_of(layer, where)
        if added:
            self._resize(num_layers=len(self._state.layer_ids))
        return rows

    def _resize(self, *, num_e: int | None = None, num_layers: int | None = None) -> None:
        e = self._state.num_e if num_e is None else num_e
        nl = len(self._state.layer_ids) if num_layers is None else num_layers
        # load may grow to MAX_WINDOWS windows: refuse now what would not fit then
        need = constants.MAX_WINDOWS * nl * e * 8
        if need > constants.MAX_LOAD_BYTES:
            raise TraceError(
                f"statistics of {nl} layers x {e} experts would take {_mib(need)} MiB, more"
                f" than placer's {_mib(constants.MAX_LOAD_BYTES)} MiB",
                where=self._state.source,
                hint="declare the expert count (`num_experts`) so a stray id"
                " is reported, or read fewer layers (limits: docs/limits.md)",
            )
        self._state.num_e = e
        w = self._windows.grid.count
        self._load = _grow(self._load, (w, nl, e))
        if self._state.options.coact and not self._sparse:
            if _coact_bytes(nl, self._aff.shape[0], e + 1) > constants.MAX_COACT_BYTES:
                self._go_sparse()
            else:
                # one more expert than the accumulators' width: -1 (no expert) counts
                # there and is cleared after each chunk (see _clear_trash)
                self._coact = _grow(self._coact, (nl, e + 1, e + 1))
                self._aff = _grow(self._aff, (self._aff.shape[0], e + 1, e + 1))
        k = self._state.k or 1
        self._warmup.grow(nl, k)

    def _go_sparse(self) -> None:
        """Count pairs sparsely from now on: dense ``[E, E]`` counts would pass
        ``constants.MAX_COACT_BYTES``.  The counts so far move to the sparse stores."""
        for dense, store, triangle in ((self._coact, self._sp_coact, True),
                                       (self._aff, self._sp_aff, False)):
            ew = dense.shape[1] if dense.ndim == 3 else 0
            for row in range(dense.shape[0]):
                flat = dense[row].reshape(-1)
                idx = np.flatnonzero(flat)
                i, j = idx // ew, idx % ew
                if triangle:  # counted in either order: key them unordered
                    i, j = np.minimum(i, j), np.maximum(i, j)
                keep = (j < ew - 1) & (i < ew - 1) & ((i != j) | (not triangle))
                store.add(row, ((i << _KEY_BITS) | j)[keep].astype(_KEY_DTYPE),
                          flat[idx][keep])
        self._sparse = True
        self._coact = np.zeros((0, 0, 0), dtype=np.int64)
        self._aff = np.zeros((0, 0, 0), dtype=np.int64)
        self._hot = None

    def _check_sparse_size(self, *, final: bool = False) -> None:
        """Leave co-activation out once the sparse counts hold more than
        ``constants.MAX_COACT_PAIRS`` distinct pairs.  While counting they hold repeats
        of pairs from different chunks until merged: merge (and look again) only past
        twice the limit, so merges stay rare near it; ``final``: look now."""
        limit = constants.MAX_COACT_PAIRS * (1 if final else 2)
        if not self._sparse or self._sp_coact.size + self._sp_aff.size <= limit:
            return
        held = self._sp_coact.merge() + self._sp_aff.merge()  # distinct pairs only
        if held > constants.MAX_COACT_PAIRS:
            self._drop_coact(
                f"counting it holds {held:,} distinct expert pairs, more than placer's"
                f" {constants.MAX_COACT_PAIRS:,}"
            )

    def _drop_coact(self, why: str) -> None:
        """Stop counting co-activation and layer affinity (the load is still counted)."""
        self._state.notes.append(
            f"co-activation was left out: {why} (docs/limits.md); the load was read."
            "  Declare the expert count (`num_experts`) if a stray id raised"
            " it, or read fewer layers"
        )
        self._state.options = replace(self._state.options, coact=False)
        self._sparse = False
        self._sp_coact = _SparsePairs()
        self._sp_aff = _SparsePairs()
        self._coact = np.zeros((0, 0, 0), dtype=np.int64)
        self._aff = np.zeros((0, 0, 0), dtype=np.int64)
        self._aff_pairs = {}
        self._pair_of_rows = np.zeros((0, 0), dtype=np.int64)
        self._hot = None
