"""Canonical per-token JSONL traces (``.jsonl``, ``.jsonl.gz``): reader and writer.

One JSON object per line and per (token, layer)::

    {"format": "placer-trace", "version": 1, "model": "m", "num_layers": 2,
     "num_experts": 8, "top_k": 2, "synthetic": false}
    {"request": "r17", "step": 42, "token": 3, "layer": 5, "experts": [4, 1],
     "weights": [0.7, 0.3], "rank": 2}

(each object on one line).

Only ``layer`` and ``experts`` are required.  Field aliases (:data:`ALIASES`) cover the
logs engines and patched engines write.  Objects with a ``type`` other than ``"route"``
(``{"type": "meta"}``) are skipped and counted; blank lines too.

Token identity: rows with a ``token`` id belong to token ``(file, request, token)``;
rows without one are numbered by order: the n-th row of a layer (within a request) is
the n-th token.

Parsing is vectorized (:mod:`placer.traces.jsonscan`): lines with the same layout as the
block's first routing row are cut into numbers with numpy; every other line goes
through ``json.loads``.  Both give the same rows.

Limits (docs/limits.md): a line holds at most ``constants.MAX_LINE_BYTES`` (``/dev/zero``
fails at once), numbers fit int64, weights are finite, and a gzip file past
``constants.DECOMPRESSION_FREE_BYTES`` may not decompress to more than
``constants.MAX_DECOMPRESSION_RATIO`` times its size.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

from placer import constants
from placer.errors import TraceError, UsageError
from placer.fileio import atomic_path
from placer.traces.accumulate import Accumulator, RowChunk, TokenChunk
from placer.traces.jsonscan import Scan, Template, scan_block
from placer.traces.registry import register_format

__all__ = ["ALIASES", "HEADER_FORMAT", "write_jsonl_trace"]

#: ``format`` value of the header object.
HEADER_FORMAT = "placer-trace"
HEADER_VERSION = 1

#: Canonical field -> accepted names, first match wins.
ALIASES: dict[str, tuple[str, ...]] = {
    "layer": ("layer",),
    "experts": ("experts", "topk_ids"),
    "weights": ("weights", "topk_weights", "gating_probs"),
    "token": ("token", "token_idx", "token_pos"),
    "request": ("request", "req_id", "problem_id"),
    "step": ("step", "forward_step", "iteration"),
    "rank": ("rank", "source_rank", "dp_rank"),
}

#: Bytes read and parsed per block (40,000 rows of a typical trace).  Small enough that
#: the parser's temporaries (a few bytes per input byte) are reused from the heap and
#: stay in cache: 25 MB blocks spent a tenth of their time in page faults.
BLOCK_BYTES = 4 << 20

_ROUTE_TYPES = ("route",)

#: ``bytes.translate`` table: 1 for bytes other than whitespace (``bytes.strip``'s set).
_NOT_BLANK = bytes(0 if c in b" \t\n\r\x0b\x0c" else 1 for c in range(256))

#: Lines of a block tried as the template of the fast path.
_TEMPLATE_TRIES = 8


def _sniff(path: Path, head: bytes) -> bool:
    """JSON objects one a line: a header, a row with ``layer``, or ``type``-tagged objects."""
    seen_object = False
    for raw in head.split(b"\n")[:20]:
        line = raw.strip()
        if not line:
            continue
        if not line.startswith(b"{"):
            return False
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            # a truncated last line of the head, or a broken line the reader will report
            return seen_object or b'"layer"' in line
        if not isinstance(obj, dict):
            return False
        if obj.get("format") == HEADER_FORMAT or "layer" in obj:
            return True
        if "type" not in obj:
            return False
        seen_object = True
    return seen_object


def _open(path: Path) -> tuple[IO[bytes], IO[bytes]]:
    """(stream of decompressed bytes, raw file for progress)."""
    raw: IO[bytes] = open(path, "rb")  # noqa: SIM115  (closed by the caller)
    magic = raw.read(2)
    raw.seek(0)
    if magic == b"\x1f\x8b":
        stream: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[assignment]
        return stream, raw
    return raw, raw


def _blocks(stream: IO[bytes], raw: IO[bytes], size: int, where: str) -> Iterator[bytes]:
    """Blocks of whole lines (the last one may lack its newline).

    ``raw`` is the file under ``stream`` (the same object when not compressed): a gzip
    stream that inflates past ``constants.MAX_DECOMPRESSION_RATIO`` times the bytes read
    of it (after ``constants.DECOMPRESSION_FREE_BYTES``) is refused, and so is a line
    longer than ``constants.MAX_LINE_BYTES`` (a file without newlines never ends one).
    """
    rest = b""
    lines = 0  # newlines before ``rest``
    inflated = 0
    while True:
        try:
            data = stream.read(size)
        except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise TraceError(
                f"cannot read the file ({e})", where=where, hint="is the gzip file complete?"
            ) from None
        if not data:
            if rest:
                yield rest
            return
        if stream is not raw:
            inflated += len(data)
            if (
                inflated > constants.DECOMPRESSION_FREE_BYTES
                and inflated > constants.MAX_DECOMPRESSION_RATIO * max(raw.tell(), 1)
            ):
                raise TraceError(
                    f"the gzip file inflates more than {constants.MAX_DECOMPRESSION_RATIO}"
                    f" times (to over {inflated >> 20} MiB from {raw.tell() >> 10} KiB):"
                    " no routing trace compresses this well",
                    where=where, hint="is this a compression bomb? (limits: docs/limits.md)",
                )
        data = rest + data
        cut = data.rfind(b"\n")
        if cut < 0:
            if len(data) > constants.MAX_LINE_BYTES:
                raise _long_line(where, lines + 1)
            rest = data
            continue
        rest = data[cut + 1 :]
        if len(rest) > constants.MAX_LINE_BYTES:
            raise _long_line(where, lines + data.count(b"\n") + 1)
        lines += data.count(b"\n", 0, cut + 1)
        yield data[: cut + 1]


def _long_line(where: str, line: int) -> TraceError:
    return TraceError(
        f"line {line} is longer than {constants.MAX_LINE_BYTES >> 20} MiB",
        where=f"{where}:{line}",
        hint="a routing row is one short line; is this a JSONL trace? (limits:"
        " docs/limits.md)",
    )


class _Columns:
    """Row columns being built from one block of lines."""

    def __init__(self) -> None:
        self.layer: list[int] = []
        self.experts: list[list[int]] = []
        self.weights: list[Any] = []
        self.token: list[int] = []
        self.request: list[int] = []
        self.step: list[int] = []
        self.rank: list[int] = []
        self.lines: list[int] = []
        self.has_weights = True
        self.has_step = False
        self.has_rank = False


class _Reader:
    """Reads one JSONL file into an accumulator."""

    def __init__(self, path: Path, acc: Accumulator) -> None:
        self.path = path
        self.acc = acc
        self.first_content_line: int | None = None
        self.template: Template | None = None
        self.k: int | None = None
        self.request_ids: dict[Any, int] = {}
        self.no_request = acc.request_id(None)

    def where(self, line: int) -> str:
        return f"{self.path}:{line}"

    def run(self) -> None:
        stream, raw = _open(self.path)
        line_no = 0
        pos = 0
        any_content = False
        with raw:
            for block in _blocks(stream, raw, BLOCK_BYTES, str(self.path)):
                any_content = any_content or bool(block.strip())
                line_no = self._block(block, line_no)
                now = raw.tell()
                self.acc.advance(now - pos)
                pos = now
        if not any_content:
            raise TraceError(
                "the file is empty",
                where=str(self.path),
                hint="a trace needs at least one routing row",
            )

    # -- one block ---------------------------------------------------------------------
    def _block(self, data: bytes, first_line: int) -> int:
        """Parse a block of whole lines numbered from ``first_line + 1``; returns the last."""
        if not data.strip():  # only blank lines (a file of them must not take minutes)
            n = data.count(b"\n") + (not data.endswith(b"\n"))
            self.acc.skip("blank line", n)
            return first_line + n
        scan = scan_block(data)
        n = scan.num_lines
        if n:
            length = scan.line_end - scan.line_start
            if int(length.max()) > constants.MAX_LINE_BYTES:
                raise _long_line(str(self.path), first_line + int(np.argmax(length)) + 1)
        if self.first_content_line is None:
            content = np.flatnonzero((scan.num_tok > 0) | (scan.num_struct > 0))
            if content.size:
                self.first_content_line = first_line + int(content[0]) + 1
        tpl = self._template(data, scan)
        good, values = (
            tpl.parse(scan, weights=self.acc.options.keep_tokens)
            if tpl is not None
            else (np.zeros(n, dtype=bool), {})
        )
        fast_idx = np.flatnonzero(good)
        if tpl is not None and fast_idx.size:
            if self.k is None:
                self.k = tpl.k
            elif tpl.k != self.k:
                raise TraceError(
                    f"row has {tpl.k} experts but earlier rows have {self.k}",
                    where=self.where(first_line + int(fast_idx[0]) + 1),
                    hint="all rows must select the same number of experts (top_k); pad with -1",
                )
        cols = _Columns()
        starts, ends = scan.line_start, scan.line_end
        # blank lines in bulk, not a Python call a line (control bytes are not blank)
        blank = (scan.num_tok == 0) & (scan.num_struct == 0)
        if blank.any():
            odd = np.frombuffer(data.translate(_NOT_BLANK), dtype=np.uint8)
            blank &= np.add.reduceat(odd, starts, dtype=np.int64) == 0
            self.acc.skip("blank line", int(blank.sum()))
        for i in np.flatnonzero(~good & ~blank).tolist():
            self._line(data[starts[i] : ends[i]], first_line + i + 1, cols)
        fast: dict[str, Any] = {}
        if tpl is not None and fast_idx.size:
            fast = values
            fast["lines"] = first_line + fast_idx + 1
            if "request" in fast:
                uniq, inv = np.unique(fast["request"], return_inverse=True)
                ids = np.array(
                    [self._request(u.decode("utf-8", "replace"), "") for u in uniq.tolist()],
                    dtype=np.int64,
                )
                fast["request"] = ids[inv.ravel()]
            fast["has_weights"] = "weights" in tpl.fields
        self._flush(cols, fast)
        return first_line + n

    def _template(self, data: bytes, scan: Scan) -> Template | None:
        """The layout of most lines of the block (the previous block's when it still fits)."""
        if self.template is not None:
            tpl = self.template
            fits = (scan.num_tok == tpl.num_tok) & (scan.num_struct == tpl.num_struct)
            if fits.size and fits.mean() >= 0.5:
                return tpl
        tried = 0
        for i in range(scan.num_lines):
            if scan.num_tok[i] == 0:
                continue
            tried += 1
            if tried > _TEMPLATE_TRIES:
                break
            try:
                obj = json.loads(data[scan.line_start[i] : scan.line_end[i]])
            except (ValueError, RecursionError):
                continue
            if (
                not isinstance(obj, dict)
                or obj.get("format") == HEADER_FORMAT
                or obj.get("type", "route") not in _ROUTE_TYPES
            ):
                continue
            found = Template.from_line(obj, scan, i, ALIASES)
            if found is not None:
                self.template = found
                return found
        return None

    def _line(self, line: bytes, line_no: int, cols: _Columns) -> None:
        if not line.strip():
            self.acc.skip("blank line")
            return
        try:
            obj = json.loads(line)
        except ValueError as e:
            msg = getattr(e, "msg", str(e))
            col = getattr(e, "colno", None)
            raise TraceError(
                f"malformed JSON ({msg}" + (f" at column {col})" if col else ")"),
                where=self.where(line_no),
                hint="each line must be one JSON object",
            ) from None
        except RecursionError:
            raise TraceError(
                "the JSON nests too deeply", where=self.where(line_no),
                hint="each line must be one flat JSON object (a routing row)",
            ) from None
        if not isinstance(obj, dict):
            raise TraceError(
                f"expected a JSON object, got {type(obj).__name__}",
                where=self.where(line_no),
                hint="each line must be one JSON object: {\"layer\": ..., \"experts\": [...]}",
            )
        if obj.get("format") == HEADER_FORMAT:
            self._header(obj, line_no, line_no == self.first_content_line)
            return
        kind = obj.get("type")
        if kind is not None and kind not in _ROUTE_TYPES:
            self.acc.skip(f"type={kind}")
            return
        self._row(obj, line_no, cols)

    def _header(self, obj: dict[str, Any], line_no: int, first: bool) -> None:
        version = obj.get("version", HEADER_VERSION)
        if version != HEADER_VERSION:
            raise TraceError(
                f"unsupported {HEADER_FORMAT} version {version!r:.40}",
                where=self.where(line_no),
                hint=f"this placer reads version {HEADER_VERSION}",
            )
        if not first:
            self.acc.skip("header")
        self.acc.declare(
            where=self.where(line_no),
            num_experts=obj.get("num_experts"),
            top_k=obj.get("top_k"),
            num_layers=obj.get("num_layers"),
            model=obj.get("model"),
            synthetic=obj.get("synthetic"),
        )

    def _field(self, obj: dict[str, Any], name: str) -> Any:
        for alias in ALIASES[name]:
            if alias in obj:
                return obj[alias]
        return None

    def _row(self, obj: dict[str, Any], line_no: int, cols: _Columns) -> None:
        where = self.where(line_no)
        layer = obj.get("layer")
        if layer is None:
            raise TraceError(
                "missing field 'layer'",
                where=where,
                hint="a routing row needs 'layer' and 'experts' (or 'topk_ids')",
            )
        experts = self._field(obj, "experts")
        if experts is None:
            raise TraceError(
                "missing field 'experts' (or 'topk_ids')",
                where=where,
                hint="a routing row needs 'layer' and 'experts' (or 'topk_ids')",
            )
        if not _is_int(layer):
            raise TraceError(
                f"layer must be an integer, got {layer!r:.40}", where=where,
                hint="layer is the model's absolute layer index, from 0",
            )
        if not isinstance(experts, list) or not all(_is_int(e) for e in experts):
            raise TraceError(
                f"experts must be a list of integer expert ids, got {experts!r:.60}",
                where=where, hint="e.g. \"experts\": [4, 1]; -1 marks no expert",
            )
        if not _fits_int64(layer) or not all(_fits_int64(e) for e in experts):
            raise TraceError(
                f"layer or expert id beyond the 64-bit range in {experts!r:.60}",
                where=where, hint="ids are small whole numbers; is the row corrupt?",
            )
        if self.k is None:
            self.k = len(experts)
        elif len(experts) != self.k:
            raise TraceError(
                f"row has {len(experts)} experts but earlier rows have {self.k}",
                where=where,
                hint="all rows must select the same number of experts (top_k); pad with -1",
            )
        weights = self._field(obj, "weights")
        if weights is None:
            cols.has_weights = False
        elif (
            not isinstance(weights, list)
            or len(weights) != len(experts)
            or not all(isinstance(w, int | float) and not isinstance(w, bool) for w in weights)
        ):
            raise TraceError(
                f"weights must be a list of {len(experts)} numbers, got {weights!r:.60}",
                where=where, hint="one gate weight per expert, in the same order",
            )
        elif not all(_finite(w) for w in weights):
            raise TraceError(
                f"weights must be finite numbers, got {weights!r:.60}", where=where,
                hint="gate weights are probabilities; NaN or Infinity is not one",
            )
        token = self._field(obj, "token")
        if token is not None and (not _is_int(token) or not 0 <= token <= _INT64_MAX):
            raise TraceError(
                f"token must be an integer >= 0, got {token!r:.40}", where=where,
                hint="token numbers a token within its request (or the file)",
            )
        step = self._field(obj, "step")
        if step is not None:
            if not _is_int(step) or not 0 <= step <= _INT64_MAX:
                raise TraceError(
                    f"step must be an integer >= 0, got {step!r:.40}", where=where,
                    hint="step is the engine's forward pass (batch) number",
                )
            cols.has_step = True
        rank = self._field(obj, "rank")
        if rank is not None:
            if not _is_int(rank) or not 0 <= rank <= _INT64_MAX:
                raise TraceError(
                    f"rank must be an integer >= 0, got {rank!r:.40}", where=where,
                    hint="rank is the data-parallel rank the token came from",
                )
            cols.has_rank = True
        request = self._field(obj, "request")
        cols.request.append(self._request(request, where))
        cols.layer.append(layer)
        cols.experts.append(experts)
        cols.weights.append(weights)
        cols.token.append(-1 if token is None else token)
        cols.step.append(-1 if step is None else step)
        cols.rank.append(-1 if rank is None else rank)
        cols.lines.append(line_no)

    def _request(self, label: Any, where: str) -> int:
        if label is None:
            return self.no_request
        if isinstance(label, bool) or not isinstance(label, int | str):
            raise TraceError(
                f"request must be a string or an integer, got {label!r:.40}", where=where,
                hint="request labels the request a token belongs to",
            )
        key = str(label)
        rid = self.request_ids.get(key)
        if rid is None:
            rid = self.acc.request_id(key)
            self.request_ids[key] = rid
        return rid

    def _flush(self, cols: _Columns, fast: dict[str, Any]) -> None:
        """Rows of the slow and fast paths, merged in line order, to the accumulator."""
        n_slow = len(cols.layer)
        n_fast = int(fast["layer"].size) if fast else 0
        if n_slow + n_fast == 0:
            return
        k = self.k or 0
        keep = self.acc.options.keep_tokens

        def merged(name: str, slow: list[Any], present: bool) -> np.ndarray | None:
            has_fast = name in fast
            if not (present or has_fast):
                return None
            out = np.full(n_slow + n_fast, -1, dtype=np.int64)
            out[:n_slow] = slow
            if has_fast:
                out[n_slow:] = fast[name]
            return out

        experts = np.empty((n_slow + n_fast, k), dtype=np.int64)
        experts[:n_slow] = np.array(cols.experts, dtype=np.int64).reshape(n_slow, k)
        if n_fast:
            experts[n_slow:] = fast["experts"]
        layer = merged("layer", cols.layer, True)
        request = merged("request", cols.request, True)
        if n_fast and "request" not in fast:
            assert request is not None
            request[n_slow:] = self.no_request
        lines = merged("lines", cols.lines, True)
        token = merged("token", cols.token, True)
        weights = None
        if keep and (n_slow == 0 or cols.has_weights) and (
            n_fast == 0 or fast.get("has_weights", False)
        ):
            weights = np.empty((n_slow + n_fast, k), dtype=np.float32)
            weights[:n_slow] = np.array(cols.weights, dtype=np.float32).reshape(n_slow, k)
            if n_fast:
                weights[n_slow:] = fast["weights"]
        chunk = RowChunk(
            layer=layer,  # type: ignore[arg-type]
            experts=experts,
            request=request,  # type: ignore[arg-type]
            token=token,  # type: ignore[arg-type]
            lines=lines,  # type: ignore[arg-type]
            step=merged("step", cols.step, cols.has_step),
            rank=merged("rank", cols.rank, cols.has_rank),
            weights=weights,
        )
        if n_slow and n_fast:
            assert lines is not None
            order = np.argsort(lines, kind="stable")
            chunk = _reorder(chunk, order)
        self.acc.add_rows(chunk)


def _reorder(chunk: RowChunk, order: np.ndarray) -> RowChunk:
    def sel(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else a[order]

    return RowChunk(
        layer=chunk.layer[order],
        experts=chunk.experts[order],
        request=chunk.request[order],
        token=chunk.token[order],
        lines=chunk.lines[order],
        step=sel(chunk.step),
        rank=sel(chunk.rank),
        weights=sel(chunk.weights),
    )


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_INT64_MAX = (1 << 63) - 1


def _fits_int64(v: int) -> bool:
    return -_INT64_MAX - 1 <= v <= _INT64_MAX


def _finite(w: float) -> bool:
    try:
        return math.isfinite(w)
    except OverflowError:  # an integer too large for a float
        return False


def _read(path: Path, acc: Accumulator) -> None:
    _Reader(path, acc).run()


register_format(
    "jsonl",
    extensions=(".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz"),
    sniff=_sniff,
    read=_read,
    description="per-token JSONL, one object per (token, layer) (optionally gzip)",
)


# -- writer ----------------------------------------------------------------------------
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
