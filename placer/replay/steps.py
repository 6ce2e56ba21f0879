"""The steps of a replay: per-token routing cut into serving steps, walked in order.

A *step* is one forward pass of the whole EP group: ``tokens_per_gpu x G`` consecutive
tokens of the trace (the regime's batch, as every command judges), or the trace's own
``step`` field (forward passes an engine recorded) with ``trace_steps``.  A
:class:`StepSource` reads the routing once for the load of every step (what the
rebalancing policies decide on) and again, chunk by chunk of whole steps, for the
evaluator; per-token NPZ files are streamed (a DeepSeek-V3-sized hour of decode does
not fit in memory), other per-token formats are read whole by ``placer.traces``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from placer.errors import Param, TraceError, UsageError
from placer.evaluate.batches import attention_ranks
from placer.planning.build import check_declared_model
from placer.stats import RoutingTrace
from placer.traces import detect_format, read_routing
from placer.traces.formats.npz import NpzTokens

if TYPE_CHECKING:
    from placer.model import ModelSpec

#: Tokens read per chunk of the trace (whole steps are added until at least this many).
CHUNK_TOKENS = 1 << 17


@dataclass(frozen=True)
class Chunk:
    """Whole steps of the trace: tokens ``lo:hi`` (trace order), steps ``first_step``
    onwards.

    Attributes
    ----------
    topk_ids: ``[tokens, columns, k]`` expert ids (-1 = none) of the layer columns asked
        of :meth:`StepSource.chunks` (default: all, in :attr:`StepSource.layer_ids`
        order); reused between chunks by streamed sources.
    step: ``[tokens]`` int64 replay step of each token (absolute).
    rank: ``[tokens]`` int64 source rank, -1 where unknown, or None.
    """

    lo: int
    hi: int
    first_step: int
    num_steps: int
    topk_ids: np.ndarray
    step: np.ndarray
    rank: np.ndarray | None


@dataclass(frozen=True)
class StepSource:
    """Per-token routing cut into replay steps.

    Attributes
    ----------
    name: the trace, for messages.
    layer_ids: ``[layers]`` int64 absolute layer ids (ascending).
    top_k: experts each token selects.
    step_of_token: ``[tokens]`` int64 replay step of each token (non-decreasing).
    rank: ``[tokens]`` int64 source ranks (-1 unknown), or None.
    trace: the routing in memory, or None when ``npz`` streams it.
    npz: the streamed NPZ file, or None.
    dealt_ranks: the source ranks the trace records when they are fewer than the GPUs
        (its tokens are then dealt over every GPU, ``rank`` None:
        :func:`placer.evaluate.batches.attention_ranks`); 0 otherwise.
    """

    name: str
    layer_ids: np.ndarray
    top_k: int
    step_of_token: np.ndarray
    rank: np.ndarray | None
    trace: RoutingTrace | None = None
    npz: NpzTokens | None = None
    dealt_ranks: int = 0

    @property
    def num_tokens(self) -> int:
        return int(self.step_of_token.size)

    @property
    def num_steps(self) -> int:
        return int(self.step_of_token[-1]) + 1 if self.step_of_token.size else 0

    @property
    def num_layers(self) -> int:
        return int(self.layer_ids.size)

    def chunks(self, tokens: int | None = None, columns: Sequence[int] | None = None, *,
               verify: bool = False) -> Iterator[Chunk]:
        """Whole steps, in order, about ``tokens`` tokens a chunk (at least one step;
        default :data:`CHUNK_TOKENS`); only the layer ``columns`` given (indices of
        :attr:`layer_ids`, default all), in that order.  ``verify``: check the streamed
        file's CRC on the way (a zip stream always checks it)."""
        tokens = tokens or CHUNK_TOKENS
        bounds = np.searchsorted(self.step_of_token, np.arange(self.num_steps + 1))
        firsts = [0]
        while firsts[-1] < self.num_steps:
            firsts.append(_last_step(bounds, firsts[-1], tokens))
        spans = [(int(bounds[a]), int(bounds[b]))
                 for a, b in itertools.pairwise(firsts)]
        cols = None if columns is None else np.asarray(columns, dtype=np.int64)
        if self.npz is not None:
            pieces: Iterable[np.ndarray] = self.npz.rows(spans, cols, verify=verify)
        else:
            assert self.trace is not None
            every = self.trace.topk_ids
            pieces = (every[lo:hi] if cols is None else every[lo:hi][:, cols]
                      for lo, hi in spans)
        for (lo, hi), step, last, ids in zip(spans, firsts[:-1], firsts[1:], pieces,
                                             strict=True):
            yield Chunk(lo, hi, step, last - step, ids, self.step_of_token[lo:hi],
                        None if self.rank is None else self.rank[lo:hi])


