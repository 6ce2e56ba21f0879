"""Warm-up pass detection of :class:`~placer.traces.accumulate.Accumulator`: runs of
``constants.WARMUP_RUN_ROWS`` or more identical consecutive rows of one layer.

:class:`WarmupDetector` is a part the accumulator holds and delegates to: it owns each
layer row's run carried from earlier rows, the longest run seen and the count of rows
left out; the accumulator hands it rows (with their accumulator rows) and counts what
it keeps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from placer import constants
from placer.traces.accumulate.occurrences import grown
from placer.traces.chunks import HeldTokens, RowChunk

#: Rows held back for warm-up detection: a layer's last run of identical rows stays
#: open (may still grow into a warm-up pass) while the layer had a row among this many
#: last rows; older runs are counted (logs that list a layer's rows in one block).
_OPEN_RUN_ROWS = 1 << 16


@dataclass
class _Runs:
    """Runs of identical consecutive rows of each layer, in rows sorted by layer.

    Rows of one layer are in file order; a run is rows with the same experts (and the
    same request, where rows carry one).  Every array but ``seg_of`` has one entry a run.
    """

    first: np.ndarray  # index of the run's first row here
    carry: np.ndarray  # rows of the run read before these rows
    length: np.ndarray  # rows of the run so far, carried ones included
    last: np.ndarray  # index of the run's last row here
    trailing: np.ndarray  # bool: the layer's last run here (it may go on)
    warm: np.ndarray  # bool: length >= constants.WARMUP_RUN_ROWS
    seg_of: np.ndarray  # [rows] run of each row


#: Reason counted in ``Provenance.rows_skipped`` for the rows of warm-up passes.
WARMUP_SKIP = "warm-up pass"


class WarmupDetector:
    """Cuts warm-up passes out of rows and whole tokens.

    Parameters
    ----------
    keep_warmup: find runs (for the longest one) but leave every row in.
    skip: called as ``skip(WARMUP_SKIP, rows)`` for the rows left out.

    Attributes
    ----------
    rows: rows left out as a warm-up pass so far.
    best: ``(rows, layer id, where)`` of the longest run seen.
    """

    def __init__(self, keep_warmup: bool, skip: Callable[[str, int], None]) -> None:
        self.keep_warmup = keep_warmup
        self.skip = skip
        # per layer row, the run carried from earlier rows: its experts, request and
        # length (0: none)
        self.run_last = np.zeros((0, 0), dtype=np.int64)
        self.run_req = np.zeros(0, dtype=np.int64)
        self.run_len = np.zeros(0, dtype=np.int64)
        self.best: tuple[int, int, str] = (0, -1, "")
        self.rows = 0

    def reset(self) -> None:
        """Forget the runs carried from earlier rows (a new source begins)."""
        self.run_len[:] = 0
        self.run_last[:] = -2
        self.run_req[:] = -1

    def grow(self, num_layers: int, k: int) -> None:
        """Room for ``num_layers`` layer rows of ``k`` experts."""
        self.run_last = grown(self.run_last, (num_layers, k), -2)
        self.run_req = grown(self.run_req, (num_layers,), -1)
        self.run_len = grown(self.run_len, (num_layers,))

    def cut_rows(
        self, chunk: RowChunk, rows: np.ndarray, layer_ids: list[int], source: str, *,
        final: bool,
    ) -> tuple[RowChunk | None, RowChunk | None]:
        """``(counted, held)``: the rows of ``chunk`` to count now, without the rows of
        warm-up passes and (unless ``final``) without the rows from the start of the first
        layer run that may still grow into a warm-up pass; and those held back to go
        before the next rows (None: none).

        ``rows``: the accumulator row of each row; ``layer_ids``: the layer id of each
        accumulator row; ``source``: for messages.  What is held is a suffix in file
        order, so rows are counted in file order (a token's rows in layer order, as layer
        affinity needs).  A layer's last run stays open while the layer had a row among
        the last ``_OPEN_RUN_ROWS`` rows.
        """
        experts = chunk.experts
        n = rows.size
        if n > 1 and (rows[1:] < rows[:-1]).any():
            order: np.ndarray | None = np.argsort(rows, kind="stable")
        else:
            order = None

        def by_layer(a: np.ndarray) -> np.ndarray:
            return a if order is None else a[order]

        r, ex, rq = by_layer(rows), by_layer(experts), by_layer(chunk.request)
        eq = np.zeros(n, dtype=bool)
        eq[1:] = (ex[1:] == ex[:-1]).all(axis=1) & (rq[1:] == rq[:-1])
        runs = self._find_runs(r, eq, lambda idx: ex[idx], rq)
        hold = None
        if not (final or self.keep_warmup):
            pos = np.arange(n) if order is None else order  # file position of sorted rows
            open_runs = runs.trailing & ~runs.warm & (pos[runs.last] >= n - _OPEN_RUN_ROWS)
            if open_runs.any():
                hold = pos >= int(pos[runs.first[open_runs]].min())

        def where(i: int) -> str:
            j = i if order is None else int(order[i])
            return f"{source}:{int(chunk.lines[j])}"

        drop = self._end_runs(r, runs, hold, lambda idx: ex[idx], rq, where, layer_ids)
        if drop is None:
            return chunk, None
        if order is not None:
            drop_sorted, drop = drop, np.empty_like(drop)
            drop[order] = drop_sorted
            if hold is not None:
                hold_sorted, hold = hold, np.empty_like(hold)
                hold[order] = hold_sorted
        held = chunk.take(hold) if hold is not None and hold.any() else None
        if drop.all():
            return None, held
        return (chunk.take(~drop) if drop.any() else chunk), held

    def cut_tokens(
        self, xt: np.ndarray, rows: np.ndarray, present: np.ndarray | None,
        tokens: HeldTokens, layer_ids: list[int], source: str, *, final: bool,
    ) -> tuple[int, np.ndarray | None]:
        """Warm-up passes in whole tokens ``xt [layers, k, tokens]``.

        Returns ``(cut, excluded)``: tokens from ``cut`` on are held back (the last run
        of some layer may still grow into a warm-up pass; all tokens when ``final``
        or ``keep_warmup``), and ``excluded [layers, cut or more]`` marks the rows of
        warm-up passes before ``cut`` (None: none).
        """
        nl, k, t = xt.shape
        if present is None:
            # eq[c, j]: token j repeats token j - 1 in column c, column by column
            eq2 = np.empty((nl, t), dtype=bool)
            eq2[:, 0] = False
            eq2[:, 1:] = xt[:, 0, 1:] == xt[:, 0, :-1]
            for i in range(1, k):
                if not eq2.any():
                    break
                eq2[:, 1:] &= xt[:, i, 1:] == xt[:, i, :-1]
            if not eq2.any():
                quick = self._no_repeats(xt, rows, final=final)
                if quick is not None:
                    return quick
            r = np.repeat(rows, t)
            eq = eq2.ravel()
            tok = np.tile(np.arange(t), nl)
            col = np.repeat(np.arange(nl), t)

            def ex_at(idx: np.ndarray) -> np.ndarray:
                return np.asarray(xt[idx // t, :, idx % t], dtype=np.int64)
        else:
            kept = present.ravel()
            col_all, tok_all = np.divmod(np.flatnonzero(kept), t)
            r, tok, col = rows[col_all], tok_all, col_all
            ex = np.asarray(xt[col_all, :, tok_all], dtype=np.int64)
            eq = np.zeros(r.size, dtype=bool)
            eq[1:] = (ex[1:] == ex[:-1]).all(axis=1)

            def ex_at(idx: np.ndarray) -> np.ndarray:
                return ex[idx]

        if r.size == 0:
            return t, None
        runs = self._find_runs(r, eq, ex_at, None)
        cut = t
        hold = None
        if not (final or self.keep_warmup):
            open_runs = runs.trailing & ~runs.warm
            if open_runs.any():
                cut = int(tok[runs.first[open_runs]].min())
                hold = tok >= cut

        def where(i: int) -> str:
            return f"{source}: {tokens.array}[{tokens.offset + int(tok[i])}, {int(col[i])}]"

        drop = self._end_runs(r, runs, hold, ex_at, None, where, layer_ids)
        if drop is None or (hold is not None and not (drop & ~hold).any()):
            return cut, None
        excluded = np.zeros((nl, t), dtype=bool)
        gone = drop if hold is None else drop & ~hold
        excluded[col[gone], tok[gone]] = True
        return cut, excluded

    def _no_repeats(self, xt: np.ndarray, rows: np.ndarray, *,
                    final: bool) -> tuple[int, np.ndarray | None] | None:
        """:meth:`cut_tokens` of whole tokens none of which repeats the one before it in
        any layer, when no layer's first token continues the run carried to it: every
        run is one row long, so nothing is a warm-up pass and only the last token is
        held back (the run it starts may still grow).  The runs carried on are the same
        as the general path leaves; None where that path is needed (a carried run
        continues, one token, or no run was noted yet)."""
        t = xt.shape[2]
        carried = self.run_len[rows] > 0
        if t < 2 or self.best[0] < 1 or constants.WARMUP_RUN_ROWS < 2 or (
                carried.any()
                and (xt[carried, :, 0] == self.run_last[rows[carried]]).all(axis=1).any()):
            return None
        cut = t if (final or self.keep_warmup) else t - 1
        self.run_len[rows] = 1
        self.run_last[rows] = xt[:, :, cut - 1]
        self.run_req[rows] = -1
        return cut, None

    def _find_runs(
        self, r: np.ndarray, eq: np.ndarray, ex_at: Callable[[np.ndarray], np.ndarray],
        rq: np.ndarray | None,
    ) -> _Runs:
        """Runs in rows sorted by layer.

        ``r [rows]`` accumulator rows, sorted (a layer's rows in file order); ``eq
        [rows]`` row i repeats row i - 1 (experts and request; ignored where the layer
        changes); ``ex_at(idx)`` experts ``[len(idx), k]`` of rows ``idx``; ``rq`` request
        of each row, or None.  A layer's first row here continues the run carried from
        earlier rows when it repeats it.
        """
        n = r.size
        grp_first = np.ones(n, dtype=bool)
        grp_first[1:] = r[1:] != r[:-1]
        f = np.flatnonzero(grp_first)
        rf = r[f]
        cont = self.run_len[rf] > 0
        if cont.any():
            cont &= (ex_at(f) == self.run_last[rf]).all(axis=1)
            if rq is not None:
                cont &= rq[f] == self.run_req[rf]
        boundary = grp_first | ~eq
        first = np.flatnonzero(boundary)
        seg_of = np.cumsum(boundary) - 1
        carry = np.zeros(first.size, dtype=np.int64)
        carry[seg_of[f[cont]]] = self.run_len[rf[cont]]
        last = np.empty_like(first)
        last[:-1] = first[1:] - 1
        last[-1] = n - 1
        length = last - first + 1 + carry
        trailing = np.ones(first.size, dtype=bool)
        trailing[:-1] = r[first[1:]] != r[first[:-1]]
        return _Runs(first, carry, length, last, trailing,
                     length >= constants.WARMUP_RUN_ROWS, seg_of)

    def _end_runs(
        self, r: np.ndarray, runs: _Runs, hold: np.ndarray | None,
        ex_at: Callable[[np.ndarray], np.ndarray], rq: np.ndarray | None,
        where: Callable[[int], str], layer_ids: list[int],
    ) -> np.ndarray | None:
        """Carry each layer's run past the rows counted now (all but ``hold``), note the
        longest run, and count the rows of warm-up passes.

        Returns the rows not to count now (warm-up passes and ``hold``), None if none.
        """
        counted = np.arange(r.size) if hold is None else np.flatnonzero(~hold)
        if counted.size:
            rr = r[counted]
            end = np.ones(counted.size, dtype=bool)
            end[:-1] = rr[1:] != rr[:-1]
            il, rl = counted[end], rr[end]
            s = runs.seg_of[il]
            self.run_len[rl] = il - runs.first[s] + 1 + runs.carry[s]
            self.run_last[rl] = ex_at(il)
            self.run_req[rl] = -1 if rq is None else rq[il]
        best = int(np.argmax(runs.length))
        if runs.length[best] > self.best[0]:
            i = int(runs.last[best])
            self.best = (int(runs.length[best]), layer_ids[int(r[i])], where(i))
        held = hold is not None and bool(hold.any())
        if self.keep_warmup or not runs.warm.any():
            return hold if held else None
        drop = runs.warm[runs.seg_of]
        gone = int((drop & ~hold).sum()) if held and hold is not None else int(drop.sum())
        self.rows += gone
        self.skip(WARMUP_SKIP, gone)
        return drop | hold if held and hold is not None else drop
