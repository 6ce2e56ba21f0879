"""Canonical per-token NPZ traces: reader (streaming) and writer (atomic, streaming).

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

import math
import os
import tempfile
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np
from numpy.lib import format as npformat

from placer import constants
from placer.errors import TraceError, UsageError
from placer.io.fileio import atomic_path
from placer.io.ptfile import ZIP_READ_ERRORS, check_zip
from placer.traces.accumulate import Accumulator, TokenChunk
from placer.traces.formats.jsonl.write import iter_token_chunks
from placer.traces.registry import register_format

__all__ = ["read_npz_header", "write_npz_trace"]

#: Scalar metadata the reader understands.
META_KEYS = ("model", "num_experts", "top_k", "num_layers", "synthetic")

_ZIP_MAGIC = b"PK\x03\x04"


def _members(path: Path) -> set[str] | None:
    try:
        with zipfile.ZipFile(path) as zf:
            return {n[:-4] for n in zf.namelist() if n.endswith(".npy")}
    except ZIP_READ_ERRORS:
        return None


def _sniff(path: Path, head: bytes) -> bool:
    if not head.startswith(_ZIP_MAGIC):
        return False
    names = _members(path)
    return names is not None and "topk_ids" in names


def _open_array(
    zf: zipfile.ZipFile, name: str, where: str
) -> tuple[IO[bytes], tuple[int, ...], np.dtype[Any], bool]:
    """Open member ``name.npy``: (stream after the header, shape, dtype, fortran order).

    The header is checked before anything is sized by it: a shape of whole numbers whose
    bytes are exactly what the member holds (a 1 KB member cannot declare 16 GB), and a
    dtype without Python objects.
    """
    info = zf.getinfo(f"{name}.npy")
    try:
        f = zf.open(info)
    except ZIP_READ_ERRORS as e:
        raise TraceError(
            f"cannot read array {name} ({e})", where=where, hint=_DAMAGED_HINT
        ) from None
    try:
        version = npformat.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = npformat.read_array_header_1_0(f)
        else:
            shape, fortran, dtype = npformat.read_array_header_2_0(f)
    except ValueError as e:
        f.close()
        raise TraceError(
            f"array {name} is not a valid .npy member ({e})", where=where,
            hint="write the file with numpy.savez (or placer's writer)",
        ) from None
    except ZIP_READ_ERRORS as e:
        f.close()
        raise TraceError(
            f"cannot read array {name} ({e})", where=where, hint=_DAMAGED_HINT
        ) from None
    where_a = f"{where}: {name}"
    if dtype.hasobject:
        f.close()
        raise TraceError(
            f"array {name} holds Python objects", where=where_a,
            hint="placer reads numeric arrays only (no pickles)",
        )
    if any(n < 0 for n in shape):
        f.close()
        raise TraceError(f"array {name} has a negative shape {shape}", where=where_a,
                         hint=_DAMAGED_HINT)
    declared = math.prod(shape) * dtype.itemsize
    held = info.file_size - f.tell()
    if declared > held:
        f.close()
        raise TraceError(
            f"{name} ends early: the member is truncated", where=where_a,
            hint=f"its header declares shape {shape!s:.60} ({declared:,} bytes) but it holds"
            f" {held:,}; the file may be incomplete, write it again",
        )
    return f, tuple(shape), dtype, fortran


_DAMAGED_HINT = "the file may be damaged or incomplete; write it again"

#: Most bytes of a member read whole besides step and rank (scalars, layer_ids).
_SMALL_BYTES = 1 << 20


def read_member(
    zf: zipfile.ZipFile, name: str, where: str, max_bytes: int = _SMALL_BYTES
) -> np.ndarray:
    """Member ``name.npy`` of an archive, read whole once its header is checked
    (:func:`_open_array`) and its elements, 8 bytes each at least (as int64), fit
    ``max_bytes``."""
    f, shape, dtype, _ = _open_array(zf, name, where)
    f.close()
    nbytes = math.prod(shape) * max(dtype.itemsize, 8)
    if nbytes > max_bytes:
        raise TraceError(
            f"array {name} of shape {shape!s:.60} takes {nbytes:,} bytes, more than placer"
            f" reads of it ({max_bytes:,})",
            where=f"{where}: {name}", hint="is this the right file? (limits: docs/limits.md)",
        )
    try:
        with zf.open(f"{name}.npy") as f:
            return np.asarray(npformat.read_array(f, allow_pickle=False))
    except ValueError as e:
        raise TraceError(
            f"array {name} cannot be read ({e})", where=where, hint=_DAMAGED_HINT
        ) from None
    except ZIP_READ_ERRORS as e:
        raise TraceError(
            f"cannot read array {name} ({e})", where=where, hint=_DAMAGED_HINT
        ) from None


def read_npz_header(path: str | Path) -> dict[str, Any]:
    """Shape, layer ids and scalar metadata of an NPZ trace, without reading the tokens."""
    path = Path(path)
    where = str(path)
    with zipfile.ZipFile(path) as zf:
        check_zip(zf, where, TraceError)
        f, shape, dtype, _ = _open_array(zf, "topk_ids", where)
        f.close()
        names = {n[:-4] for n in zf.namelist() if n.endswith(".npy")}
        meta = {key: _scalar(read_member(zf, key, where)) for key in META_KEYS if key in names}
        layer_ids = read_member(zf, "layer_ids", where) if "layer_ids" in names else None
    return {"shape": shape, "dtype": str(dtype), "layer_ids": layer_ids, **meta}


def _scalar(a: np.ndarray) -> Any:
    return a.item() if a.ndim == 0 or a.size == 1 else a


def _read(path: Path, acc: Accumulator) -> None:
    where = str(path)
    with _open_zip(path, where) as zf:
        check_zip(zf, where, TraceError)
        names = {n[:-4] for n in zf.namelist() if n.endswith(".npy")}
        if "topk_ids" not in names:
            raise TraceError(
                "no topk_ids array",
                where=where,
                hint="a per-token .npz trace holds topk_ids [tokens, layers, k]; aggregated"
                " files hold load",
            )
        f_ids, shape, dtype, fortran = _open_array(zf, "topk_ids", where)
        with f_ids:
            t, nl, _ = _check_ids_header(shape, dtype, where)
            meta = {
                key: _scalar(read_member(zf, key, where)) for key in META_KEYS if key in names
            }
            acc.declare(where=where, **meta)
            layer_ids = _layer_ids(zf, names, nl, where)
            step = _token_array(zf, names, "step", t, where)
            rank = _token_array(zf, names, "rank", t, where)
            weights = _open_weights(zf, names, shape, where)
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


def _open_zip(path: Path, where: str) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except ZIP_READ_ERRORS as e:
        raise TraceError(
            f"not a readable .npz file ({e})", where=where, hint=_DAMAGED_HINT
        ) from None


def _check_ids_header(
    shape: tuple[int, ...], dtype: np.dtype[Any], where: str
) -> tuple[int, int, int]:
    """``(tokens, layers, k)`` of ``topk_ids``, once its shape and dtype are checked."""
    if len(shape) != 3:
        raise TraceError(
            f"topk_ids has shape {shape}, expected [tokens, layers, k]",
            where=f"{where}: topk_ids", hint=_SHAPE_HINT,
        )
    if not np.issubdtype(dtype, np.integer):
        raise TraceError(
            f"topk_ids has dtype {dtype}, expected integers (int16 or int32)",
            where=f"{where}: topk_ids", hint=_SHAPE_HINT,
        )
    t, nl, k = shape
    if not 1 <= k <= constants.MAX_TOP_K:
        raise TraceError(
            f"topk_ids has k = {k} experts per row; expected 1 to"
            f" {constants.MAX_TOP_K}", where=f"{where}: topk_ids", hint=_SHAPE_HINT,
        )
    if not 1 <= nl <= constants.MAX_LAYERS:
        raise TraceError(
            f"topk_ids has {nl} layers; expected 1 to {constants.MAX_LAYERS}",
            where=f"{where}: topk_ids", hint=_SHAPE_HINT,
        )
    return t, nl, k


def _open_weights(
    zf: zipfile.ZipFile, names: set[str], shape: tuple[int, ...], where: str
) -> tuple[IO[bytes], np.dtype[Any], bool] | None:
    """Member ``topk_weights`` opened (stream, dtype, fortran order), or None without one."""
    if "topk_weights" not in names:
        return None
    f_w, w_shape, w_dtype, w_fortran = _open_array(zf, "topk_weights", where)
    if w_shape != shape:
        f_w.close()
        raise TraceError(
            f"topk_weights has shape {w_shape}, expected {shape} like topk_ids",
            where=f"{where}: topk_weights", hint=_SHAPE_HINT,
        )
    if not np.issubdtype(w_dtype, np.floating):
        f_w.close()
        raise TraceError(
            f"topk_weights has dtype {w_dtype}, expected floats",
            where=f"{where}: topk_weights", hint="gate weights are float32",
        )
    return f_w, w_dtype, w_fortran


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
    ``constants.CHUNK_ROWS`` rows, columns in layer order."""
    t, nl, k = shape
    order = np.argsort(layer_ids, kind="stable")
    sort_cols = bool((order != np.arange(nl)).any())
    sorted_ids = layer_ids[order]
    per_tok = max(1, constants.CHUNK_ROWS // max(nl, 1))
    buffers: dict[str, np.ndarray] = {}
    done = 0
    while done < t:
        n = min(per_tok, t - done)
        ids = _read_rows(*ids_member, (n, nl, k), where, "topk_ids", buffers)
        w = None
        if weights_member is not None:
            w = _read_rows(*weights_member, (n, nl, k), where, "topk_weights", buffers)
        if sort_cols:
            ids = ids[:, order]
            w = None if w is None else w[:, order]
        chunk = TokenChunk(
            topk_ids=ids,
            step=None if step is None else step[done : done + n],
            rank=None if rank is None else rank[done : done + n],
            topk_weights=w,
        )
        acc.add_tokens(chunk, sorted_ids, token_offset=done)
        acc.advance(int(ids.nbytes * ratio))
        done += n


_SHAPE_HINT = "topk_ids is [tokens, layers, k] int16/int32 expert ids, -1 where none"


def _ratio(path: Path, zf: zipfile.ZipFile) -> float:
    """File bytes per uncompressed byte, for progress."""
    total = sum(i.file_size for i in zf.infolist()) or 1
    return os.path.getsize(path) / total


def _read_rows(
    f: IO[bytes], dtype: np.dtype[Any], shape: tuple[int, int, int], where: str, name: str,
    buffers: dict[str, np.ndarray],
) -> np.ndarray:
    """The next ``shape`` array of member ``f``, in ``buffers[name]`` (reused: valid until
    the next call).  Read in pieces of ``_PIECE_BYTES``: one ``read`` of a whole chunk
    makes the zip reader build several chunk-sized bytes objects, fresh pages each."""
    nbytes = int(np.prod(shape)) * dtype.itemsize
    buf = buffers.get(name)
    if buf is None or buf.size < nbytes:
        buf = buffers[name] = np.empty(nbytes, dtype=np.uint8)
    pos = 0
    while pos < nbytes:
        try:
            piece = f.read(min(_PIECE_BYTES, nbytes - pos))
        except ZIP_READ_ERRORS as e:
            raise TraceError(
                f"cannot read {name} ({e})", where=f"{where}: {name}", hint=_DAMAGED_HINT
            ) from None
        if not piece:
            raise TraceError(
                f"{name} ends early: the member is truncated",
                where=f"{where}: {name}",
                hint="the file may be incomplete; write it again",
            )
        buf[pos : pos + len(piece)] = np.frombuffer(piece, dtype=np.uint8)
        pos += len(piece)
    return buf[:nbytes].view(dtype).reshape(shape)


#: Bytes per read of a member (the heap reuses pieces this size).
_PIECE_BYTES = 1 << 20


def _layer_ids(zf: zipfile.ZipFile, names: set[str], nl: int, where: str) -> np.ndarray:
    if "layer_ids" not in names:
        return np.arange(nl, dtype=np.int64)
    lid = read_member(zf, "layer_ids", where)
    if lid.shape != (nl,) or not np.issubdtype(lid.dtype, np.integer):
        raise TraceError(
            f"layer_ids has shape {lid.shape} and dtype {lid.dtype}, expected [{nl}] integers",
            where=f"{where}: layer_ids", hint="one absolute layer id per column of topk_ids",
        )
    if len(np.unique(lid)) != nl or (lid < 0).any():
        raise TraceError(
            f"layer_ids {lid.tolist()!s:.80} must be distinct layer indices >= 0",
            where=f"{where}: layer_ids", hint="one absolute layer id per column of topk_ids",
        )
    return lid.astype(np.int64)


def _token_array(
    zf: zipfile.ZipFile, names: set[str], name: str, t: int, where: str
) -> np.ndarray | None:
    if name not in names:
        return None
    a = read_member(zf, name, where, max_bytes=max(_SMALL_BYTES, 8 * t))
    if a.shape != (t,) or not np.issubdtype(a.dtype, np.integer):
        raise TraceError(
            f"{name} has shape {a.shape} and dtype {a.dtype}, expected [{t}] integers",
            where=f"{where}: {name}", hint=f"one {name} per token of topk_ids",
        )
    if (a < -1).any():
        i = int(np.flatnonzero(a < -1)[0])
        raise TraceError(
            f"{name}[{i}] is {int(a[i])}; expected >= 0 (-1 = unknown)",
            where=f"{where}: {name}[{i}]", hint=f"one {name} per token; -1 where unknown",
        )
    if a.dtype == np.uint64 and (a > np.iinfo(np.int64).max).any():
        raise TraceError(
            f"{name} holds values beyond the 64-bit signed range", where=f"{where}: {name}",
            hint=f"store {name} as int64",
        )
    return a.astype(np.int64)


register_format(
    "npz",
    extensions=(".npz",),
    sniff=_sniff,
    read=_read,
    description="per-token NPZ: topk_ids [tokens, layers, k] (+ weights, step, rank, layer_ids)",
)


# -- writer ----------------------------------------------------------------------------
class _Spool:
    """Raw bytes of one array written chunk by chunk to a temporary file."""

    def __init__(self, folder: str, name: str, dtype: np.dtype[Any]) -> None:
        self.path = os.path.join(folder, name + ".raw")
        self.f = open(self.path, "wb")  # noqa: SIM115  (closed by close())
        self.dtype = dtype
        self.rows = 0

    def write(self, a: np.ndarray) -> None:
        self.f.write(np.ascontiguousarray(a, dtype=self.dtype).tobytes())
        self.rows += a.shape[0]

    def close(self) -> None:
        self.f.close()


def write_npz_trace(
    path: str | Path,
    topk_ids: np.ndarray | Iterable[TokenChunk | Mapping[str, Any]],
    *,
    layer_ids: np.ndarray | list[int],
    step: np.ndarray | None = None,
    rank: np.ndarray | None = None,
    topk_weights: np.ndarray | None = None,
    meta: Mapping[str, Any] | None = None,
    compress: bool = True,
) -> int:
    """Write a canonical NPZ trace atomically; chunks are spooled, so any length fits.

    Parameters
    ----------
    path: output ``.npz``; written to a temporary file and renamed when complete.
    topk_ids: ``[tokens, layers, k]`` int expert ids (-1 = none), or an iterable of
        :class:`~placer.traces.accumulate.TokenChunk` (or mappings with its keys).
        Stored as int16 (expert ids are below ``constants.MAX_EXPERTS``).
    layer_ids: ``[layers]`` absolute layer id of each column.
    step, rank: ``[tokens]`` int, or None (with an iterable, they come in the chunks).
    topk_weights: ``[tokens, layers, k]`` float, stored float32, or None.
    meta: scalars stored beside the arrays (``model``, ``num_experts``, ``top_k``,
        ``synthetic``, ...); ``top_k`` defaults to k.
    compress: deflate the members (smaller; reading costs a little more).

    The file depends only on the inputs: members carry a fixed date (1980-01-01), so
    writing the same trace twice gives the same bytes.

    Returns
    -------
    Tokens written.
    """
    lid = np.asarray(layer_ids, dtype=np.int64).ravel()
    chunks: Iterator[TokenChunk] = iter_token_chunks(
        topk_ids, step=step, rank=rank, topk_weights=topk_weights
    )
    path = Path(path)
    with tempfile.TemporaryDirectory(prefix=".placer-npz-", dir=path.parent or ".") as folder:
        spools, shape_k, total = _spool_chunks(chunks, lid, folder)
        k = shape_k if shape_k is not None else 0
        scalars = {"top_k": k, **dict(meta or {})}
        with atomic_path(path) as tmp:
            mode = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
            level = 1 if compress else None
            with zipfile.ZipFile(tmp, "w", compression=mode, compresslevel=level) as zf:
                if "topk_ids" not in spools:
                    _write_member(zf, "topk_ids", np.zeros((0, lid.size, k), np.int16))
                for name, s in spools.items():
                    per_token = name in ("topk_ids", "topk_weights")
                    shape = (total, lid.size, k) if per_token else (total,)
                    _write_spool(zf, name, s, shape)
                _write_member(zf, "layer_ids", lid)
                _write_scalars(zf, scalars)
    return total


def _spool_chunks(
    chunks: Iterator[TokenChunk], lid: np.ndarray, folder: str
) -> tuple[dict[str, _Spool], int | None, int]:
    """Write every chunk's arrays to spools in ``folder`` (closed on return): the spools
    by member name, ``k`` (None without chunks) and the tokens written."""
    spools: dict[str, _Spool] = {}
    shape_k: int | None = None
    total = 0
    present: dict[str, bool] = {}
    for c in chunks:
        ids = np.asarray(c.topk_ids)
        _check_chunk_ids(ids, lid, shape_k)
        shape_k = ids.shape[2]
        t = ids.shape[0]
        parts = {
            "topk_ids": ids, "topk_weights": c.topk_weights, "step": c.step, "rank": c.rank
        }
        for name, a in parts.items():
            has = a is not None
            if name in present and present[name] != has:
                raise UsageError(f"{name} is in some chunks but not in others")
            present[name] = has
            if a is None:
                continue
            a = np.asarray(a)
            expect = ids.shape if name in ("topk_ids", "topk_weights") else (t,)
            if a.shape != expect:
                raise UsageError(f"{name} chunk has shape {a.shape}, expected {expect}")
            if name not in spools:
                dtype = {"topk_ids": np.int16, "topk_weights": np.float32}.get(name, np.int64)
                spools[name] = _Spool(folder, name, np.dtype(dtype))
            spools[name].write(a)
        total += t
    for s in spools.values():
        s.close()
    return spools, shape_k, total


def _check_chunk_ids(ids: np.ndarray, lid: np.ndarray, shape_k: int | None) -> None:
    """A chunk's ``topk_ids``: ``[tokens, layers, k]`` with the earlier chunks' ``k``, ids
    in ``[-1, MAX_EXPERTS)``."""
    if ids.ndim != 3 or ids.shape[1] != lid.size:
        raise UsageError(
            f"topk_ids chunk has shape {ids.shape}, expected [tokens, {lid.size}, k]"
        )
    if shape_k is not None and ids.shape[2] != shape_k:
        raise UsageError(f"topk_ids chunk has k={ids.shape[2]}, earlier chunks {shape_k}")
    if ids.size and (ids.max() >= constants.MAX_EXPERTS or ids.min() < -1):
        raise UsageError(
            f"expert ids must be in [-1, {constants.MAX_EXPERTS}), got"
            f" [{ids.min()}, {ids.max()}]"
        )


def _write_scalars(zf: zipfile.ZipFile, scalars: Mapping[str, Any]) -> None:
    """One member per scalar that is not None."""
    for key, value in scalars.items():
        if value is None:
            continue
        a = np.asarray(value)
        if a.dtype == object:
            raise UsageError(f"meta[{key!r}] is not a plain value: {value!r}")
        _write_member(zf, key, a)


#: Timestamp of every member (the earliest a zip can store): same inputs, same bytes.
_ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)


def _member(zf: zipfile.ZipFile, name: str) -> zipfile.ZipInfo:
    """A member entry that does not depend on the clock: fixed date, Unix mode 0644, the
    archive's compression and level."""
    info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_DATE_TIME)
    info.compress_type = zf.compression
    info.external_attr = 0o644 << 16
    # the level is ZipInfo.compress_level from Python 3.13, _compresslevel before
    attr = "compress_level" if hasattr(info, "compress_level") else "_compresslevel"
    setattr(info, attr, zf.compresslevel)
    return info


def _write_member(zf: zipfile.ZipFile, name: str, a: np.ndarray) -> None:
    with zf.open(_member(zf, name), "w", force_zip64=True) as f:
        npformat.write_array(f, np.asarray(a), allow_pickle=False)


def _write_spool(zf: zipfile.ZipFile, name: str, s: _Spool, shape: tuple[int, ...]) -> None:
    header = {"descr": npformat.dtype_to_descr(s.dtype), "fortran_order": False, "shape": shape}
    with zf.open(_member(zf, name), "w", force_zip64=True) as f:
        npformat.write_array_header_1_0(f, header)
        with open(s.path, "rb") as src:
            while True:
                block = src.read(1 << 24)
                if not block:
                    break
                f.write(block)
