"""Chunks of routing that readers hand to :class:`~placer.traces.accumulate.Accumulator`
(and what ``read_routing`` was asked for); moved out of :mod:`placer.traces.accumulate`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from placer import constants
from placer.errors import Param, UsageError

#: ``placer plan`` counts pairs (co-activation) on every token up to this many, and on a
#: sample past them (``read_routing``'s ``pair_tokens``): a 65,536-token trace is
#: counted whole, a 1,000,000-token one on about 194,000 tokens.
PLAN_PAIR_TOKENS = 1 << 16

#: A trace of at most this many (token, layer, pick) selections is kept whole by a
#: :class:`TokenSample` (a 144,630-token DeepSeek-V3 trace: 58 layers x 8 picks): as
#: much as a judgement replays (``placer.evaluate.params.REPLAY_MAX_SELECTIONS``).
SAMPLE_WHOLE_SELECTIONS = 1 << 26


@dataclass(frozen=True)
class TokenSample:
    """Per-token routing to keep for a judge's replay, within bounds: the whole trace
    while it holds at most ``whole_selections`` selections, else whole batches of
    ``batch_tokens`` consecutive tokens, at most ``per_window`` in each window, chosen by
    ``seed`` (:mod:`placer.traces.accumulate.sample`; memory: at most
    ``constants.MAX_WINDOWS x per_window`` batches).

    Attributes
    ----------
    batch_tokens: tokens per batch, the judge's step (``Regime.batch_tokens``).
    per_window: batches kept per window once the trace is sampled.
    seed: seeds the batches' priorities: same seed, same batches.
    whole_selections: the trace is kept whole up to this many selections.
    """

    batch_tokens: int
    per_window: int = 1
    seed: int = 0
    whole_selections: int = SAMPLE_WHOLE_SELECTIONS

    def __post_init__(self) -> None:
        for name in ("batch_tokens", "per_window"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be >= 1, got {getattr(self, name)}",
                                 where=Param(name), hint="the nearest valid value is 1")
        if self.whole_selections < 0:
            raise UsageError(f"whole_selections must be >= 0, got {self.whole_selections}",
                             where=Param("whole_selections"), hint="0 samples every trace")


@dataclass(frozen=True)
class ReadOptions:
    """What ``read_routing`` was asked for (see :func:`placer.traces.read_routing`).

    The options that bound the cost of a long trace:

    - ``affinity``: with ``coact``, also count layer affinity (pairs a token selects in
      consecutive layers; ``placer stats`` shows them, planning reads none: False saves
      about two thirds of the pair counting);
    - ``sample``: keep per-token routing within bounds (:class:`TokenSample`): the whole
      trace while it is small, else whole batches per window, stated in the trace
      (:class:`~placer.stats.TraceSample`); not with ``keep_tokens``;
    - ``pair_tokens``: count pairs on every token up to this many, and past them on a
      hashed sample whose rate halves each time the tokens read double, each counted
      token weighted by the tokens it stands for: unbiased estimates at a cost that grows
      with the log of the trace's length
      (:func:`~placer.traces.accumulate.counting.pair_weights`), then fitted to the loads
      (:mod:`placer.traces.accumulate.estimates`); None: on every token.
    """

    window_tokens: int | None = None
    keep_tokens: bool = False
    coact: bool = True
    affinity: bool = True
    layers: tuple[int, ...] | None = None
    num_experts: int | None = None
    top_k: int | None = None
    keep_warmup: bool = False
    sample: TokenSample | None = None
    pair_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.pair_tokens is not None and self.pair_tokens < 1:
            raise UsageError(
                f"pair_tokens must be >= 1, got {self.pair_tokens}", where=Param("pair_tokens"),
                hint="pairs are counted on every token up to this many (None: on all)",
            )
        if self.keep_tokens and self.sample is not None:
            raise UsageError(
                "keep_tokens keeps every token, sample a bounded part of them",
                where=Param("sample"), hint="pass one of them",
            )
        if self.window_tokens is not None and self.window_tokens < 1:
            raise UsageError(
                f"window_tokens must be >= 1, got {self.window_tokens}",
                where=Param("window_tokens"),
                hint="a window is this many consecutive tokens",
            )
        if self.num_experts is not None and not 1 <= self.num_experts <= constants.MAX_EXPERTS:
            raise UsageError(
                f"num_experts must be in [1, {constants.MAX_EXPERTS}], got {self.num_experts}",
                where=Param("num_experts"), hint="the routed experts of one MoE layer",
            )
        if self.top_k is not None and not 1 <= self.top_k <= constants.MAX_TOP_K:
            raise UsageError(
                f"top_k must be in [1, {constants.MAX_TOP_K}], got {self.top_k}",
                where=Param("top_k"), hint="the experts each token selects per layer",
            )
        if (
            self.top_k is not None and self.num_experts is not None
            and self.top_k > self.num_experts
        ):
            raise UsageError(
                f"top_k {self.top_k} is more than num_experts {self.num_experts}",
                where=Param("top_k"), hint="a token selects top_k of the layer's experts",
            )
        if self.layers is not None and any(i < 0 for i in self.layers):
            raise UsageError(
                "layer ids are >= 0", where=Param("layers"),
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
    columns: ``[layers, k, tokens]`` int32, ``topk_ids`` laid out expert-major as the
        accumulator counts them, made ahead by a reader (in its thread), or None.
    """

    topk_ids: np.ndarray
    step: np.ndarray | None = None
    rank: np.ndarray | None = None
    topk_weights: np.ndarray | None = None
    request: np.ndarray | None = None
    columns: np.ndarray | None = None

    def columns_as(self, layers: int, k: int, tokens: int) -> np.ndarray | None:
        """:attr:`columns` when they are ``[layers, k, tokens]`` int32, else None."""
        c = self.columns
        return c if c is not None and c.shape == (layers, k, tokens) \
            and c.dtype == np.int32 else None


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

    def take(self, index: np.ndarray) -> RowChunk:
        """The rows ``index`` selects (a boolean mask or row numbers, in their order)."""

        def sel(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[index]

        return RowChunk(
            layer=self.layer[index], experts=self.experts[index],
            request=self.request[index], token=self.token[index], lines=self.lines[index],
            step=sel(self.step), rank=sel(self.rank), weights=sel(self.weights),
        )


@dataclass
class HeldTokens:
    """Validated whole tokens of one source held back until a warm-up run that may still
    grow is seen whole (:meth:`Accumulator.add_tokens`); arrays as in :class:`TokenChunk`."""

    ids: np.ndarray  # [tokens, layers, k]
    lid: np.ndarray  # [layers] absolute layer ids
    step: np.ndarray | None
    rank: np.ndarray | None
    weights: np.ndarray | None
    offset: int  # index of the first token in its file, for messages
    array: str  # name of the id array, for messages
    has_none: bool = False
    columns: np.ndarray | None = None  # [layers, k, tokens] int32 (TokenChunk.columns)

    def continued_by(self, other: HeldTokens) -> bool:
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

    def goes_with(self, other: HeldTokens, has_none: bool) -> bool:
        """Whether these held tokens go first with ``other``, the tokens after them: a run
        they end may grow into ``other`` (its first token repeats the last held in some
        layer, or a row may be missing: ``has_none``).  Otherwise they are counted alone,
        which counts the same, and ``other`` as it came (its columns need no copy)."""
        return self.continued_by(other) and (
            has_none or self.has_none or bool((self.ids[-1] == other.ids[0]).all(axis=-1).any()))

    def join(self, other: HeldTokens) -> HeldTokens:
        def cat(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
            return None if a is None or b is None else np.concatenate([a, np.asarray(b)])

        columns = None if self.columns is None or other.columns is None \
            else np.concatenate([self.columns, other.columns], axis=2)
        return HeldTokens(
            np.concatenate([self.ids, other.ids]), other.lid, cat(self.step, other.step),
            cat(self.rank, other.rank), cat(self.weights, other.weights), self.offset,
            self.array, self.has_none or other.has_none, columns,
        )

    def tail(self, cut: int, has_none: bool) -> HeldTokens:
        """Copies of the tokens from ``cut`` on (readers reuse their chunk buffers)."""
        def part(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else np.array(np.asarray(a)[cut:])

        ids = part(self.ids)
        assert ids is not None
        columns = None if self.columns is None else np.array(self.columns[:, :, cut:])
        return HeldTokens(
            ids, self.lid, part(self.step), part(self.rank), part(self.weights),
            self.offset + cut, self.array, has_none, columns,
        )


def concat_rows(a: RowChunk, b: RowChunk) -> RowChunk:
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
