"""Which windows of a trace a placement is judged on, token by token.

The window ranges themselves (parsing, checks, the default fit/held-out split) are
:mod:`placer.windows`'s; this module maps a per-token trace onto its windows.
"""

from __future__ import annotations

import numpy as np

from placer.errors import DataError
from placer.stats import ExpertStats, RoutingTrace
from placer.windows import (
    WindowRange,
    default_split,
    evaluation_parts,
    parse_window_range,
    resolve_window_range,
)

__all__ = ["WindowRange", "default_split", "evaluation_parts", "parse_window_range",
           "resolve_window_range", "token_windows"]


def token_windows(trace: RoutingTrace, stats: ExpertStats) -> np.ndarray:
    """``[tokens]`` int64, the window of ``stats`` each token of ``trace`` belongs to.

    Windows cut by step (``window_starts`` holds each window's first step) are matched
    by step; windows of consecutive tokens by position (cumulative ``stats.tokens``).
    The first rule whose per-window token counts equal ``stats.tokens`` wins.

    Raises DataError when neither matches (the trace and its statistics disagree).
    """
    num_windows = stats.num_windows
    if num_windows == 1:
        return np.zeros(trace.num_tokens, dtype=np.int64)
    expected = np.asarray(stats.tokens, dtype=np.int64)
    if stats.window_starts is not None and trace.has_steps:
        starts = np.asarray(stats.window_starts, dtype=np.int64)
        if np.all(np.diff(starts) > 0):
            by_step = np.searchsorted(starts, trace.step, side="right") - 1
            ok = (by_step >= 0).all()
            if ok and np.array_equal(np.bincount(by_step, minlength=num_windows), expected):
                return by_step.astype(np.int64)
    if int(expected.sum()) == trace.num_tokens:
        bounds = np.cumsum(expected)
        return np.searchsorted(bounds, np.arange(trace.num_tokens), side="right").astype(np.int64)
    raise DataError(
        f"the per-token trace ({trace.num_tokens} tokens) does not match its statistics"
        f" ({int(expected.sum())} tokens in {num_windows} windows)",
        hint="read the trace again with keep_tokens=True, without merging other files",
    )
