"""Streaming accumulation of routing into :class:`~placer.stats.ExpertStats`.

Every per-token reader hands chunks to one :class:`Accumulator`, which owns what all
formats share: layer and expert bookkeeping, token identity, windows, load,
co-activation, layer affinity, validation, skipped-row counts and warnings.  Memory is
``O(layers x experts^2)`` for the statistics plus one chunk, plus a small per-token
record (``8 x (7 + k)`` bytes) for traces whose rows carry token ids; ``keep_tokens``
also keeps every row.

Two kinds of chunk come in:

- :class:`RowChunk`: one row per (token, layer), as JSONL logs have them; tokens are
  found by id (``request``, ``token``) or, for rows without a token id, by order: the
  n-th row of a layer (within a request) belongs to the n-th token.
- :class:`TokenChunk`: consecutive whole tokens ``[tokens, layers, k]``, as NPZ traces
  and the writers have them.

Aggregated inputs go through :meth:`Accumulator.add_aggregate` (load matrices) or
:meth:`Accumulator.add_step_counts` (counts per forward pass).

Real logs: the n-th row of a (request, token, layer) belongs to the n-th occurrence of
the token (a second pass with the same ids, token numbers that restart), with one
warning.  Runs of ``constants.WARMUP_RUN_ROWS`` or more identical consecutive rows of one
layer (and request) are an engine's warm-up pass: left out unless ``keep_warmup``.  To
see a run whole, the rows from the start of the first run that may still grow are held
back and go first with the next chunk, so rows are always counted in file order.

Windows (``ExpertStats.load`` is ``[windows, layers, experts]``): a token belongs to
one window, chosen when it is first seen.  With ``window_tokens=N`` windows are N
consecutive tokens; otherwise windows follow the trace's ``step`` when rows carry one,
else tokens in order of first appearance; :mod:`placer.traces.windows` keeps at most
``constants.MAX_WINDOWS`` of them by merging adjacent windows pairwise.

Limits (docs/limits.md), checked before anything is sized by them: expert ids below
``constants.MAX_EXPERTS``, rows of at most ``constants.MAX_TOP_K`` experts, at most
``constants.MAX_LAYERS`` layers, load within ``constants.MAX_LOAD_BYTES`` and counts of
aggregated inputs within ``constants.MAX_TOTAL_COUNT``.  Co-activation past
``constants.MAX_COACT_BYTES`` is left out with a warning (the load is still read).
"""

from __future__ import annotations

import itertools
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from placer import constants
from placer.errors import TraceError, TraceWarning, UsageError
from placer.stats import ExpertStats, Provenance, RoutingData, RoutingTrace, format_ranges
from placer.traces.windows import WindowGrid

__all__ = ["Accumulator", "ReadOptions", "RowChunk", "TokenChunk"]

_WORD_BITS = 64

#: How messages name figures the caller declared (read_routing's arguments, which the
#: CLI fills from --top-k / --num-experts or the model).
_DECLARED_EXPERTS = "the declared num_experts"
_DECLARED_TOP_K = "the declared top_k"


@dataclass(frozen=True)
class ReadOptions:
    """What ``read_routing`` was asked for (see :func:`placer.traces.read_routing`)."""

    window_tokens: int | None = None
    keep_tokens: bool = False
    coact: bool = True
    layers: tuple[int, ...] | None = None
    num_experts: int | None = None
    top_k: int | None = None
    progress: bool = False
    keep_warmup: bool = False

    def __post_init__(self) -> None:
        if self.window_tokens is not None and self.window_tokens < 1:
            raise UsageError(
                f"window_tokens must be >= 1, got {self.window_tokens}", where="--window-tokens",
                hint="a window is this many consecutive tokens",
            )
        if self.num_experts is not None and not 1 <= self.num_experts <= constants.MAX_EXPERTS:
            raise UsageError(
                f"num_experts must be in [1, {constants.MAX_EXPERTS}], got {self.num_experts}",
                where="--num-experts", hint="the routed experts of one MoE layer",
            )
        if self.top_k is not None and not 1 <= self.top_k <= constants.MAX_TOP_K:
            raise UsageError(
                f"top_k must be in [1, {constants.MAX_TOP_K}], got {self.top_k}",
                where="--top-k", hint="the experts each token selects per layer",
            )
        if (
            self.top_k is not None and self.num_experts is not None
            and self.top_k > self.num_experts
        ):
            raise UsageError(
                f"top_k {self.top_k} is more than num_experts {self.num_experts}",
                where="--top-k", hint="a token selects top_k of the layer's experts",
            )
        if self.layers is not None and any(i < 0 for i in self.layers):
            raise UsageError(
                "layer ids are >= 0", where="--layers",
                hint="layers are the model's absolute layer indices, from 0",
            )


@dataclass
class TokenChunk:
    """Routing of consecutive whole tokens.

    Attributes
    ----------
    topk_ids: ``[tokens, layers, k]`` int, logical expert ids, -1 where none.
    step: ``[tokens]`` int forward step of each token, or None.
    rank: ``[tokens]`` int source (DP) rank of each token, or None.
    topk_weights: ``[tokens, layers, k]`` float gate weights, or None.
    request: ``[tokens]`` request label of each token (int or str), or None; only the
        JSONL writer uses it.
    """

    topk_ids: np.ndarray
    step: np.ndarray | None = None
    rank: np.ndarray | None = None
    topk_weights: np.ndarray | None = None
    request: np.ndarray | None = None


@dataclass
class RowChunk:
    """Routing rows, one per (token, layer), in file order.

    Attributes
    ----------
    layer: ``[rows]`` int64 absolute layer id.
    experts: ``[rows, k]`` int64 expert ids, -1 where none.
    request: ``[rows]`` int64 request number from :meth:`Accumulator.request_id`.
    token: ``[rows]`` int64 token id, -1 where the row has none.
    step: ``[rows]`` int64 or None; -1 where a row has none.
    rank: ``[rows]`` int64 or None; -1 where a row has none.
    weights: ``[rows, k]`` float32 or None.
    lines: ``[rows]`` int64 line number of each row, for messages.
    """

    layer: np.ndarray
    experts: np.ndarray
    request: np.ndarray
    token: np.ndarray
    lines: np.ndarray
    step: np.ndarray | None = None
    rank: np.ndarray | None = None
    weights: np.ndarray | None = None


def _grow(arr: np.ndarray, shape: tuple[int, ...], fill: int = 0) -> np.ndarray:
    """``arr`` padded with ``fill`` at the end of each axis up to ``shape``."""
    if arr.shape == shape:
        return arr
    # zeros come from calloc: pages are mapped on first touch, not written here
    out = np.zeros(shape, dtype=arr.dtype) if fill == 0 else np.full(shape, fill, arr.dtype)
    out[tuple(slice(0, n) for n in arr.shape)] = arr
    return out


def _capacity(n: int) -> int:
    return max(1024, 1 << (max(n, 1) - 1).bit_length())


class _KeyIndex:
    """Sorted 64-bit keys, each with a value (a token's table index)."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, dtype=np.int64)  # sorted
        self.values = np.zeros(0, dtype=np.int64)  # value of each sorted key

    def find(self, keys: np.ndarray) -> np.ndarray:
        """Value of each key, -1 for keys not in the index."""
        if self.keys.size == 0:
            return np.full(keys.size, -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.keys, keys), self.keys.size - 1)
        return np.where(self.keys[pos] == keys, self.values[pos], -1)

    def lookup(self, keys: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Value of each key, adding new keys with values ``start, start + 1, ...`` in
        order of first appearance.

        Returns ``(values [rows], new_first [rows] bool, added)``: ``new_first`` marks
        the first row of each key the index had not seen.
        """
        uniq, first, inv = np.unique(keys, return_index=True, return_inverse=True)
        val_u = self.find(uniq)
        new = np.flatnonzero(val_u < 0)
        new = new[np.argsort(first[new], kind="stable")]
        val_u[new] = start + np.arange(new.size)
        if new.size:
            self.keys = np.concatenate([self.keys, uniq[new]])
            self.values = np.concatenate([self.values, val_u[new]])
            order = np.argsort(self.keys, kind="stable")
            self.keys, self.values = self.keys[order], self.values[order]
        new_first = np.zeros(keys.size, dtype=bool)
        new_first[first[new]] = True
        return val_u[inv.ravel()], new_first, int(new.size)


class _TokenTable:
    """Tokens known by id: a key index plus per-token records.

    A token id (request, token) that repeats a layer starts a new occurrence of the
    token: occurrence ``n >= 1`` of the token whose first occurrence is at table index
    ``f`` is found under key ``f << _OCC_BITS | n`` in ``occurrences``.
    """

    def __init__(self) -> None:
        self.index = _KeyIndex()  # token key -> table index of its first occurrence
        self.occurrences = _KeyIndex()  # (first index, occurrence) -> table index
        self.size = 0
        self.glob = np.zeros(0, dtype=np.int64)  # global token index
        self.step = np.zeros(0, dtype=np.int64)  # step of the token's first row, -1 none
        self.wkey = np.zeros(0, dtype=np.int64)  # window key: step or token order
        self.last_layer = np.zeros(0, dtype=np.int64)
        self.last_experts = np.zeros((0, 0), dtype=np.int64)
        self.seen = np.zeros((0, 1), dtype=np.uint64)
        self.extra = np.zeros(0, dtype=np.int64)  # occurrences after the first (first index)

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Table index of each key's first occurrence, adding new keys in order of first
        appearance.

        Returns ``(index [rows], new_first [rows] bool)``: ``new_first`` marks the first
        row of each token the table had not seen.
        """
        idx, new_first, added = self.index.lookup(keys, self.size)
        self.size += added
        return idx, new_first

    def occurrence(self, first: np.ndarray, occ: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Table index of occurrence ``occ [rows] >= 1`` of the tokens first at ``first``,
        adding new occurrences in order of first appearance; ``(index, new_first)``."""
        idx, new_first, added = self.occurrences.lookup((first << _OCC_BITS) | occ, self.size)
        self.size += added
        return idx, new_first

    def reserve(self, k: int, words: int) -> None:
        """Per-token records for ``size`` tokens, ``k`` experts, ``words`` x 64 layer rows."""
        cap = self.glob.size
        if self.size > cap or k != self.last_experts.shape[1] or words != self.seen.shape[1]:
            cap = _capacity(self.size) if self.size > cap else cap
            self.glob = _grow(self.glob, (cap,), -1)
            self.step = _grow(self.step, (cap,), -1)
            self.wkey = _grow(self.wkey, (cap,))
            self.last_layer = _grow(self.last_layer, (cap,), -1)
            self.last_experts = _grow(self.last_experts, (cap, k), -1)
            self.seen = _grow(self.seen, (cap, words))
            self.extra = _grow(self.extra, (cap,))


#: Bits of an occurrence number in the occurrence keys of :class:`_TokenTable`.
_OCC_BITS = 24

