"""The members of a per-token NPZ archive, read without trusting them: headers checked
against what each member holds, member streams read in reused pieces, small arrays whole.
Shared by the reader (:mod:`.read`), the token stream of a replay and other formats'
``.npz`` inputs (aggregated loads, EPLB arrays)."""

from __future__ import annotations

import math
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
from numpy.lib import format as npformat

from placer import constants
from placer.errors import TraceError
from placer.io.ptfile import ZIP_READ_ERRORS

#: Scalar metadata the reader understands.
META_KEYS = ("model", "num_experts", "top_k", "num_layers", "synthetic")

ZIP_MAGIC = b"PK\x03\x04"


def member_names(path: Path) -> set[str] | None:
    try:
        with zipfile.ZipFile(path) as zf:
            return {n[:-4] for n in zf.namelist() if n.endswith(".npy")}
    except ZIP_READ_ERRORS:
        return None


def open_array(
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
            f"cannot read array {name} ({e})", where=where, hint=DAMAGED_HINT
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
            f"cannot read array {name} ({e})", where=where, hint=DAMAGED_HINT
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
                         hint=DAMAGED_HINT)
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


DAMAGED_HINT = "the file may be damaged or incomplete; write it again"


@dataclass(frozen=True)
class StoredMember:
    """Where the data of a member stored without compression lies in the archive file:
    read with plain file reads, the CRC checked by the reader (:meth:`check_crc`).

    Attributes
    ----------
    start: file offset of the member's first byte (its ``.npy`` header).
    data_offset: file offset of the array data, after the ``.npy`` header.
    size: the member's bytes, header included.  crc: its CRC-32 as the archive says.
    """

    start: int
    data_offset: int
    size: int
    crc: int

    def crc_of_header(self, f: IO[bytes]) -> int:
        """CRC-32 of the member's bytes before the array data."""
        f.seek(self.start)
        return zlib.crc32(f.read(self.data_offset - self.start))

    def check_crc(self, f: IO[bytes], crc: int, data_bytes: int, where: str) -> None:
        """Raise TraceError unless ``crc`` of header and ``data_bytes`` of data, with the
        member's bytes after them, is the archive's CRC."""
        tail = self.start + self.size - (self.data_offset + data_bytes)
        if tail > 0:
            f.seek(self.data_offset + data_bytes)
            crc = zlib.crc32(f.read(tail), crc)
        if crc != self.crc:
            raise TraceError("topk_ids fails its CRC check: its bytes are not those written",
                             where=f"{where}: topk_ids", hint=DAMAGED_HINT)


def stored_member(zf: zipfile.ZipFile, name: str, where: str) -> StoredMember | None:
    """Where member ``name.npy`` lies in the file when it is stored without compression
    or encryption (else None), its ``.npy`` header already checked (:func:`open_array`)."""
    info = zf.getinfo(f"{name}.npy")
    if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1 \
            or zf.fp is None:
        return None
    fp = zf.fp
    try:
        fp.seek(info.header_offset)
        local = fp.read(30)
        if len(local) != 30 or local[:4] != ZIP_MAGIC:
            return None
        start = info.header_offset + 30 + int.from_bytes(local[26:28], "little") \
            + int.from_bytes(local[28:30], "little")
        fp.seek(start)
        version = npformat.read_magic(fp)
        if version == (1, 0):
            npformat.read_array_header_1_0(fp)
        else:
            npformat.read_array_header_2_0(fp)
        data_offset = fp.tell()
    except (OSError, ValueError):
        return None
    return StoredMember(start, data_offset, info.file_size, info.CRC)

#: Most bytes of a member read whole besides step and rank (scalars, layer_ids).
SMALL_BYTES = 1 << 20


def read_member(
    zf: zipfile.ZipFile, name: str, where: str, max_bytes: int = SMALL_BYTES
) -> np.ndarray:
    """Member ``name.npy`` of an archive, read whole once its header is checked
    (:func:`open_array`) and its elements, 8 bytes each at least (as int64), fit
    ``max_bytes``."""
    f, shape, dtype, _ = open_array(zf, name, where)
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
            f"array {name} cannot be read ({e})", where=where, hint=DAMAGED_HINT
        ) from None
    except ZIP_READ_ERRORS as e:
        raise TraceError(
            f"cannot read array {name} ({e})", where=where, hint=DAMAGED_HINT
        ) from None


