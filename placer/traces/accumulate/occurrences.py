"""Token identity: sorted key indexes and the per-token table (occurrences of a
token id that repeats a layer); used by :class:`~placer.traces.accumulate.Accumulator`."""

from __future__ import annotations

import numpy as np

WORD_BITS = 64


def grown(arr: np.ndarray, shape: tuple[int, ...], fill: int = 0) -> np.ndarray:
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


class TokenTable:
    """Tokens known by id: a key index plus per-token records.

    A token id (request, token) that repeats a layer starts a new occurrence of the
    token: occurrence ``n >= 1`` of the token whose first occurrence is at table index
    ``f`` is found under key ``f << OCC_BITS | n`` in ``occurrences``.
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
        idx, new_first, added = self.occurrences.lookup((first << OCC_BITS) | occ, self.size)
        self.size += added
        return idx, new_first

    def reserve(self, k: int, words: int) -> None:
        """Per-token records for ``size`` tokens, ``k`` experts, ``words`` x 64 layer rows."""
        cap = self.glob.size
        if self.size > cap or k != self.last_experts.shape[1] or words != self.seen.shape[1]:
            cap = _capacity(self.size) if self.size > cap else cap
            self.glob = grown(self.glob, (cap,), -1)
            self.step = grown(self.step, (cap,), -1)
            self.wkey = grown(self.wkey, (cap,))
            self.last_layer = grown(self.last_layer, (cap,), -1)
            self.last_experts = grown(self.last_experts, (cap, k), -1)
            self.seen = grown(self.seen, (cap, words))
            self.extra = grown(self.extra, (cap,))


#: Bits of an occurrence number in the occurrence keys of :class:`TokenTable`.
OCC_BITS = 24
