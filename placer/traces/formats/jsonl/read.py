"""The JSONL trace reader: canonical per-token traces (``.jsonl``, ``.jsonl.gz``).

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

Parsing is vectorized (:mod:`placer.traces.formats.jsonl.scan`): lines with the same layout as the
block's first routing row are cut into numbers with numpy; every other line goes
through ``json.loads``.  Both give the same rows.

Limits (docs/limits.md): a line holds at most ``constants.MAX_LINE_BYTES`` (``/dev/zero``
fails at once), numbers fit int64, weights are finite, and a gzip file, read as a stream
in bounded memory, may inflate to at most ``constants.MAX_INFLATED_BYTES``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from placer import constants
from placer.errors import TraceError
from placer.traces.accumulate import Accumulator, RowChunk
from placer.traces.formats.jsonl.lines import (
    ALIASES,
    HEADER_FORMAT,
    HEADER_VERSION,
    INT64_MAX,
    NOT_BLANK,
    ROUTE_TYPES,
    fits_int64,
    is_finite,
    is_int,
    line_blocks,
    long_line_error,
    open_trace,
    sniff_jsonl,
)
from placer.traces.formats.jsonl.scan import Scan, Template, scan_block
from placer.traces.registry import register_format

#: Bytes read and parsed per block (40,000 rows of a typical trace).  Small enough that
#: the parser's temporaries (a few bytes per input byte) are reused from the heap and
#: stay in cache: 25 MB blocks spent a tenth of their time in page faults.
BLOCK_BYTES = 4 << 20

#: Lines of a block tried as the template of the fast path.
_TEMPLATE_TRIES = 8


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
        stream, raw = open_trace(self.path)
        line_no = 0
        pos = 0
        any_content = False
        with raw:
            for block in line_blocks(stream, raw, BLOCK_BYTES, str(self.path)):
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
                raise long_line_error(str(self.path), first_line + int(np.argmax(length)) + 1)
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
            odd = np.frombuffer(data.translate(NOT_BLANK), dtype=np.uint8)
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
                or obj.get("type", "route") not in ROUTE_TYPES
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
        if kind is not None and kind not in ROUTE_TYPES:
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
        layer, experts = self._layer_experts(obj, where)
        if self.k is None:
            self.k = len(experts)
        elif len(experts) != self.k:
            raise TraceError(
                f"row has {len(experts)} experts but earlier rows have {self.k}",
                where=where,
                hint="all rows must select the same number of experts (top_k); pad with -1",
            )
        weights = self._weights(obj, len(experts), where)
        if weights is None:
            cols.has_weights = False
        token = self._count_field(obj, "token", where)
        step = self._count_field(obj, "step", where)
        if step is not None:
            cols.has_step = True
        rank = self._count_field(obj, "rank", where)
        if rank is not None:
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

    def _layer_experts(self, obj: dict[str, Any], where: str) -> tuple[int, list[int]]:
        """A row's ``layer`` and ``experts``: present, whole numbers within 64 bits."""
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
        if not is_int(layer):
            raise TraceError(
                f"layer must be an integer, got {layer!r:.40}", where=where,
                hint="layer is the model's absolute layer index, from 0",
            )
        if not isinstance(experts, list) or not all(is_int(e) for e in experts):
            raise TraceError(
                f"experts must be a list of integer expert ids, got {experts!r:.60}",
                where=where, hint="e.g. \"experts\": [4, 1]; -1 marks no expert",
            )
        if not fits_int64(layer) or not all(fits_int64(e) for e in experts):
            raise TraceError(
                f"layer or expert id beyond the 64-bit range in {experts!r:.60}",
                where=where, hint="ids are small whole numbers; is the row corrupt?",
            )
        return layer, experts

    def _weights(self, obj: dict[str, Any], k: int, where: str) -> list[float] | None:
        """A row's gate weights (``k`` finite numbers), or None when it has none."""
        weights = self._field(obj, "weights")
        if weights is None:
            return None
        if (
            not isinstance(weights, list)
            or len(weights) != k
            or not all(isinstance(w, int | float) and not isinstance(w, bool) for w in weights)
        ):
            raise TraceError(
                f"weights must be a list of {k} numbers, got {weights!r:.60}",
                where=where, hint="one gate weight per expert, in the same order",
            )
        if not all(is_finite(w) for w in weights):
            raise TraceError(
                f"weights must be finite numbers, got {weights!r:.60}", where=where,
                hint="gate weights are probabilities; NaN or Infinity is not one",
            )
        return weights

    def _count_field(self, obj: dict[str, Any], name: str, where: str) -> int | None:
        """Field ``name`` (``token``, ``step`` or ``rank``): a whole number >= 0, or None."""
        value = self._field(obj, name)
        if value is not None and (not is_int(value) or not 0 <= value <= INT64_MAX):
            raise TraceError(
                f"{name} must be an integer >= 0, got {value!r:.40}", where=where,
                hint=_COUNT_FIELD_HINTS[name],
            )
        return value  # type: ignore[no-any-return]

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
            chunk = chunk.take(order)
        self.acc.add_rows(chunk)


#: Hint of the error about each whole-number field of a row.
_COUNT_FIELD_HINTS = {
    "token": "token numbers a token within its request (or the file)",
    "step": "step is the engine's forward pass (batch) number",
    "rank": "rank is the data-parallel rank the token came from",
}


def _read(path: Path, acc: Accumulator) -> None:
    _Reader(path, acc).run()


register_format(
    "jsonl",
    extensions=(".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz"),
    sniff=sniff_jsonl,
    read=_read,
    description="per-token JSONL, one object per (token, layer) (optionally gzip)",
)
