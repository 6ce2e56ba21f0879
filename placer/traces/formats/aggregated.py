"""Aggregated statistics: load matrices from ``.npz``, ``.npy``, ``.csv`` and ``.json``.

Content (docs/traces.md, aggregated loads), whatever the container:

- ``load``: ``[layers, experts]`` or ``[windows, layers, experts]`` whole token counts
  (``(token, expert)`` selections) >= 0;
- ``coact``: ``[layers, experts, experts]`` symmetric same-token pair counts, optional;
- ``layer_ids``: ``[layers]`` absolute layer ids, optional (default ``0..L-1``);
- ``top_k``: experts per token, optional: inferred from ``coact`` when it is complete
  (each row sums to ``(top_k - 1) x load``), else required (``top_k=``);
- ``num_experts``, ``model``, ``window_starts`` ``[windows]``: optional.

Containers:

- ``.npz``: arrays named as above (scalars as 0-d arrays);
- ``.npy``: the load array alone;
- ``.json``: ``{"load": [[...]], "coact": ..., "layer_ids": [...], "top_k": 8}``;
- ``.csv``: a header row then one row per cell: columns ``layer,expert,load`` and
  optionally ``window`` (any order; ``count`` or ``logical_count`` may name ``load``).
  ``layer`` is the absolute layer id; cells not listed are 0.

Limits (docs/limits.md), checked before arrays are sized: load within
``constants.MAX_LOAD_BYTES``, coact within ``constants.MAX_COACT_BYTES``, expert ids below
``constants.MAX_EXPERTS``, counts whole, finite, ``>= 0`` and summing to at most
``constants.MAX_TOTAL_COUNT``; ``.npz`` members are checked against their headers and
compression bombs, JSON and CSV files are read whole up to
``constants.MAX_DOCUMENT_BYTES``.
"""

from __future__ import annotations

import csv
import io
import math
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib import format as npformat

from placer import constants
from placer.errors import TraceError
from placer.io.ptfile import ZIP_READ_ERRORS, check_zip
from placer.io.yaml_schema import decode_text, load_json, read_document
from placer.traces.accumulate import Accumulator, check_counts
from placer.traces.formats.npz import read_member
from placer.traces.registry import register_format

__all__ = ["CSV_LOAD_COLUMNS"]

#: Accepted names of the CSV count column.
CSV_LOAD_COLUMNS = ("load", "count", "logical_count")

_NPY_MAGIC = b"\x93NUMPY"
_KNOWN = {"load", "coact", "layer_ids", "top_k", "num_experts", "model", "window_starts"}


# -- sniffing ------------------------------------------------------------------------
def _sniff_npz(path: Path, head: bytes) -> bool:
    if not head.startswith(b"PK\x03\x04"):
        return False
    try:
        with zipfile.ZipFile(path) as zf:
            return "load.npy" in zf.namelist()
    except ZIP_READ_ERRORS:
        return False


def _sniff_npy(path: Path, head: bytes) -> bool:
    return head.startswith(_NPY_MAGIC)


def _sniff_json(path: Path, head: bytes) -> bool:
    s = head.lstrip()
    return s.startswith(b"{") and b'"load"' in s and b'"layer"' not in s.split(b"\n", 1)[0][:200]


def _sniff_csv(path: Path, head: bytes) -> bool:
    first = head.split(b"\n", 1)[0].decode("utf-8", "replace").strip().lower()
    cols = [c.strip() for c in first.split(",")]
    return "layer" in cols and "expert" in cols and any(c in cols for c in CSV_LOAD_COLUMNS)


# -- validation ---------------------------------------------------------------------
def _counts(a: Any, name: str, where: str) -> np.ndarray:
    """Whole non-negative counts as int64; TraceError naming the first bad cell."""
    try:
        arr = np.asarray(a)
    except (ValueError, OverflowError) as e:
        raise TraceError(
            f"{name} is not a rectangular array ({e})", where=where,
            hint="a ragged list (rows of different lengths) is not an array",
        ) from None
    if arr.dtype == object or not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
        or arr.dtype == bool
    ):
        raise TraceError(
            f"{name} must be a numeric array, got {arr.dtype}",
            where=where,
            hint="a ragged list (rows of different lengths) is not an array",
        )
    return check_counts(arr, name, where)


