"""The accumulator: one facade (:class:`Accumulator`) over peer parts that every reader
streams chunks into.  See :mod:`placer.traces.accumulate.accumulator` for the parts."""

from placer.traces.accumulate.accumulator import Accumulator, check_counts
from placer.traces.chunks import ReadOptions, RowChunk, TokenChunk

__all__ = ["Accumulator", "ReadOptions", "RowChunk", "TokenChunk", "check_counts"]