def _last_step(bounds: np.ndarray, step: int, tokens: int) -> int:
    """The step after the last one of a chunk starting at ``step``: whole steps until
    the chunk holds at least ``tokens`` tokens (one step at least)."""
    target = bounds[step] + tokens
    last = int(np.searchsorted(bounds, target, side="left"))
    return min(max(last, step + 1), bounds.size - 1)


def open_steps(path: str | os.PathLike[str] | list[Path], *, num_gpus: int,
               batch_tokens: int, trace_steps: bool = False, trace_format: str | None = None,
               num_experts: int | None = None, top_k: int | None = None,
               model: ModelSpec | None = None,
               allow_model_mismatch: bool = False) -> StepSource:
    """The steps of a per-token trace (module docstring).

    ``batch_tokens``: tokens of one step (``tokens_per_gpu x G``) unless ``trace_steps``.
    A per-token NPZ file is streamed; other formats are read with
    :func:`placer.traces.read_routing` (``keep_tokens``) and kept in memory.  ``model``:
    the model replayed; a trace that declares another one (an NPZ array or a JSONL
    header's ``model``) is a TraceError naming both and what differs, a TraceWarning with
    ``allow_model_mismatch`` (:func:`placer.planning.build.check_declared_model`, as
    ``placer plan`` checks it).  A trace recorded on fewer source ranks than ``num_gpus``
    has its tokens dealt over every GPU (:attr:`StepSource.dealt_ranks`).

    Raises TraceError for aggregated statistics (a replay needs tokens), steps out of
    order or another model, UsageError for bad arguments.
    """
    paths = [Path(p) for p in path] if isinstance(path, list) else [Path(path)]
    name = ", ".join(str(p) for p in paths)
    if len(paths) == 1 and trace_format in (None, "npz") and paths[0].is_file() \
            and (trace_format == "npz" or detect_format(paths[0]).name == "npz"):
        npz = NpzTokens.open(paths[0])
        _check_declared(npz, num_experts, name)
        if model is not None:
            declared = npz.meta.get("model")
            check_declared_model(None if declared is None else str(declared), model,
                                 num_experts=int(npz.meta.get("num_experts")
                                                 or model.num_experts),
                                 top_k=npz.top_k, layer_ids=npz.layer_ids, where=name,
                                 allow_mismatch=allow_model_mismatch)
        step = _steps(npz.num_tokens, npz.step, batch_tokens, trace_steps, name)
        rank, dealt = attention_ranks(npz.rank, num_gpus)
        return StepSource(name, npz.layer_ids, npz.top_k, step, rank, npz=npz,
                          dealt_ranks=dealt)
    routing = read_routing(paths, trace_format, keep_tokens=True, coact=False,
                           num_experts=num_experts, top_k=top_k)
    if model is not None:
        stats = routing.stats
        check_declared_model(stats.provenance.model, model, num_experts=stats.num_experts,
                             top_k=stats.top_k, layer_ids=stats.layer_ids, where=name,
                             allow_mismatch=allow_model_mismatch)
    trace = routing.trace
    if trace is None:
        raise TraceError(
            "a replay needs per-token routing; these are aggregated statistics", where=name,
            hint="record per-token routing (SGLang per_token dumps, a JSONL or NPZ trace)")
    order = np.argsort(trace.layer_ids, kind="stable")
    if (order != np.arange(order.size)).any():
        trace = RoutingTrace(trace.topk_ids[:, order], trace.layer_ids[order], trace.step,
                             trace.rank, None)
    keep = np.arange(trace.num_tokens)
    if trace_steps:
        keep = np.argsort(trace.step, kind="stable")  # engines' passes, in order
        trace = RoutingTrace(trace.topk_ids[keep], trace.layer_ids, trace.step[keep],
                             trace.rank[keep], None)
    step = _steps(trace.num_tokens, trace.step if trace.has_steps else None, batch_tokens,
                  trace_steps, name)
    rank, dealt = attention_ranks(trace.rank if (trace.rank >= 0).any() else None, num_gpus)
    return StepSource(name, trace.layer_ids, trace.top_k, step, rank, trace=trace,
                      dealt_ranks=dealt)