#: Hint of the errors about an aggregated file's layout.
_LAYOUT_HINT = "load is [layers, experts] or [windows, layers, experts]; see docs/traces.md"


def _check_size(shape: tuple[int, ...], name: str, where: str, limit: int) -> None:
    """Refuse a ``name`` of ``shape`` (as int64) past ``limit`` bytes, before reading it."""
    nbytes = math.prod(shape) * 8
    if nbytes > limit:
        raise TraceError(
            f"{name} of shape {shape!s:.60} takes {nbytes / (1 << 20):,.0f} MiB, more than"
            f" placer's {limit >> 20} MiB", where=f"{where}: {name}",
            hint="is this the right file? (limits: docs/limits.md)",
        )


def _add(
    acc: Accumulator,
    where: str,
    load: Any,
    *,
    coact: Any = None,
    layer_ids: Any = None,
    top_k: Any = None,
    num_experts: Any = None,
    model: Any = None,
    window_starts: Any = None,
) -> None:
    load = _check_load(load, where)
    w, nl, e = load.shape
    lid = None if layer_ids is None else _check_layer_ids(layer_ids, nl, where)
    co = None if coact is None else _check_coact(acc, coact, nl, e, where)
    starts = None
    if window_starts is not None:
        starts = np.asarray(window_starts)
        if starts.shape != (w,) or not np.issubdtype(starts.dtype, np.integer) or (
            starts.dtype == np.uint64 and (starts > np.iinfo(np.int64).max).any()
        ):
            raise TraceError(
                f"window_starts has shape {starts.shape}, expected [{w}] integers",
                where=f"{where}: window_starts", hint="the first step of each window",
            )
    acc.declare(where=where, top_k=top_k, num_experts=num_experts, model=model)
    acc.add_aggregate(load, layer_ids=lid, coact=co, window_starts=starts, where=where)


def _check_load(load: Any, where: str) -> np.ndarray:
    """``load`` as ``[windows, layers, experts]`` counts, within placer's limits."""
    load = _counts(load, "load", where)
    if load.ndim == 2:
        load = load[None]
    if load.ndim != 3 or 0 in load.shape:
        raise TraceError(
            f"load has shape {load.shape}, expected [layers, experts] or"
            " [windows, layers, experts]",
            where=f"{where}: load", hint=_LAYOUT_HINT,
        )
    _, nl, e = load.shape
    if e > constants.MAX_EXPERTS or nl > constants.MAX_LAYERS:
        raise TraceError(
            f"load has {nl} layers of {e} experts; placer handles {constants.MAX_LAYERS}"
            f" layers of {constants.MAX_EXPERTS} experts", where=f"{where}: load",
            hint="is this the right file? (limits: docs/limits.md)",
        )
    _check_size(load.shape, "load", where, constants.MAX_LOAD_BYTES)
    return load


def _check_layer_ids(layer_ids: Any, nl: int, where: str) -> np.ndarray:
    """``layer_ids`` as ``[layers]`` int64: distinct ids in ``[0, MAX_LAYER_ID]``."""
    lid = np.asarray(layer_ids)
    if lid.shape != (nl,) or not np.issubdtype(lid.dtype, np.integer):
        raise TraceError(
            f"layer_ids has shape {lid.shape} and dtype {lid.dtype}, expected [{nl}] integers",
            where=f"{where}: layer_ids", hint="one absolute layer id per layer row of load",
        )
    if (
        len(np.unique(lid)) != nl or (lid < 0).any()
        or (lid > constants.MAX_LAYER_ID).any()
    ):
        raise TraceError(
            f"layer_ids {lid.tolist()!s:.80} must be distinct layer indices in [0,"
            f" {constants.MAX_LAYER_ID}]",
            where=f"{where}: layer_ids", hint="one absolute layer id per layer row of load",
        )
    return lid.astype(np.int64)


