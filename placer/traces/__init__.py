"""Reading routing traces and load files into :class:`~placer.stats.RoutingData`.

Entry point: :func:`read_routing`.  Formats live in a registry (one module each);
built in: ``jsonl`` and ``npz`` (per token), ``load-npz``, ``load-npy``, ``load-json``
and ``load-csv`` (aggregated).  More register themselves through
:func:`register_format`.  See ``docs/traces.md`` for the formats and rules, and
``docs/limits.md`` for the limits every reader checks before it allocates.

Example::

    >>> from placer.traces import read_routing
    >>> data = read_routing("trace.jsonl.gz")            # doctest: +SKIP
    >>> data.stats.load.shape                             # doctest: +SKIP
    (64, 32, 8)
"""

from placer.traces import formats  # noqa: F401  (the built-in formats register themselves)
from placer.traces.accumulate import Accumulator, ReadOptions, RowChunk, TokenChunk
from placer.traces.chunks import PLAN_PAIR_TOKENS, TokenSample
from placer.traces.formats.jsonl import write_jsonl_trace
from placer.traces.formats.npz import read_npz_header, write_npz_trace
from placer.traces.read import read_routing
from placer.traces.registry import (
    TraceFormat,
    detect_format,
    format_names,
    get_format,
    register_format,
)

__all__ = [
    "PLAN_PAIR_TOKENS",
    "Accumulator",
    "ReadOptions",
    "RowChunk",
    "TokenChunk",
    "TokenSample",
    "TraceFormat",
    "detect_format",
    "format_names",
    "get_format",
    "read_npz_header",
    "read_routing",
    "register_format",
    "write_jsonl_trace",
    "write_npz_trace",
]
