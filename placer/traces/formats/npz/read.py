"""Canonical per-token NPZ traces: the reader (streaming; the writer is :mod:`.write`).

Arrays (members of the ``.npz``):

- ``topk_ids`` ``[tokens, layers, k]`` int16/int32 logical expert ids, -1 = none;
- ``topk_weights`` ``[tokens, layers, k]`` float, optional;
- ``step``, ``rank`` ``[tokens]`` int, optional;
- ``layer_ids`` ``[layers]`` int absolute layer id of each column (default ``0..L-1``);
- scalars, optional: ``model`` (str), ``num_experts``, ``top_k``, ``num_layers`` (int),
  ``synthetic`` (bool).

The reader streams ``topk_ids`` (and, with ``keep_tokens``, ``topk_weights``) from the
zip member in chunks of about ``constants.CHUNK_ROWS`` (token, layer) rows, so a trace
larger than memory is fine; ``step`` and ``rank`` (8 bytes a token) are loaded whole.

Before reading, each member's header is checked against the member (a declared shape
must be what the member holds), the archive against compression bombs
(:func:`placer.io.ptfile.check_zip`), and the shape against placer's limits
(docs/limits.md): ``k`` from 1 to ``constants.MAX_TOP_K``, at most
``constants.MAX_LAYERS`` layers.
"""

from __future__ import annotations

import os
import queue
import threading
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from placer import constants
from placer.errors import TraceError
from placer.io.ptfile import check_zip
from placer.traces.accumulate import Accumulator, TokenChunk
from placer.traces.formats.npz.members import (
    DAMAGED_HINT,
    META_KEYS,
    ZIP_MAGIC,
    StoredMember,
    check_ids_header,
    layer_ids_of,
    member_names,
    open_array,
    open_weights,
    open_zip,
    read_member,
    read_rows,
    scalar,
    stored_member,
    token_array,
)
from placer.traces.registry import register_format


def _sniff(path: Path, head: bytes) -> bool:
    if not head.startswith(ZIP_MAGIC):
        return False
    names = member_names(path)
    return names is not None and "topk_ids" in names


def read_npz_header(path: str | Path) -> dict[str, Any]:
    """Shape, layer ids and scalar metadata of an NPZ trace, without reading the tokens."""
    path = Path(path)
    where = str(path)
    with zipfile.ZipFile(path) as zf:
        check_zip(zf, where, TraceError)
        f, shape, dtype, _ = open_array(zf, "topk_ids", where)
        f.close()
        names = {n[:-4] for n in zf.namelist() if n.endswith(".npy")}
        meta = {key: scalar(read_member(zf, key, where)) for key in META_KEYS if key in names}
        layer_ids = read_member(zf, "layer_ids", where) if "layer_ids" in names else None
    return {"shape": shape, "dtype": str(dtype), "layer_ids": layer_ids, **meta}