def _check_coact(acc: Accumulator, coact: Any, nl: int, e: int, where: str) -> np.ndarray:
    """``coact`` as symmetric ``[layers, E, E]`` counts; a diagonal is zeroed with a note."""
    _check_size(np.shape(coact), "coact", where, constants.MAX_COACT_BYTES)
    co = _counts(coact, "coact", where)
    if co.shape != (nl, e, e):
        raise TraceError(
            f"coact has shape {co.shape}, expected [{nl}, {e}, {e}] like load",
            where=f"{where}: coact", hint="coact is [layers, experts, experts]",
        )
    asym = co != co.transpose(0, 2, 1)
    if asym.any():
        a, i, j = (int(x) for x in np.argwhere(asym)[0])
        raise TraceError(
            f"coact is not symmetric: coact[{a}, {i}, {j}] = {co[a, i, j]} but"
            f" coact[{a}, {j}, {i}] = {co[a, j, i]}",
            where=f"{where}: coact[{a}, {i}, {j}]",
            hint="coact counts unordered same-token pairs",
        )
    diag = np.einsum("lii->li", co)
    if diag.any():
        acc.notes.append(
            f"{where}: the diagonal of coact is not zero (it holds self-pairs); set to 0"
        )
        co = co.copy()
        idx = np.arange(e)
        co[:, idx, idx] = 0
    return co


# -- readers ------------------------------------------------------------------------
def _read_npz(path: Path, acc: Accumulator) -> None:
    where = str(path)
    try:
        zf = zipfile.ZipFile(path)
    except ZIP_READ_ERRORS as e:
        raise TraceError(
            f"not a readable .npz file ({e})", where=where,
            hint="write it with numpy.savez; the file may be damaged",
        ) from None
    with zf:
        check_zip(zf, where, TraceError)
        names = {n[:-4] for n in zf.namelist() if n.endswith(".npy")}
        if "load" not in names:
            raise TraceError("no load array", where=where, hint="aggregated files hold load")
        limits = {"load": constants.MAX_LOAD_BYTES, "coact": constants.MAX_COACT_BYTES}
        parts: dict[str, Any] = {
            n: read_member(zf, n, where, max_bytes=limits.get(n, 1 << 20))
            for n in sorted(names & _KNOWN)
        }
    for key in ("top_k", "num_experts", "model"):
        if key in parts:
            parts[key] = parts[key].item() if parts[key].size == 1 else parts[key]
    _add(acc, where, **parts)


def _read_npy(path: Path, acc: Accumulator) -> None:
    where = str(path)
    try:
        with open(path, "rb") as f:
            version = npformat.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = npformat.read_array_header_1_0(f)
            else:
                shape, _, dtype = npformat.read_array_header_2_0(f)
            held = path.stat().st_size - f.tell()
    except (ValueError, OSError) as e:
        raise TraceError(
            f"not a readable .npy file ({e})", where=where,
            hint="write it with numpy.save; the file may be damaged",
        ) from None
    if dtype.hasobject or math.prod(shape) * dtype.itemsize > held:
        raise TraceError(
            f"the .npy header declares {shape!s:.60} {dtype} but the file holds {held:,}"
            " bytes of data", where=where, hint="the file may be incomplete; save it again",
        )
    _check_size(tuple(shape), "load", where, constants.MAX_LOAD_BYTES)
    try:
        load = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise TraceError(
            f"not a readable .npy file ({e})", where=where,
            hint="write it with numpy.save; the file may be damaged",
        ) from None
    _add(acc, where, load)


def _read_json(path: Path, acc: Accumulator) -> None:
    where = str(path)
    doc = load_json(
        read_document(path, TraceError, what="load file"), where, TraceError,
        hint='an aggregated load file is one JSON object: {"load": [[...]], "top_k": 8}',
    )
    if not isinstance(doc, dict) or "load" not in doc:
        raise TraceError(
            "expected an object with a load entry",
            where=where,
            hint='{"load": [[...]], "coact": ..., "layer_ids": [...], "top_k": 8}',
        )
    unknown = sorted(set(doc) - _KNOWN - {"format", "version"})
    if unknown:
        raise TraceError(
            f"unknown entries {unknown}",
            where=where,
            hint=f"entries: {', '.join(sorted(_KNOWN))}",
        )
    parts = {key: doc[key] for key in _KNOWN if key in doc}
    _add(acc, where, **parts)