#: Rows held back for warm-up detection: a layer's last run of identical rows stays
#: open (may still grow into a warm-up pass) while the layer had a row among this many
#: last rows; older runs are counted (logs that list a layer's rows in one block).
_OPEN_RUN_ROWS = 1 << 16


@dataclass
class _Keep:
    """Rows kept for ``keep_tokens``."""

    tokens: list[np.ndarray] = field(default_factory=list)  # [rows] global token
    layers: list[np.ndarray] = field(default_factory=list)  # [rows] layer id
    experts: list[np.ndarray] = field(default_factory=list)  # [rows, k]
    weights: list[np.ndarray | None] = field(default_factory=list)
    step: list[np.ndarray] = field(default_factory=list)  # per token, in token order
    rank: list[np.ndarray] = field(default_factory=list)


@dataclass
class _HeldTokens:
    """Validated whole tokens of one source waiting to be counted (see
    :meth:`Accumulator._cut_warmup_tokens`); arrays as in :class:`TokenChunk`."""

    ids: np.ndarray  # [tokens, layers, k]
    lid: np.ndarray  # [layers] absolute layer ids
    step: np.ndarray | None
    rank: np.ndarray | None
    weights: np.ndarray | None
    offset: int  # index of the first token in its file, for messages
    array: str  # name of the id array, for messages
    has_none: bool = False

    def continued_by(self, other: _HeldTokens) -> bool:
        """Whether ``other`` are the tokens right after these, in the same layout."""
        return (
            self.array == other.array
            and self.offset + self.ids.shape[0] == other.offset
            and self.ids.shape[2] == other.ids.shape[2]
            and np.array_equal(self.lid, other.lid)
            and all(
                (getattr(self, name) is None) == (getattr(other, name) is None)
                for name in ("step", "rank", "weights")
            )
        )

    def join(self, other: _HeldTokens) -> _HeldTokens:
        def cat(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
            return None if a is None or b is None else np.concatenate([a, np.asarray(b)])

        return _HeldTokens(
            np.concatenate([self.ids, other.ids]), other.lid, cat(self.step, other.step),
            cat(self.rank, other.rank), cat(self.weights, other.weights), self.offset,
            self.array, self.has_none or other.has_none,
        )

    def tail(self, cut: int, has_none: bool) -> _HeldTokens:
        """Copies of the tokens from ``cut`` on (readers reuse their chunk buffers)."""
        def part(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else np.array(np.asarray(a)[cut:])

        ids = part(self.ids)
        assert ids is not None
        return _HeldTokens(
            ids, self.lid, part(self.step), part(self.rank), part(self.weights),
            self.offset + cut, self.array, has_none,
        )


@dataclass
class _Runs:
    """Runs of identical consecutive rows of each layer, in rows sorted by layer.

    Rows of one layer are in file order; a run is rows with the same experts (and the
    same request, where rows carry one).  Every array but ``seg_of`` has one entry a run.
    """

    first: np.ndarray  # index of the run's first row here
    carry: np.ndarray  # rows of the run read before these rows
    length: np.ndarray  # rows of the run so far, carried ones included
    last: np.ndarray  # index of the run's last row here
    trailing: np.ndarray  # bool: the layer's last run here (it may go on)
    warm: np.ndarray  # bool: length >= constants.WARMUP_RUN_ROWS
    seg_of: np.ndarray  # [rows] run of each row


#: Reason counted in ``Provenance.rows_skipped`` for the rows of warm-up passes.
WARMUP_SKIP = "warm-up pass"


class Accumulator:
    """Builds one :class:`~placer.stats.RoutingData` from chunks of routing.

    Readers call :meth:`begin_source` once per file, then :meth:`declare` (header
    metadata), :meth:`add_rows` / :meth:`add_tokens` / :meth:`add_aggregate`,
    :meth:`skip` for rows they leave out on purpose, and :meth:`advance` for progress;
    :meth:`result` ends the accumulation.
    """

    def __init__(self, options: ReadOptions | None = None) -> None:
        self.options = options or ReadOptions()
        self.sources: list[str] = []
        self.formats: list[str] = []
        self.source = ""
        self.skipped: Counter[str] = Counter()
        self.rows_read = 0
        self.synthetic = False
        self.model: str | None = None
        self.notes: list[str] = []
        self._progress: Callable[[int], None] | None = None
        # declared metadata and where it came from
        self._num_experts: int | None = self.options.num_experts
        self._experts_from = _DECLARED_EXPERTS if self._num_experts else ""
        self._top_k: int | None = self.options.top_k
        self._top_k_from = _DECLARED_TOP_K if self._top_k else ""
        self._num_layers_declared: int | None = None
        self._layer_filter = (
            None if self.options.layers is None else np.unique(np.asarray(self.options.layers))
        )
        self._all_layers: set[int] = set()  # layer ids in the input, selected or not
        # layers: row r of the accumulators holds absolute layer self._layer_ids[r]
        self._layer_ids: list[int] = []
        self._row_of_layer = np.full(0, -1, dtype=np.int64)
        self._k: int | None = None  # width of expert arrays
        self._max_valid = 0  # most valid experts in one row
        self._num_e = self._num_experts or 0  # current expert capacity
        self._max_expert = -1
        # statistics
        self._kind: str | None = None  # "tokens" or "aggregate"
        self._load = np.zeros((0, 0, 0), dtype=np.int64)  # [windows, layers, experts]
        self._tokens_w = np.zeros(0, dtype=np.int64)  # [windows]
        self._coact = np.zeros((0, 0, 0), dtype=np.int64)  # upper triangle [L, E, E]
        self._aff = np.zeros((0, 0, 0), dtype=np.int64)  # [pairs, E, E]
        self._aff_pairs: dict[tuple[int, int], int] = {}  # (layer id a, layer id b) -> index
        self._pair_of_rows = np.zeros((0, 0), dtype=np.int64)  # same, by accumulator rows
        self._agg_coact: np.ndarray | None = None
        self._agg_has_coact = True
        self._agg_window_starts: np.ndarray | None = None
        self._agg_by_step: bool | None = None  # add_step_counts (True) or add_aggregate
        # windows
        self._window_mode: str | None = None  # "step", "order", "fixed"
        self._grid = WindowGrid()
        # tokens
        self._num_tokens = 0
        self._table = _TokenTable()
        self._requests: dict[tuple[int, Any], int] = {}
        self._request_labels: list[Any] = []
        self._order_count: dict[int, int] = {}  # (request << 20 | layer) -> rows so far
        # warm-up passes (see _cut_warmup): per layer row, the run carried from earlier
        # rows (its experts, request and length; length 0: none), and rows held back
        # while their run may still grow into a warm-up pass
        self._run_last = np.zeros((0, 0), dtype=np.int64)
        self._run_req = np.zeros(0, dtype=np.int64)
        self._run_len = np.zeros(0, dtype=np.int64)
        self._run_best: tuple[int, int, str] = (0, -1, "")  # (rows, layer id, where)
        self._warmup_rows = 0  # rows left out as a warm-up pass
        self._held_rows: RowChunk | None = None
        self._held_tokens: _HeldTokens | None = None
        # token ids that repeat a layer: rows, tokens they started, first row's place
        self._repeat_rows = 0
        self._repeat_tokens = 0
        self._repeat_where = ""
        self._keep = _Keep() if self.options.keep_tokens else None
        self._result: RoutingData | None = None
        self._scratch_buf: np.ndarray | None = None
        self._columns: np.ndarray | None = None
        self._hot: np.ndarray | None = None
        self._count_total = 0.0  # counts of aggregated inputs so far (MAX_TOTAL_COUNT)

    # -- reader API ----------------------------------------------------------------
    def begin_source(self, source: str, format_name: str) -> None:
        """Start reading ``source`` (a path, for messages) in format ``format_name``."""
        self._flush_held()
        self.sources.append(source)
        if format_name not in self.formats:
            self.formats.append(format_name)
        self.source = source
        self._run_len[:] = 0
        self._run_last[:] = -2
        self._run_req[:] = -1

    def set_progress(self, callback: Callable[[int], None] | None) -> None:
        self._progress = callback

    def advance(self, nbytes: int) -> None:
        """Report ``nbytes`` more of the current source read (for the progress bar)."""
        if self._progress is not None and nbytes:
            self._progress(nbytes)

    def skip(self, reason: str, count: int = 1) -> None:
        """Count ``count`` rows left out on purpose because of ``reason``."""
        if count:
            self.skipped[reason] += count

    def request_id(self, label: Any) -> int:
        """A number for request ``label`` of the current source (labels are per file)."""
        key = (len(self.sources), label)
        rid = self._requests.get(key)
        if rid is None:
            rid = len(self._request_labels)
            if rid >= 1 << 30:
                raise TraceError(
                    "more than 2^30 requests", where=self.source,
                    hint="read the trace in parts",
                )
            self._requests[key] = rid
            self._request_labels.append(label)
        return rid

    def declare(
        self,
        *,
        where: str,
        num_experts: Any = None,
        top_k: Any = None,
        num_layers: Any = None,
        model: Any = None,
        synthetic: Any = None,
    ) -> None:
        """Metadata a file declares (header, scalar arrays); checked against arguments."""
        if num_experts is not None:
            e = _positive_int(num_experts, "num_experts", where)
            if e > constants.MAX_EXPERTS:
                raise TraceError(
                    f"num_experts {e} is more than placer handles ({constants.MAX_EXPERTS})",
                    where=where, hint=_LIMITS_HINT,
                )
            if self._num_experts is not None and self._num_experts != e:
                raise TraceError(
                    f"num_experts is {e} here but {self._num_experts} in {self._experts_from}",
                    where=where,
                    hint="check --num-experts against the trace"
                    if self._experts_from == _DECLARED_EXPERTS
                    else "all inputs of one read must describe the same model",
                )
            if self._max_expert >= e:
                raise TraceError(
                    f"num_experts is {e} but expert {self._max_expert} was already read",
                    where=where, hint="expert ids are 0..num_experts-1; check the header",
                )
            self._num_experts, self._experts_from = e, where
            self._resize(num_e=max(self._num_e, e))
        if top_k is not None:
            k = _positive_int(top_k, "top_k", where)
            if k > constants.MAX_TOP_K:
                raise TraceError(
                    f"top_k {k} is more than placer handles ({constants.MAX_TOP_K})",
                    where=where, hint=_LIMITS_HINT,
                )
            if self._top_k is not None and self._top_k != k:
                raise TraceError(
                    f"top_k is {k} here but {self._top_k} in {self._top_k_from}",
                    where=where,
                    hint="check --model and --top-k against the trace"
                    if self._top_k_from == _DECLARED_TOP_K
                    else "all inputs of one read must describe the same model",
                )
            self._top_k, self._top_k_from = k, where
        if (
            self._top_k is not None and self._num_experts is not None
            and self._top_k > self._num_experts
        ):
            raise TraceError(
                f"top_k {self._top_k} ({self._top_k_from}) is more than num_experts"
                f" {self._num_experts} ({self._experts_from})",
                where=where, hint="a token selects top_k of the layer's experts; check both",
            )
        if num_layers is not None:
            self._num_layers_declared = _positive_int(num_layers, "num_layers", where)
            if self._num_layers_declared > constants.MAX_LAYERS:
                raise TraceError(
                    f"num_layers {self._num_layers_declared} is more than placer handles"
                    f" ({constants.MAX_LAYERS})", where=where, hint=_LIMITS_HINT,
                )
        if model is not None:
            self.model = str(model)
        if synthetic is not None:
            if not isinstance(synthetic, bool | np.bool_):
                raise TraceError(
                    f"synthetic must be true or false, got {synthetic!r:.40}", where=where,
                    hint="synthetic: true marks a generated trace",
                )
            self.synthetic = self.synthetic or bool(synthetic)

    # -- per-token rows -----------------------------------------------------------
    def add_rows(self, chunk: RowChunk) -> None:
        """Accumulate routing rows (one per token and layer)."""
        self._begin_kind("tokens")
        if chunk.layer.size == 0:
            return
        keep = self._filter_layers(chunk.layer)
        if keep is not None:
            chunk = _take_rows(chunk, keep)
            if chunk.layer.size == 0:
                return

        def where(i: int) -> str:
            return f"{self.source}:{int(chunk.lines[i])}"

        if self._check_experts(chunk.experts, where, chunk.layer):
            valid_rows = np.asarray((chunk.experts >= 0).any(axis=1), dtype=bool)
            if not valid_rows.all():
                self.skip("no expert (all -1)", int((~valid_rows).sum()))
                chunk = _take_rows(chunk, valid_rows)
                if chunk.layer.size == 0:
                    return
        if self._held_rows is not None:
            chunk = _concat_rows(self._held_rows, chunk)
            self._held_rows = None
        self._count_rows(self._cut_warmup_rows(chunk, final=False))

    def _cut_warmup_rows(self, chunk: RowChunk, *, final: bool) -> RowChunk | None:
        """The rows of ``chunk`` to count now: without the rows of warm-up passes and
        (unless ``final``) without the rows from the start of the first layer run that
        may still grow into a warm-up pass, held back to go before the next rows.

        What is held is a suffix in file order, so rows are counted in file order (a
        token's rows in layer order, as layer affinity needs).  A layer's last run stays
        open while the layer had a row among the last ``_OPEN_RUN_ROWS`` rows.
        """
        rows = self._rows_of(chunk.layer, lambda i: self.source)
        experts = chunk.experts
        n = rows.size
        if n > 1 and (rows[1:] < rows[:-1]).any():
            order: np.ndarray | None = np.argsort(rows, kind="stable")
        else:
            order = None

        def by_layer(a: np.ndarray) -> np.ndarray:
            return a if order is None else a[order]

        r, ex, rq = by_layer(rows), by_layer(experts), by_layer(chunk.request)
        eq = np.zeros(n, dtype=bool)
        eq[1:] = (ex[1:] == ex[:-1]).all(axis=1) & (rq[1:] == rq[:-1])
        runs = self._find_runs(r, eq, lambda idx: ex[idx], rq)
        hold = None
        if not (final or self.options.keep_warmup):
            pos = np.arange(n) if order is None else order  # file position of sorted rows
            open_runs = runs.trailing & ~runs.warm & (pos[runs.last] >= n - _OPEN_RUN_ROWS)
            if open_runs.any():
                hold = pos >= int(pos[runs.first[open_runs]].min())

        def where(i: int) -> str:
            j = i if order is None else int(order[i])
            return f"{self.source}:{int(chunk.lines[j])}"

        drop = self._end_runs(r, runs, hold, lambda idx: ex[idx], rq, where)
        if drop is None:
            return chunk
        if order is not None:
            drop_sorted, drop = drop, np.empty_like(drop)
            drop[order] = drop_sorted
            if hold is not None:
                hold_sorted, hold = hold, np.empty_like(hold)
                hold[order] = hold_sorted
        if hold is not None and hold.any():
            self._held_rows = _take_rows(chunk, hold)
        if drop.all():
            return None
        return _take_rows(chunk, ~drop) if drop.any() else chunk

    def _count_rows(self, chunk: RowChunk | None) -> None:
        """Count validated rows (see :meth:`add_rows`)."""
        if chunk is None or chunk.layer.size == 0:
            return

        def where(i: int) -> str:
            return f"{self.source}:{int(chunk.lines[i])}"

        experts = chunk.experts.astype(np.int64, copy=False)
        has_none = int(experts.min()) < 0
        rows = self._rows_of(chunk.layer, where)
        step = chunk.step
        if self._window_mode is None:
            self._start_windows(step is not None and bool((step >= 0).all()))
        if self._window_mode == "step" and (step is None or (step < 0).any()):
            i = 0 if step is None else int(np.flatnonzero(step < 0)[0])
            raise TraceError(
                "row has no step but earlier rows have one",
                where=where(i),
                hint="give every row a step (or none at all), or pass window_tokens",
            )
        # token identity
        keys = self._token_keys(chunk, rows)
        local, new_first = self._token_indices(keys, rows, where)
        t_new = int(new_first.sum())
        glob_new = self._num_tokens + np.arange(t_new)
        self._num_tokens += t_new
        table = self._table
        table.glob[local[new_first]] = glob_new
        step_rows = step if step is not None else np.full(local.size, -1, dtype=np.int64)
        table.step[local[new_first]] = step_rows[new_first]
        if step is not None:
            bad = (table.step[local] != step_rows) & (step_rows >= 0)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise TraceError(
                    f"token {self._token_label(chunk, i)} has rows from steps "
                    f"{int(table.step[local[i]])} and {int(step_rows[i])}",
                    where=where(i),
                    hint="a token runs in one step: when token ids restart, the new token"
                    " repeats every layer (a repeated layer starts a new token); or drop"
                    " the token field to number tokens by row order",
                )
        glob = table.glob[local]
        # windows: each token's key (its step, or its order), fixed when first seen
        win_key_new = step_rows[new_first] if self._window_mode == "step" else glob_new
        table.wkey[local[new_first]] = win_key_new
        if t_new:
            self._fit_windows(int(win_key_new.min()), int(win_key_new.max()))
            self._tokens_w += np.bincount(
                self._window_of(win_key_new), minlength=self._grid.count
            )
        w_rows = self._window_of(table.wkey[local])
        # layer-major rows, expert-major columns: each layer's counts in cache, and every
        # code array is built from contiguous vectors
        if rows.size > 1 and (rows[1:] < rows[:-1]).any():
            by_layer = np.argsort(rows, kind="stable")
            rows_l, ex_l, w_l = rows[by_layer], experts[by_layer], w_rows[by_layer]
        else:
            rows_l, ex_l, w_l = rows, experts, w_rows
        cuts = np.flatnonzero(rows_l[1:] != rows_l[:-1]) + 1
        bounds = np.concatenate([[0], cuts, [rows_l.size]]).tolist()
        xt = np.ascontiguousarray(ex_l.T)  # [k, rows]
        _, nl, e = self._load.shape
        self._count(xt, (w_l * nl + rows_l) * e, rows_l, bounds, has_none)
        if self.options.coact:
            self._add_row_affinity(local, chunk.layer, experts)
        self.rows_read += experts.shape[0]
        if self._keep is not None:
            self._keep.tokens.append(glob)
            self._keep.layers.append(chunk.layer.astype(np.int64))
            self._keep.experts.append(experts)
            self._keep.weights.append(chunk.weights)
            order = np.argsort(glob[new_first], kind="stable")
            self._keep.step.append(step_rows[new_first][order])
            rank = chunk.rank if chunk.rank is not None else np.full(local.size, -1)
            self._keep.rank.append(rank[new_first][order])

    # -- whole tokens --------------------------------------------------------------
    def add_tokens(
        self,
        chunk: TokenChunk,
        layer_ids: Sequence[int] | np.ndarray,
        *,
        token_offset: int = 0,
        array: str = "topk_ids",
    ) -> None:
        """Accumulate consecutive whole tokens.

        Parameters
        ----------
        chunk: the tokens; ``topk_ids [tokens, layers, k]``.  Nothing keeps a reference to
            its arrays, so readers may reuse them for the next chunk.
        layer_ids: ``[layers]`` absolute layer id of each column, strictly increasing.
        token_offset: index of the chunk's first token in its file, for messages.
        array: name of the id array, for messages (``"topk_ids"``).
        """
        self._begin_kind("tokens")
        ids = np.asarray(chunk.topk_ids)
        lid = np.asarray(layer_ids, dtype=np.int64)
        if ids.ndim != 3 or ids.shape[1] != lid.size:
            raise TraceError(
                f"{array} has shape {ids.shape}, expected [tokens, {lid.size}, k]",
                where=self.source, hint="one column of expert ids per layer id",
            )
        t, _, k = ids.shape
        if t == 0:
            return
        if lid.size > 1 and (np.diff(lid) <= 0).any():
            raise TraceError(
                f"layer_ids {lid.tolist()!s:.80} are not strictly increasing",
                where=self.source, hint="each layer once, in increasing order",
            )
        weights = chunk.topk_weights
        if self._layer_filter is not None:
            self._all_layers.update(lid.tolist())
            cols = np.isin(lid, self._layer_filter)
            if not cols.all():
                self.skip("layer not selected", int(t * (~cols).sum()))
                ids, lid = ids[:, cols], lid[cols]
                weights = None if weights is None else np.asarray(weights)[:, cols]
                if lid.size == 0:
                    return

        def where3(i: int) -> str:
            tok, col, j = np.unravel_index(i, ids.shape)
            return f"{self.source}: {array}[{token_offset + int(tok)}, {int(col)}, {int(j)}]"

        flat = ids.reshape(-1, k)
        has_none = self._check_experts(
            flat, lambda r: where3(r * k), lid, where_flat=where3,
            where_layer=lambda i: where3(i * k), duplicates=False,
        )
        step = None if chunk.step is None else np.asarray(chunk.step, dtype=np.int64)
        rank = None if chunk.rank is None else np.asarray(chunk.rank, dtype=np.int64)
        for name, a in (("step", step), ("rank", rank)):
            if a is not None and a.shape != (t,):
                raise TraceError(
                    f"{name} has shape {a.shape}, expected [{t}]", where=self.source,
                    hint=f"one {name} per token",
                )
        tokens = _HeldTokens(ids, lid, step, rank, weights, token_offset, array)
        held = self._held_tokens
        if held is not None:
            if held.continued_by(tokens):
                tokens, has_none = held.join(tokens), has_none or held.has_none
                self._held_tokens = None
            else:
                self._flush_held()
        self._count_token_chunk(tokens, has_none, final=False)

    def _count_token_chunk(self, tokens: _HeldTokens, has_none: bool, *, final: bool) -> None:
        """Count validated whole tokens (see :meth:`add_tokens`), less warm-up passes and
        (unless ``final``) the tokens held back while a run may still grow into one."""
        ids, lid, step, rank, weights = (
            tokens.ids, tokens.lid, tokens.step, tokens.rank, tokens.weights
        )
        token_offset, array = tokens.offset, tokens.array
        t, _, k = ids.shape
        rows = self._rows_of(lid, lambda i: self.source)
        # expert-major columns per layer: xt[c, i] is the i-th expert of every token
        xt = self._columns_buffer(lid.size * k * t).reshape(lid.size, k, t)
        xt[...] = ids.transpose(1, 2, 0)
        present = np.asarray((xt >= 0).any(axis=1), dtype=bool) if has_none else None  # [L, t]
        cut, excluded = self._cut_warmup_tokens(xt, rows, present, tokens, final=final)
        if cut < t:
            self._held_tokens = tokens.tail(cut, has_none)
            if cut == 0:
                return
            t = cut
            xt, ids = xt[:, :, :t], ids[:t]
            present = None if present is None else present[:, :t]
            excluded = None if excluded is None else excluded[:, :t]
            step = None if step is None else step[:t]
            rank = None if rank is None else rank[:t]
            weights = None if weights is None else np.asarray(weights)[:t]
        had_rows = present
        if excluded is not None:
            # rows of warm-up passes count as no expert
            for i in range(k):
                xt[:, i][excluded] = -1
            ids = np.array(ids)
            ids[excluded.T] = -1
            had_rows = present if present is not None else np.ones((lid.size, t), dtype=bool)
            present = had_rows & ~excluded
            has_none = True

        def where3(i: int) -> str:
            tok, col, j = np.unravel_index(i, ids.shape)
            return f"{self.source}: {array}[{token_offset + int(tok)}, {int(col)}, {int(j)}]"

        flat = ids.reshape(-1, k)
        if k > 1 and not self.options.coact and _has_duplicate(xt.transpose(1, 0, 2)):
            self._raise_duplicate(flat, lambda r: where3(r * k))
        if present is not None:
            assert had_rows is not None
            counted = present.any(axis=0)
            if not counted.all():
                # a token with no expert in any layer is no token (as in JSONL, it has no row)
                empty = int((~had_rows.any(axis=0)).sum())
                self.skip("token with no expert in any layer", empty)
                xt, present, ids = xt[:, :, counted], present[:, counted], ids[counted]
                step = None if step is None else step[counted]
                rank = None if rank is None else rank[counted]
                weights = None if weights is None else np.asarray(weights)[counted]
                t = int(counted.sum())
                if t == 0:
                    return
        if self._window_mode is None:
            self._start_windows(step is not None and bool((step >= 0).all()))
        if self._window_mode == "step" and (step is None or (step < 0).any()):
            raise TraceError(
                "tokens without a step after tokens with one", where=self.source,
                hint="give every token a step (or none), or pass window_tokens",
            )
        glob = self._num_tokens + np.arange(t)
        self._num_tokens += t
        wkey = step if self._window_mode == "step" and step is not None else glob
        self._fit_windows(int(wkey.min()), int(wkey.max()))
        tok_win = self._window_of(wkey)
        self._tokens_w += np.bincount(tok_win, minlength=self._grid.count)
        self._count_tokens(xt, rows, lid, tok_win, has_none, lambda r: where3(r * k), flat)
        keep_rows = None if present is None else present.ravel()  # layer-major
        self.rows_read += lid.size * t if present is None else int(present.sum())
        if self._keep is not None:
            kept = slice(None) if keep_rows is None else keep_rows
            self._keep.tokens.append(np.tile(glob, lid.size)[kept])
            self._keep.layers.append(np.repeat(lid, t)[kept])
            # copies: readers may reuse the chunk's arrays for the next chunk
            original = np.array(ids.transpose(1, 0, 2)).reshape(-1, k)
            self._keep.experts.append(original[kept])
            self._keep.weights.append(
                None if weights is None
                else np.array(
                    np.asarray(weights, dtype=np.float32).transpose(1, 0, 2)
                ).reshape(-1, k)[kept]
            )
            self._keep.step.append(step if step is not None else np.full(t, -1, np.int64))
            self._keep.rank.append(rank if rank is not None else np.full(t, -1, np.int64))

    def _cut_warmup_tokens(
        self, xt: np.ndarray, rows: np.ndarray, present: np.ndarray | None,
        tokens: _HeldTokens, *, final: bool,
    ) -> tuple[int, np.ndarray | None]:
        """Warm-up passes in whole tokens ``xt [layers, k, tokens]``.

        Returns ``(cut, excluded)``: tokens from ``cut`` on are held back (the last run
        of some layer may still grow into a warm-up pass; all tokens when ``final``
        or ``keep_warmup``), and ``excluded [layers, cut or more]`` marks the rows of
        warm-up passes before ``cut`` (None: none).
        """
        nl, k, t = xt.shape
        if present is None:
            # eq[c, j]: token j repeats token j - 1 in column c, column by column
            eq2 = np.empty((nl, t), dtype=bool)
            eq2[:, 0] = False
            eq2[:, 1:] = xt[:, 0, 1:] == xt[:, 0, :-1]
            for i in range(1, k):
                if not eq2.any():
                    break
                eq2[:, 1:] &= xt[:, i, 1:] == xt[:, i, :-1]
            r = np.repeat(rows, t)
            eq = eq2.ravel()
            tok = np.tile(np.arange(t), nl)
            col = np.repeat(np.arange(nl), t)

            def ex_at(idx: np.ndarray) -> np.ndarray:
                return np.asarray(xt[idx // t, :, idx % t], dtype=np.int64)
        else:
            kept = present.ravel()
            col_all, tok_all = np.divmod(np.flatnonzero(kept), t)
            r, tok, col = rows[col_all], tok_all, col_all
            ex = np.asarray(xt[col_all, :, tok_all], dtype=np.int64)
            eq = np.zeros(r.size, dtype=bool)
            eq[1:] = (ex[1:] == ex[:-1]).all(axis=1)

            def ex_at(idx: np.ndarray) -> np.ndarray:
                return ex[idx]

        if r.size == 0:
            return t, None
        runs = self._find_runs(r, eq, ex_at, None)
        cut = t
        hold = None
        if not (final or self.options.keep_warmup):
            open_runs = runs.trailing & ~runs.warm
            if open_runs.any():
                cut = int(tok[runs.first[open_runs]].min())
                hold = tok >= cut

        def where(i: int) -> str:
            return f"{self.source}: {tokens.array}[{tokens.offset + int(tok[i])}, {int(col[i])}]"

        drop = self._end_runs(r, runs, hold, ex_at, None, where)
        if drop is None or (hold is not None and not (drop & ~hold).any()):
            return cut, None
        excluded = np.zeros((nl, t), dtype=bool)
        gone = drop if hold is None else drop & ~hold
        excluded[col[gone], tok[gone]] = True
        return cut, excluded

    # -- aggregated statistics ------------------------------------------------------
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
                    where="--layers",
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
                where=where, hint="check --num-experts and --model against the file",
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
                where=where, hint="check --num-experts and --model against the file",
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

    def _check_top_k(self, top_k: int, num_e: int, where: str) -> None:
        """top_k cannot exceed the experts: such statistics would be silently wrong."""
        if top_k > num_e:
            source = self._top_k_from or "the data"
            raise TraceError(
                f"top_k {top_k} ({source}) is more than the {num_e} experts of the data",
                where=where,
                hint="check top_k (--top-k, --model) and the expert count (--num-experts)",
            )

    # -- result -------------------------------------------------------------------
    def only_warmup(self) -> bool:
        """Whether every per-token row read so far was left out as a warm-up pass."""
        if self._result is None:
            self._flush_held()
        return self._kind == "tokens" and self.rows_read == 0 and self._warmup_rows > 0

    def result(self) -> RoutingData:
        """The statistics (and per-token trace with ``keep_tokens``); ends the accumulation
        (later calls return the same result)."""
        if self._result is None:
            self._flush_held()
        if self._kind is None or (self._kind == "tokens" and self.rows_read == 0):
            skipped = ", ".join(f"{n} {r}" for r, n in sorted(self.skipped.items()))
            raise TraceError(
                "no routing rows" + (f" (skipped: {skipped})" if skipped else ""),
                where=", ".join(self.sources) or None,
                hint="every row is part of a warm-up pass (identical routing): pass"
                " keep_warmup=True (--keep-warmup) to count them"
                if self._warmup_rows
                else "a routing row needs 'layer' and 'experts'; check --layers and the format",
            )
        if self._result is None:
            self._result = (
                self._result_aggregate() if self._kind == "aggregate" else self._result_tokens()
            )
        return self._result

    # -- internals: bookkeeping ------------------------------------------------------
    def _begin_kind(self, kind: str) -> None:
        if self._kind is None:
            self._kind = kind
        elif self._kind != kind:
            raise UsageError(
                "per-token traces and aggregated load files cannot be read together",
                where=self.source,
                hint="read them separately",
            )

    def _filter_layers(self, layer: np.ndarray) -> np.ndarray | None:
        if self._layer_filter is None:
            return None
        self._all_layers.update(np.unique(layer).tolist())
        keep = np.isin(layer, self._layer_filter)
        if keep.all():
            return None
        self.skip("layer not selected", int((~keep).sum()))
        return keep

    def _words(self) -> int:
        return max(1, -(-len(self._layer_ids) // _WORD_BITS))

    def _check_experts(
        self,
        experts: np.ndarray,
        where: Callable[[int], str],
        layer: np.ndarray,
        *,
        where_flat: Callable[[int], str] | None = None,
        where_layer: Callable[[int], str] | None = None,
        duplicates: bool = True,
    ) -> bool:
        """Validate ``[rows, k]`` expert ids and layer ids; grow the expert capacity.

        ``layer``: the layer ids of the rows (or of the columns, with ``where_layer``
        naming index ``i`` of it).  ``duplicates``: also look for an expert twice in one
        row (callers that count co-activation may find them there instead, see
        :meth:`_raise_duplicate`).  Returns whether some entries are -1 (no expert).
        The ids keep their dtype; nothing is copied unless a check fails.
        """
        if experts.ndim != 2 or experts.shape[1] == 0:
            raise TraceError(
                "routing rows need at least one expert", where=where(0),
                hint="each row lists the top_k experts a token selected in a layer",
            )
        k = experts.shape[1]
        if k > constants.MAX_TOP_K:
            raise TraceError(
                f"a row lists {k} experts, more than placer handles ({constants.MAX_TOP_K})",
                where=where(0), hint=_LIMITS_HINT,
            )
        if not np.issubdtype(experts.dtype, np.integer):
            raise TraceError(
                f"expert ids must be integers, got {experts.dtype}", where=where(0),
                hint="store expert ids as int16 or int32",
            )
        if self._k is None:
            self._k = k
            if self._top_k is not None and k < self._top_k:
                raise TraceError(
                    f"row has {k} experts but top_k is {self._top_k} ({self._top_k_from})",
                    where=where(0),
                    hint="each row lists top_k experts (-1 where none)",
                )
            self._resize(num_e=self._num_e)
        elif k != self._k:
            raise TraceError(
                f"row has {k} experts but earlier rows have {self._k}",
                where=where(0),
                hint="all rows must select the same number of experts (top_k); pad with -1",
            )
        lo = int(layer.min())
        if lo < 0 or int(layer.max()) > constants.MAX_LAYER_ID:
            i = int(np.flatnonzero((layer < 0) | (layer > constants.MAX_LAYER_ID))[0])
            raise TraceError(
                f"layer {int(layer[i])} is out of range [0, {constants.MAX_LAYER_ID}]",
                where=(where_layer or where)(i),
                hint="layer is the model's absolute layer index, from 0",
            )
        wf = where_flat or (lambda i: where(i // k))
        mn = int(experts.min())
        if mn < -1:
            i = int(np.argmin(experts.ravel()))
            raise TraceError(
                f"expert id {mn} is negative",
                where=wf(i),
                hint="expert ids are 0..num_experts-1; -1 marks no expert",
            )
        mx = int(experts.max())
        if self._num_experts is not None and mx >= self._num_experts:
            i = int(np.flatnonzero(experts.ravel() >= self._num_experts)[0])
            raise TraceError(
                f"expert id {int(experts.ravel()[i])} is out of range [0, {self._num_experts})",
                where=wf(i),
                hint=f"num_experts is {self._num_experts} ({self._experts_from}); check the"
                " model, or pass num_experts= (--num-experts)",
            )
        if mx > constants.MAX_EXPERTS - 1:
            i = int(np.argmax(experts.ravel()))
            raise TraceError(
                f"expert id {mx} is more than placer handles ({constants.MAX_EXPERTS} experts)",
                where=wf(i), hint=_LIMITS_HINT,
            )
        if duplicates and k > 1 and _has_duplicate(experts.T):
            self._raise_duplicate(experts, where)
        has_none = mn < 0
        if has_none:
            valid = (experts >= 0).sum(axis=1)
            most = int(valid.max())
        else:
            most = k
        if self._top_k is not None and most > self._top_k:
            r = int(np.argmax(valid)) if has_none else 0
            raise TraceError(
                f"row selects {most} experts but top_k is {self._top_k} ({self._top_k_from})",
                where=where(r),
                hint="pass the model's top_k (--top-k), or fix the header",
            )
        self._max_valid = max(self._max_valid, most)
        if mx > self._max_expert:
            self._max_expert = mx
            if mx >= self._num_e:
                self._resize(num_e=mx + 1)
        return has_none

    @staticmethod
    def _raise_duplicate(experts: np.ndarray, where: Callable[[int], str]) -> None:
        """Raise for the first row of ``experts [rows, k]`` naming an expert twice, if any."""
        x = np.asarray(experts, dtype=np.int64)
        dup = np.zeros(x.shape[0], dtype=bool)
        for i in range(x.shape[1] - 1):
            dup |= (x[:, i + 1 :] == x[:, i : i + 1]).any(axis=1) & (x[:, i] >= 0)
        if not dup.any():
            return
        r = int(np.flatnonzero(dup)[0])
        srt = np.sort(x[r])
        e = int(srt[1:][(srt[1:] == srt[:-1]) & (srt[1:] >= 0)][0])
        raise TraceError(
            f"expert {e} appears twice in one token's top-k {x[r].tolist()}",
            where=where(r),
            hint="a token selects distinct experts in a layer",
        )

    def _rows_of(self, layer: np.ndarray, where: Callable[[int], str]) -> np.ndarray:
        """Accumulator row of each absolute layer id, adding new layers."""
        top = int(layer.max())
        if top >= self._row_of_layer.size:
            self._row_of_layer = _grow(self._row_of_layer, (top + 1,), -1)
        rows = self._row_of_layer[layer]
        if (rows < 0).any():
            new = np.unique(layer[rows < 0])
            if len(self._layer_ids) + new.size > constants.MAX_LAYERS:
                raise TraceError(
                    f"the input names more than {constants.MAX_LAYERS} layers, the most placer"
                    " handles", where=where(int(np.flatnonzero(rows < 0)[0])),
                    hint="layer is the model's absolute layer index (limits:"
                    " docs/limits.md)",
                )
            for lid in new.tolist():
                self._row_of_layer[lid] = len(self._layer_ids)
                self._layer_ids.append(int(lid))
            self._resize(num_layers=len(self._layer_ids))
            rows = self._row_of_layer[layer]
        return rows

    def _resize(self, *, num_e: int | None = None, num_layers: int | None = None) -> None:
        e = self._num_e if num_e is None else num_e
        nl = len(self._layer_ids) if num_layers is None else num_layers
        # load may grow to MAX_WINDOWS windows: refuse now what would not fit then
        need = constants.MAX_WINDOWS * nl * e * 8
        if need > constants.MAX_LOAD_BYTES:
            raise TraceError(
                f"statistics of {nl} layers x {e} experts would take {_mib(need)} MiB, more"
                f" than placer's {_mib(constants.MAX_LOAD_BYTES)} MiB",
                where=self.source,
                hint="declare the expert count (num_experts=, --num-experts) so a stray id"
                " is reported, or read fewer layers (limits: docs/limits.md)",
            )
        self._num_e = e
        w = self._grid.count
        self._load = _grow(self._load, (w, nl, e))
        if self.options.coact:
            if _coact_bytes(nl, self._aff.shape[0], e + 1) > constants.MAX_COACT_BYTES:
                self._drop_coact(nl, e)
            else:
                # one more expert than the accumulators' width: -1 (no expert) counts
                # there and is cleared after each chunk (see _clear_trash)
                self._coact = _grow(self._coact, (nl, e + 1, e + 1))
                self._aff = _grow(self._aff, (self._aff.shape[0], e + 1, e + 1))
        k = self._k or 1
        self._run_last = _grow(self._run_last, (nl, k), -2)
        self._run_req = _grow(self._run_req, (nl,), -1)
        self._run_len = _grow(self._run_len, (nl,))

    # -- internals: tokens ---------------------------------------------------------
    def _token_keys(self, chunk: RowChunk, rows: np.ndarray) -> np.ndarray:
        """A 64-bit key per row: request << 32 | token id, or order-based ids."""
        req = chunk.request.astype(np.int64)
        tok = chunk.token.astype(np.int64)
        if (tok >= 1 << 31).any():
            i = int(np.flatnonzero(tok >= 1 << 31)[0])
            raise TraceError(
                f"token id {int(tok[i])} is out of range [0, 2^31)",
                where=f"{self.source}:{int(chunk.lines[i])}",
                hint="token numbers a token within its request; number from 0",
            )
        missing = tok < 0
        if missing.any():
            # the n-th row of a layer (within a request) is the n-th token
            idx = np.flatnonzero(missing)
            group = (req[idx] << 20) | chunk.layer[idx]
            uniq, inv = np.unique(group, return_inverse=True)
            order = np.argsort(inv, kind="stable")
            counts = np.bincount(inv, minlength=uniq.size)
            starts = np.cumsum(counts) - counts
            rank_in = np.empty(idx.size, dtype=np.int64)
            rank_in[order] = np.arange(idx.size) - np.repeat(starts, counts)
            base = np.array([self._order_count.get(int(g), 0) for g in uniq], dtype=np.int64)
            for g, b, c in zip(uniq.tolist(), base.tolist(), counts.tolist(), strict=True):
                self._order_count[g] = b + c
            tok = tok.copy()
            tok[idx] = (base[inv.ravel()] + rank_in) | (1 << 31)
        return (req << 32) | tok

    def _token_label(self, chunk: RowChunk, i: int) -> str:
        req = self._request_labels[int(chunk.request[i])]
        tok = int(chunk.token[i])
        parts = []
        if req is not None:
            parts.append(f"request {req}")
        parts.append(f"token {tok}" if tok >= 0 else "(no token id)")
        return "(" + ", ".join(parts) + ")"

    def _token_indices(
        self, keys: np.ndarray, rows: np.ndarray, where: Callable[[int], str]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Table index of the token of each row, and the first row of each new token.

        ``keys [rows]`` token keys (:meth:`_token_keys`), ``rows [rows]`` accumulator rows.
        A token has one row per layer: the n-th row of a (request, token, layer) belongs
        to the n-th occurrence of the token (a second pass with the same ids, token
        numbers that restart), counted for the warning.
        """
        table = self._table
        first, new_first = table.lookup(keys)
        table.reserve(self._k or 1, self._words())
        words = table.seen.shape[1]
        word = rows // _WORD_BITS
        mask = np.left_shift(np.uint64(1), (rows % _WORD_BITS).astype(np.uint64))
        code = first * (words * _WORD_BITS) + rows
        order = np.argsort(code, kind="stable")
        sc = code[order]
        repeat_in = sc[1:] == sc[:-1]
        before = (table.seen[first, word] & mask) != 0
        if not repeat_in.any() and not before.any():
            np.bitwise_or.at(table.seen, (first, word), mask)
            return first, new_first
        # occurrence of each row = rows of its (token, layer) read before it
        n = keys.size
        starts = np.flatnonzero(np.concatenate([[True], ~repeat_in]))
        sizes = np.diff(np.append(starts, n))
        occ_sorted = np.arange(n) - np.repeat(starts, sizes)
        g_rows = order[starts]
        g_before = before[g_rows]
        if g_before.any():
            base = np.zeros(starts.size, dtype=np.int64)
            gb = g_rows[g_before]
            base[g_before] = self._layer_count(first[gb], rows[gb])
            occ_sorted += np.repeat(base, sizes)
        occ = np.empty(n, dtype=np.int64)
        occ[order] = occ_sorted
        rep = np.flatnonzero(occ > 0)
        if int(occ.max()) >= 1 << _OCC_BITS or table.size >= 1 << (62 - _OCC_BITS):
            i = int(np.argmax(occ))
            raise TraceError(
                "too many repeats of one token id (or too many tokens) to tell the"
                " occurrences apart",
                where=where(i),
                hint="number tokens uniquely within a request, or drop the token field",
            )
        idx, new_occ = table.occurrence(first[rep], occ[rep])
        table.reserve(self._k or 1, words)
        local = first.copy()
        local[rep] = idx
        new_first = new_first.copy()
        new_first[rep[new_occ]] = True
        np.maximum.at(table.extra, first[rep], occ[rep])
        self._repeat_rows += rep.size
        self._repeat_tokens += int(new_occ.sum())
        if not self._repeat_where:
            self._repeat_where = where(int(rep[0]))
        np.bitwise_or.at(table.seen, (local, word), mask)
        return local, new_first

    def _layer_count(self, first: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Occurrences of each token (table index of its first) with a row for its layer
        row in ``rows``; occurrence 0 has one.  Occurrences take a layer in order, so
        those with it are a prefix: a binary search over them."""
        table = self._table
        word = rows // _WORD_BITS
        mask = np.left_shift(np.uint64(1), (rows % _WORD_BITS).astype(np.uint64))
        lo = np.ones(first.size, dtype=np.int64)  # occurrences known to hold the layer
        hi = 1 + table.extra[first]  # occurrences that exist
        active = np.flatnonzero(lo < hi)
        while active.size:
            mid = (lo[active] + hi[active]) // 2
            idx = table.occurrences.find((first[active] << _OCC_BITS) | mid)
            holds = (table.seen[idx, word[active]] & mask[active]) != 0
            lo[active[holds]] = mid[holds] + 1
            hi[active[~holds]] = mid[~holds]
            active = active[lo[active] < hi[active]]
        return lo

    # -- internals: windows --------------------------------------------------------
    def _start_windows(self, has_step: bool) -> None:
        if self.options.window_tokens is not None:
            self._window_mode = "fixed"
            self._grid = WindowGrid(self.options.window_tokens)
        elif has_step:
            self._window_mode = "step"
        else:
            self._window_mode = "order"

    def _fit_windows(self, kmin: int, kmax: int) -> None:
        """Make windows for keys ``kmin..kmax`` (merging pairwise past MAX_WINDOWS)."""
        self._load, self._tokens_w = self._grid.fit(
            kmin, kmax, [self._load, self._tokens_w], align=self._window_mode == "step"
        )

    def _window_of(self, keys: np.ndarray) -> np.ndarray:
        return self._grid.index(keys)

    # -- internals: statistics ------------------------------------------------------
    def _count(
        self, xt: np.ndarray, base: np.ndarray, rows: np.ndarray, bounds: list[int],
        has_none: bool,
    ) -> None:
        """Load and co-activation of layer-sorted rows.

        ``xt [k, rows]`` expert ids (-1 none), one row per column; ``base [rows]`` flat
        index into ``self._load`` of each row's expert 0; ``rows [rows]`` accumulator
        rows, sorted, in runs ``bounds[i]:bounds[i + 1]``.
        """
        load = self._load_flat()
        coact = self.options.coact and xt.shape[0] > 1
        if coact:
            ew = self._coact.shape[1]
            xs = np.where(xt < 0, ew - 1, xt) if has_none else xt
        scratch = self._scratch()
        for a, b in itertools.pairwise(bounds):
            _load_into(load, base[a:b], xt[:, a:b], has_none, scratch)
            if coact:
                self._add_pair_counts(self._coact[int(rows[a])], xs[:, a:b], xs[:, a:b],
                                      triangle=True)
        if coact and has_none:
            self._clear_trash()

    def _count_tokens(
        self, xt: np.ndarray, rows: np.ndarray, lid: np.ndarray, tok_win: np.ndarray,
        has_none: bool, where: Callable[[int], str], flat: np.ndarray,
    ) -> None:
        """Load, co-activation and affinity of whole tokens.

        ``xt [layers, k, tokens]`` expert ids (-1 none), expert-major; ``rows [layers]``
        accumulator rows of the columns ``lid``; ``tok_win [tokens]`` windows.  With
        co-activation on, an expert twice in one row shows as a diagonal count and is
        reported from ``flat [tokens x layers, k]`` (token-major rows) with ``where``.
        """
        load = self._load_flat()
        _, nl, e = self._load.shape
        tok_base = tok_win * (nl * e)
        coact = self.options.coact
        if coact:
            pidx = [self._pair_index(int(lid[c]), int(lid[c + 1])) for c in range(lid.size - 1)]
            coact = self.options.coact  # pairs past MAX_COACT_BYTES leave co-activation out
            if not coact and xt.shape[1] > 1 and _has_duplicate(xt.transpose(1, 0, 2)):
                self._raise_duplicate(flat, where)
        if coact:
            ew = self._coact.shape[1]
            xs = np.where(xt < 0, ew - 1, xt) if has_none else xt
        scratch = self._scratch()
        for c in range(lid.size):
            _load_into(load, tok_base + int(rows[c]) * e, xt[c], has_none, scratch)
            if coact:
                if xt.shape[1] > 1:
                    self._add_pair_counts(self._coact[int(rows[c])], xs[c], xs[c],
                                          triangle=True)
                if c + 1 < lid.size:
                    self._add_pair_counts(self._aff[pidx[c]], xs[c], xs[c + 1],
                                          triangle=False)
        if coact:
            if has_none:
                self._clear_trash()
            diag = self._coact.reshape(self._coact.shape[0], -1)[:, :: ew + 1]
            if diag.any():  # an expert twice in one row
                self._raise_duplicate(flat, where)

    def _columns_buffer(self, size: int) -> np.ndarray:
        """``[size]`` int32 (expert ids and the -1 column fit), reused from chunk to chunk
        (chunks have the same size)."""
        if self._columns is None or self._columns.size < size:
            self._columns = np.empty(size, dtype=np.int32)
        return self._columns[:size]

    def _add_pair_counts(
        self, counts: np.ndarray, a: np.ndarray, b: np.ndarray, *, triangle: bool
    ) -> None:
        """:func:`_pairs_into` the ``[width, width]`` matrix ``counts``.

        Many pairs are counted into a reused zeroed matrix that stays in cache, then
        added to ``counts`` in one sequential pass: the accumulators of all layers are
        tens of MB, and scattered increments into a cold one cost half as much again.
        """
        ew = counts.shape[0]
        per_column = a.shape[0] * (b.shape[0] - 1) // 2 if triangle else a.shape[0] * b.shape[0]
        n = a.shape[1] * per_column
        if 8 * n < ew * ew:
            _pairs_into(counts.reshape(-1), a, b, ew, self._scratch(), triangle=triangle)
            return
        if self._hot is None or self._hot.size != ew * ew:
            self._hot = np.zeros(ew * ew, dtype=np.int64)
        _pairs_into(self._hot, a, b, ew, self._scratch(), triangle=triangle)
        counts += self._hot.reshape(ew, ew)
        self._hot[:] = 0

    def _scratch(self) -> np.ndarray:
        """Reusable intp work space for codes (see :func:`_pairs_into`): fresh large
        temporaries cost page faults on every call."""
        if self._scratch_buf is None:
            self._scratch_buf = np.empty(3 * _BLOCK_CODES, dtype=np.intp)
        return self._scratch_buf

    def _load_flat(self) -> np.ndarray:
        if not self._load.flags.c_contiguous:
            self._load = np.ascontiguousarray(self._load)
        return self._load.reshape(-1)

    def _clear_trash(self) -> None:
        """Zero the pair counts of the extra expert that stands for -1 (no expert)."""
        for acc in (self._coact, self._aff):
            if acc.size:
                acc[:, -1, :] = 0
                acc[:, :, -1] = 0

    def _drop_coact(self, nl: int, e: int) -> None:
        """Stop counting co-activation and layer affinity: they would pass
        ``constants.MAX_COACT_BYTES`` (the load is still counted)."""
        nl = max(nl, 1)
        need = _coact_bytes(nl, max(self._aff.shape[0], nl - 1), e + 1)
        self.notes.append(
            f"co-activation was left out: counting it for {nl} layer{'s' * (nl > 1)} of"
            f" {e:,} experts needs {_mib(need)} MiB, more than placer's"
            f" {_mib(constants.MAX_COACT_BYTES)} MiB"
            " (docs/limits.md); the load was read.  Declare the expert count"
            " (num_experts=, --num-experts) if a stray id raised it, or read fewer layers"
        )
        self.options = replace(self.options, coact=False)
        self._coact = np.zeros((0, 0, 0), dtype=np.int64)
        self._aff = np.zeros((0, 0, 0), dtype=np.int64)
        self._aff_pairs = {}
        self._pair_of_rows = np.zeros((0, 0), dtype=np.int64)
        self._hot = None

    def _pair_index(self, a: int, b: int) -> int:
        """Affinity index of layer pair ``(a, b)``, adding it; -1 once co-activation was
        left out (:meth:`_drop_coact`)."""
        if not self.options.coact:
            return -1
        p = self._aff_pairs.get((a, b))
        if p is None:
            p = len(self._aff_pairs)
            self._aff_pairs[(a, b)] = p
            if p >= self._aff.shape[0]:
                ew = self._num_e + 1
                nl = len(self._layer_ids)
                rows = p + 1 + nl
                if _coact_bytes(nl, rows, ew) > constants.MAX_COACT_BYTES:
                    rows = p + 1  # no room to spare: grow by one
                if _coact_bytes(nl, rows, ew) > constants.MAX_COACT_BYTES:
                    self._drop_coact(nl, self._num_e)
                    return -1
                self._aff = _grow(self._aff, (rows, ew, ew))
        return p

    def _pair_indices(self, row_a: np.ndarray, row_b: np.ndarray) -> np.ndarray:
        """Affinity index of each (accumulator row a, row b) pair, adding new pairs."""
        nl = len(self._layer_ids)
        if self._pair_of_rows.shape[0] < nl:
            self._pair_of_rows = _grow(self._pair_of_rows, (nl, nl), -1)
        pidx = self._pair_of_rows[row_a, row_b]
        if (pidx < 0).any():
            for a, b in set(zip(row_a[pidx < 0].tolist(), row_b[pidx < 0].tolist(),
                                strict=True)):
                p = self._pair_index(self._layer_ids[a], self._layer_ids[b])
                if p < 0:  # co-activation was left out
                    return pidx
                self._pair_of_rows[a, b] = p
            pidx = self._pair_of_rows[row_a, row_b]
        return pidx

    def _add_pairs(self, pidx: np.ndarray, ea: np.ndarray, eb: np.ndarray) -> None:
        """Affinity counts for rows ``(pair index, experts in a [n, k], experts in b [n, k])``,
        ``pidx`` sorted."""
        if pidx.size == 0:
            return
        ew = self._aff.shape[1]
        xa, xb = np.ascontiguousarray(ea.T), np.ascontiguousarray(eb.T)
        none = bool(xa.min() < 0 or xb.min() < 0)
        if none:
            xa, xb = np.where(xa < 0, ew - 1, xa), np.where(xb < 0, ew - 1, xb)
        cuts = np.flatnonzero(pidx[1:] != pidx[:-1]) + 1
        bounds = np.concatenate([[0], cuts, [pidx.size]]).tolist()
        for a, b in itertools.pairwise(bounds):
            self._add_pair_counts(self._aff[int(pidx[a])], xa[:, a:b], xb[:, a:b],
                                  triangle=False)
        if none:
            self._clear_trash()

    def _add_row_affinity(self, local: np.ndarray, layer: np.ndarray, experts: np.ndarray) -> None:
        """Pairs between each token's consecutive observed layers (ascending layer ids)."""
        table = self._table
        if local.size > 1 and not _sorted_by(local, layer):
            order = np.lexsort((layer, local))
            lo, ly, ex = local[order], layer[order], experts[order]
        else:  # token-major logs: a token's rows in layer order, tokens one after another
            lo, ly, ex = local, layer, experts
        same = lo[1:] == lo[:-1]
        first = np.ones(lo.size, dtype=bool)
        first[1:] = ~same
        # pairs inside the chunk
        ia = np.flatnonzero(same)
        a_layer, b_layer = ly[ia], ly[ia + 1]
        a_exp, b_exp = ex[ia], ex[ia + 1]
        # pairs with the token's last row from earlier chunks
        jf = np.flatnonzero(first)
        prev_layer = table.last_layer[lo[jf]]
        carry = (prev_layer >= 0) & (prev_layer < ly[jf])
        jc = jf[carry]
        if jc.size:
            a_layer = np.concatenate([prev_layer[carry], a_layer])
            b_layer = np.concatenate([ly[jc], b_layer])
            a_exp = np.concatenate([table.last_experts[lo[jc]], a_exp])
            b_exp = np.concatenate([ex[jc], b_exp])
        if a_layer.size:
            pidx = self._pair_indices(self._row_of_layer[a_layer], self._row_of_layer[b_layer])
            if not self.options.coact:  # left out just now (MAX_COACT_BYTES)
                return
            if pidx.size > 1 and (pidx[1:] < pidx[:-1]).any():
                small = pidx.astype(np.int16) if pidx.max() < 1 << 15 else pidx
                by_pair = np.argsort(small, kind="stable")  # radix sort for int16
                pidx, a_exp, b_exp = pidx[by_pair], a_exp[by_pair], b_exp[by_pair]
            self._add_pairs(pidx, a_exp, b_exp)
        # remember each token's last (highest) row
        last = np.ones(lo.size, dtype=bool)
        last[:-1] = ~same
        jl = np.flatnonzero(last)
        upd = ly[jl] > table.last_layer[lo[jl]]
        table.last_layer[lo[jl][upd]] = ly[jl][upd]
        table.last_experts[lo[jl][upd]] = ex[jl][upd]

    def _find_runs(
        self, r: np.ndarray, eq: np.ndarray, ex_at: Callable[[np.ndarray], np.ndarray],
        rq: np.ndarray | None,
    ) -> _Runs:
        """Runs in rows sorted by layer.

        ``r [rows]`` accumulator rows, sorted (a layer's rows in file order); ``eq
        [rows]`` row i repeats row i - 1 (experts and request; ignored where the layer
        changes); ``ex_at(idx)`` experts ``[len(idx), k]`` of rows ``idx``; ``rq`` request
        of each row, or None.  A layer's first row here continues the run carried from
        earlier rows when it repeats it.
        """
        n = r.size
        grp_first = np.ones(n, dtype=bool)
        grp_first[1:] = r[1:] != r[:-1]
        f = np.flatnonzero(grp_first)
        rf = r[f]
        cont = self._run_len[rf] > 0
        if cont.any():
            cont &= (ex_at(f) == self._run_last[rf]).all(axis=1)
            if rq is not None:
                cont &= rq[f] == self._run_req[rf]
        boundary = grp_first | ~eq
        first = np.flatnonzero(boundary)
        seg_of = np.cumsum(boundary) - 1
        carry = np.zeros(first.size, dtype=np.int64)
        carry[seg_of[f[cont]]] = self._run_len[rf[cont]]
        last = np.empty_like(first)
        last[:-1] = first[1:] - 1
        last[-1] = n - 1
        length = last - first + 1 + carry
        trailing = np.ones(first.size, dtype=bool)
        trailing[:-1] = r[first[1:]] != r[first[:-1]]
        return _Runs(first, carry, length, last, trailing,
                     length >= constants.WARMUP_RUN_ROWS, seg_of)

    def _end_runs(
        self, r: np.ndarray, runs: _Runs, hold: np.ndarray | None,
        ex_at: Callable[[np.ndarray], np.ndarray], rq: np.ndarray | None,
        where: Callable[[int], str],
    ) -> np.ndarray | None:
        """Carry each layer's run past the rows counted now (all but ``hold``), note the
        longest run, and count the rows of warm-up passes.

        Returns the rows not to count now (warm-up passes and ``hold``), None if none.
        """
        counted = np.arange(r.size) if hold is None else np.flatnonzero(~hold)
        if counted.size:
            rr = r[counted]
            end = np.ones(counted.size, dtype=bool)
            end[:-1] = rr[1:] != rr[:-1]
            il, rl = counted[end], rr[end]
            s = runs.seg_of[il]
            self._run_len[rl] = il - runs.first[s] + 1 + runs.carry[s]
            self._run_last[rl] = ex_at(il)
            self._run_req[rl] = -1 if rq is None else rq[il]
        best = int(np.argmax(runs.length))
        if runs.length[best] > self._run_best[0]:
            i = int(runs.last[best])
            self._run_best = (int(runs.length[best]), self._layer_ids[int(r[i])], where(i))
        held = hold is not None and bool(hold.any())
        if self.options.keep_warmup or not runs.warm.any():
            return hold if held else None
        drop = runs.warm[runs.seg_of]
        gone = int((drop & ~hold).sum()) if held and hold is not None else int(drop.sum())
        self._warmup_rows += gone
        self.skip(WARMUP_SKIP, gone)
        return drop | hold if held and hold is not None else drop

    def _flush_held(self) -> None:
        """Count the rows and tokens held back for warm-up detection (end of a source)."""
        rows, self._held_rows = self._held_rows, None
        if rows is not None:
            self._count_rows(self._cut_warmup_rows(rows, final=True))
        tokens, self._held_tokens = self._held_tokens, None
        if tokens is not None:
            self._count_token_chunk(tokens, tokens.has_none, final=True)

    # -- internals: results --------------------------------------------------------
    def _finish_meta(self) -> tuple[int, int]:
        num_e = self._num_experts if self._num_experts is not None else self._max_expert + 1
        top_k = self._top_k if self._top_k is not None else self._max_valid
        return num_e, top_k

    def _warnings(self, load: np.ndarray, layer_ids: np.ndarray) -> list[str]:
        out = list(self.notes)
        if self.synthetic:
            out.append("the trace declares itself synthetic (synthetic: true): its statistics"
                       " are not measured routing")
        rows, layer, where = self._run_best
        if self._warmup_rows:
            out.append(
                f"left out {self._warmup_rows} routing rows of a profiling or warm-up pass:"
                f" runs of {constants.WARMUP_RUN_ROWS} or more identical consecutive"
                f" selections in one layer (the longest: {rows} rows for layer {layer},"
                f" ending at {where}); pass keep_warmup=True (--keep-warmup) to count them"
            )
        elif rows >= constants.WARMUP_RUN_ROWS:
            out.append(
                f"{rows} identical consecutive routing rows for layer {layer} (ending at"
                f" {where}): this looks like a profiling or warm-up pass"
            )
        if self._repeat_rows:
            out.append(
                f"{self._repeat_rows} routing rows repeat a (request, token, layer) read"
                f" before (the first at {self._repeat_where}): each repeat starts a new"
                f" occurrence of the token ({self._repeat_tokens} tokens more), as in a"
                " second pass with the same ids or token numbers that restart"
            )
        total = load.sum(axis=0)
        zero = np.argwhere(total == 0)
        if zero.size:
            show = ", ".join(f"layer {int(layer_ids[a])} expert {int(b)}" for a, b in zero[:5])
            more = f" and {len(zero) - 5} more" if len(zero) > 5 else ""
            out.append(
                f"{len(zero)} of {total.size} (layer, expert) pairs were never routed to:"
                f" {show}{more}"
            )
        if (
            self._num_layers_declared is not None
            and self._kind == "tokens"
            and self._num_layers_declared != layer_ids.size
            and self._layer_filter is None
        ):
            out.append(
                f"the header declares {self._num_layers_declared} layers but rows name"
                f" {layer_ids.size} ({format_ranges(layer_ids)})"
            )
        if self._grid.merged_from is not None and self._window_mode == "fixed":
            out.append(
                f"window_tokens={self._grid.merged_from} gave more than {constants.MAX_WINDOWS}"
                f" windows; merged pairwise into windows of {self._grid.width} tokens"
            )
        return out

    def _provenance(self) -> Provenance:
        return Provenance(
            sources=tuple(self.sources),
            format="+".join(self.formats),
            rows_read=self.rows_read,
            rows_skipped=tuple(sorted(self.skipped.items())),
            synthetic=self.synthetic,
            model=self.model,
        )

    def _check_selected_layers(self, layer_ids: np.ndarray) -> None:
        if self._layer_filter is None:
            return
        missing = sorted(set(self._layer_filter.tolist()) - set(layer_ids.tolist()))
        if missing:
            present = np.array(sorted(self._all_layers | set(layer_ids.tolist())))
            raise UsageError(
                f"layer {missing[0]} has no rows in the trace",
                where="--layers",
                hint=f"layers present: {format_ranges(present)}",
            )

    def _result_tokens(self) -> RoutingData:
        num_e, top_k = self._finish_meta()
        self._check_top_k(top_k, num_e, ", ".join(self.sources))
        lid = np.asarray(self._layer_ids, dtype=np.int64)
        order = np.argsort(lid)
        layer_ids = lid[order]
        self._check_selected_layers(layer_ids)
        same = bool((order == np.arange(order.size)).all())
        load = self._load[:, order, :num_e]
        coact = aff = None
        if self.options.coact:
            # pairs were counted in either order (positions i < j of a row): the
            # co-activation is the counts plus their transpose, made in place, layer by
            # layer (the accumulation ends here), without new [L, E, E] arrays
            full = self._coact if same else self._coact[order]
            for r in range(full.shape[0]):
                full[r] += full[r].T
            coact = full[:, :num_e, :num_e]
            if layer_ids.size > 1:
                pairs = [
                    self._aff_pairs.get((int(layer_ids[r]), int(layer_ids[r + 1])))
                    for r in range(layer_ids.size - 1)
                ]
                if pairs == list(range(len(pairs))):
                    aff = self._aff[: len(pairs), :num_e, :num_e]
                else:
                    aff = np.zeros((layer_ids.size - 1, num_e, num_e), dtype=np.int64)
                    for r, p in enumerate(pairs):
                        if p is not None:
                            aff[r] = self._aff[p, :num_e, :num_e]
        if self._keep is not None:
            self._check_trace_size(layer_ids.size)
        starts = self._grid.starts()
        warn = self._warnings(load, layer_ids)
        stats = ExpertStats(
            load=load,
            tokens=self._tokens_w.copy(),
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

    def _check_trace_size(self, num_layers: int) -> None:
        """Refuse a per-token trace whose dense ``[tokens, layers, k]`` array would dwarf
        the rows read (tokens with rows in few of many layers) past MAX_LOAD_BYTES."""
        assert self._keep is not None
        k = self._k or 1
        have_w = bool(self._keep.weights) and all(w is not None for w in self._keep.weights)
        need = self._num_tokens * num_layers * k * (8 if have_w else 4)
        if (
            need > constants.MAX_LOAD_BYTES
            and need > _SPARSE_TRACE_RATIO * self.rows_read * k * 4
        ):
            raise TraceError(
                f"the per-token trace would take {_mib(need)} MiB for {self.rows_read} rows:"
                f" its {self._num_tokens} tokens have rows in few of its {num_layers} layers",
                where=", ".join(self.sources),
                hint="a token has a row in each MoE layer it passed through; read the layers"
                " apart (layers=) or the trace in parts (limits: docs/limits.md)",
            )

    def _build_trace(self, layer_ids: np.ndarray) -> RoutingTrace:
        keep = self._keep
        assert keep is not None
        k = self._k or 1
        t = self._num_tokens
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

    def _result_aggregate(self) -> RoutingData:
        load = self._load
        if self._agg_by_step:
            num_e = self._num_experts if self._num_experts is not None else self._num_e
            load = load[:, :, :num_e]
            self._agg_window_starts = self._grid.starts()
        w, nl, _ = load.shape
        lid = np.asarray(self._layer_ids, dtype=np.int64)
        order = np.argsort(lid)
        load, lid = load[:, order], lid[order]
        if self._agg_by_step:
            self._check_selected_layers(lid)
        coact = None if self._agg_coact is None else self._agg_coact[order]
        top_k = self._top_k
        if top_k is None:
            top_k = _top_k_from_coact(load.sum(axis=0), coact)
            if top_k is None:
                raise TraceError(
                    "top_k is unknown: the file does not give it and co-activation cannot"
                    " tell it",
                    where=", ".join(self.sources),
                    hint="pass top_k= (--top-k), or add a top_k entry to the file",
                )
            self.notes.append(f"top_k {top_k} inferred from complete co-activation counts")
        self._check_top_k(top_k, load.shape[2], ", ".join(self.sources))
        tokens = np.rint(load.sum(axis=(1, 2)) / (top_k * nl)).astype(np.int64)
        starts = (
            np.arange(w, dtype=np.int64)
            if self._agg_window_starts is None
            else np.asarray(self._agg_window_starts, dtype=np.int64)
        )
        warn = self._warnings(load, lid)
        stats = ExpertStats(
            load=load,
            tokens=tokens,
            layer_ids=lid,
            top_k=top_k,
            coact=coact,
            layer_affinity=None,
            window_starts=starts,
            provenance=self._provenance(),
            warnings=tuple(warn),
        )
        _emit(warn)
        return RoutingData(stats=stats, trace=None)


def _top_k_from_coact(load: np.ndarray, coact: np.ndarray | None) -> int | None:
    """k when co-activation is complete: each row sums to ``(k - 1) x load``."""
    if coact is None:
        return None
    rows = coact.sum(axis=2)
    used = load > 0
    if not used.any():
        return None
    ratio = rows[used] / load[used]
    k1 = round(float(ratio[0]))
    if np.all(rows[used] == k1 * load[used]):
        return k1 + 1
    return None


def _load_into(
    flat: np.ndarray, base: np.ndarray, x: np.ndarray, has_none: bool, scratch: np.ndarray
) -> None:
    """``flat[base[r] + x[i, r]] += 1`` for every column ``r`` and ``x[i, r] >= 0``.

    ``x [k, n]`` expert ids (-1 none), ``base [n]``; ``scratch``: intp work space of at
    least ``_BLOCK_CODES`` entries.
    """
    k, n = x.shape
    step = max(1, _BLOCK_CODES // k)
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        codes = scratch[: k * (hi - lo)].reshape(k, hi - lo)
        np.add(base[lo:hi], x[:, lo:hi], out=codes)
        np.add.at(flat, codes[x[:, lo:hi] >= 0] if has_none else codes.reshape(-1), 1)


def _pairs_into(
    flat: np.ndarray, a: np.ndarray, b: np.ndarray, width: int, scratch: np.ndarray, *,
    triangle: bool,
) -> None:
    """``flat[a[i, r] * width + b[j, r]] += 1`` for every column ``r`` and pair ``(i, j)``.

    ``a [ka, n]``, ``b [kb, n]`` expert ids (>= 0) one column per row of experts;
    ``flat`` a ``[width, width]`` count matrix, flattened; ``triangle``: ``a`` is ``b``
    and only pairs ``j > i`` count (pairs within one row).  Codes are made in blocks of
    at most ``_BLOCK_CODES`` in ``scratch`` (intp, ``3 x _BLOCK_CODES``), so they stay in
    cache and nothing is allocated.  ``np.add.at`` (one pass) beats ``np.bincount`` (a
    min/max pass, a count, then an add) and a GEMM on one-hot rows (``2 x E^2`` flops
    a row against ``k^2`` increments).
    """
    ka, n = a.shape
    kb = b.shape[0]
    codes, head = scratch[:_BLOCK_CODES], scratch[_BLOCK_CODES:]
    step = max(1, _BLOCK_CODES // (max(kb - 1, 1) if triangle else ka * kb))
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        m = hi - lo
        ha = head[: ka * m].reshape(ka, m)
        np.multiply(a[:, lo:hi], width, out=ha, dtype=np.intp)
        if triangle:
            for i in range(ka - 1):
                out = codes[: (kb - 1 - i) * m].reshape(kb - 1 - i, m)
                np.add(ha[i], b[i + 1 :, lo:hi], out=out)
                np.add.at(flat, codes[: out.size], 1)
        else:
            out3 = codes[: ka * kb * m].reshape(ka, kb, m)
            np.add(ha[:, None, :], b[None, :, lo:hi], out=out3)
            np.add.at(flat, codes[: ka * kb * m], 1)


#: Codes per np.add.at call of :func:`_pairs_into` and :func:`_load_into` (512 KB).
_BLOCK_CODES = 1 << 16


def _has_duplicate(xt: np.ndarray) -> bool:
    """Whether some row names an expert twice: ``xt [k, ...]`` expert-major, -1 = none."""
    for i in range(xt.shape[0] - 1):
        eq = xt[i + 1 :] == xt[i]
        if eq.any() and (eq & (xt[i] >= 0)).any():
            return True
    return False


def _sorted_by(major: np.ndarray, minor: np.ndarray) -> bool:
    """Whether rows are in ``(major, minor)`` order, ``minor`` strictly rising within a
    run of equal ``major``."""
    step = major[1:] - major[:-1]
    return bool((step >= 0).all() and ((step > 0) | (minor[1:] > minor[:-1])).all())


def _take_rows(chunk: RowChunk, keep: np.ndarray) -> RowChunk:
    def sel(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else a[keep]

    return RowChunk(
        layer=chunk.layer[keep],
        experts=chunk.experts[keep],
        request=chunk.request[keep],
        token=chunk.token[keep],
        lines=chunk.lines[keep],
        step=sel(chunk.step),
        rank=sel(chunk.rank),
        weights=sel(chunk.weights),
    )


def _concat_rows(a: RowChunk, b: RowChunk) -> RowChunk:
    """Rows of ``a`` then ``b`` (a row without step or rank has -1 there)."""

    def cat(x: np.ndarray | None, y: np.ndarray | None, n: int, m: int) -> np.ndarray | None:
        if x is None and y is None:
            return None
        return np.concatenate([
            np.full(n, -1, dtype=np.int64) if x is None else x,
            np.full(m, -1, dtype=np.int64) if y is None else y,
        ])

    n, m = a.layer.size, b.layer.size
    return RowChunk(
        layer=np.concatenate([a.layer, b.layer]),
        experts=np.concatenate([a.experts, b.experts]),
        request=np.concatenate([a.request, b.request]),
        token=np.concatenate([a.token, b.token]),
        lines=np.concatenate([a.lines, b.lines]),
        step=cat(a.step, b.step, n, m),
        rank=cat(a.rank, b.rank, n, m),
        weights=None if a.weights is None or b.weights is None
        else np.concatenate([a.weights, b.weights]),
    )


def _positive_int(value: Any, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or int(value) < 1:
        raise TraceError(
            f"{name} must be a positive integer, got {value!r:.40}", where=where,
            hint=f"{name} is a whole number >= 1",
        )
    return int(value)


#: The dense per-token trace may be this many times the rows read (tokens missing from
#: layers leave holes in it); past it and MAX_LOAD_BYTES it is refused.
_SPARSE_TRACE_RATIO = 8

#: Hint of every error for an input past one of placer's limits.
_LIMITS_HINT = "placer's limits are in docs/limits.md; is this the right file?"


def _coact_bytes(num_layers: int, aff_rows: int, width: int) -> int:
    """Bytes of the co-activation ``[layers, width, width]`` and affinity ``[aff_rows,
    width, width]`` int64 counts, and of the reused ``[width, width]`` work matrix."""
    return (num_layers + aff_rows + 1) * width * width * 8


def _mib(nbytes: float) -> str:
    return f"{nbytes / (1 << 20):,.0f}"


def check_counts(counts: np.ndarray, name: str, where: str) -> np.ndarray:
    """Whole counts ``>= 0`` of any numeric dtype as int64; a TraceError naming the
    first bad cell of ``counts`` (NaN, infinite, fractional, negative, or past
    ``constants.MAX_TOTAL_COUNT``), checked before the conversion."""
    arr = np.asarray(counts)
    if arr.dtype == bool:
        arr = arr.astype(np.int64)
    if not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise TraceError(
            f"{name} must hold numbers, got {arr.dtype}", where=where,
            hint="counts are whole numbers of (token, expert) selections",
        )
    if arr.size == 0:
        return arr.astype(np.int64)
    if np.issubdtype(arr.dtype, np.floating):
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            raise TraceError(
                f"{name}{list(idx)} is {arr[idx]}; expected a whole count",
                where=f"{where}: {name}{list(idx)}",
                hint="counts are whole (token, expert) selections; round averaged counts",
            )
    neg = arr < 0
    if neg.any():
        idx = tuple(int(i) for i in np.argwhere(neg)[0])
        raise TraceError(
            f"{name}{list(idx)} is {arr[idx]}; counts are >= 0",
            where=f"{where}: {name}{list(idx)}",
            hint="a count is how often tokens selected the expert; it cannot be negative",
        )
    big = arr > constants.MAX_TOTAL_COUNT
    if big.any():
        idx = tuple(int(i) for i in np.argwhere(big)[0])
        raise TraceError(
            f"{name}{list(idx)} is {arr[idx]:.6g}, more than placer counts"
            f" (2^53 selections)", where=f"{where}: {name}{list(idx)}", hint=_LIMITS_HINT,
        )
    return arr.astype(np.int64)


def _emit(messages: list[str]) -> None:
    for m in messages:
        warnings.warn(m, TraceWarning, stacklevel=5)  # the caller of read_routing


