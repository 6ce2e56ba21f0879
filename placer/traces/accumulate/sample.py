"""Per-token routing kept for a judge within bounds: :class:`TokenSampler`, the part of
:class:`~placer.traces.accumulate.Accumulator` that ``ReadOptions.sample``
(:class:`~placer.traces.chunks.TokenSample`) asks for.

While the tokens counted hold at most ``whole_selections`` (token, layer, pick)
selections, every token is kept and the trace comes out whole, as with
``keep_tokens``.  Past that the trace is *sampled*:

1. tokens are cut into *batches* of ``batch_tokens`` consecutive tokens in the order
   they are numbered (batch ``b`` holds tokens ``b x batch_tokens`` up to the next
   batch's first; the last batch may be shorter);
2. a batch belongs to the window of its first token, and has a *priority*, a hash of
   ``seed`` and ``b`` (:func:`batch_priority`);
3. each window keeps the ``per_window`` batches of lowest priority; a batch out of
   them is dropped as soon as that is known, with its tokens.

When windows merge pairwise (``constants.MAX_WINDOWS``), the batches kept by the two
halves compete again: the lowest of the union are among the lowest of each half, so
nothing dropped earlier is missed.  Each window of the statistics thus ends with a
uniform sample of its batches (all of them when it has at most ``per_window``), the
same for the same trace and seed whatever the chunks or the format.  Memory: the
tokens of at most ``MAX_WINDOWS x per_window`` batches, plus the batch being read;
the statistics are counted on every token all the same.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from placer.stats import RoutingTrace, TraceSample
from placer.traces.accumulate.grid import Windows
from placer.traces.chunks import TokenSample

_MASK = (1 << 64) - 1
#: splitmix64's constants (Steele, Lea and Flood): a bijective mix of 64-bit keys.
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def batch_priority(seed: int, batch: np.ndarray) -> np.ndarray:
    """``[n]`` uint64 priority of each batch number: splitmix64 of ``batch`` offset by a
    mix of ``seed`` (same seed, same priorities; a batch's priority never depends on
    the others)."""
    base = np.uint64(((int(seed) + 1) * _GOLDEN) & _MASK)
    with np.errstate(over="ignore"):
        z = np.asarray(batch, dtype=np.int64).astype(np.uint64) * np.uint64(_GOLDEN) + base
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
    out: np.ndarray = z ^ (z >> np.uint64(31))
    return out


@dataclass
class _Batch:
    """The tokens of one batch held so far."""

    key: int  # window key (step or token index) of the batch's first token
    priority: int
    # whole tokens: (first token, ids [t, layers, k], layer ids [layers])
    blocks: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)
    # rows: (token [r], layer id [r], experts [r, k])
    rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    # tokens first seen: (token [n], step [n], rank [n])
    tokens: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)


class TokenSampler:
    """Keeps the tokens a :class:`~placer.traces.chunks.TokenSample` asks for (see the
    module): every token up to the whole-trace bound, then whole batches per window.

    Parameters
    ----------
    sample: what to keep.
    windows: the accumulator's windows (their grid places batches in windows).
    """

    def __init__(self, sample: TokenSample, windows: Windows) -> None:
        self.sample = sample
        self.windows = windows
        self.sampled = False  # past the whole-trace bound
        self.selections = 0  # selections counted so far (kept or not)
        self._batches: dict[int, _Batch] = {}  # batch number -> its tokens held

    # -- tokens in ---------------------------------------------------------------------
    def add_whole_tokens(
        self, glob: np.ndarray, keys: np.ndarray, lid: np.ndarray, ids: np.ndarray,
        step: np.ndarray | None, rank: np.ndarray | None,
    ) -> None:
        """Counted whole tokens: ``glob [t]`` consecutive token numbers, ``keys [t]`` their
        window keys, ``ids [t, layers, k]`` (copied: readers reuse their buffers) of the
        absolute layers ``lid``."""
        t = int(glob.size)
        if t == 0:
            return
        self._open(glob, keys)
        self.selections += int(ids.shape[1]) * int(ids.shape[2]) * t
        self._prune()
        bt = self.sample.batch_tokens
        g0 = int(glob[0])
        for b in range(g0 // bt, int(glob[-1]) // bt + 1):
            held = self._batches.get(b)
            if held is None:
                continue
            lo, hi = max(b * bt, g0) - g0, min((b + 1) * bt, g0 + t) - g0
            held.blocks.append((g0 + lo, _mapped(ids[lo:hi]), lid))
            held.tokens.append((glob[lo:hi].copy(), _or_unknown(step, lo, hi),
                                _or_unknown(rank, lo, hi)))

    def add_rows(
        self, glob: np.ndarray, layer: np.ndarray, experts: np.ndarray,
        new_glob: np.ndarray, new_keys: np.ndarray, new_step: np.ndarray,
        new_rank: np.ndarray,
    ) -> None:
        """Counted rows (``glob [r]``: their tokens, ``layer [r]`` absolute layer ids,
        ``experts [r, k]``) and the tokens first seen in them (``new_glob [n]`` rising,
        their window keys, steps and ranks)."""
        self._open(new_glob, new_keys)
        self.selections += int(experts.shape[0]) * int(experts.shape[1])
        self._prune()
        bt = self.sample.batch_tokens
        for b, at in _groups(glob // bt):
            held = self._batches.get(b)
            if held is not None:
                held.rows.append((glob[at], layer[at].astype(np.int64),
                                  _mapped(experts[at])))
        for b, at in _groups(new_glob // bt):
            held = self._batches.get(b)
            if held is not None:
                held.tokens.append((new_glob[at], new_step[at], new_rank[at]))

    def _open(self, glob: np.ndarray, keys: np.ndarray) -> None:
        """Hold the batches whose first token is among ``glob``."""
        first = np.flatnonzero(glob % self.sample.batch_tokens == 0)
        if first.size == 0:
            return
        numbers = glob[first] // self.sample.batch_tokens
        priority = batch_priority(self.sample.seed, numbers)
        for b, key, p in zip(numbers.tolist(), keys[first].tolist(), priority.tolist(),
                             strict=True):
            self._batches[b] = _Batch(int(key), int(p))

    def _prune(self) -> None:
        """Past the whole-trace bound, drop every batch out of the ``per_window`` of
        lowest priority in its window (windows of the grid as it is now)."""
        if not self.sampled and self.selections <= self.sample.whole_selections:
            return
        self.sampled = True
        numbers = np.fromiter(self._batches, dtype=np.int64, count=len(self._batches))
        if numbers.size <= self.sample.per_window:
            return
        keys = np.array([self._batches[b].key for b in numbers.tolist()], dtype=np.int64)
        priority = np.array([self._batches[b].priority for b in numbers.tolist()],
                            dtype=np.uint64)
        window = self.windows.index(keys)
        order = np.lexsort((priority, window))
        starts = np.r_[True, window[order][1:] != window[order][:-1]]
        rank = np.arange(order.size) - np.maximum.accumulate(
            np.where(starts, np.arange(order.size), 0))
        for b in numbers[order][rank >= self.sample.per_window].tolist():
            del self._batches[b]

    # -- the result --------------------------------------------------------------------
    def held(self) -> tuple[int, int]:
        """``(tokens, rows)`` held for the trace: its dense array's first dimension, and
        the (token, layer) rows read into it (:meth:`trace` checks no more)."""
        self._prune()
        tokens = sum(int(p[0].size) for b in self._batches.values() for p in b.tokens)
        rows = sum(int(ids.shape[0]) * int(ids.shape[1])
                   for b in self._batches.values() for _, ids, _ in b.blocks)
        rows += sum(int(tok.size) for b in self._batches.values() for tok, _, _ in b.rows)
        return tokens, rows

    @staticmethod
    def itemsize(num_experts: int) -> int:
        """Bytes of one expert id in the trace: int16 when ``num_experts`` fits."""
        return 2 if num_experts < np.iinfo(np.int16).max else 4

    def trace(self, layer_ids: np.ndarray, num_tokens: int, k: int,
              num_experts: int) -> RoutingTrace:
        """The tokens kept, as a :class:`~placer.stats.RoutingTrace` over ``layer_ids``
        (ascending) with ``k`` experts a row: every token (``sample`` None) while the
        trace is within the whole-trace bound, else the sampled batches with their
        :class:`~placer.stats.TraceSample`.  Ids are int16 when ``num_experts`` fits."""
        self._prune()
        numbers = sorted(self._batches)
        tokens = [piece for b in numbers for piece in self._batches[b].tokens]
        glob = _cat([p[0] for p in tokens])
        order = np.argsort(glob, kind="stable")
        glob = glob[order]
        step = _cat([p[1] for p in tokens])[order]
        rank = _cat([p[2] for p in tokens])[order]
        keys = np.array([self._batches[b].key for b in numbers], dtype=np.int64)
        small = self.itemsize(num_experts) == 2
        # pages of the map are taken as each batch is written, while the batch's pieces
        # are let go: the sample is held about once, not twice
        topk = _mapped_empty((glob.size, layer_ids.size, k),
                             np.dtype(np.int16 if small else np.int32))
        bounds = np.searchsorted(glob // self.sample.batch_tokens,
                                 [*numbers, numbers[-1] + 1] if numbers else [0])
        for i, b in enumerate(numbers):
            held = self._batches.pop(b)
            topk[bounds[i]:bounds[i + 1]] = -1
            for first, ids, lid in held.blocks:
                at = np.searchsorted(glob, first)
                cols = np.searchsorted(layer_ids, lid)
                topk[at:at + ids.shape[0], cols, :ids.shape[2]] = ids
            for tok, lay, ex in held.rows:
                topk[np.searchsorted(glob, tok), np.searchsorted(layer_ids, lay),
                     :ex.shape[1]] = ex
        sample = None
        if self.sampled:
            bt = self.sample.batch_tokens
            window_of = dict(zip(numbers, self.windows.index(keys).tolist(), strict=True))
            window = np.array([window_of[b] for b in (glob // bt).tolist()], dtype=np.int64)
            sample = TraceSample(
                token_index=glob, window=window, num_windows=self.windows.grid.count,
                batch_tokens=bt, per_window=self.sample.per_window, seed=self.sample.seed,
                num_tokens=int(num_tokens))
        return RoutingTrace(topk_ids=topk, layer_ids=layer_ids.copy(), step=step,
                            rank=rank, sample=sample)


def _mapped_empty(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """An array in its own anonymous memory map, returned to the system as soon as it is
    let go (freed heap memory often is not, and the sample's pieces would then count
    twice at the peak, once more in the trace built from them); its pages are also
    taken faster than a large ``np.empty``'s here."""
    nbytes = int(np.prod(shape)) * dtype.itemsize
    if nbytes < mmap.PAGESIZE:
        return np.empty(shape, dtype=dtype)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).reshape(shape)


def _mapped(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` in its own memory map (:func:`_mapped_empty`)."""
    out = _mapped_empty(a.shape, a.dtype)
    out[...] = a
    return out


def _or_unknown(a: np.ndarray | None, lo: int, hi: int) -> np.ndarray:
    """``a[lo:hi]`` as int64, or -1s (unknown) when ``a`` is None."""
    if a is None:
        return np.full(hi - lo, -1, dtype=np.int64)
    return np.asarray(a[lo:hi], dtype=np.int64).copy()


def _groups(values: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """``[(value, positions)]`` of each distinct value of ``values``, rising."""
    if values.size == 0:
        return []
    if values[0] == values[-1] and (values == values[0]).all():
        return [(int(values[0]), np.arange(values.size))]
    order = np.argsort(values, kind="stable")
    cuts = np.flatnonzero(np.diff(values[order])) + 1
    return [(int(values[part[0]]), part) for part in np.split(order, cuts)]


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int64, copy=False) if parts \
        else np.zeros(0, dtype=np.int64)
