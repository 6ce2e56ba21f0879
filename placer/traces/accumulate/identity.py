"""Token identity of :class:`~placer.traces.accumulate.Accumulator`: which token each
routing row belongs to.

:class:`TokenIdentity` is a part the accumulator holds and delegates to.  A row's token
is found by its key (request and token id) or, for rows without a token id, by order:
the n-th row of a layer (within a request) belongs to the n-th token.  The n-th row of a
(request, token, layer) belongs to the n-th occurrence of the token (a second pass with
the same ids, token numbers that restart); such repeats are counted for one warning.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from placer.errors import TraceError
from placer.traces.accumulate.occurrences import OCC_BITS, WORD_BITS, TokenTable
from placer.traces.chunks import RowChunk


class TokenIdentity:
    """Requests, token keys and the per-token table of one accumulation.

    Attributes
    ----------
    table: the per-token table (global index, step, window key, layers seen).
    repeat_rows, repeat_tokens, repeat_where: rows that repeat a (request, token,
        layer), the occurrences they started, and where the first was.
    """

    def __init__(self) -> None:
        self.table = TokenTable()
        self._requests: dict[tuple[int, Any], int] = {}
        self._request_labels: list[Any] = []
        self._order_count: dict[int, int] = {}  # (request << 20 | layer) -> rows so far
        self.repeat_rows = 0
        self.repeat_tokens = 0
        self.repeat_where = ""

    def request_id(self, source_index: int, label: Any, source: str) -> int:
        """A number for request ``label`` of source ``source_index`` (labels are per
        file); ``source``: for messages."""
        key = (source_index, label)
        rid = self._requests.get(key)
        if rid is None:
            rid = len(self._request_labels)
            if rid >= 1 << 30:
                raise TraceError(
                    "more than 2^30 requests", where=source,
                    hint="read the trace in parts",
                )
            self._requests[key] = rid
            self._request_labels.append(label)
        return rid

    def keys(self, chunk: RowChunk, source: str) -> np.ndarray:
        """A 64-bit key per row: request << 32 | token id, or order-based ids (the n-th
        row of a layer within a request is the n-th token).  ``source``: for messages."""
        req = chunk.request.astype(np.int64)
        tok = chunk.token.astype(np.int64)
        if (tok >= 1 << 31).any():
            i = int(np.flatnonzero(tok >= 1 << 31)[0])
            raise TraceError(
                f"token id {int(tok[i])} is out of range [0, 2^31)",
                where=f"{source}:{int(chunk.lines[i])}",
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

    def label(self, chunk: RowChunk, i: int) -> str:
        """Row ``i``'s token as messages name it: ``(request r, token t)``."""
        req = self._request_labels[int(chunk.request[i])]
        tok = int(chunk.token[i])
        parts = []
        if req is not None:
            parts.append(f"request {req}")
        parts.append(f"token {tok}" if tok >= 0 else "(no token id)")
        return "(" + ", ".join(parts) + ")"

    def indices(
        self, keys: np.ndarray, rows: np.ndarray, where: Callable[[int], str], k: int,
        words: int,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Table index of the token of each row, and the first row of each new token.

        ``keys [rows]`` token keys (:meth:`keys`), ``rows [rows]`` accumulator rows; ``k``
        experts a row and ``words`` 64-bit words of layer bits a token (table room).
        A token has one row per layer: the n-th row of a (request, token, layer) belongs
        to the n-th occurrence of the token (a second pass with the same ids, token
        numbers that restart), counted for the warning.
        """
        table = self.table
        first, new_first = table.lookup(keys)
        table.reserve(k, words)
        words = table.seen.shape[1]
        word = rows // WORD_BITS
        mask = np.left_shift(np.uint64(1), (rows % WORD_BITS).astype(np.uint64))
        code = first * (words * WORD_BITS) + rows
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
        if int(occ.max()) >= 1 << OCC_BITS or table.size >= 1 << (62 - OCC_BITS):
            i = int(np.argmax(occ))
            raise TraceError(
                "too many repeats of one token id (or too many tokens) to tell the"
                " occurrences apart",
                where=where(i),
                hint="number tokens uniquely within a request, or drop the token field",
            )
        idx, new_occ = table.occurrence(first[rep], occ[rep])
        table.reserve(k, words)
        local = first.copy()
        local[rep] = idx
        new_first = new_first.copy()
        new_first[rep[new_occ]] = True
        np.maximum.at(table.extra, first[rep], occ[rep])
        self.repeat_rows += rep.size
        self.repeat_tokens += int(new_occ.sum())
        if not self.repeat_where:
            self.repeat_where = where(int(rep[0]))
        np.bitwise_or.at(table.seen, (local, word), mask)
        return local, new_first

    def _layer_count(self, first: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Occurrences of each token (table index of its first) with a row for its layer
        row in ``rows``; occurrence 0 has one.  Occurrences take a layer in order, so
        those with it are a prefix: a binary search over them."""
        table = self.table
        word = rows // WORD_BITS
        mask = np.left_shift(np.uint64(1), (rows % WORD_BITS).astype(np.uint64))
        lo = np.ones(first.size, dtype=np.int64)  # occurrences known to hold the layer
        hi = 1 + table.extra[first]  # occurrences that exist
        active = np.flatnonzero(lo < hi)
        while active.size:
            mid = (lo[active] + hi[active]) // 2
            idx = table.occurrences.find((first[active] << OCC_BITS) | mid)
            holds = (table.seen[idx, word[active]] & mask[active]) != 0
            lo[active[holds]] = mid[holds] + 1
            hi[active[~holds]] = mid[~holds]
            active = active[lo[active] < hi[active]]
        return lo