@dataclass(frozen=True)
class NpzTokens:
    """The per-token arrays of an NPZ trace for a reader that walks them in order without
    holding them (a replay): shape, layer ids (ascending, as the reader keeps columns),
    metadata, ``step`` and ``rank`` up front; the tokens in chunks (:meth:`chunks`).

    Attributes
    ----------
    path: the file.  num_tokens, top_k: of ``topk_ids``.
    layer_ids: ``[layers]`` int64 ascending absolute layer ids of the chunks' columns.
    meta: the scalar metadata (``num_experts``, ``model``, ...).
    step, rank: ``[tokens]`` int64, or None when the file has none.
    """

    path: Path
    num_tokens: int
    top_k: int
    layer_ids: np.ndarray
    meta: dict[str, Any]
    step: np.ndarray | None
    rank: np.ndarray | None
    column_order: np.ndarray

    @classmethod
    def open(cls, path: str | Path) -> NpzTokens:
        """Check the file (as the reader does) and read all but the tokens."""
        path = Path(path)
        where = str(path)
        with open_zip(path, where) as zf:
            check_zip(zf, where, TraceError)
            names = {n[:-4] for n in zf.namelist() if n.endswith(".npy")}
            if "topk_ids" not in names:
                raise TraceError("no topk_ids array", where=where,
                                 hint="a replay reads per-token routing: topk_ids [tokens,"
                                 " layers, k]")
            f_ids, shape, dtype, fortran = open_array(zf, "topk_ids", where)
            f_ids.close()
            t, nl, k = check_ids_header(shape, dtype, where)
            if fortran:
                raise TraceError("arrays in Fortran order cannot be streamed", where=where,
                                 hint="save them with np.ascontiguousarray")
            meta = {key: scalar(read_member(zf, key, where)) for key in META_KEYS
                    if key in names}
            layer_ids = layer_ids_of(zf, names, nl, where)
            step = token_array(zf, names, "step", t, where)
            rank = token_array(zf, names, "rank", t, where)
        order = np.argsort(layer_ids, kind="stable")
        return cls(path, t, k, layer_ids[order], meta, step, rank, order)

    def rows(self, spans: Iterable[tuple[int, int]], columns: np.ndarray | None = None,
             *, verify: bool = True) -> Iterator[np.ndarray]:
        """``ids [hi - lo, columns, k]`` of each ``(lo, hi)`` token span, in order
        (consecutive spans from token 0; ``columns`` index :attr:`layer_ids`, default all;
        the array may be reused by the next span: copy what must outlive it).

        A member stored without compression (what ``numpy.savez`` writes) is read span
        by span straight into one reused buffer (no zip stream, no piece copies), its
        CRC checked when the spans reach the end unless ``verify`` is False (a reader
        that already checked it); a compressed one is streamed through the zip reader,
        which always checks.  Raises TraceError for a damaged member."""
        where = str(self.path)
        order = self.column_order if columns is None else \
            self.column_order[np.asarray(columns, dtype=np.int64)]
        # ascending neighbours (a piece's layers): a view of the rows, not a copy
        span = slice(int(order[0]), int(order[-1]) + 1) if order.size and bool(
            (np.diff(order) == 1).all()) else None
        with open_zip(self.path, where) as zf:
            f_ids, shape, dtype, _ = open_array(zf, "topk_ids", where)
            with f_ids:
                _, nl, k = shape
                stored = stored_member(zf, "topk_ids", where)
                if stored is None:
                    pieces = self._streamed_rows(f_ids, spans, dtype, (nl, k), where)
                else:
                    f_ids.close()
                    pieces = self._stored_rows(stored, spans, dtype, (nl, k), where, verify)
                for ids in pieces:
                    yield ids[:, span] if span is not None else ids[:, order]

    def _streamed_rows(self, f: IO[bytes], spans: Iterable[tuple[int, int]],
                       dtype: np.dtype[Any], row: tuple[int, int], where: str,
                       ) -> Iterator[np.ndarray]:
        """Spans read in order from the zip stream ``f`` (positioned at token 0)."""
        buffers: dict[str, np.ndarray] = {}
        at = 0
        for lo, hi in spans:
            if lo != at:
                raise ValueError(f"spans must be consecutive: {lo} after {at}")
            yield read_rows(f, dtype, (hi - lo, *row), where, "topk_ids", buffers)
            at = hi

    def _stored_rows(self, stored: StoredMember, spans: Iterable[tuple[int, int]],
                     dtype: np.dtype[Any], row: tuple[int, int], where: str, verify: bool,
                     ) -> Iterator[np.ndarray]:
        """Spans read straight from the file of an uncompressed member."""
        row_bytes = int(np.prod(row)) * dtype.itemsize
        buf = np.empty(0, dtype=np.uint8)
        at = 0
        with open(self.path, "rb") as f:
            crc = stored.crc_of_header(f) if verify else 0
            for lo, hi in spans:
                if lo != at:
                    raise ValueError(f"spans must be consecutive: {lo} after {at}")
                nbytes = (hi - lo) * row_bytes
                if buf.size < nbytes:
                    buf = np.empty(nbytes, dtype=np.uint8)
                view = buf[:nbytes]
                f.seek(stored.data_offset + lo * row_bytes)
                if f.readinto(view.data) != nbytes:
                    raise TraceError("topk_ids ends early: the member is truncated",
                                     where=f"{where}: topk_ids", hint=DAMAGED_HINT)
                if verify:
                    crc = zlib.crc32(view.data, crc)
                yield view.view(dtype).reshape(hi - lo, *row)
                at = hi
            if verify and at == self.num_tokens:
                stored.check_crc(f, crc, self.num_tokens * row_bytes, where)


def _read(path: Path, acc: Accumulator) -> None:
    where = str(path)
    with open_zip(path, where) as zf:
        check_zip(zf, where, TraceError)
        names = {n[:-4] for n in zf.namelist() if n.endswith(".npy")}
        if "topk_ids" not in names:
            raise TraceError(
                "no topk_ids array",
                where=where,
                hint="a per-token .npz trace holds topk_ids [tokens, layers, k]; aggregated"
                " files hold load",
            )
        f_ids, shape, dtype, fortran = open_array(zf, "topk_ids", where)
        with f_ids:
            t, nl, _ = check_ids_header(shape, dtype, where)
            meta = {
                key: scalar(read_member(zf, key, where)) for key in META_KEYS if key in names
            }
            acc.declare(where=where, **meta)
            layer_ids = layer_ids_of(zf, names, nl, where)
            step = token_array(zf, names, "step", t, where)
            rank = token_array(zf, names, "rank", t, where)
            weights = open_weights(zf, names, shape, where)
            if fortran or (weights is not None and weights[2]):
                raise TraceError(
                    "arrays in Fortran order cannot be streamed",
                    where=where,
                    hint="save them with np.ascontiguousarray",
                )
            if weights is not None and not acc.options.keep_tokens:
                # only the per-token trace carries weights: do not inflate them
                weights[0].close()
                weights = None
            try:
                _stream_tokens(
                    acc, (f_ids, dtype), None if weights is None else weights[:2],
                    shape, layer_ids, step, rank, where=where, ratio=_ratio(path, zf),
                )
            finally:
                if weights is not None:
                    weights[0].close()


