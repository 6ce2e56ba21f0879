"""Counting of :class:`~placer.traces.accumulate.Accumulator`: load,
co-activation and layer affinity."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from placer import constants
from placer.traces.checks import raise_duplicate
from placer.traces.kernels import _BLOCK_CODES, _has_duplicate, _load_into, _pairs_into, _sorted_by
from placer.traces.limits import _coact_bytes
from placer.traces.occurrences import _grow
from placer.traces.pairs import _pair_keys
from placer.traces.state import _AccumulatorState


class _Counting(_AccumulatorState):
    """The counting kernels' callers."""

    def _fit_windows(self, kmin: int, kmax: int) -> None:
        """Make windows for keys ``kmin..kmax`` (merging pairwise past MAX_WINDOWS)."""
        self._load = self._windows.fit(kmin, kmax, self._load)

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
        coact = self._state.options.coact and xt.shape[0] > 1
        if coact:
            xs = self._pair_columns(xt, has_none)
        scratch = self._scratch()
        for a, b in itertools.pairwise(bounds):
            _load_into(load, base[a:b], xt[:, a:b], has_none, scratch)
            if coact:
                self._count_pairs(False, int(rows[a]), xs[:, a:b], xs[:, a:b], triangle=True)
        if coact:
            self._end_pairs(has_none)

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
        coact = self._state.options.coact
        if coact:
            # (a new layer pair may turn the counts sparse: MAX_COACT_BYTES)
            pidx = [self._pair_index(int(lid[c]), int(lid[c + 1])) for c in range(lid.size - 1)]
            # sparse counts leave out self-pairs: look for an expert twice in one row first
            if self._sparse and xt.shape[1] > 1 and _has_duplicate(xt.transpose(1, 0, 2)):
                raise_duplicate(flat, where)
        if coact:
            xs = self._pair_columns(xt, has_none)
        scratch = self._scratch()
        for c in range(lid.size):
            _load_into(load, tok_base + int(rows[c]) * e, xt[c], has_none, scratch)
            if coact:
                if xt.shape[1] > 1:
                    self._count_pairs(False, int(rows[c]), xs[c], xs[c], triangle=True)
                if c + 1 < lid.size:
                    self._count_pairs(True, pidx[c], xs[c], xs[c + 1], triangle=False)
        if coact and self._sparse:  # an expert twice in one row was looked for above
            self._check_sparse_size()
        elif coact:
            if has_none:
                self._clear_trash()
            ew = self._coact.shape[1]
            diag = self._coact.reshape(self._coact.shape[0], -1)[:, :: ew + 1]
            if diag.any():  # an expert twice in one row
                raise_duplicate(flat, where)

    def _columns_buffer(self, size: int) -> np.ndarray:
        """``[size]`` int32 (expert ids and the -1 column fit), reused from chunk to chunk
        (chunks have the same size)."""
        if self._columns is None or self._columns.size < size:
            self._columns = np.empty(size, dtype=np.int32)
        return self._columns[:size]

    def _pair_columns(self, xt: np.ndarray, has_none: bool) -> np.ndarray:
        """Expert ids for :meth:`_count_pairs`: dense counts take -1 (no expert) as the
        extra last expert (cleared by :meth:`_end_pairs`), sparse ones leave it out."""
        if self._sparse or not has_none:
            return xt
        return np.where(xt < 0, self._coact.shape[1] - 1, xt)

    def _count_pairs(
        self, affinity: bool, index: int, a: np.ndarray, b: np.ndarray, *, triangle: bool
    ) -> None:
        """Pairs of ``a [ka, n]`` and ``b [kb, n]`` (see :func:`_pairs_into`) into
        co-activation row ``index`` or, ``affinity``, layer pair ``index``."""
        if self._sparse:
            store = self._sp_aff if affinity else self._sp_coact
            store.add(index, _pair_keys(a, b, triangle=triangle))
        else:
            self._add_pair_counts((self._aff if affinity else self._coact)[index], a, b,
                                  triangle=triangle)

    def _end_pairs(self, has_none: bool) -> None:
        """After a chunk's pairs: clear the -1 expert of dense counts, or bound the
        sparse ones (``constants.MAX_COACT_PAIRS``)."""
        if self._sparse:
            self._check_sparse_size()
        elif has_none:
            self._clear_trash()

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

    def _pair_index(self, a: int, b: int) -> int:
        """Affinity index of layer pair ``(a, b)``, adding it (dense counts grow a row, or
        turn sparse past ``constants.MAX_COACT_BYTES``)."""
        p = self._aff_pairs.get((a, b))
        if p is None:
            p = len(self._aff_pairs)
            self._aff_pairs[(a, b)] = p
            if p >= self._aff.shape[0] and not self._sparse:
                ew = self._state.num_e + 1
                nl = len(self._state.layer_ids)
                rows = p + 1 + nl
                if _coact_bytes(nl, rows, ew) > constants.MAX_COACT_BYTES:
                    rows = p + 1  # no room to spare: grow by one
                if _coact_bytes(nl, rows, ew) > constants.MAX_COACT_BYTES:
                    self._go_sparse()
                else:
                    self._aff = _grow(self._aff, (rows, ew, ew))
        return p

    def _pair_indices(self, row_a: np.ndarray, row_b: np.ndarray) -> np.ndarray:
        """Affinity index of each (accumulator row a, row b) pair, adding new pairs."""
        nl = len(self._state.layer_ids)
        if self._pair_of_rows.shape[0] < nl:
            self._pair_of_rows = _grow(self._pair_of_rows, (nl, nl), -1)
        pidx = self._pair_of_rows[row_a, row_b]
        if (pidx < 0).any():
            for a, b in set(zip(row_a[pidx < 0].tolist(), row_b[pidx < 0].tolist(),
                                strict=True)):
                self._pair_of_rows[a, b] = self._pair_index(self._state.layer_ids[a],
                                                            self._state.layer_ids[b])
            pidx = self._pair_of_rows[row_a, row_b]
        return pidx

    def _add_pairs(self, pidx: np.ndarray, ea: np.ndarray, eb: np.ndarray) -> None:
        """Affinity counts for rows ``(pair index, experts in a [n, k], experts in b [n, k])``,
        ``pidx`` sorted."""
        if pidx.size == 0:
            return
        xa, xb = np.ascontiguousarray(ea.T), np.ascontiguousarray(eb.T)
        none = bool(xa.min() < 0 or xb.min() < 0)
        if none and not self._sparse:
            ew = self._aff.shape[1]
            xa, xb = np.where(xa < 0, ew - 1, xa), np.where(xb < 0, ew - 1, xb)
        cuts = np.flatnonzero(pidx[1:] != pidx[:-1]) + 1
        bounds = np.concatenate([[0], cuts, [pidx.size]]).tolist()
        for a, b in itertools.pairwise(bounds):
            self._count_pairs(True, int(pidx[a]), xa[:, a:b], xb[:, a:b], triangle=False)
        if self._sparse:
            self._check_sparse_size()
        if none:
            self._clear_trash()

    def _add_row_affinity(self, local: np.ndarray, layer: np.ndarray, experts: np.ndarray) -> None:
        """Pairs between each token's consecutive observed layers (ascending layer ids)."""
        table = self._tokens.table
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
            row_of = self._state.row_of_layer
            pidx = self._pair_indices(row_of[a_layer], row_of[b_layer])
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
