"""Expert statistics: the aggregated view of routing that planners consume.

:class:`ExpertStats` is built by the trace readers (``placer.traces``) from
per-token traces or from aggregated load files.  It is frozen and holds numpy
arrays; derived figures (skew, drift, pairs) live in ``placer.stats.analysis``.
Pair counts (co-activation, layer affinity) are :class:`PairCounts`: sparse, so
their memory follows the pairs seen, not the square of the expert count.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from placer import constants
from placer.errors import DataError, UsageError


@dataclass(frozen=True)
class Provenance:
    """Where statistics came from and what was read to build them.

    Attributes
    ----------
    sources: input paths, in reading order.
    format: name of the trace format that read them (``"jsonl"``, ``"npz"``, ...).
    rows_read: routing rows (one per token and layer) accumulated.
    rows_skipped: rows skipped on purpose, by reason (``{"type=meta": 3}``).
    synthetic: the input declares itself synthetic (header ``synthetic: true``).
    model: model name declared by the input, if any.
    pair_tokens: tokens whose pairs (co-activation, layer affinity) were counted, each
        weighted by the tokens it stands for; 0 when every token's were (or none:
        aggregated inputs, ``coact`` off).  See ``read_routing``'s ``pair_tokens``.
    tokens_read: tokens read in all (per-token inputs).
    """

    sources: tuple[str, ...] = ()
    format: str = ""
    rows_read: int = 0
    rows_skipped: tuple[tuple[str, int], ...] = ()
    synthetic: bool = False
    model: str | None = None
    pair_tokens: int = 0
    tokens_read: int = 0

    @property
    def skipped_total(self) -> int:
        return sum(n for _, n in self.rows_skipped)


@dataclass(frozen=True, eq=False)
class PairCounts:
    """Sparse pair counts of expert pairs, one set per row (a layer, or a layer pair).

    Row ``r`` holds the pairs ``keys[indptr[r]:indptr[r + 1]]`` with the counts at the
    same places; a key is ``i * num_experts + j``, keys rise within a row and every
    count is positive.  ``symmetric``: unordered same-token pairs, stored once with
    ``i < j`` (the dense form is symmetric with a zero diagonal); otherwise ordered
    pairs (``i`` in one layer, ``j`` in the next).  Memory is 16 bytes a pair held.

    Attributes
    ----------
    num_experts: ``E``, the side of the dense ``[E, E]`` form of a row.
    indptr: ``[rows + 1]`` int64, where each row's pairs start.
    keys: ``[pairs]`` int64 pair keys.
    counts: ``[pairs]`` int64 counts.
    symmetric: unordered pairs (co-activation) or ordered ones (layer affinity).
    """

    num_experts: int
    indptr: np.ndarray
    keys: np.ndarray
    counts: np.ndarray
    symmetric: bool = True

    def __post_init__(self) -> None:
        if self.indptr.ndim != 1 or self.indptr.size < 1 or int(self.indptr[0]) != 0:
            raise ValueError("indptr must be [rows + 1] starting at 0")
        if self.keys.shape != (int(self.indptr[-1]),) or self.counts.shape != self.keys.shape:
            raise ValueError(
                f"keys and counts must be [{int(self.indptr[-1])}], got {self.keys.shape}"
                f" and {self.counts.shape}"
            )

    @classmethod
    def from_dense(cls, dense: np.ndarray, *, symmetric: bool = True) -> PairCounts:
        """Pair counts of ``dense [rows, E, E]``; ``symmetric``: each row must equal its
        transpose, and the cells above the diagonal are kept (the diagonal, self-pairs, is
        dropped)."""
        arr = np.asarray(dense)
        if arr.ndim != 3 or arr.shape[1] != arr.shape[2]:
            raise ValueError(f"pair counts must be [rows, E, E], got shape {arr.shape}")
        rows, e, _ = arr.shape
        if symmetric and not all(np.array_equal(arr[r], arr[r].T) for r in range(rows)):
            raise ValueError("symmetric pair counts must equal their transpose")
        keys, counts = [], []
        upper = np.triu(np.ones((e, e), dtype=bool), k=1).reshape(-1) if symmetric else None
        for r in range(rows):
            flat = arr[r].reshape(-1)
            hit = flat != 0 if upper is None else (flat != 0) & upper
            idx = np.flatnonzero(hit)
            keys.append(idx.astype(np.int64))
            counts.append(flat[idx].astype(np.int64))
        return cls.from_rows(e, keys, counts, symmetric=symmetric)

    @classmethod
    def from_rows(
        cls, num_experts: int, keys: list[np.ndarray], counts: list[np.ndarray], *,
        symmetric: bool = True,
    ) -> PairCounts:
        """Pair counts from each row's sorted unique ``keys`` and positive ``counts``."""
        sizes = np.array([k.size for k in keys], dtype=np.int64)
        indptr = np.zeros(sizes.size + 1, dtype=np.int64)
        np.cumsum(sizes, out=indptr[1:])
        return cls(int(num_experts), indptr, _cat(keys), _cat(counts), symmetric)

    @property
    def num_rows(self) -> int:
        return int(self.indptr.size - 1)

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(rows, E, E)``: the shape of the dense form (:meth:`to_dense`)."""
        return (self.num_rows, self.num_experts, self.num_experts)

    @property
    def num_pairs(self) -> int:
        """Pairs held, all rows together."""
        return int(self.keys.size)

    @property
    def nbytes(self) -> int:
        return int(self.indptr.nbytes + self.keys.nbytes + self.counts.nbytes)

    def pairs(self, row: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(i, j, count)`` of row ``row``, int64, in rising ``(i, j)`` order."""
        lo, hi = int(self.indptr[row]), int(self.indptr[row + 1])
        keys = self.keys[lo:hi]
        return keys // self.num_experts, keys % self.num_experts, self.counts[lo:hi]

    def totals(self) -> np.ndarray:
        """``[rows]`` int64: the sum of each row's counts (each unordered pair once)."""
        sums = np.zeros(self.num_rows, dtype=np.int64)
        nonempty = self.indptr[1:] > self.indptr[:-1]
        if self.keys.size:
            sums[nonempty] = np.add.reduceat(self.counts, self.indptr[:-1][nonempty])
        return sums

    def partner_sums(self) -> np.ndarray:
        """``[rows, E]`` int64: the sums of the dense form's rows (``dense(r).sum(axis=1)``
        for every row ``r``), without making it."""
        e = self.num_experts
        row_of = np.repeat(np.arange(self.num_rows, dtype=np.int64), np.diff(self.indptr))
        sums = np.zeros(self.num_rows * e, dtype=np.int64)
        np.add.at(sums, row_of * e + self.keys // e, self.counts)
        if self.symmetric:
            np.add.at(sums, row_of * e + self.keys % e, self.counts)
        return sums.reshape(self.num_rows, e)

    def take(self, rows: list[int] | np.ndarray) -> PairCounts:
        """The rows ``rows``, in that order."""
        idx = [int(r) for r in rows]
        keys = [self.keys[self.indptr[r]:self.indptr[r + 1]] for r in idx]
        counts = [self.counts[self.indptr[r]:self.indptr[r + 1]] for r in idx]
        return PairCounts.from_rows(self.num_experts, keys, counts, symmetric=self.symmetric)

    def dense(self, row: int) -> np.ndarray:
        """``[E, E]`` int64 dense counts of row ``row`` (symmetric: both halves filled).

        Raises DataError when the matrix would pass ``constants.MAX_COACT_BYTES``."""
        self._check_dense(1)
        return self._fill(np.zeros((self.num_experts, self.num_experts), dtype=np.int64), row)

    def to_dense(self) -> np.ndarray:
        """``[rows, E, E]`` int64 dense counts of every row (see :meth:`dense`)."""
        self._check_dense(self.num_rows)
        e = self.num_experts
        out = np.zeros((self.num_rows, e, e), dtype=np.int64)
        for r in range(self.num_rows):
            self._fill(out[r], r)
        return out

    def _fill(self, out: np.ndarray, row: int) -> np.ndarray:
        i, j, c = self.pairs(row)
        out[i, j] = c
        if self.symmetric:
            out[j, i] = c
        return out

    def dense_fits(self, rows: int = 1) -> bool:
        """Whether the dense form of ``rows`` rows fits ``constants.MAX_COACT_BYTES``."""
        return rows * self.num_experts * self.num_experts * 8 <= constants.MAX_COACT_BYTES

    def _check_dense(self, rows: int) -> None:
        need = rows * self.num_experts * self.num_experts * 8
        if not self.dense_fits(rows):
            mib = 1 << 20
            raise DataError(
                f"dense pair counts of {rows} layer{'s' * (rows != 1)} x"
                f" {self.num_experts:,} experts would take {need / mib:,.0f} MiB, more than"
                f" placer's {constants.MAX_COACT_BYTES / mib:,.0f} MiB",
                where="co-activation",
                hint="this figure needs dense [experts, experts] pair counts; declare the"
                " expert count (`num_experts`) if a stray id raised it, or select fewer"
                " layers (limits: docs/limits.md)",
            )


@dataclass(frozen=True)
class ExpertStats:
    """Per-layer expert load and co-activation, by window.

    Attributes
    ----------
    load: ``[windows, layers, experts]`` int64, (token, expert) selections per window.
    tokens: ``[windows]`` int64, tokens per window (a token counts once per window,
        whatever its number of MoE layers; for aggregated inputs this is
        ``load[w].sum() / (top_k * layers)`` rounded).
    layer_ids: ``[layers]`` int64, the model's absolute layer index of each layer row.
    top_k: experts selected per token per layer.
    coact: :class:`PairCounts` (symmetric, one row per layer) or None; same-token pair
        counts within a layer over all windows.  A dense ``[layers, experts, experts]``
        array given here is converted (its upper triangle is kept).
    layer_affinity: :class:`PairCounts` (ordered, ``layers - 1`` rows) or None; tokens
        that selected expert i in layer row l and expert j in layer row l + 1 (only
        for per-token traces that span consecutive layers).  A dense ``[layers - 1,
        experts, experts]`` array given here is converted.
    window_starts: ``[windows]`` int64, the first step (or token) of each window.
    provenance: what was read.
    warnings: messages about suspicious data (synthetic, warm-up passes, ...).
    """

    load: np.ndarray
    tokens: np.ndarray
    layer_ids: np.ndarray
    top_k: int
    coact: PairCounts | None = None
    layer_affinity: PairCounts | None = None
    window_starts: np.ndarray | None = None
    provenance: Provenance = field(default_factory=Provenance)
    warnings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.load.ndim != 3:
            raise ValueError(
                f"load must be [windows, layers, experts], got shape {self.load.shape}"
            )
        w, l, e = self.load.shape  # noqa: E741
        if self.tokens.shape != (w,):
            raise ValueError(f"tokens must be [windows]={w}, got shape {self.tokens.shape}")
        if self.layer_ids.shape != (l,):
            raise ValueError(f"layer_ids must be [layers]={l}, got shape {self.layer_ids.shape}")
        for name, symmetric in (("coact", True), ("layer_affinity", False)):
            value = getattr(self, name)
            if isinstance(value, np.ndarray):
                if value.ndim != 3 or value.shape[1:] != (e, e):
                    raise ValueError(f"{name} must be [rows, {e}, {e}], got shape {value.shape}")
                object.__setattr__(self, name, PairCounts.from_dense(value, symmetric=symmetric))
            elif value is not None and value.num_experts != e:
                raise ValueError(f"{name} counts pairs of {value.num_experts} experts, not {e}")
        if self.coact is not None and self.coact.num_rows != l:
            raise ValueError(f"coact must have {l} layer rows, got {self.coact.num_rows}")
        if self.window_starts is not None and self.window_starts.shape != (w,):
            raise ValueError(f"window_starts must be [{w}], got shape {self.window_starts.shape}")

    @property
    def num_windows(self) -> int:
        return int(self.load.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.load.shape[1])

    @property
    def num_experts(self) -> int:
        return int(self.load.shape[2])

    @property
    def mean_load(self) -> np.ndarray:
        """``[layers, experts]`` int64: load summed over all windows."""
        return self.load.sum(axis=0)

    @property
    def total_tokens(self) -> int:
        return int(self.tokens.sum())

    def coact_dense(self, row: int) -> np.ndarray | None:
        """``[experts, experts]`` int64 co-activation of layer row ``row`` (symmetric, zero
        diagonal), or None without co-activation.  Raises DataError past
        ``constants.MAX_COACT_BYTES``; figures that only need the pairs read
        :meth:`PairCounts.pairs` instead."""
        return None if self.coact is None else self.coact.dense(row)

    def layer_index(self, layer_id: int) -> int:
        """Row of absolute layer ``layer_id``; raises UsageError when absent."""
        hits = np.flatnonzero(self.layer_ids == layer_id)
        if hits.size == 0:
            raise UsageError(
                f"layer {layer_id} is not in the statistics",
                hint=f"layers present: {format_ranges(self.layer_ids)}",
            )
        return int(hits[0])

    def select_layers(self, layer_ids: list[int] | np.ndarray) -> ExpertStats:
        """The same statistics restricted to the given absolute layer ids."""
        rows = [self.layer_index(int(i)) for i in layer_ids]
        aff = None
        if self.layer_affinity is not None:
            pairs = [r for r in rows[:-1]
                     if r + 1 in rows and r < self.layer_affinity.num_rows]
            aff = self.layer_affinity.take(pairs) if len(pairs) == len(rows) - 1 else None
        return replace(
            self,
            load=self.load[:, rows],
            layer_ids=self.layer_ids[rows],
            coact=None if self.coact is None else self.coact.take(rows),
            layer_affinity=aff,
        )

    def select_windows(self, start: int, stop: int) -> ExpertStats:
        """Windows ``start:stop``.  Co-activation is kept as measured over all windows."""
        if not (0 <= start < stop <= self.num_windows):
            raise UsageError(
                f"window range {start}:{stop} is outside 0:{self.num_windows}",
                hint="window ranges are START:STOP with 0 <= START < STOP <= number of windows",
            )
        return replace(
            self,
            load=self.load[start:stop],
            tokens=self.tokens[start:stop],
            window_starts=None if self.window_starts is None else self.window_starts[start:stop],
        )


@dataclass(frozen=True, eq=False)
class TraceSample:
    """Which tokens of a trace a sampled :class:`RoutingTrace` holds.

    A trace too large to keep whole is kept as a sample of whole *batches*: runs of
    ``batch_tokens`` consecutive tokens in read order (batch ``b`` is tokens ``b x
    batch_tokens`` up to the next batch's first; the last may be shorter), at most
    ``per_window`` of them in each window of the statistics (the window of the batch's
    first token), those whose seeded priority is lowest there
    (:mod:`placer.traces.accumulate.sample`).  The statistics are counted on every token.

    Attributes
    ----------
    token_index: ``[tokens]`` int64 index of each held token among the tokens read
        (ascending).
    window: ``[tokens]`` int64 window of the statistics each held token is judged in:
        the window of its batch's first token (a batch is judged whole).
    num_windows: windows of the statistics the sample was drawn over.
    batch_tokens: tokens per batch.
    per_window: most batches held per window.
    seed: seed of the batches' priorities.
    num_tokens: tokens read in all (the sample is drawn from them).
    """

    token_index: np.ndarray
    window: np.ndarray
    num_windows: int
    batch_tokens: int
    per_window: int
    seed: int
    num_tokens: int

    def __post_init__(self) -> None:
        if self.token_index.shape != self.window.shape or self.token_index.ndim != 1:
            raise ValueError("token_index and window must be [tokens]")

    @property
    def batch(self) -> np.ndarray:
        """``[tokens]`` int64 batch of each held token (``token_index // batch_tokens``)."""
        return self.token_index // self.batch_tokens

    @property
    def num_batches(self) -> int:
        """Whole batches held."""
        return int(np.unique(self.batch).size)

    def take(self, token_index: np.ndarray) -> TraceSample:
        """The held tokens at ``token_index`` (a boolean mask or integer indices)."""
        return replace(self, token_index=self.token_index[token_index],
                       window=self.window[token_index])


@dataclass(frozen=True)
class RoutingTrace:
    """Per-token routing, kept in memory for the evaluator.

    Attributes
    ----------
    topk_ids: ``[tokens, layers, k]`` int32 logical expert ids, -1 where none (int16 in a
        sample, when the expert ids fit).
    layer_ids: ``[layers]`` int64 absolute layer index of each column.
    step: ``[tokens]`` int64 forward step (batch) of each token, -1 when unknown.
    rank: ``[tokens]`` int64 source rank (DP rank) of each token, -1 when unknown.
    topk_weights: ``[tokens, layers, k]`` float32 gate weights, or None.
    sample: which tokens of the trace these are (:class:`TraceSample`), or None when
        they are all of them, in order.
    """

    topk_ids: np.ndarray
    layer_ids: np.ndarray
    step: np.ndarray
    rank: np.ndarray
    topk_weights: np.ndarray | None = None
    sample: TraceSample | None = None

    def __post_init__(self) -> None:
        if self.topk_ids.ndim != 3:
            raise ValueError(f"topk_ids must be [tokens, layers, k], got {self.topk_ids.shape}")
        t, l, _ = self.topk_ids.shape  # noqa: E741
        if self.layer_ids.shape != (l,):
            raise ValueError(f"layer_ids must be [{l}], got {self.layer_ids.shape}")
        if self.step.shape != (t,) or self.rank.shape != (t,):
            raise ValueError("step and rank must be [tokens]")
        if self.sample is not None and self.sample.token_index.shape != (t,):
            raise ValueError("a sample's token_index must be [tokens]")

    @property
    def num_tokens(self) -> int:
        return int(self.topk_ids.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.topk_ids.shape[1])

    @property
    def top_k(self) -> int:
        return int(self.topk_ids.shape[2])

    @property
    def has_steps(self) -> bool:
        return bool(self.num_tokens) and bool((self.step >= 0).all())

    def take(self, token_index: np.ndarray) -> RoutingTrace:
        """The tokens at ``token_index`` (a boolean mask or integer indices)."""
        return RoutingTrace(
            topk_ids=self.topk_ids[token_index],
            layer_ids=self.layer_ids,
            step=self.step[token_index],
            rank=self.rank[token_index],
            topk_weights=None if self.topk_weights is None else self.topk_weights[token_index],
            sample=None if self.sample is None else self.sample.take(token_index),
        )


@dataclass(frozen=True)
class RoutingData:
    """What a trace file gives: statistics always, per-token routing when the format has it."""

    stats: ExpertStats
    trace: RoutingTrace | None = None


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(parts).astype(np.int64, copy=False)


def format_ranges(ids: Iterable[int] | np.ndarray) -> str:
    """Layer or expert ids as runs: ``[3, 4, 5, 9]`` -> ``"3-5, 9"`` (sorted, repeats dropped)."""
    out: list[str] = []
    vals = sorted({int(i) for i in ids})
    i = 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        out.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    return ", ".join(out)
