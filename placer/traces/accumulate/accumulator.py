"""Streaming accumulation of routing into :class:`~placer.stats.ExpertStats`.

Every reader hands chunks to one :class:`Accumulator`, a thin facade over parts it
holds and delegates to, each with one job; the bookkeeping they share (provenance,
declared metadata, layer rows, expert capacity) is one
:class:`~placer.traces.accumulate.state.TraceState` handed to the parts that need it:

- :class:`~placer.traces.accumulate.identity.TokenIdentity`: which token a row belongs to;
- :class:`~placer.traces.accumulate.grid.Windows`: which window a token falls in;
- :class:`~placer.traces.accumulate.warmup.WarmupDetector`: warm-up passes;
- :class:`~placer.traces.accumulate.checks.Checks`: validation of rows, expert ids, layers and
  declared metadata, and the warnings of the result;
- :class:`~placer.traces.accumulate.counting.Counts`: load, co-activation and layer affinity, dense
  or sparse, and the calls of the counting kernels;
- :class:`~placer.traces.accumulate.aggregate.AggregateBuilder`: aggregated inputs and their
  result;
- :class:`~placer.traces.accumulate.results.KeptRows`: the rows kept for ``keep_tokens``;
- :class:`~placer.traces.accumulate.sample.TokenSampler`: the tokens kept for ``sample``
  (the whole trace while it is small, else whole batches per window).

:func:`~placer.traces.accumulate.results.token_result` builds the result of per-token inputs from
the parts.  The accumulator keeps the order of things: it has a chunk checked, grows the
counts (and the warm-up runs) to the layers and experts seen, cuts warm-up passes, numbers
the tokens and places them in windows, then has the chunk counted.  Memory is
``O(layers x experts^2)`` for the statistics plus one chunk, plus a small per-token
record (``8 x (7 + k)`` bytes) for traces whose rows carry token ids; ``keep_tokens``
also keeps every row, ``sample`` at most ``MAX_WINDOWS x per_window`` batches of them.

Two kinds of chunk come in:

- :class:`RowChunk`: one row per (token, layer), as JSONL logs have them; tokens are
  found by id (``request``, ``token``) or, for rows without a token id, by order: the
  n-th row of a layer (within a request) belongs to the n-th token.
- :class:`TokenChunk`: consecutive whole tokens ``[tokens, layers, k]``, as NPZ traces
  and the writers have them.

Aggregated inputs go through :meth:`Accumulator.add_aggregate` (load matrices) or
:meth:`Accumulator.add_step_counts` (counts per forward pass).

Real logs: the n-th row of a (request, token, layer) belongs to the n-th occurrence of
the token (a second pass with the same ids, token numbers that restart), with one
warning.  Runs of ``constants.WARMUP_RUN_ROWS`` or more identical consecutive rows of one
layer (and request) are an engine's warm-up pass: left out unless ``keep_warmup``.  To
see a run whole, the rows from the start of the first run that may still grow are held
back and go first with the next chunk, so rows are always counted in file order.

Windows (``ExpertStats.load`` is ``[windows, layers, experts]``): a token belongs to
one window, chosen when it is first seen.  With ``window_tokens=N`` windows are N
consecutive tokens; otherwise windows follow the trace's ``step`` when rows carry one,
else tokens in order of first appearance; :mod:`placer.traces.accumulate.grid` keeps at most
``constants.MAX_WINDOWS`` of them by merging adjacent windows pairwise.

Limits (docs/limits.md), checked before anything is sized by them: expert ids below
``constants.MAX_EXPERTS``, rows of at most ``constants.MAX_TOP_K`` experts, at most
``constants.MAX_LAYERS`` layers, load within ``constants.MAX_LOAD_BYTES`` and counts of
aggregated inputs within ``constants.MAX_TOTAL_COUNT``.  Pairs (co-activation, layer
affinity) are counted in dense ``[E, E]`` matrices while they fit
``constants.MAX_COACT_BYTES``, then sparsely (:mod:`placer.traces.accumulate.pairs`), so
their memory follows the pairs seen; past ``constants.MAX_COACT_PAIRS`` distinct pairs
co-activation is left out with a warning (the load is still read).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from placer.errors import TraceError
from placer.stats import RoutingData
from placer.traces.accumulate.aggregate import AggregateBuilder
from placer.traces.accumulate.checks import Checks, raise_duplicate
from placer.traces.accumulate.counting import Counts
from placer.traces.accumulate.grid import Windows
from placer.traces.accumulate.identity import TokenIdentity
from placer.traces.accumulate.kernels import has_duplicate
from placer.traces.accumulate.limits import check_counts as check_counts
from placer.traces.accumulate.results import KeptRows, hand_rows, token_result
from placer.traces.accumulate.sample import TokenSampler
from placer.traces.accumulate.state import TraceState
from placer.traces.accumulate.warmup import WARMUP_SKIP as WARMUP_SKIP
from placer.traces.accumulate.warmup import WarmupDetector
from placer.traces.chunks import HeldTokens, concat_rows
from placer.traces.chunks import ReadOptions as ReadOptions
from placer.traces.chunks import RowChunk as RowChunk
from placer.traces.chunks import TokenChunk as TokenChunk

__all__ = ["Accumulator", "ReadOptions", "RowChunk", "TokenChunk"]


class Accumulator:
    """Builds one :class:`~placer.stats.RoutingData` from chunks of routing.

    Readers call :meth:`begin_source` once per file, then :meth:`declare` (header
    metadata), :meth:`add_rows` / :meth:`add_tokens` / :meth:`add_aggregate`,
    :meth:`skip` for rows they leave out on purpose, and :meth:`advance` for progress;
    :meth:`result` ends the accumulation.  It holds its parts and delegates to them
    (see the module docstring); readers may read ``options``, ``source``, ``sources``,
    ``notes`` (and append to them) and the provenance figures.
    """

    def __init__(self, options: ReadOptions | None = None) -> None:
        state = TraceState(options or ReadOptions())
        self._state = state
        self._windows = Windows(state.options.window_tokens)
        self._tokens = TokenIdentity()
        self._warmup = WarmupDetector(state.options.keep_warmup, state.skip)
        self._counts = Counts(state, self._windows)
        self._checks = Checks(
            state, windows=self._windows, warmup=self._warmup, tokens=self._tokens
        )
        self._aggregates = AggregateBuilder(state, self._counts, self._windows, self._checks)
        self._keep = KeptRows() if state.options.keep_tokens else None
        sample = state.options.sample
        self._sampler = None if sample is None else TokenSampler(sample, self._windows)
        # rows and tokens held back while their run may still grow into a warm-up pass
        self._held_rows: RowChunk | None = None
        self._held_tokens: HeldTokens | None = None
        self._result: RoutingData | None = None
        self._progress: Callable[[int], None] | None = None

    # -- what readers may read ------------------------------------------------------
    @property
    def options(self) -> ReadOptions:
        """What ``read_routing`` was asked for (``coact`` is off once it was left out)."""
        return self._state.options

    @property
    def source(self) -> str:
        """The file read now (for messages)."""
        return self._state.source

    @property
    def sources(self) -> list[str]:
        return self._state.sources

    @property
    def formats(self) -> list[str]:
        return self._state.formats

    @property
    def notes(self) -> list[str]:
        """Warnings to give with the result (readers append to it)."""
        return self._state.notes

    @property
    def skipped(self) -> Counter[str]:
        return self._state.skipped

    @property
    def rows_read(self) -> int:
        return self._state.rows_read

    @property
    def model(self) -> str | None:
        return self._state.model

    @property
    def num_experts(self) -> tuple[int | None, str]:
        """The experts per layer declared so far (by the caller or a file; None: not
        yet), and where that came from (for messages)."""
        return self._state.num_experts, self._state.experts_from

    @property
    def synthetic(self) -> bool:
        return self._state.synthetic

    # -- reader API ----------------------------------------------------------------
    def begin_source(self, source: str, format_name: str) -> None:
        """Start reading ``source`` (a path, for messages) in format ``format_name``."""
        self._flush_held()
        self._state.sources.append(source)
        if format_name not in self._state.formats:
            self._state.formats.append(format_name)
        self._state.source = source
        self._warmup.reset()

    def set_progress(self, callback: Callable[[int], None] | None) -> None:
        self._progress = callback

    def advance(self, nbytes: int) -> None:
        """Report ``nbytes`` more of the current source read (for the reader's progress)."""
        if self._progress is not None and nbytes:
            self._progress(nbytes)

    def skip(self, reason: str, count: int = 1) -> None:
        """Count ``count`` rows left out on purpose because of ``reason``."""
        self._state.skip(reason, count)

    def request_id(self, label: Any) -> int:
        """A number for request ``label`` of the current source (labels are per file)."""
        return self._tokens.request_id(len(self._state.sources), label, self._state.source)

    def declare(
        self,
        *,
        where: str,
        num_experts: Any = None,
        top_k: Any = None,
        num_layers: Any = None,
        model: Any = None,
        synthetic: Any = None,
    ) -> None:
        """Metadata a file declares (header, scalar arrays); checked against arguments."""
        if num_experts is not None:
            e = self._checks.declare_experts(num_experts, where)
            self._resize(num_e=max(self._state.num_e, e))
        self._checks.declare(
            where, top_k=top_k, num_layers=num_layers, model=model, synthetic=synthetic
        )

    def _check_experts(
        self,
        experts: np.ndarray,
        where: Callable[[int], str],
        layer: np.ndarray,
        *,
        where_flat: Callable[[int], str] | None = None,
        where_layer: Callable[[int], str] | None = None,
        duplicates: bool = True,
    ) -> bool:
        """:meth:`Checks.experts <placer.traces.accumulate.checks.Checks.experts>`, then room in
        the counts for the experts and the row width read."""
        s = self._state
        new_width = s.k is None
        has_none = self._checks.experts(
            experts, where, layer, where_flat=where_flat, where_layer=where_layer,
            duplicates=duplicates,
        )
        if new_width or s.max_expert >= s.num_e:
            self._resize(num_e=max(s.num_e, s.max_expert + 1))
        return has_none

    def _rows_of(self, layer: np.ndarray, where: Callable[[int], str]) -> np.ndarray:
        """Layer row of each absolute layer id, adding new layers (and room for them)."""
        rows, added = self._state.rows_of(layer, where)
        if added:
            self._resize()
        return rows

    def _resize(self, *, num_e: int | None = None) -> None:
        """Room for the state's layers and ``num_e`` experts: in the counts and in the
        warm-up runs."""
        self._counts.resize(num_e=num_e)
        self._warmup.grow(len(self._state.layer_ids), self._state.k or 1)

    # -- aggregated inputs --------------------------------------------------------
    def add_aggregate(
        self,
        load: np.ndarray,
        *,
        layer_ids: np.ndarray | None = None,
        coact: np.ndarray | None = None,
        window_starts: np.ndarray | None = None,
        where: str | None = None,
    ) -> None:
        """Accumulate an aggregated load ``[windows, layers, experts]`` (summed over files).

        ``coact``: ``[layers, experts, experts]`` symmetric pair counts, or None.
        """
        self._aggregates.add_aggregate(
            load, layer_ids=layer_ids, coact=coact, window_starts=window_starts,
            where=where,
        )

    def add_step_counts(
        self,
        load: np.ndarray,
        steps: np.ndarray,
        *,
        layer_ids: np.ndarray,
        where: str | None = None,
    ) -> None:
        """Accumulate counts of forward passes: ``load [passes, layers, experts]`` int,
        pass ``i`` taken at step ``steps[i]`` (see
        :meth:`~placer.traces.accumulate.aggregate.AggregateBuilder.add_step_counts`)."""
        self._aggregates.add_step_counts(load, steps, layer_ids=layer_ids, where=where)

    # -- per-token rows -----------------------------------------------------------
    def add_rows(self, chunk: RowChunk) -> None:
        """Accumulate routing rows (one per token and layer)."""
        self._state.begin_kind("tokens")
        if chunk.layer.size == 0:
            return
        keep = self._state.filter_layers(chunk.layer)
        if keep is not None:
            chunk = chunk.take(keep)
            if chunk.layer.size == 0:
                return

        def where(i: int) -> str:
            return f"{self._state.source}:{int(chunk.lines[i])}"

        if self._check_experts(chunk.experts, where, chunk.layer):
            valid_rows = np.asarray((chunk.experts >= 0).any(axis=1), dtype=bool)
            if not valid_rows.all():
                self.skip("no expert (all -1)", int((~valid_rows).sum()))
                chunk = chunk.take(valid_rows)
                if chunk.layer.size == 0:
                    return
        if self._held_rows is not None:
            chunk = concat_rows(self._held_rows, chunk)
            self._held_rows = None
        self._count_rows(self._cut_warmup_rows(chunk, final=False))

    def _cut_warmup_rows(self, chunk: RowChunk, *, final: bool) -> RowChunk | None:
        """The rows of ``chunk`` to count now, less warm-up passes; rows whose run may
        still grow into one (unless ``final``) are held back for the next chunk."""
        rows = self._rows_of(chunk.layer, lambda i: self._state.source)
        counted, held = self._warmup.cut_rows(
            chunk, rows, self._state.layer_ids, self._state.source, final=final
        )
        if held is not None:
            self._held_rows = held
        return counted

    def _count_rows(self, chunk: RowChunk | None) -> None:
        """Count validated rows (see :meth:`add_rows`)."""
        if chunk is None or chunk.layer.size == 0:
            return

        def where(i: int) -> str:
            return f"{self._state.source}:{int(chunk.lines[i])}"

        experts = chunk.experts.astype(np.int64, copy=False)
        has_none = int(experts.min()) < 0
        rows = self._rows_of(chunk.layer, where)
        step = chunk.step
        if self._windows.mode is None:
            self._windows.start(step is not None and bool((step >= 0).all()))
        if self._windows.mode == "step" and (step is None or (step < 0).any()):
            i = 0 if step is None else int(np.flatnonzero(step < 0)[0])
            raise TraceError(
                "row has no step but earlier rows have one",
                where=where(i),
                hint="give every row a step (or none at all), or pass window_tokens",
            )
        # token identity
        keys = self._tokens.keys(chunk, self._state.source)
        local, new_first = self._tokens.indices(
            keys, rows, where, self._state.k or 1, self._state.words()
        )
        t_new = int(new_first.sum())
        glob_new = self._state.num_tokens + np.arange(t_new)
        self._state.num_tokens += t_new
        table = self._tokens.table
        table.glob[local[new_first]] = glob_new
        step_rows = step if step is not None else np.full(local.size, -1, dtype=np.int64)
        table.step[local[new_first]] = step_rows[new_first]
        if step is not None:
            bad = (table.step[local] != step_rows) & (step_rows >= 0)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise TraceError(
                    f"token {self._tokens.label(chunk, i)} has rows from steps "
                    f"{int(table.step[local[i]])} and {int(step_rows[i])}",
                    where=where(i),
                    hint="a token runs in one step: when token ids restart, the new token"
                    " repeats every layer (a repeated layer starts a new token); or drop"
                    " the token field to number tokens by row order",
                )
        glob = table.glob[local]
        # windows: each token's key (its step, or its order), fixed when first seen
        win_key_new = step_rows[new_first] if self._windows.mode == "step" else glob_new
        table.wkey[local[new_first]] = win_key_new
        if t_new:
            self._counts.fit_windows(int(win_key_new.min()), int(win_key_new.max()))
            self._windows.add_tokens(self._windows.index(win_key_new))
        w_rows = self._windows.index(table.wkey[local])
        # layer-major rows, expert-major columns: each layer's counts in cache, and every
        # code array is built from contiguous vectors
        weight = self._counts.pair_weights(glob, new=glob_new)
        if rows.size > 1 and (rows[1:] < rows[:-1]).any():
            by_layer = np.argsort(rows, kind="stable")
            rows_l, ex_l, w_l = rows[by_layer], experts[by_layer], w_rows[by_layer]
            weight_l = None if weight is None else weight[by_layer]
        else:
            rows_l, ex_l, w_l, weight_l = rows, experts, w_rows, weight
        cuts = np.flatnonzero(rows_l[1:] != rows_l[:-1]) + 1
        bounds = np.concatenate([[0], cuts, [rows_l.size]]).tolist()
        xt = np.ascontiguousarray(ex_l.T)  # [k, rows]
        _, nl, e = self._counts.load.shape
        self._counts.count_rows(xt, (w_l * nl + rows_l) * e, rows_l, bounds, has_none,
                                weight_l)
        if self._state.options.coact and self._state.options.affinity:
            self._counts.add_row_affinity(local, chunk.layer, experts, table,
                                          self._state.options.pair_tokens)
        self._state.rows_read += experts.shape[0]
        hand_rows(self._keep, self._sampler, chunk, glob, experts, new_first, win_key_new,
                  step_rows)

    # -- whole tokens --------------------------------------------------------------
    def add_tokens(
        self,
        chunk: TokenChunk,
        layer_ids: Sequence[int] | np.ndarray,
        *,
        token_offset: int = 0,
        array: str = "topk_ids",
    ) -> None:
        """Accumulate consecutive whole tokens.

        Parameters
        ----------
        chunk: the tokens; ``topk_ids [tokens, layers, k]``.  Nothing keeps a reference to
            its arrays, so readers may reuse them for the next chunk.
        layer_ids: ``[layers]`` absolute layer id of each column, strictly increasing.
        token_offset: index of the chunk's first token in its file, for messages.
        array: name of the id array, for messages (``"topk_ids"``).
        """
        self._state.begin_kind("tokens")
        ids = np.asarray(chunk.topk_ids)
        lid = np.asarray(layer_ids, dtype=np.int64)
        if ids.ndim != 3 or ids.shape[1] != lid.size:
            raise TraceError(
                f"{array} has shape {ids.shape}, expected [tokens, {lid.size}, k]",
                where=self._state.source, hint="one column of expert ids per layer id",
            )
        t, _, k = ids.shape
        if t == 0:
            return
        if lid.size > 1 and (np.diff(lid) <= 0).any():
            raise TraceError(
                f"layer_ids {lid.tolist()!s:.80} are not strictly increasing",
                where=self._state.source, hint="each layer once, in increasing order",
            )
        weights = chunk.topk_weights
        columns = chunk.columns_as(lid.size, k, t)
        if self._state.layer_filter is not None:
            self._state.all_layers.update(lid.tolist())
            cols = np.isin(lid, self._state.layer_filter)
            if not cols.all():
                self.skip("layer not selected", int(t * (~cols).sum()))
                ids, lid = ids[:, cols], lid[cols]
                weights = None if weights is None else np.asarray(weights)[:, cols]
                columns = None if columns is None else columns[cols]
                if lid.size == 0:
                    return

        def where3(i: int) -> str:
            tok, col, j = np.unravel_index(i, ids.shape)
            return f"{self._state.source}: {array}[{token_offset + int(tok)}, {int(col)}, {int(j)}]"

        flat = ids.reshape(-1, k)
        has_none = self._check_experts(
            flat, lambda r: where3(r * k), lid, where_flat=where3,
            where_layer=lambda i: where3(i * k), duplicates=False,
        )
        step = None if chunk.step is None else np.asarray(chunk.step, dtype=np.int64)
        rank = None if chunk.rank is None else np.asarray(chunk.rank, dtype=np.int64)
        for name, a in (("step", step), ("rank", rank)):
            if a is not None and a.shape != (t,):
                raise TraceError(
                    f"{name} has shape {a.shape}, expected [{t}]", where=self._state.source,
                    hint=f"one {name} per token",
                )
        tokens = HeldTokens(ids, lid, step, rank, weights, token_offset, array, columns=columns)
        held = self._held_tokens
        if held is not None:
            if held.goes_with(tokens, has_none):
                tokens, has_none = held.join(tokens), has_none or held.has_none
                self._held_tokens = None
            else:
                self._flush_held()
        self._count_token_chunk(tokens, has_none, final=False)

    def _count_token_chunk(self, tokens: HeldTokens, has_none: bool, *, final: bool) -> None:
        """Count validated whole tokens (see :meth:`add_tokens`), less warm-up passes and
        (unless ``final``) the tokens held back while a run may still grow into one."""
        ids, lid, step, rank, weights = (
            tokens.ids, tokens.lid, tokens.step, tokens.rank, tokens.weights
        )
        token_offset, array = tokens.offset, tokens.array
        t, _, k = ids.shape
        rows = self._rows_of(lid, lambda i: self._state.source)
        # expert-major columns per layer: xt[c, i] is the i-th expert of every token
        xt = tokens.columns  # made ahead by the reader, else here
        if xt is None:
            xt = self._counts.columns_buffer(lid.size * k * t).reshape(lid.size, k, t)
            xt[...] = ids.transpose(1, 2, 0)
        present = np.asarray((xt >= 0).any(axis=1), dtype=bool) if has_none else None  # [L, t]
        cut, excluded = self._warmup.cut_tokens(
            xt, rows, present, tokens, self._state.layer_ids, self._state.source, final=final
        )
        if cut < t:
            self._held_tokens = tokens.tail(cut, has_none)
            if cut == 0:
                return
            t = cut
            xt, ids = xt[:, :, :t], ids[:t]
            present = None if present is None else present[:, :t]
            excluded = None if excluded is None else excluded[:, :t]
            step = None if step is None else step[:t]
            rank = None if rank is None else rank[:t]
            weights = None if weights is None else np.asarray(weights)[:t]
        had_rows = present
        if excluded is not None:
            # rows of warm-up passes count as no expert
            for i in range(k):
                xt[:, i][excluded] = -1
            ids = np.array(ids)
            ids[excluded.T] = -1
            had_rows = present if present is not None else np.ones((lid.size, t), dtype=bool)
            present = had_rows & ~excluded
            has_none = True

        def where3(i: int) -> str:
            tok, col, j = np.unravel_index(i, ids.shape)
            return f"{self._state.source}: {array}[{token_offset + int(tok)}, {int(col)}, {int(j)}]"

        flat = ids.reshape(-1, k)
        if k > 1 and not self._state.options.coact and has_duplicate(xt.transpose(1, 0, 2)):
            raise_duplicate(flat, lambda r: where3(r * k))
        if present is not None:
            assert had_rows is not None
            counted = present.any(axis=0)
            if not counted.all():
                # a token with no expert in any layer is no token (as in JSONL, it has no row)
                empty = int((~had_rows.any(axis=0)).sum())
                self.skip("token with no expert in any layer", empty)
                xt, present, ids = xt[:, :, counted], present[:, counted], ids[counted]
                step = None if step is None else step[counted]
                rank = None if rank is None else rank[counted]
                weights = None if weights is None else np.asarray(weights)[counted]
                t = int(counted.sum())
                if t == 0:
                    return
        glob, tok_win, wkey = self._token_windows(step, t)
        self._counts.count_tokens(xt, rows, lid, tok_win, has_none, lambda r: where3(r * k), flat,
                                  self._counts.pair_weights(glob, new=glob))
        self._state.rows_read += lid.size * t if present is None else int(present.sum())
        if self._keep is not None:
            self._keep.add_whole_tokens(glob, lid, ids, weights, step, rank, present)
        if self._sampler is not None:
            self._sampler.add_whole_tokens(glob, wkey, lid, ids, step, rank)

    def _token_windows(
        self, step: np.ndarray | None, t: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Number ``t`` new tokens and place them in windows (by ``step`` when windows
        follow steps): ``[t]`` global token indices, ``[t]`` windows and ``[t]`` window
        keys."""
        if self._windows.mode is None:
            self._windows.start(step is not None and bool((step >= 0).all()))
        if self._windows.mode == "step" and (step is None or (step < 0).any()):
            raise TraceError(
                "tokens without a step after tokens with one", where=self._state.source,
                hint="give every token a step (or none), or pass window_tokens",
            )
        glob = self._state.num_tokens + np.arange(t)
        self._state.num_tokens += t
        wkey = step if self._windows.mode == "step" and step is not None else glob
        self._counts.fit_windows(int(wkey.min()), int(wkey.max()))
        tok_win = self._windows.index(wkey)
        self._windows.add_tokens(tok_win)
        return glob, tok_win, wkey

    # -- result -------------------------------------------------------------------
    def only_warmup(self) -> bool:
        """Whether every per-token row read so far was left out as a warm-up pass."""
        if self._result is None:
            self._flush_held()
        return self._state.kind == "tokens" and self._state.rows_read == 0 and self._warmup.rows > 0

    def result(self) -> RoutingData:
        """The statistics (and per-token trace with ``keep_tokens``); ends the accumulation
        (later calls return the same result)."""
        if self._result is None:
            self._flush_held()
        kind = self._state.kind
        if kind is None or (kind == "tokens" and self._state.rows_read == 0):
            skipped = ", ".join(f"{n} {r}" for r, n in sorted(self._state.skipped.items()))
            raise TraceError(
                "no routing rows" + (f" (skipped: {skipped})" if skipped else ""),
                where=", ".join(self._state.sources) or None,
                hint="every row is part of a warm-up pass (identical routing): pass"
                " `keep_warmup` to count them"
                if self._warmup.rows
                else "a routing row needs 'layer' and 'experts'; check `layers` and the format",
            )
        if self._result is None:
            if self._state.kind == "aggregate":
                self._result = self._aggregates.result()
            else:
                self._result = token_result(
                    self._state, self._counts, self._windows, self._checks, self._keep,
                    self._sampler,
                )
        return self._result

    def _flush_held(self) -> None:
        """Count the rows and tokens held back for warm-up detection (end of a source)."""
        rows, self._held_rows = self._held_rows, None
        if rows is not None:
            self._count_rows(self._cut_warmup_rows(rows, final=True))
        tokens, self._held_tokens = self._held_tokens, None
        if tokens is not None:
            self._count_token_chunk(tokens, tokens.has_none, final=True)
