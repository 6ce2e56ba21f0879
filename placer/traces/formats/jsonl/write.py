"""The JSONL trace writer (:func:`write_jsonl_trace`).

The format is described in :mod:`placer.traces.formats.jsonl.read` (the reader).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

from placer.errors import UsageError
from placer.io.fileio import atomic_path
from placer.traces.accumulate import TokenChunk
from placer.traces.formats.jsonl.lines import HEADER_FORMAT, HEADER_VERSION


def iter_token_chunks(
    topk_ids: np.ndarray | Iterable[TokenChunk | Mapping[str, Any]],
    *,
    step: np.ndarray | None = None,
    rank: np.ndarray | None = None,
    topk_weights: np.ndarray | None = None,
    request: np.ndarray | None = None,
) -> Iterator[TokenChunk]:
    """Normalize writer input: one array ``[tokens, layers, k]`` or an iterable of chunks.

    Chunks are :class:`~placer.traces.accumulate.TokenChunk` or mappings with the same
    keys (``topk_ids`` required; ``step``, ``rank``, ``topk_weights``, ``request``).
    """
    if isinstance(topk_ids, np.ndarray):
        yield TokenChunk(
            topk_ids=topk_ids,
            step=step,
            rank=rank,
            topk_weights=topk_weights,
            request=request,
        )
        return
    if any(a is not None for a in (step, rank, topk_weights, request)):
        raise UsageError(
            "step, rank, topk_weights and request come with the chunks when topk_ids is an"
            " iterable of chunks"
        )
    for c in topk_ids:
        if isinstance(c, TokenChunk):
            yield c
        elif isinstance(c, Mapping):
            unknown = set(c) - {"topk_ids", "step", "rank", "topk_weights", "request"}
            if unknown:
                raise UsageError(f"unknown chunk keys {sorted(unknown)}")
            yield TokenChunk(
                topk_ids=np.asarray(c["topk_ids"]),
                step=c.get("step"),
                rank=c.get("rank"),
                topk_weights=c.get("topk_weights"),
                request=c.get("request"),
            )
        else:
            raise UsageError(
                f"a chunk must be a TokenChunk or a mapping, got {type(c).__name__}"
            )


def _check_chunk(c: TokenChunk, num_layers: int, k: int | None) -> tuple[int, int]:
    ids = np.asarray(c.topk_ids)
    if ids.ndim != 3 or ids.shape[1] != num_layers:
        raise UsageError(
            f"topk_ids chunk has shape {ids.shape}, expected [tokens, {num_layers}, k]"
        )
    if k is not None and ids.shape[2] != k:
        raise UsageError(f"topk_ids chunk has k={ids.shape[2]}, earlier chunks {k}")
    t = ids.shape[0]
    for name in ("step", "rank", "request"):
        a = getattr(c, name)
        if a is not None and np.shape(a) != (t,):
            raise UsageError(f"{name} chunk has shape {np.shape(a)}, expected [{t}]")
    if c.topk_weights is not None and np.shape(c.topk_weights) != ids.shape:
        raise UsageError(
            f"topk_weights chunk has shape {np.shape(c.topk_weights)}, expected {ids.shape}"
        )
    return t, ids.shape[2]


def header_object(meta: Mapping[str, Any] | None, *, num_layers: int, top_k: int) -> dict[str, Any]:
    """The header a writer puts first: format, version, then ``meta`` with defaults."""
    head: dict[str, Any] = {"format": HEADER_FORMAT, "version": HEADER_VERSION}
    meta = dict(meta or {})
    head["model"] = meta.pop("model", None)
    head["num_layers"] = int(meta.pop("num_layers", num_layers))
    head["num_experts"] = meta.pop("num_experts", None)
    head["top_k"] = int(meta.pop("top_k", top_k))
    head["synthetic"] = bool(meta.pop("synthetic", False))
    head.update(meta)
    return {key: _plain(v) for key, v in head.items() if v is not None}


def _plain(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    return v


def write_jsonl_trace(
    path: str | Path,
    topk_ids: np.ndarray | Iterable[TokenChunk | Mapping[str, Any]],
    *,
    layer_ids: np.ndarray | list[int],
    step: np.ndarray | None = None,
    rank: np.ndarray | None = None,
    topk_weights: np.ndarray | None = None,
    meta: Mapping[str, Any] | None = None,
    request: np.ndarray | None = None,
) -> int:
    """Write a canonical JSONL trace atomically (gzip when ``path`` ends in ``.gz``).

    Parameters
    ----------
    path: output file; written to a temporary file and renamed when complete.
    topk_ids: ``[tokens, layers, k]`` int expert ids (-1 = none; a token with none in a
        layer has no row there), or an iterable
        of :class:`~placer.traces.accumulate.TokenChunk` (or mappings with its keys) for
        traces too long to hold.
    layer_ids: ``[layers]`` absolute layer id of each column.
    step, rank: ``[tokens]`` int forward step and source rank, or None.
    topk_weights: ``[tokens, layers, k]`` float gate weights, or None.
    meta: header fields (``model``, ``num_experts``, ``top_k``, ``synthetic``, ...);
        ``num_layers`` and ``top_k`` default to the arrays' sizes.
    request: ``[tokens]`` request label of each token; rows then carry ``request`` and
        ``token`` = position of the token within its request, else ``token`` = index.

    Returns
    -------
    Tokens written.

    Rows are token-major (a token's layers, then the next token), keys in the order
    ``request, step, token, layer, experts, weights, rank``; numbers are right-aligned in
    fixed-width fields (space padded, valid JSON) so chunks are formatted with numpy.
    The file depends only on the inputs (the gzip header has no name and time 0).
    """
    lid = [int(i) for i in np.asarray(layer_ids).ravel()]
    chunks = iter_token_chunks(
        topk_ids, step=step, rank=rank, topk_weights=topk_weights, request=request
    )
    total = 0
    k: int | None = None
    positions: dict[Any, int] = {}
    path = Path(path)
    with atomic_path(path) as tmp:
        raw: IO[bytes] = open(tmp, "wb")  # noqa: SIM115  (closed below)
        out: IO[bytes] = (
            # no name (it would be the temporary file's) and no time in the gzip header
            gzip.GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=6, mtime=0)  # type: ignore[assignment]
            if path.name.endswith(".gz")
            else raw
        )
        with raw, out:
            wrote_header = False
            for c in chunks:
                t, k = _check_chunk(c, len(lid), k)
                if not wrote_header:
                    head = header_object(meta, num_layers=len(lid), top_k=k)
                    out.write(json.dumps(head).encode() + b"\n")
                    wrote_header = True
                out.write(_format_rows(c, lid, total, positions))
                total += t
            if not wrote_header:
                head = header_object(meta, num_layers=len(lid), top_k=0)
                out.write(json.dumps(head).encode() + b"\n")
    return total


def _format_rows_py(
    c: TokenChunk, lid: list[int], first: int, positions: dict[Any, int]
) -> str:
    """Rows of a chunk formatted one by one (weights outside [0, 1])."""
    ids = np.asarray(c.topk_ids).tolist()
    t = len(ids)
    weights = (
        None
        if c.topk_weights is None
        else np.round(np.asarray(c.topk_weights, dtype=np.float64), 6).tolist()
    )
    steps = None if c.step is None else np.asarray(c.step).tolist()
    ranks = None if c.rank is None else np.asarray(c.rank).tolist()
    reqs = None if c.request is None else np.asarray(c.request).tolist()
    out: list[str] = []
    for i in range(t):
        head = ""
        if reqs is not None:
            r = reqs[i]
            pos = positions.get(r, 0)
            positions[r] = pos + 1
            head = f'"request": {json.dumps(r)}, '
            tok = pos
        else:
            tok = first + i
        if steps is not None:
            head += f'"step": {steps[i]}, '
        head += f'"token": {tok}, '
        tail = "}" if ranks is None else f', "rank": {ranks[i]}}}'
        row = ids[i]
        for j, layer in enumerate(lid):
            ex = row[j]
            if max(ex) < 0:
                continue  # no expert in this layer: no row
            if weights is None:
                out.append(f'{{{head}"layer": {layer}, "experts": {ex}{tail}')
            else:
                ws = weights[i][j]
                out.append(f'{{{head}"layer": {layer}, "experts": {ex}, "weights": {ws}{tail}')
    return "\n".join(out) + ("\n" if out else "")



def _format_rows(c: TokenChunk, lid: list[int], first: int, positions: dict[Any, int]) -> bytes:
    """Rows of a chunk as bytes, built column-wise with numpy.

    Numbers are right-aligned in fixed-width fields padded with spaces (valid JSON), so a
    whole chunk is one ``[rows, width]`` byte matrix; weights get 6 decimals.
    """
    ids = np.asarray(c.topk_ids, dtype=np.int64)
    t, _, k = ids.shape
    w = None if c.topk_weights is None else np.asarray(c.topk_weights, dtype=np.float64)
    if w is not None and not (np.isfinite(w).all() and (w >= 0).all() and (w <= 1).all()):
        return _format_rows_py(c, lid, first, positions).encode()
    present = (ids >= 0).any(axis=2)  # [t, L]
    tok_of, col_of = np.nonzero(present)  # token-major rows
    if tok_of.size == 0:
        return b""
    pieces: list[np.ndarray] = []

    def const(text: str) -> None:
        row = np.frombuffer(text.encode(), np.uint8)
        pieces.append(np.broadcast_to(row, (tok_of.size, len(text))))

    const("{")
    if c.request is not None:
        labels = np.asarray(c.request).tolist()
        tok = np.empty(t, dtype=np.int64)
        for i, r in enumerate(labels):
            tok[i] = positions.get(r, 0)
            positions[r] = tok[i] + 1
        texts = [json.dumps(r).encode() for r in labels]
        width = max(len(x) for x in texts)
        req = np.frombuffer(b"".join(x.ljust(width) for x in texts), np.uint8).reshape(t, width)
        const('"request": ')
        pieces.append(req[tok_of])
        const(", ")
    else:
        tok = first + np.arange(t)
    if c.step is not None:
        const('"step": ')
        pieces.append(_int_text(np.asarray(c.step))[tok_of])
        const(", ")
    const('"token": ')
    pieces.append(_int_text(tok)[tok_of])
    const(', "layer": ')
    pieces.append(_int_text(np.asarray(lid))[col_of])
    const(', "experts": [')
    ex = _int_text(ids[tok_of, col_of].ravel()).reshape(tok_of.size, k, -1)
    for j in range(k):
        pieces.append(ex[:, j])
        const(", " if j < k - 1 else "]")
    if w is not None:
        const(', "weights": [')
        wt = _unit_text(w[tok_of, col_of].ravel()).reshape(tok_of.size, k, -1)
        for j in range(k):
            pieces.append(wt[:, j])
            const(", " if j < k - 1 else "]")
    if c.rank is not None:
        const(', "rank": ')
        pieces.append(_int_text(np.asarray(c.rank))[tok_of])
    const("}\n")
    return np.concatenate(pieces, axis=1).tobytes()


def _int_text(values: np.ndarray) -> np.ndarray:
    """``[n]`` integers as ``[n, width]`` uint8 decimal text, right-aligned, space-padded."""
    v = np.asarray(values, dtype=np.int64).ravel()
    mag = np.abs(v)
    ndig = len(str(int(mag.max()))) if v.size else 1
    neg = v < 0
    width = ndig + int(neg.any())
    out = np.full((v.size, width), ord(" "), dtype=np.uint8)
    digits = np.ones(v.size, dtype=np.int64)  # digits of each value
    rem = mag.copy()
    for j in range(ndig):
        show = (j == 0) | (mag >= 10**j)
        digits += (j > 0) & show
        out[show, width - 1 - j] = (ord("0") + rem[show] % 10).astype(np.uint8)
        rem //= 10
    if neg.any():
        out[np.flatnonzero(neg), width - 1 - digits[neg]] = ord("-")
    return out


def _unit_text(values: np.ndarray) -> np.ndarray:
    """``[n]`` floats in [0, 1] as ``[n, 8]`` uint8 text ``d.dddddd``."""
    q = np.rint(np.asarray(values, dtype=np.float64) * 1e6).astype(np.int64)
    out = np.empty((q.size, 8), dtype=np.uint8)
    out[:, 0] = ord("0") + q // 1_000_000
    out[:, 1] = ord(".")
    rem = q % 1_000_000
    for j in range(6):
        out[:, 7 - j] = ord("0") + rem % 10
        rem //= 10
    return out
