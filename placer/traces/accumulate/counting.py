"""Counting of :class:`~placer.traces.accumulate.Accumulator`: :class:`Counts`, a part
it holds, owns the statistics counted so far (load ``[windows, layers, experts]``,
co-activation and layer affinity) and calls the counting kernels
(:mod:`placer.traces.accumulate.kernels`) on chunks the accumulator has validated and placed.

Pairs are counted in dense ``[E + 1, E + 1]`` matrices (the extra expert stands for -1,
no expert, and is cleared after each chunk) while they fit
``constants.MAX_COACT_BYTES``, then sparsely (:mod:`placer.traces.accumulate.pairs`); past
``constants.MAX_COACT_PAIRS`` distinct pairs co-activation is left out with a note.
Layer rows and the expert capacity are the shared
:class:`~placer.traces.accumulate.state.TraceState`'s; windows are the
:class:`~placer.traces.accumulate.grid.Windows` part's."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from placer import constants
from placer.errors import TraceError
from placer.stats import PairCounts
from placer.traces.accumulate.checks import raise_duplicate
from placer.traces.accumulate.grid import Windows
from placer.traces.accumulate.kernels import (
    BLOCK_CODES,
    has_duplicate,
    load_into,
    pairs_into,
    sorted_by,
)
from placer.traces.accumulate.limits import coact_bytes, mib_text
from placer.traces.accumulate.occurrences import TokenTable, grown
from placer.traces.accumulate.pairs import KEY_BITS, KEY_DTYPE, SparsePairs, pair_keys
from placer.traces.accumulate.sample import batch_priority
from placer.traces.accumulate.state import TraceState

#: Seed of the token hash that samples pair counting (fixed: the same trace always has the
#: same statistics).
_PAIR_SEED = 0x5EED


def pair_weights(glob: np.ndarray, whole: int | None) -> np.ndarray | None:
    """``[n]`` int64 weight of the pairs of tokens ``glob`` (their numbers in read
    order) when pairs are counted on every token below ``whole`` and on a sample past
    it; None when every token counts once (``whole`` None, or every token below it).

    A token ``n`` in ``[whole x 2^(j - 1), whole x 2^j)`` is counted when the low ``j``
    bits of a hash of ``n`` are zero (probability ``2^-j``, whatever the order of the
    tokens' ranks or requests) and weighs ``2^j``: the counts are unbiased estimates of
    every token's, and the tokens counted grow with the log of the trace's length
    (about ``whole x (1 + log2(N / whole) / 2)`` of ``N``); 0: not counted.
    """
    if whole is None or glob.size == 0 or int(glob.max()) < whole:
        return None
    n = np.asarray(glob, dtype=np.int64)
    j = np.zeros(n.size, dtype=np.int64)
    past = n >= whole
    j[past] = np.floor(np.log2(n[past] // whole)).astype(np.int64) + 1
    stride = (np.int64(1) << j).astype(np.int64)
    low = batch_priority(_PAIR_SEED, n) & (stride.astype(np.uint64) - np.uint64(1))
    out: np.ndarray = np.where(low == 0, stride, 0)
    return out


def weight_groups(weight: np.ndarray | None, n: int) -> list[tuple[int, np.ndarray | None]]:
    """``[(weight, positions)]`` of the positive weights of ``weight [n]`` (positions
    None: all ``n``, weight 1, when ``weight`` is None)."""
    if weight is None:
        return [(1, None)]
    return [(int(w), np.flatnonzero(weight == w)) for w in np.unique(weight).tolist() if w > 0]


def _empty(ndim: int) -> np.ndarray:
    return np.zeros((0,) * ndim, dtype=np.int64)


class Counts:
    """Load, co-activation and layer affinity counted so far, with the work buffers of
    the kernels.

    Attributes
    ----------
    load: ``[windows, layers, experts]`` int64, rows as in ``state.layer_ids``, experts
        up to ``state.num_e``.
    aff_pairs: ``(layer id a, layer id b) -> index`` of each layer pair counted.
    sparse: pairs are counted sparsely (dense counts would pass MAX_COACT_BYTES).
    """

    def __init__(self, state: TraceState, windows: Windows) -> None:
        self.state = state
        self.windows = windows
        self.load = _empty(3)
        self._coact = _empty(3)  # upper triangle [L, E + 1, E + 1]
        self._aff = _empty(3)  # [pairs, E + 1, E + 1]
        self.aff_pairs: dict[tuple[int, int], int] = {}
        self._pair_of_rows = _empty(2)  # affinity index by (row a, row b), -1 none
        self.sparse = False
        self._sp_coact = SparsePairs()  # by layer row
        self._sp_aff = SparsePairs()  # by affinity index
        self._scratch_buf: np.ndarray | None = None
        self._columns: np.ndarray | None = None
        self._hot: np.ndarray | None = None

    # -- sizes -----------------------------------------------------------------------
    def resize(self, *, num_e: int | None = None) -> None:
        """Grow to ``state``'s layers and ``num_e`` experts (default ``state.num_e``,
        which becomes ``num_e``); past MAX_COACT_BYTES pairs turn sparse."""
        s = self.state
        e = s.num_e if num_e is None else num_e
        nl = len(s.layer_ids)
        # load may grow to MAX_WINDOWS windows: refuse now what would not fit then
        need = constants.MAX_WINDOWS * nl * e * 8
        if need > constants.MAX_LOAD_BYTES:
            raise TraceError(
                f"statistics of {nl} layers x {e} experts would take {mib_text(need)} MiB, more"
                f" than placer's {mib_text(constants.MAX_LOAD_BYTES)} MiB",
                where=s.source,
                hint="declare the expert count (`num_experts`) so a stray id"
                " is reported, or read fewer layers (limits: docs/limits.md)",
            )
        s.num_e = e
        self.load = grown(self.load, (self.windows.grid.count, nl, e))
        if s.options.coact and not self.sparse:
            if coact_bytes(nl, self._aff.shape[0], e + 1) > constants.MAX_COACT_BYTES:
                self._go_sparse()
            else:
                # one more expert than the counts' width: -1 (no expert) counts
                # there and is cleared after each chunk (see _clear_trash)
                self._coact = grown(self._coact, (nl, e + 1, e + 1))
                self._aff = grown(self._aff, (self._aff.shape[0], e + 1, e + 1))

    def fit_windows(self, kmin: int, kmax: int) -> None:
        """Make windows for keys ``kmin..kmax`` (merging pairwise past MAX_WINDOWS)."""
        self.load = self.windows.fit(kmin, kmax, self.load)

    def columns_buffer(self, size: int) -> np.ndarray:
        """``[size]`` int32 (expert ids and the -1 column fit), reused from chunk to chunk
        (chunks have the same size)."""
        if self._columns is None or self._columns.size < size:
            self._columns = np.empty(size, dtype=np.int32)
        return self._columns[:size]

    # -- counting --------------------------------------------------------------------
    def pair_weights(self, glob: np.ndarray, *, new: np.ndarray) -> np.ndarray | None:
        """:func:`pair_weights` of the tokens ``glob`` (None: every pair counts once),
        counting the tokens ``new`` (first seen now) whose pairs are counted."""
        s = self.state
        if not s.options.coact:
            return None
        weight = pair_weights(glob, s.options.pair_tokens)
        new_weight = weight if new is glob else pair_weights(new, s.options.pair_tokens)
        if new_weight is None:
            s.pair_tokens += int(new.size)
        else:
            s.pair_tokens += int(np.count_nonzero(new_weight))
            s.pairs_sampled = True
        return weight

    def count_rows(
        self, xt: np.ndarray, base: np.ndarray, rows: np.ndarray, bounds: list[int],
        has_none: bool, pair_weight: np.ndarray | None = None,
    ) -> None:
        """Load and co-activation of layer-sorted rows.

        ``xt [k, rows]`` expert ids (-1 none), one row per column; ``base [rows]`` flat
        index into ``self.load`` of each row's expert 0; ``rows [rows]`` accumulator
        rows, sorted, in runs ``bounds[i]:bounds[i + 1]``; ``pair_weight [rows]``: the
        weight of each row's pairs (:func:`pair_weights`; None: 1).
        """
        load = self._load_flat()
        coact = self.state.options.coact and xt.shape[0] > 1
        if coact:
            xs = self._pair_columns(xt, has_none)
        scratch = self._scratch()
        for a, b in itertools.pairwise(bounds):
            load_into(load, base[a:b], xt[:, a:b], has_none, scratch)
            if coact:
                part = None if pair_weight is None else pair_weight[a:b]
                for w, at in weight_groups(part, b - a):
                    cols = xs[:, a:b] if at is None else np.take(xs[:, a:b], at, axis=1)
                    self._count_pairs(False, int(rows[a]), cols, cols, triangle=True,
                                      weight=w)
        if coact:
            self._end_pairs(has_none)

    def count_tokens(
        self, xt: np.ndarray, rows: np.ndarray, lid: np.ndarray, tok_win: np.ndarray,
        has_none: bool, where: Callable[[int], str], flat: np.ndarray,
        pair_weight: np.ndarray | None = None,
    ) -> None:
        """Load, co-activation and affinity of whole tokens.

        ``xt [layers, k, tokens]`` expert ids (-1 none), expert-major; ``rows [layers]``
        layer rows of the columns ``lid``; ``tok_win [tokens]`` windows;
        ``pair_weight [tokens]`` the weight of each token's pairs (:func:`pair_weights`;
        None: 1).  With co-activation on, an expert twice in one row shows as a diagonal
        count and is reported from ``flat [tokens x layers, k]`` (token-major rows) with
        ``where`` (tokens whose pairs are not counted are looked at apart).
        """
        load = self._load_flat()
        _, nl, e = self.load.shape
        tok_base = tok_win * (nl * e)
        coact = self.state.options.coact
        affinity = coact and self.state.options.affinity
        if coact:
            # (a new layer pair may turn the counts sparse: MAX_COACT_BYTES)
            pidx = [self._pair_index(int(lid[c]), int(lid[c + 1]))
                    for c in range(lid.size - 1)] if affinity else []
            # sparse counts leave out self-pairs: look for an expert twice in one row first
            if self.sparse and xt.shape[1] > 1 and has_duplicate(xt.transpose(1, 0, 2)):
                raise_duplicate(flat, where)
        groups: list[tuple[int, np.ndarray]] = []
        if coact:
            xs = self._pair_columns(xt, has_none)
            # (np.take keeps the tokens' axis innermost, as a boolean index would not)
            groups = [(w, xs if at is None else np.take(xs, at, axis=2))
                      for w, at in weight_groups(pair_weight, xt.shape[2])]
            skipped = pair_weight is not None and bool((pair_weight == 0).any())
            if skipped and xt.shape[1] > 1 and has_duplicate(xt.transpose(1, 0, 2)):
                # some tokens' pairs are not counted: look for a repeat apart
                raise_duplicate(flat, where)
        scratch = self._scratch()
        for c in range(lid.size):
            load_into(load, tok_base + int(rows[c]) * e, xt[c], has_none, scratch)
            for w, part in groups:
                if xt.shape[1] > 1:
                    self._count_pairs(False, int(rows[c]), part[c], part[c], triangle=True,
                                      weight=w)
                if affinity and c + 1 < lid.size:
                    self._count_pairs(True, pidx[c], part[c], part[c + 1], triangle=False,
                                      weight=w)
        if coact and self.sparse:  # an expert twice in one row was looked for above
            self.check_sparse_size()
        elif coact:
            if has_none:
                self._clear_trash()
            ew = self._coact.shape[1]
            diag = self._coact.reshape(self._coact.shape[0], -1)[:, :: ew + 1]
            if diag.any():  # an expert twice in one row
                raise_duplicate(flat, where)

    def add_row_affinity(
        self, local: np.ndarray, layer: np.ndarray, experts: np.ndarray, table: TokenTable,
        pair_tokens: int | None = None,
    ) -> None:
        """Pairs between each token's consecutive observed layers (ascending layer ids);
        ``local`` indexes the token ``table``, which keeps each token's last row (and its
        number, whose :func:`pair_weights` below ``pair_tokens`` weigh its pairs)."""
        if local.size > 1 and not sorted_by(local, layer):
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
            row_of = self.state.row_of_layer
            pidx = self._pair_indices(row_of[a_layer], row_of[b_layer])
            tokens = lo[np.concatenate([jc, ia + 1])] if jc.size else lo[ia + 1]
            weight = pair_weights(table.glob[tokens], pair_tokens)
            if weight is not None:
                kept = weight > 0
                pidx, a_exp, b_exp, weight = pidx[kept], a_exp[kept], b_exp[kept], weight[kept]
            if pidx.size > 1 and (pidx[1:] < pidx[:-1]).any():
                small = pidx.astype(np.int16) if pidx.max() < 1 << 15 else pidx
                by_pair = np.argsort(small, kind="stable")  # radix sort for int16
                pidx, a_exp, b_exp = pidx[by_pair], a_exp[by_pair], b_exp[by_pair]
                weight = None if weight is None else weight[by_pair]
            self._add_pairs(pidx, a_exp, b_exp, weight)
        # remember each token's last (highest) row
        last = np.ones(lo.size, dtype=bool)
        last[:-1] = ~same
        jl = np.flatnonzero(last)
        upd = ly[jl] > table.last_layer[lo[jl]]
        table.last_layer[lo[jl][upd]] = ly[jl][upd]
        table.last_experts[lo[jl][upd]] = ex[jl][upd]

    def _pair_columns(self, xt: np.ndarray, has_none: bool) -> np.ndarray:
        """Expert ids for :meth:`_count_pairs`: dense counts take -1 (no expert) as the
        extra last expert (cleared by :meth:`_end_pairs`), sparse ones leave it out."""
        if self.sparse or not has_none:
            return xt
        return np.where(xt < 0, self._coact.shape[1] - 1, xt)

    def _count_pairs(
        self, affinity: bool, index: int, a: np.ndarray, b: np.ndarray, *, triangle: bool,
        weight: int = 1,
    ) -> None:
        """Pairs of ``a [ka, n]`` and ``b [kb, n]`` (see :func:`pairs_into`), ``weight``
        each, into co-activation row ``index`` or, ``affinity``, layer pair ``index``."""
        if self.sparse:
            store = self._sp_aff if affinity else self._sp_coact
            store.add(index, pair_keys(a, b, triangle=triangle), weight=weight)
        else:
            self._add_pair_counts((self._aff if affinity else self._coact)[index], a, b,
                                  triangle=triangle, weight=weight)

    def _end_pairs(self, has_none: bool) -> None:
        """After a chunk's pairs: clear the -1 expert of dense counts, or bound the
        sparse ones (``constants.MAX_COACT_PAIRS``)."""
        if self.sparse:
            self.check_sparse_size()
        elif has_none:
            self._clear_trash()

    def _add_pair_counts(
        self, counts: np.ndarray, a: np.ndarray, b: np.ndarray, *, triangle: bool,
        weight: int = 1,
    ) -> None:
        """:func:`pairs_into` the ``[width, width]`` matrix ``counts``.

        Many pairs are counted into a reused zeroed matrix that stays in cache, then
        added to ``counts`` in one sequential pass: the accumulators of all layers are
        tens of MB, and scattered increments into a cold one cost half as much again.
        """
        ew = counts.shape[0]
        per_column = a.shape[0] * (b.shape[0] - 1) // 2 if triangle else a.shape[0] * b.shape[0]
        n = a.shape[1] * per_column
        if 8 * n < ew * ew:
            pairs_into(counts.reshape(-1), a, b, ew, self._scratch(), triangle=triangle,
                       weight=weight)
            return
        if self._hot is None or self._hot.size != ew * ew:
            self._hot = np.zeros(ew * ew, dtype=np.int64)
        pairs_into(self._hot, a, b, ew, self._scratch(), triangle=triangle, weight=weight)
        counts += self._hot.reshape(ew, ew)
        self._hot[:] = 0

    def _scratch(self) -> np.ndarray:
        """Reusable intp work space for codes (see :func:`pairs_into`): fresh large
        temporaries cost page faults on every call."""
        if self._scratch_buf is None:
            self._scratch_buf = np.empty(3 * BLOCK_CODES, dtype=np.intp)
        return self._scratch_buf

    def _load_flat(self) -> np.ndarray:
        if not self.load.flags.c_contiguous:
            self.load = np.ascontiguousarray(self.load)
        return self.load.reshape(-1)

    def _clear_trash(self) -> None:
        """Zero the pair counts of the extra expert that stands for -1 (no expert)."""
        for acc in (self._coact, self._aff):
            if acc.size:
                acc[:, -1, :] = 0
                acc[:, :, -1] = 0

    def _pair_index(self, a: int, b: int) -> int:
        """Affinity index of layer pair ``(a, b)``, adding it (dense counts grow a row, or
        turn sparse past ``constants.MAX_COACT_BYTES``)."""
        p = self.aff_pairs.get((a, b))
        if p is None:
            p = len(self.aff_pairs)
            self.aff_pairs[(a, b)] = p
            if p >= self._aff.shape[0] and not self.sparse:
                ew = self.state.num_e + 1
                nl = len(self.state.layer_ids)
                rows = p + 1 + nl
                if coact_bytes(nl, rows, ew) > constants.MAX_COACT_BYTES:
                    rows = p + 1  # no room to spare: grow by one
                if coact_bytes(nl, rows, ew) > constants.MAX_COACT_BYTES:
                    self._go_sparse()
                else:
                    self._aff = grown(self._aff, (rows, ew, ew))
        return p

    def _pair_indices(self, row_a: np.ndarray, row_b: np.ndarray) -> np.ndarray:
        """Affinity index of each (layer row a, row b) pair, adding new pairs."""
        nl = len(self.state.layer_ids)
        if self._pair_of_rows.shape[0] < nl:
            self._pair_of_rows = grown(self._pair_of_rows, (nl, nl), -1)
        pidx = self._pair_of_rows[row_a, row_b]
        if (pidx < 0).any():
            for a, b in set(zip(row_a[pidx < 0].tolist(), row_b[pidx < 0].tolist(),
                                strict=True)):
                self._pair_of_rows[a, b] = self._pair_index(self.state.layer_ids[a],
                                                            self.state.layer_ids[b])
            pidx = self._pair_of_rows[row_a, row_b]
        return pidx

    def _add_pairs(self, pidx: np.ndarray, ea: np.ndarray, eb: np.ndarray,
                   weight: np.ndarray | None = None) -> None:
        """Affinity counts for rows ``(pair index, experts in a [n, k], experts in b [n, k])``,
        ``pidx`` sorted; ``weight [n]`` of each row's pairs (None: 1)."""
        if pidx.size == 0:
            return
        xa, xb = np.ascontiguousarray(ea.T), np.ascontiguousarray(eb.T)
        none = bool(xa.min() < 0 or xb.min() < 0)
        if none and not self.sparse:
            ew = self._aff.shape[1]
            xa, xb = np.where(xa < 0, ew - 1, xa), np.where(xb < 0, ew - 1, xb)
        cuts = np.flatnonzero(pidx[1:] != pidx[:-1]) + 1
        bounds = np.concatenate([[0], cuts, [pidx.size]]).tolist()
        for a, b in itertools.pairwise(bounds):
            part = None if weight is None else weight[a:b]
            for w, at in weight_groups(part, b - a):
                ca = xa[:, a:b] if at is None else np.take(xa[:, a:b], at, axis=1)
                cb = xb[:, a:b] if at is None else np.take(xb[:, a:b], at, axis=1)
                self._count_pairs(True, int(pidx[a]), ca, cb, triangle=False, weight=w)
        if self.sparse:
            self.check_sparse_size()
        if none:
            self._clear_trash()

    # -- dense and sparse pairs ----------------------------------------------------
    def _go_sparse(self) -> None:
        """Count pairs sparsely from now on: dense ``[E, E]`` counts would pass
        ``constants.MAX_COACT_BYTES``.  The counts so far move to the sparse stores."""
        for dense, store, triangle in ((self._coact, self._sp_coact, True),
                                       (self._aff, self._sp_aff, False)):
            ew = dense.shape[1] if dense.ndim == 3 else 0
            for row in range(dense.shape[0]):
                flat = dense[row].reshape(-1)
                idx = np.flatnonzero(flat)
                i, j = idx // ew, idx % ew
                if triangle:  # counted in either order: key them unordered
                    i, j = np.minimum(i, j), np.maximum(i, j)
                keep = (j < ew - 1) & (i < ew - 1) & ((i != j) | (not triangle))
                store.add(row, ((i << KEY_BITS) | j)[keep].astype(KEY_DTYPE),
                          flat[idx][keep])
        self.sparse = True
        self._coact = _empty(3)
        self._aff = _empty(3)
        self._hot = None

    def check_sparse_size(self, *, final: bool = False) -> None:
        """Leave co-activation out once the sparse counts hold more than
        ``constants.MAX_COACT_PAIRS`` distinct pairs.  While counting they hold repeats
        of pairs from different chunks until merged: merge (and look again) only past
        twice the limit, so merges stay rare near it; ``final``: look now."""
        limit = constants.MAX_COACT_PAIRS * (1 if final else 2)
        if not self.sparse or self._sp_coact.size + self._sp_aff.size <= limit:
            return
        held = self._sp_coact.merge() + self._sp_aff.merge()  # distinct pairs only
        if held > constants.MAX_COACT_PAIRS:
            self._drop_coact(
                f"counting it holds {held:,} distinct expert pairs, more than placer's"
                f" {constants.MAX_COACT_PAIRS:,}"
            )

    def _drop_coact(self, why: str) -> None:
        """Stop counting co-activation and layer affinity (the load is still counted)."""
        self.state.notes.append(
            f"co-activation was left out: {why} (docs/limits.md); the load was read."
            "  Declare the expert count (`num_experts`) if a stray id raised"
            " it, or read fewer layers"
        )
        self.state.options = replace(self.state.options, coact=False)
        self.sparse = False
        self._sp_coact = SparsePairs()
        self._sp_aff = SparsePairs()
        self._coact = _empty(3)
        self._aff = _empty(3)
        self.aff_pairs = {}
        self._pair_of_rows = _empty(2)
        self._hot = None

    # -- the result ------------------------------------------------------------------
    def take_pairs(
        self, order: np.ndarray, layer_ids: np.ndarray, num_e: int
    ) -> tuple[PairCounts | None, PairCounts | None]:
        """Co-activation of the layer rows in ``order`` (``layer_ids``, ascending, are
        their ids) and the affinity of each consecutive pair of them, cut to ``num_e``
        experts; (None, None) when co-activation is off or was left out, and no affinity
        when it was not asked for (``affinity``).  Ends the counting: dense counts are
        made symmetric in place, sparse ones handed over."""
        self.check_sparse_size(final=True)
        if not self.state.options.coact:
            return None, None
        pairs = [
            self.aff_pairs.get((int(layer_ids[r]), int(layer_ids[r + 1])))
            for r in range(layer_ids.size - 1)
        ] if self.state.options.affinity else []
        if self.sparse:
            # each row handed over in turn, so the counts are held about once, not twice
            coact = self._sp_coact.take_rows([int(r) for r in order], num_e, symmetric=True)
            aff = self._sp_aff.take_rows(pairs, num_e, symmetric=False) if pairs else None
            return coact, aff
        # pairs were counted in either order (positions i < j of a row): the counts
        # plus their transpose, made in place layer by layer (the accumulation ends here)
        same = bool((order == np.arange(order.size)).all())
        full = self._coact if same else self._coact[order]
        for r in range(full.shape[0]):
            full[r] += full[r].T
        coact = _nonzero_rows(full, list(range(full.shape[0])), num_e, symmetric=True)
        aff = _nonzero_rows(self._aff, pairs, num_e, symmetric=False) if pairs else None
        return coact, aff


