"""Aggregated statistics: load matrices from ``.npz``, ``.npy``, ``.csv`` and ``.json``.

Content (DESIGN.md 4.2), whatever the container:

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
"""

from __future__ import annotations

import csv
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from placer.errors import TraceError
from placer.traces.accumulate import Accumulator
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
    except (zipfile.BadZipFile, OSError):
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
    except ValueError as e:
        raise TraceError(f"{name} is not a rectangular array ({e})", where=where) from None
    if arr.dtype == object or not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
        or arr.dtype == bool
    ):
        raise TraceError(
            f"{name} must be a numeric array, got {arr.dtype}",
            where=where,
            hint="a ragged list (rows of different lengths) is not an array",
        )
    if np.issubdtype(arr.dtype, np.floating):
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            raise TraceError(
                f"{name}{list(idx)} is {arr[idx]}; expected a whole token count",
                where=f"{where}: {name}{list(idx)}",
                hint="loads count (token, expert) selections; round averaged loads first",
            )
    arr = arr.astype(np.int64)
    if (arr < 0).any():
        idx = tuple(int(i) for i in np.argwhere(arr < 0)[0])
        raise TraceError(
            f"{name}{list(idx)} is {arr[idx]}; counts are >= 0",
            where=f"{where}: {name}{list(idx)}",
        )
    return arr


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
    load = _counts(load, "load", where)
    if load.ndim == 2:
        load = load[None]
    if load.ndim != 3 or 0 in load.shape:
        raise TraceError(
            f"load has shape {load.shape}, expected [layers, experts] or"
            " [windows, layers, experts]",
            where=f"{where}: load",
        )
    w, nl, e = load.shape
    lid = None
    if layer_ids is not None:
        lid = np.asarray(layer_ids)
        if lid.shape != (nl,) or not np.issubdtype(lid.dtype, np.integer):
            raise TraceError(
                f"layer_ids has shape {lid.shape} and dtype {lid.dtype}, expected [{nl}] integers",
                where=f"{where}: layer_ids",
            )
        if len(np.unique(lid)) != nl or (lid < 0).any():
            raise TraceError(
                f"layer_ids {lid.tolist()} must be distinct layer indices >= 0",
                where=f"{where}: layer_ids",
            )
        lid = lid.astype(np.int64)
    co = None
    if coact is not None:
        co = _counts(coact, "coact", where)
        if co.shape != (nl, e, e):
            raise TraceError(
                f"coact has shape {co.shape}, expected [{nl}, {e}, {e}] like load",
                where=f"{where}: coact",
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
    starts = None
    if window_starts is not None:
        starts = np.asarray(window_starts)
        if starts.shape != (w,) or not np.issubdtype(starts.dtype, np.integer):
            raise TraceError(
                f"window_starts has shape {starts.shape}, expected [{w}] integers",
                where=f"{where}: window_starts",
            )
    acc.declare(where=where, top_k=top_k, num_experts=num_experts, model=model)
    acc.add_aggregate(load, layer_ids=lid, coact=co, window_starts=starts, where=where)


# -- readers ------------------------------------------------------------------------
def _read_npz(path: Path, acc: Accumulator) -> None:
    where = str(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            names = set(z.files)
            if "load" not in names:
                raise TraceError("no load array", where=where, hint="aggregated files hold load")
            parts = {n: z[n] for n in names & _KNOWN}
    except (ValueError, OSError, zipfile.BadZipFile) as e:
        raise TraceError(f"not a readable .npz file ({e})", where=where) from None
    for key in ("top_k", "num_experts", "model"):
        if key in parts:
            parts[key] = parts[key].item() if parts[key].size == 1 else parts[key]
    _add(acc, where, **parts)


def _read_npy(path: Path, acc: Accumulator) -> None:
    where = str(path)
    try:
        load = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise TraceError(f"not a readable .npy file ({e})", where=where) from None
    _add(acc, where, load)


def _read_json(path: Path, acc: Accumulator) -> None:
    where = str(path)
    try:
        doc = json.loads(path.read_bytes())
    except ValueError as e:
        line = getattr(e, "lineno", None)
        raise TraceError(
            f"malformed JSON ({getattr(e, 'msg', e)})",
            where=f"{where}:{line}" if line else where,
        ) from None
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
    text = path.read_bytes().decode("utf-8", "replace")
    reader = csv.reader(io.StringIO(text))
    try:
        header = [c.strip().lower() for c in next(reader)]
    except StopIteration:
        raise TraceError("the file is empty", where=where) from None
    load_col = next((c for c in CSV_LOAD_COLUMNS if c in header), None)
    missing = [c for c in ("layer", "expert") if c not in header]
    if missing or load_col is None:
        need = missing + ([] if load_col else ["load"])
        raise TraceError(
            f"missing column {need[0]!r}",
            where=f"{where}:1",
            hint="columns: layer,expert,load and optionally window",
        )
    known = {"layer", "expert", "window", *CSV_LOAD_COLUMNS}
    extra = [c for c in header if c not in known]
    if extra:
        raise TraceError(
            f"unknown column {extra[0]!r}",
            where=f"{where}:1",
            hint="columns: layer,expert,load and optionally window",
        )
    idx = {c: header.index(c) for c in ("layer", "expert", "window", load_col) if c in header}
    cells: list[tuple[int, int, int, int, int]] = []
    for line_no, rec in enumerate(reader, start=2):
        if not rec or all(not c.strip() for c in rec):
            acc.skip("blank line")
            continue
        if len(rec) != len(header):
            raise TraceError(
                f"row has {len(rec)} fields, the header {len(header)}", where=f"{where}:{line_no}"
            )
        vals = {}
        for c, i in idx.items():
            vals[c] = _int_cell(rec[i], c, f"{where}:{line_no}")
        cells.append(
            (vals.get("window", 0), vals["layer"], vals["expert"], vals[load_col], line_no)
        )
    if not cells:
        raise TraceError("no rows after the header", where=where)
    arr = np.array(cells, dtype=np.int64)
    win, lay, exp, cnt, lines = arr.T
    for name, col in (("window", win), ("layer", lay), ("expert", exp), (load_col, cnt)):
        if (col < 0).any():
            i = int(np.flatnonzero(col < 0)[0])
            raise TraceError(f"{name} is {int(col[i])}; expected >= 0", where=f"{where}:{lines[i]}")
    layer_ids = np.unique(lay)
    e = int(exp.max()) + 1
    wins = np.unique(win)
    lrow = np.searchsorted(layer_ids, lay)
    wrow = np.searchsorted(wins, win)
    code = (wrow * layer_ids.size + lrow) * e + exp
    order = np.argsort(code, kind="stable")
    dup = np.flatnonzero(code[order][1:] == code[order][:-1])
    if dup.size:
        i = int(order[dup[0] + 1])
        raise TraceError(
            f"cell (window {int(win[i])}, layer {int(lay[i])}, expert {int(exp[i])}) is listed"
            f" twice (first at line {int(lines[order[dup[0]]])})",
            where=f"{where}:{lines[i]}",
        )
    load = np.zeros((wins.size, layer_ids.size, e), dtype=np.int64)
    load.reshape(-1)[code] = cnt
    _add(acc, where, load, layer_ids=layer_ids, window_starts=wins if "window" in idx else None)


def _int_cell(text: str, column: str, where: str) -> int:
    s = text.strip()
    try:
        return int(s)
    except ValueError:
        try:
            f = float(s)
        except ValueError:
            f = float("nan")
        if f == f and f == int(f):
            return int(f)
        raise TraceError(
            f"{column} is {s!r}; expected a whole number", where=where
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
