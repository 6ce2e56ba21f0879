"""Limits (docs/limits.md) and count checks shared by the readers and
:class:`~placer.traces.accumulate.Accumulator`."""

from __future__ import annotations

from typing import Any

import numpy as np

from placer import constants
from placer.errors import TraceError


def positive_int(value: Any, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or int(value) < 1:
        raise TraceError(
            f"{name} must be a positive integer, got {value!r:.40}", where=where,
            hint=f"{name} is a whole number >= 1",
        )
    return int(value)


#: The dense per-token trace may be this many times the rows read (tokens missing from
#: layers leave holes in it); past it and MAX_LOAD_BYTES it is refused.
SPARSE_TRACE_RATIO = 8


#: Hint of every error for an input past one of placer's limits.
LIMITS_HINT = "placer's limits are in docs/limits.md; is this the right file?"


def coact_bytes(num_layers: int, aff_rows: int, width: int) -> int:
    """Bytes of the co-activation ``[layers, width, width]`` and affinity ``[aff_rows,
    width, width]`` int64 counts, and of the reused ``[width, width]`` work matrix."""
    return (num_layers + aff_rows + 1) * width * width * 8


def mib_text(nbytes: float) -> str:
    return f"{nbytes / (1 << 20):,.0f}"


def check_counts(counts: np.ndarray, name: str, where: str) -> np.ndarray:
    """Whole counts ``>= 0`` of any numeric dtype as int64; a TraceError naming the
    first bad cell of ``counts`` (NaN, infinite, fractional, negative, or past
    ``constants.MAX_TOTAL_COUNT``), checked before the conversion."""
    arr = np.asarray(counts)
    if arr.dtype == bool:
        arr = arr.astype(np.int64)
    if not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise TraceError(
            f"{name} must hold numbers, got {arr.dtype}", where=where,
            hint="counts are whole numbers of (token, expert) selections",
        )
    if arr.size == 0:
        return arr.astype(np.int64)
    if np.issubdtype(arr.dtype, np.floating):
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            raise TraceError(
                f"{name}{list(idx)} is {arr[idx]}; expected a whole count",
                where=f"{where}: {name}{list(idx)}",
                hint="counts are whole (token, expert) selections; round averaged counts",
            )
    neg = arr < 0
    if neg.any():
        idx = tuple(int(i) for i in np.argwhere(neg)[0])
        raise TraceError(
            f"{name}{list(idx)} is {arr[idx]}; counts are >= 0",
            where=f"{where}: {name}{list(idx)}",
            hint="a count is how often tokens selected the expert; it cannot be negative",
        )
    big = arr > constants.MAX_TOTAL_COUNT
    if big.any():
        idx = tuple(int(i) for i in np.argwhere(big)[0])
        raise TraceError(
            f"{name}{list(idx)} is {arr[idx]:.6g}, more than placer counts"
            f" (2^53 selections)", where=f"{where}: {name}{list(idx)}", hint=LIMITS_HINT,
        )
    return arr.astype(np.int64)