def _nonzero_rows(
    dense: np.ndarray, rows: Sequence[int | None], num_e: int, *, symmetric: bool
) -> PairCounts:
    """Pair counts of the rows ``rows`` (None: no pairs) of dense ``[R, W, W]`` counts
    (``W >= num_e``; cells of experts ``>= num_e`` are left out); ``symmetric``: only
    ``i < j``.  The nonzero cells of ``[:num_e, :num_e]`` in C order are the keys
    ``i * num_e + j`` in rising order, and boolean indexing reads their counts in the
    same order."""
    upper = np.triu(np.ones((num_e, num_e), dtype=bool), k=1) if symmetric else None
    keys: list[np.ndarray] = []
    counts: list[np.ndarray] = []
    sizes = np.zeros(len(rows), dtype=np.int64)
    for n, r in enumerate(rows):
        if r is None:
            continue
        cells = dense[r, :num_e, :num_e]
        hit = cells != 0
        if upper is not None:
            hit &= upper
        keys.append(np.flatnonzero(hit))
        counts.append(cells[hit])
        sizes[n] = keys[-1].size
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(sizes, out=indptr[1:])
    empty = np.zeros(0, dtype=np.int64)
    return PairCounts(num_e, indptr, np.concatenate(keys) if keys else empty,
                      np.concatenate(counts) if counts else empty, symmetric)
