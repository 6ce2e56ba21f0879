"""Per-token JSONL traces (``.jsonl``, ``.jsonl.gz``): the reader (:mod:`.read`, which
registers the format), the line rules and aliases real logs use (:mod:`.lines`), the
fast scanner of uniform lines (:mod:`.scan`) and the writer (:mod:`.write`)."""

from placer.traces.formats.jsonl import read
from placer.traces.formats.jsonl.lines import ALIASES, HEADER_FORMAT, HEADER_VERSION
from placer.traces.formats.jsonl.write import header_object, iter_token_chunks, write_jsonl_trace

__all__ = ["ALIASES", "HEADER_FORMAT", "HEADER_VERSION", "header_object", "iter_token_chunks",
           "read", "write_jsonl_trace"]