def _read_csv(path: Path, acc: Accumulator) -> None:
    where = str(path)
    text = decode_text(read_document(path, TraceError, what="load CSV"), where, TraceError)
    reader = csv.reader(io.StringIO(text))
    header, idx, load_col = _csv_header(reader, where)
    arr = _csv_cells(reader, len(header), idx, load_col, where, acc)
    load, layer_ids, wins = _csv_load(arr, where, acc.num_experts)
    _add(acc, where, load, layer_ids=layer_ids, window_starts=wins if "window" in idx else None)


def _csv_header(reader: Any, where: str) -> tuple[list[str], dict[str, int], str]:
    """The header's columns, the index of each known one, and the name of the load's."""
    try:
        header = [c.strip().lower() for c in next(reader)]
    except StopIteration:
        raise TraceError(
            "the file is empty", where=where, hint="columns: layer,expert,load and optionally"
            " window"
        ) from None
    except csv.Error as e:
        raise TraceError(f"not a CSV file ({e})", where=f"{where}:1", hint=_CSV_HINT) from None
    load_col = next((c for c in CSV_LOAD_COLUMNS if c in header), None)
    missing = [c for c in ("layer", "expert") if c not in header]
    if missing or load_col is None:
        need = missing + ([] if load_col else ["load"])
        raise TraceError(f"missing column {need[0]!r}", where=f"{where}:1", hint=_CSV_HINT)
    known = {"layer", "expert", "window", *CSV_LOAD_COLUMNS}
    extra = [c for c in header if c not in known]
    if extra:
        raise TraceError(f"unknown column {extra[0]!r:.40}", where=f"{where}:1", hint=_CSV_HINT)
    idx = {c: header.index(c) for c in ("layer", "expert", "window", load_col) if c in header}
    return header, idx, load_col


def _csv_cells(
    reader: Any, width: int, idx: dict[str, int], load_col: str, where: str, acc: Accumulator
) -> np.ndarray:
    """``[cells, 5]`` int64 rows ``(window, layer, expert, count, line)``, values checked."""
    # largest value of each column: ids index arrays, counts add up (docs/limits.md)
    top = {"window": _INT64_MAX, "layer": constants.MAX_LAYER_ID,
           "expert": constants.MAX_EXPERTS - 1, load_col: constants.MAX_TOTAL_COUNT}
    blocks: list[np.ndarray] = []
    cells: list[tuple[int, int, int, int, int]] = []
    line_no = 1
    try:
        for line_no, rec in enumerate(reader, start=2):
            if not rec or all(not c.strip() for c in rec):
                acc.skip("blank line")
                continue
            if len(rec) != width:
                raise TraceError(
                    f"row has {len(rec)} fields, the header {width}",
                    where=f"{where}:{line_no}", hint=_CSV_HINT,
                )
            vals = {c: _csv_value(rec[i], c, top[c], f"{where}:{line_no}") for c, i in idx.items()}
            cells.append(
                (vals.get("window", 0), vals["layer"], vals["expert"], vals[load_col], line_no)
            )
            if len(cells) == _CSV_BLOCK:  # numpy rows: 40 bytes a cell, not ~200
                blocks.append(np.array(cells, dtype=np.int64))
                cells = []
    except csv.Error as e:
        raise TraceError(
            f"not a CSV row ({e})", where=f"{where}:{line_no + 1}", hint=_CSV_HINT
        ) from None
    if cells:
        blocks.append(np.array(cells, dtype=np.int64))
    if not blocks:
        raise TraceError("no rows after the header", where=where, hint=_CSV_HINT)
    return np.concatenate(blocks)


