"""Sparse pair counting of :class:`~placer.traces.accumulate.Accumulator`: same-token
pairs and layer affinity as sorted int64 keys with counts, when dense ``[E, E]``
matrices would not fit ``constants.MAX_COACT_BYTES``.

A key is ``i << 32 | j`` (expert ids are below 2^31, so keys rise with ``(i, j)``
whatever the expert count, which may still grow while reading); each chunk's keys are
counted with one sort (``np.unique``) and merged into the row's counts when the pending
ones outgrow them, so memory follows the distinct pairs seen.
"""

from __future__ import annotations

import numpy as np

#: Bits of the second expert of a pair key.
_KEY_BITS = 32

#: Pending counted keys of a row that trigger a merge, at least (see _SparsePairs.add).
_MERGE_MIN = 1 << 20


def _pair_keys(a: np.ndarray, b: np.ndarray, *, triangle: bool) -> np.ndarray:
    """int64 keys of the pairs of each column of ``a [ka, n]`` and ``b [kb, n]`` (expert
    ids, -1 none; pairs with a -1 are left out).

    ``triangle``: ``a`` is ``b`` and the pairs are positions ``i < j`` of one row, keyed
    unordered (``min << 32 | max``); pairs of an expert with itself are left out.
    Otherwise every ``(a[i], b[j])``, ordered.
    """
    parts = []
    if triangle:
        for i in range(a.shape[0] - 1):
            x = a[i].astype(np.int64)
            y = b[i + 1 :].astype(np.int64)
            lo, hi = np.minimum(x, y), np.maximum(x, y)
            keep = (lo >= 0) & (lo != hi)
            parts.append(((lo << _KEY_BITS) | hi)[keep])
    else:
        y = b.astype(np.int64)
        for i in range(a.shape[0]):
            x = a[i].astype(np.int64)
            keep = (x >= 0) & (y >= 0)
            parts.append(((x << _KEY_BITS) | y)[keep])
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(parts)


def _merge(keys: list[np.ndarray], counts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique keys and summed counts (exact, int64) of several (keys, counts)."""
    if len(keys) == 1:
        return keys[0], counts[0]
    cat = np.concatenate(keys)
    order = np.argsort(cat, kind="stable")
    cat = cat[order]
    starts = np.flatnonzero(np.concatenate([[True], cat[1:] != cat[:-1]]))
    return cat[starts], np.add.reduceat(np.concatenate(counts)[order], starts)


class _SparsePairs:
    """Pair counts of rows (layers or layer pairs) as sorted keys and counts."""

    def __init__(self) -> None:
        self._keys: list[list[np.ndarray]] = []  # per row: merged first, then pending
        self._counts: list[list[np.ndarray]] = []
        self._pending: list[int] = []  # keys pending per row
        self._held: list[int] = []  # keys merged per row
        self.size = 0  # keys held, all rows, merged and pending

    def add(self, row: int, keys: np.ndarray, counts: np.ndarray | None = None) -> None:
        """Count ``keys`` (any order, repeats counted) into row ``row``, each once or
        ``counts`` times."""
        if keys.size == 0:
            return
        while len(self._keys) <= row:
            self._keys.append([])
            self._counts.append([])
            self._pending.append(0)
            self._held.append(0)
        if counts is None:
            uniq, counts = np.unique(keys, return_counts=True)
        else:
            uniq, counts = _merge([keys, keys[:0]], [counts, counts[:0]])
        self._keys[row].append(uniq)
        self._counts[row].append(counts.astype(np.int64))
        self._pending[row] += uniq.size
        self.size += uniq.size
        if self._pending[row] > max(self._held[row], _MERGE_MIN):
            self._compact(row)

    def _compact(self, row: int) -> None:
        keys, counts = _merge(self._keys[row], self._counts[row])
        self.size += keys.size - self._held[row] - self._pending[row]
        self._keys[row], self._counts[row] = [keys], [counts]
        self._held[row], self._pending[row] = keys.size, 0

    def row(self, row: int, num_experts: int) -> tuple[np.ndarray, np.ndarray]:
        """Sorted keys ``i * num_experts + j`` and counts of row ``row`` (every id is below
        ``num_experts``)."""
        if row >= len(self._keys) or not self._keys[row]:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        self._compact(row)
        keys, counts = self._keys[row][0], self._counts[row][0]
        return (keys >> _KEY_BITS) * num_experts + (keys & ((1 << _KEY_BITS) - 1)), counts
