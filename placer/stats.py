"""Expert statistics: the aggregated view of routing that planners consume.

:class:`ExpertStats` is built by the trace readers (``placer.traces``) from
per-token traces or from aggregated load files.  It is frozen and holds numpy
arrays; derived figures (skew, drift, pairs) live in ``placer.analysis``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from placer.errors import UsageError


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
    """

    sources: tuple[str, ...] = ()
    format: str = ""
    rows_read: int = 0
    rows_skipped: tuple[tuple[str, int], ...] = ()
    synthetic: bool = False
    model: str | None = None

    @property
    def skipped_total(self) -> int:
        return sum(n for _, n in self.rows_skipped)


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
    coact: ``[layers, experts, experts]`` int64 or None; symmetric same-token pair
        counts within a layer over all windows, zero diagonal.
    layer_affinity: ``[layers - 1, experts, experts]`` int64 or None; tokens that
        selected expert i in layer row l and expert j in layer row l + 1 (only
        for per-token traces that span consecutive layers).
    window_starts: ``[windows]`` int64, the first step (or token) of each window.
    provenance: what was read.
    warnings: messages about suspicious data (synthetic, warm-up passes, ...).
    """

    load: np.ndarray
    tokens: np.ndarray
    layer_ids: np.ndarray
    top_k: int
    coact: np.ndarray | None = None
    layer_affinity: np.ndarray | None = None
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
        if self.coact is not None and self.coact.shape != (l, e, e):
            raise ValueError(f"coact must be [{l}, {e}, {e}], got shape {self.coact.shape}")
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
            pairs = [r for r in rows[:-1] if r + 1 in rows and r < self.layer_affinity.shape[0]]
            aff = self.layer_affinity[pairs] if len(pairs) == len(rows) - 1 else None
        return replace(
            self,
            load=self.load[:, rows],
            layer_ids=self.layer_ids[rows],
            coact=None if self.coact is None else self.coact[rows],
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


@dataclass(frozen=True)
class RoutingTrace:
    """Per-token routing, kept in memory for the evaluator.

    Attributes
    ----------
    topk_ids: ``[tokens, layers, k]`` int32 logical expert ids, -1 where none.
    layer_ids: ``[layers]`` int64 absolute layer index of each column.
    step: ``[tokens]`` int64 forward step (batch) of each token, -1 when unknown.
    rank: ``[tokens]`` int64 source rank (DP rank) of each token, -1 when unknown.
    topk_weights: ``[tokens, layers, k]`` float32 gate weights, or None.
    """

    topk_ids: np.ndarray
    layer_ids: np.ndarray
    step: np.ndarray
    rank: np.ndarray
    topk_weights: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.topk_ids.ndim != 3:
            raise ValueError(f"topk_ids must be [tokens, layers, k], got {self.topk_ids.shape}")
        t, l, _ = self.topk_ids.shape  # noqa: E741
        if self.layer_ids.shape != (l,):
            raise ValueError(f"layer_ids must be [{l}], got {self.layer_ids.shape}")
        if self.step.shape != (t,) or self.rank.shape != (t,):
            raise ValueError("step and rank must be [tokens]")

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
        )


@dataclass(frozen=True)
class RoutingData:
    """What a trace file gives: statistics always, per-token routing when the format has it."""

    stats: ExpertStats
    trace: RoutingTrace | None = None


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
