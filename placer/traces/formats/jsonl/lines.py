"""The line-level pieces of JSONL traces: the format's names, opening, blocks, checks.

The header's ``format`` and ``version``, the field aliases, sniffing a file, opening it
(gzip or not), cutting it into blocks of whole lines under the limits, and checking a
row's values.  The reader driving these is :mod:`placer.traces.formats.jsonl`; the writer is
:mod:`placer.traces.formats.jsonl.write`.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from placer import constants
from placer.errors import TraceError

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

ROUTE_TYPES = ("route",)

#: ``bytes.translate`` table: 1 for bytes other than whitespace (``bytes.strip``'s set).
NOT_BLANK = bytes(0 if c in b" \t\n\r\x0b\x0c" else 1 for c in range(256))


def sniff_jsonl(path: Path, head: bytes) -> bool:
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


def open_trace(path: Path) -> tuple[IO[bytes], IO[bytes]]:
    """(stream of decompressed bytes, raw file for progress: its ``tell()`` is the bytes
    read of it, a pipe's too)."""
    raw: IO[bytes] = open(path, "rb")  # noqa: SIM115  (closed by the caller)
    if not raw.seekable():  # a pipe (``<(zcat trace.jsonl.gz)``): count what is read
        raw = _Counted(raw)  # type: ignore[assignment]
    magic = raw.peek(2)[:2]  # type: ignore[attr-defined]
    if magic == b"\x1f\x8b":
        stream: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[assignment]
        return stream, raw
    return raw, raw


class _Counted(io.BufferedReader):
    """A buffered reader of a pipe whose ``tell()`` is the bytes read so far."""

    def __init__(self, inner: Any):
        super().__init__(inner.detach())
        self.done = 0

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.done += len(data)
        return data

    def read1(self, size: int = -1) -> bytes:
        data = super().read1(size)
        self.done += len(data)
        return data

    def tell(self) -> int:
        return self.done


def line_blocks(stream: IO[bytes], raw: IO[bytes], size: int, where: str) -> Iterator[bytes]:
    """Blocks of whole lines (the last one may lack its newline).

    ``raw`` is the file under ``stream`` (the same object when not compressed): a gzip
    stream is read in bounded memory whatever its ratio, and refused once it has inflated
    to more than ``constants.MAX_INFLATED_BYTES`` (which bounds the time a small file can
    take); a line longer than ``constants.MAX_LINE_BYTES`` is refused too (a file without
    newlines never ends one).
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
            if inflated > constants.MAX_INFLATED_BYTES:
                raise TraceError(
                    f"the gzip file inflates to more than {constants.MAX_INFLATED_BYTES >> 30}"
                    f" GiB (from {raw.tell() >> 20} MiB read of it), the most placer reads of"
                    " a compressed trace",
                    where=where, hint="is this a compression bomb? a larger trace reads"
                    " uncompressed, or as NPZ (limits: docs/limits.md)",
                )
        data = rest + data
        cut = data.rfind(b"\n")
        if cut < 0:
            if len(data) > constants.MAX_LINE_BYTES:
                raise long_line_error(where, lines + 1)
            rest = data
            continue
        rest = data[cut + 1 :]
        if len(rest) > constants.MAX_LINE_BYTES:
            raise long_line_error(where, lines + data.count(b"\n") + 1)
        lines += data.count(b"\n", 0, cut + 1)
        yield data[: cut + 1]


def long_line_error(where: str, line: int) -> TraceError:
    return TraceError(
        f"line {line} is longer than {constants.MAX_LINE_BYTES >> 20} MiB",
        where=f"{where}:{line}",
        hint="a routing row is one short line; is this a JSONL trace? (limits:"
        " docs/limits.md)",
    )


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


INT64_MAX = (1 << 63) - 1


def fits_int64(v: int) -> bool:
    return -INT64_MAX - 1 <= v <= INT64_MAX


def is_finite(w: float) -> bool:
    try:
        return math.isfinite(w)
    except OverflowError:  # an integer too large for a float
        return False