def _csv_value(text: str, column: str, top: int, where: str) -> int:
    """A cell's whole number, in ``[0, top]``."""
    v = _int_cell(text, column, where)
    if not 0 <= v <= top:
        shown = str(v)
        shown = shown if len(shown) <= 24 else f"{shown[:12]}... ({len(shown)} digits)"
        raise TraceError(
            f"{column} is {shown}; expected 0 to {top:,}"
            if v > 0 else f"{column} is {shown}; expected >= 0",
            where=where,
            hint=_CSV_HINT if v < 0 else "limits: docs/limits.md",
        )
    return v


def _csv_load(arr: np.ndarray, where: str, declared: tuple[int | None, str] = (None, "")
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``[windows, layers, experts]`` load of the cells, with the layer ids and windows;
    ``declared``: the experts per layer known so far and where from (the load is that
    wide; a cell of an expert beyond is an error naming its line)."""
    win, lay, exp, cnt, lines = arr.T
    layer_ids = np.unique(lay)
    num_e = int(exp.max()) + 1
    known, source = declared
    if known is not None:
        if num_e > known:
            i = int(np.flatnonzero(exp >= known)[0])
            raise TraceError(
                f"expert id {int(exp[i])} is out of range [0, {known})",
                where=f"{where}:{int(lines[i])}",
                hint=f"num_experts is {known} ({source}); check the model against the file",
            )
        num_e = known
    wins = np.unique(win)
    if layer_ids.size > constants.MAX_LAYERS:
        raise TraceError(
            f"the file names {layer_ids.size} layers, more than placer handles"
            f" ({constants.MAX_LAYERS})", where=where, hint="limits: docs/limits.md",
        )
    _check_size((wins.size, layer_ids.size, num_e), "load", where, constants.MAX_LOAD_BYTES)
    lrow = np.searchsorted(layer_ids, lay)
    wrow = np.searchsorted(wins, win)
    code = (wrow * layer_ids.size + lrow) * num_e + exp
    order = np.argsort(code, kind="stable")
    dup = np.flatnonzero(code[order][1:] == code[order][:-1])
    if dup.size:
        i = int(order[dup[0] + 1])
        raise TraceError(
            f"cell (window {int(win[i])}, layer {int(lay[i])}, expert {int(exp[i])}) is listed"
            f" twice (first at line {int(lines[order[dup[0]]])})",
            where=f"{where}:{lines[i]}", hint="list each (window, layer, expert) once",
        )
    load = np.zeros((wins.size, layer_ids.size, num_e), dtype=np.int64)
    load.reshape(-1)[code] = cnt
    return load, layer_ids, wins


_CSV_HINT = "columns: layer,expert,load and optionally window, whole numbers >= 0"
#: CSV cells gathered as Python tuples before they go to a numpy block.
_CSV_BLOCK = 1 << 16
_INT64_MAX = (1 << 63) - 1


def _int_cell(text: str, column: str, where: str) -> int:
    s = text.strip()
    try:
        return int(s)
    except ValueError:
        try:
            f = float(s)
        except ValueError:
            f = math.nan
        if math.isfinite(f) and f.is_integer():
            return int(f)
        raise TraceError(
            f"{column} is {s!r:.40}; expected a whole number", where=where, hint=_CSV_HINT
        ) from None


register_format(
    "load-npz",
    extensions=(".npz",),
    sniff=_sniff_npz,
    read=_read_npz,
    description="aggregated load [windows?, layers, experts] (+ coact, layer_ids, top_k) in .npz",
)
register_format(
    "load-npy",
    extensions=(".npy",),
    sniff=_sniff_npy,
    read=_read_npy,
    description="aggregated load [windows?, layers, experts] as one .npy array",
)
register_format(
    "load-json",
    extensions=(".json",),
    sniff=_sniff_json,
    read=_read_json,
    description="aggregated load in JSON: load, coact, layer_ids, top_k entries",
)
register_format(
    "load-csv",
    extensions=(".csv",),
    sniff=_sniff_csv,
    read=_read_csv,
    description="aggregated load in CSV: columns layer,expert,load[,window]",
)