def scalar(a: np.ndarray) -> Any:
    return a.item() if a.ndim == 0 or a.size == 1 else a


def open_zip(path: Path, where: str) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except ZIP_READ_ERRORS as e:
        raise TraceError(
            f"not a readable .npz file ({e})", where=where, hint=DAMAGED_HINT
        ) from None


def check_ids_header(
    shape: tuple[int, ...], dtype: np.dtype[Any], where: str
) -> tuple[int, int, int]:
    """``(tokens, layers, k)`` of ``topk_ids``, once its shape and dtype are checked."""
    if len(shape) != 3:
        raise TraceError(
            f"topk_ids has shape {shape}, expected [tokens, layers, k]",
            where=f"{where}: topk_ids", hint=SHAPE_HINT,
        )
    if not np.issubdtype(dtype, np.integer):
        raise TraceError(
            f"topk_ids has dtype {dtype}, expected integers (int16 or int32)",
            where=f"{where}: topk_ids", hint=SHAPE_HINT,
        )
    t, nl, k = shape
    if not 1 <= k <= constants.MAX_TOP_K:
        raise TraceError(
            f"topk_ids has k = {k} experts per row; expected 1 to"
            f" {constants.MAX_TOP_K}", where=f"{where}: topk_ids", hint=SHAPE_HINT,
        )
    if not 1 <= nl <= constants.MAX_LAYERS:
        raise TraceError(
            f"topk_ids has {nl} layers; expected 1 to {constants.MAX_LAYERS}",
            where=f"{where}: topk_ids", hint=SHAPE_HINT,
        )
    return t, nl, k


def open_weights(
    zf: zipfile.ZipFile, names: set[str], shape: tuple[int, ...], where: str
) -> tuple[IO[bytes], np.dtype[Any], bool] | None:
    """Member ``topk_weights`` opened (stream, dtype, fortran order), or None without one."""
    if "topk_weights" not in names:
        return None
    f_w, w_shape, w_dtype, w_fortran = open_array(zf, "topk_weights", where)
    if w_shape != shape:
        f_w.close()
        raise TraceError(
            f"topk_weights has shape {w_shape}, expected {shape} like topk_ids",
            where=f"{where}: topk_weights", hint=SHAPE_HINT,
        )
    if not np.issubdtype(w_dtype, np.floating):
        f_w.close()
        raise TraceError(
            f"topk_weights has dtype {w_dtype}, expected floats",
            where=f"{where}: topk_weights", hint="gate weights are float32",
        )
    return f_w, w_dtype, w_fortran


SHAPE_HINT = "topk_ids is [tokens, layers, k] int16/int32 expert ids, -1 where none"


def read_rows(
    f: IO[bytes], dtype: np.dtype[Any], shape: tuple[int, int, int], where: str, name: str,
    buffers: dict[str, np.ndarray],
) -> np.ndarray:
    """The next ``shape`` array of member ``f``, in ``buffers[name]`` (reused: valid until
    the next call).  Read in pieces of ``PIECE_BYTES``: one ``read`` of a whole chunk
    makes the zip reader build several chunk-sized bytes objects, fresh pages each."""
    nbytes = int(np.prod(shape)) * dtype.itemsize
    buf = buffers.get(name)
    if buf is None or buf.size < nbytes:
        buf = buffers[name] = np.empty(nbytes, dtype=np.uint8)
    pos = 0
    while pos < nbytes:
        try:
            piece = f.read(min(PIECE_BYTES, nbytes - pos))
        except ZIP_READ_ERRORS as e:
            raise TraceError(
                f"cannot read {name} ({e})", where=f"{where}: {name}", hint=DAMAGED_HINT
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
PIECE_BYTES = 1 << 20


def layer_ids_of(zf: zipfile.ZipFile, names: set[str], nl: int, where: str) -> np.ndarray:
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


def token_array(
    zf: zipfile.ZipFile, names: set[str], name: str, t: int, where: str
) -> np.ndarray | None:
    if name not in names:
        return None
    a = read_member(zf, name, where, max_bytes=max(SMALL_BYTES, 8 * t))
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


