"""Sparse pair counting of :class:`~placer.traces.accumulate.Accumulator`: same-token
pairs and layer affinity as sorted int64 keys with counts, when dense ``[E, E]``
matrices would not fit ``constants.MAX_COACT_BYTES``.

A key is ``i << KEY_BITS | j`` (expert ids are below ``constants.MAX_EXPERTS``, so
keys rise with ``(i, j)`` whatever the expert count, which may still grow while
reading), int32 while two ids fit in 31 bits; each chunk's keys are counted with one
sort, and the rows' counts are merged when the keys added since outgrow them, so
memory follows the distinct pairs seen.
"""

from __future__ import annotations

import numpy as np

from placer import constants
from placer.stats import PairCounts

#: Bits of the second expert of a pair key, and the keys' dtype.
KEY_BITS = max(1, (constants.MAX_EXPERTS - 1).bit_length())
KEY_DTYPE = np.int32 if 2 * KEY_BITS <= 31 else np.int64

#: Pending counted keys of a row that trigger a merge, at least (see SparsePairs.add).
_MERGE_MIN = 1 << 20


def pair_keys(a: np.ndarray, b: np.ndarray, *, triangle: bool) -> np.ndarray:
    """int64 keys of the pairs of each column of ``a [ka, n]`` and ``b [kb, n]`` (expert
    ids, -1 none; pairs with a -1 are left out).

    ``triangle``: ``a`` is ``b`` and the pairs are positions ``i < j`` of one row, keyed
    unordered (``min << KEY_BITS | max``); pairs of an expert with itself are left out.
    Otherwise every ``(a[i], b[j])``, ordered.
    """
    parts = []
    xa: np.ndarray = a.astype(KEY_DTYPE)
    xb: np.ndarray = b.astype(KEY_DTYPE)
    if triangle:
        for i in range(xa.shape[0] - 1):
            lo, hi = np.minimum(xa[i], xb[i + 1 :]), np.maximum(xa[i], xb[i + 1 :])
            keep = (lo >= 0) & (lo != hi)
            parts.append(((lo << KEY_BITS) | hi)[keep])
    else:
        for i in range(xa.shape[0]):
            keep = (xa[i] >= 0) & (xb >= 0)
            parts.append(((xa[i] << KEY_BITS) | xb)[keep])
    if not parts:
        return np.zeros(0, dtype=KEY_DTYPE)
    return np.concatenate(parts)


def _count_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique ``keys`` and how often each occurs (``keys`` is sorted in place)."""
    keys.sort()
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    counts = np.diff(np.append(starts, keys.size))
    return keys[starts], counts


def _merge(keys: list[np.ndarray], counts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique keys and summed counts (exact, int64) of several (keys, counts)."""
    if len(keys) == 1:
        return keys[0], counts[0]
    cat = np.concatenate(keys)
    order = np.argsort(cat, kind="stable")
    cat = cat[order]
    starts = np.flatnonzero(np.concatenate([[True], cat[1:] != cat[:-1]]))
    return cat[starts], np.add.reduceat(np.concatenate(counts)[order], starts)


class SparsePairs:
    """Pair counts of rows (layers or layer pairs) as sorted keys and counts.

    Each chunk's keys are counted (sorted, unique) and kept apart; once the keys added
    since the last merge outnumber those it left (and ``_MERGE_MIN``), every row is
    merged, so merging costs ``O(n log n)`` in all and memory stays within about twice
    the distinct pairs (plus ``_MERGE_MIN`` keys)."""

    def __init__(self) -> None:
        self._keys: list[list[np.ndarray]] = []  # per row: sorted unique parts
        self._counts: list[list[np.ndarray]] = []
        self.size = 0  # keys held, all rows and parts (repeats across parts included)
        self._merged = 0  # keys held after the last merge of every row

    def add(self, row: int, keys: np.ndarray, counts: np.ndarray | None = None,
            weight: int = 1) -> None:
        """Count ``keys`` (any order, repeats counted) into row ``row``, each once or
        ``counts`` times, ``weight`` times over."""
        if keys.size == 0:
            return
        while len(self._keys) <= row:
            self._keys.append([])
            self._counts.append([])
        if counts is None:
            uniq, counts = _count_keys(keys)
        else:
            uniq, counts = _merge([keys, keys[:0]], [counts, counts[:0]])
        if weight != 1:
            counts = counts * weight
        self._keys[row].append(uniq)
        self._counts[row].append(counts.astype(np.int64))
        self.size += uniq.size
        if self.size - self._merged > max(self._merged, _MERGE_MIN):
            self.merge()

    def merge(self) -> int:
        """Merge every row; returns the distinct pairs held."""
        for row in range(len(self._keys)):
            self._compact(row)
        self._merged = self.size
        return self.size

    def _compact(self, row: int) -> None:
        parts = self._keys[row]
        if len(parts) < 2:
            return
        before = sum(k.size for k in parts)
        keys, counts = _merge(parts, self._counts[row])
        self._keys[row], self._counts[row] = [keys], [counts]
        self.size += keys.size - before

    def pop(self, row: int, num_experts: int) -> tuple[np.ndarray, np.ndarray]:
        """Sorted int64 keys ``i * num_experts + j`` and counts of row ``row`` (every id
        is below ``num_experts``); the row is emptied (its memory is handed over)."""
        if row >= len(self._keys) or not self._keys[row]:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        self._compact(row)
        keys, counts = self._keys[row][0], self._counts[row][0]
        self._keys[row], self._counts[row] = [], []
        self.size -= keys.size
        self._merged = min(self._merged, self.size)
        wide = keys.astype(np.int64)
        first = wide >> KEY_BITS
        wide &= (1 << KEY_BITS) - 1
        first *= num_experts
        wide += first
        return wide, counts

    def take_rows(
        self, rows: list[int | None], num_experts: int, *, symmetric: bool
    ) -> PairCounts:
        """The rows ``rows`` (None: no pairs) as :class:`~placer.stats.PairCounts`,
        emptying them (see :meth:`pop`); the result is allocated once and filled."""
        self.merge()
        sizes = np.array([0 if r is None or r >= len(self._keys) or not self._keys[r]
                          else self._keys[r][0].size for r in rows], dtype=np.int64)
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(sizes, out=indptr[1:])
        keys = np.empty(int(indptr[-1]), dtype=np.int64)
        counts = np.empty(int(indptr[-1]), dtype=np.int64)
        for n, r in enumerate(rows):
            if sizes[n]:
                assert r is not None
                k, c = self.pop(r, num_experts)
                keys[indptr[n] : indptr[n + 1]] = k
                counts[indptr[n] : indptr[n + 1]] = c
        return PairCounts(num_experts, indptr, keys, counts, symmetric)
