"""Canonical per-token NPZ traces: the writer (atomic, streaming; the format is
:mod:`.read`'s)."""

from __future__ import annotations

import os
import tempfile
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib import format as npformat

from placer import constants
from placer.errors import UsageError
from placer.io.fileio import atomic_path
from placer.traces.accumulate import TokenChunk
from placer.traces.formats.jsonl.write import iter_token_chunks


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