def _stream_tokens(
    acc: Accumulator,
    ids_member: tuple[IO[bytes], np.dtype[Any]],
    weights_member: tuple[IO[bytes], np.dtype[Any]] | None,
    shape: tuple[int, ...],
    layer_ids: np.ndarray,
    step: np.ndarray | None,
    rank: np.ndarray | None,
    *,
    where: str,
    ratio: float,
) -> None:
    """Feed ``topk_ids`` (and weights) to the accumulator in chunks of about
    ``constants.CHUNK_ROWS`` rows, columns in layer order; the next chunk is inflated
    in a thread while this one is counted (:class:`_Prefetch`)."""
    t, nl, k = shape
    order = np.argsort(layer_ids, kind="stable")
    sort_cols = bool((order != np.arange(nl)).any())
    sorted_ids = layer_ids[order]
    per_tok = max(1, constants.CHUNK_ROWS // max(nl, 1))
    spans = [(lo, min(t, lo + per_tok)) for lo in range(0, t, per_tok)]
    with _Prefetch(ids_member, weights_member, spans, (nl, k), where,
                   order if sort_cols else None) as chunks:
        for (done, hi), (ids, w, columns) in zip(spans, chunks, strict=True):
            n = hi - done
            chunk = TokenChunk(
                topk_ids=ids,
                step=None if step is None else step[done : done + n],
                rank=None if rank is None else rank[done : done + n],
                topk_weights=w,
                columns=columns,
            )
            acc.add_tokens(chunk, sorted_ids, token_offset=done)
            acc.advance(int(ids.nbytes * ratio))


class _Prefetch:
    """The chunks of ``spans`` read from the members in a thread, one chunk ahead of
    the caller, columns in layer order (``order``: the columns' order, None when they
    are in it), with the ids laid out expert-major as the accumulator counts them
    (``TokenChunk.columns``): inflating (zlib lets go of the interpreter lock) and that
    copy take about as long as counting, and a second core does them meanwhile.

    Two sets of buffers take turns: the thread fills one while the caller holds the
    other, which it hands back by taking the next chunk (the accumulator keeps nothing
    of a chunk).  An error of the thread is raised to the caller in its place in the
    stream; leaving early stops the thread.
    """

    def __init__(self, ids_member: tuple[IO[bytes], np.dtype[Any]],
                 weights_member: tuple[IO[bytes], np.dtype[Any]] | None,
                 spans: list[tuple[int, int]], row: tuple[int, int], where: str,
                 order: np.ndarray | None = None) -> None:
        self.members = [ids_member, weights_member]
        self.spans, self.row, self.where, self.order = spans, row, where, order
        self.free: queue.Queue[dict[str, np.ndarray] | None] = queue.Queue()
        self.full: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._fill, daemon=True)

    def __enter__(self) -> Iterator[tuple[np.ndarray, np.ndarray | None, np.ndarray]]:
        for _ in range(2):
            self.free.put({})
        self.thread.start()
        return self._chunks()

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.free.put(None)  # wake the thread if it waits for a buffer
        self.thread.join()

    def _chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray | None, np.ndarray]]:
        held = None
        for _ in self.spans:
            if held is not None:
                self.free.put(held)  # the caller is done with the previous chunk
            ok, buffers, ids, w, columns = self.full.get()
            if not ok:
                raise ids
            held = buffers
            yield ids, w, columns

    def _fill(self) -> None:
        names = ("topk_ids", "topk_weights")
        for lo, hi in self.spans:
            buffers = self.free.get()
            if buffers is None or self.stop.is_set():
                return
            try:
                ids, w = [None if m is None else
                          read_rows(*m, (hi - lo, *self.row), self.where, name, buffers)
                          for m, name in zip(self.members, names, strict=True)]
                assert ids is not None
                if self.order is not None:
                    ids = ids[:, self.order]
                    w = None if w is None else w[:, self.order]
                columns = np.empty((ids.shape[1], ids.shape[2], ids.shape[0]), dtype=np.int32)
                columns[...] = ids.transpose(1, 2, 0)
            except BaseException as e:  # said to the caller, in its place
                self.full.put((False, None, e, None, None))
                return
            self.full.put((True, buffers, ids, w, columns))


def _ratio(path: Path, zf: zipfile.ZipFile) -> float:
    """File bytes per uncompressed byte, for progress."""
    total = sum(i.file_size for i in zf.infolist()) or 1
    return os.path.getsize(path) / total


register_format(
    "npz",
    extensions=(".npz",),
    sniff=_sniff,
    read=_read,
    description="per-token NPZ: topk_ids [tokens, layers, k] (+ weights, step, rank, layer_ids)",
)