def _steps(num_tokens: int, step: np.ndarray | None, batch_tokens: int, trace_steps: bool,
           name: str) -> np.ndarray:
    """``[tokens]`` int64 replay step of each token."""
    if num_tokens == 0:
        raise TraceError("the trace has no tokens", where=name, hint="replay a longer trace")
    if not trace_steps:
        if batch_tokens < 1:
            raise UsageError(f"expected at least 1 token a step, got {batch_tokens}",
                             where=Param("tokens_per_gpu"), hint="1 or more tokens per GPU")
        return np.arange(num_tokens, dtype=np.int64) // batch_tokens
    if step is None or (step < 0).any():
        raise TraceError("the trace does not give every token its step", where=name,
                         hint="replay by tokens (drop `trace_steps`): steps of"
                         " tokens_per_gpu x GPUs tokens")
    if (np.diff(step) < 0).any():
        i = int(np.flatnonzero(np.diff(step) < 0)[0]) + 1
        raise TraceError(f"token {i} has step {int(step[i])} after step {int(step[i - 1])}:"
                         " a streamed trace must be in step order", where=f"{name}: step[{i}]",
                         hint="write the tokens in step order, or replay by tokens")
    _, inverse = np.unique(step, return_inverse=True)
    return inverse.astype(np.int64).reshape(-1)


def _check_declared(npz: NpzTokens, num_experts: int | None, name: str) -> None:
    """The file's declared expert count agrees with the model's."""
    declared = npz.meta.get("num_experts")
    if num_experts is not None and declared is not None and int(declared) != num_experts:
        raise TraceError(f"the trace declares {int(declared)} experts but the model has"
                         f" {num_experts}", where=name, hint="replay with the trace's model")


def step_loads(source: StepSource, num_experts: int,
               columns: list[int] | None = None) -> np.ndarray:
    """``[steps, layers, experts]`` int32 selections of each expert at each step (the
    logical load engines record), checking every expert id on the way; only the layer
    ``columns`` given (default: all; the others stay 0), so layers can be counted apart.

    Raises TraceError naming the token and layer of an id outside ``[-1, experts)``.
    """
    cols = np.arange(source.num_layers) if columns is None else np.asarray(columns)
    width = num_experts + 1  # column 0 of each step counts the missing selections (-1)
    loads = np.zeros((source.num_steps, source.num_layers, num_experts), dtype=np.int32)
    flat = np.empty(0, dtype=np.int64)
    # every byte of a streamed file is checked once a replay: by the pass that counts
    # its first layer (replays count the loads before anything else)
    for chunk in source.chunks(columns=cols.tolist(), verify=bool((cols == 0).any())):
        ids = chunk.topk_ids
        lo_id, hi_id = int(ids.min()), int(ids.max())
        if lo_id < -1 or hi_id >= num_experts:
            bad = np.argwhere((ids < -1) | (ids >= num_experts))[0]
            token, col = chunk.lo + int(bad[0]), int(cols[int(bad[1])])
            raise TraceError(
                f"token {token}, layer {int(source.layer_ids[col])}: expert id"
                f" {int(ids[tuple(bad)])} is out of range [0, {num_experts})",
                where=f"{source.name}: topk_ids[{token}, {col}, {int(bad[2])}]",
                hint="replay with the model the trace was recorded with (`model`)")
        n, k = ids.shape[0], ids.shape[2]
        cells = chunk.num_steps * width
        # (step, expert + 1) cell of each selection, one layer at a time: small buffers
        # reused, not a [tokens, layers, k] int64 array a chunk
        base = ((chunk.step - chunk.first_step) * width + 1)[:, None]
        if flat.size < n * k:
            flat = np.empty(n * k, dtype=np.int64)
        cell = flat[: n * k].reshape(n, k)
        rows = loads[chunk.first_step : chunk.first_step + chunk.num_steps]
        for at, col in enumerate(cols):
            np.add(base, ids[:, at], out=cell)
            counts = np.bincount(flat[: n * k], minlength=cells)
            rows[:, col] = counts.reshape(chunk.num_steps, width)[:, 1:]
    return loads
