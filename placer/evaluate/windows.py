"""Window ranges: which part of a trace a placement was fitted on, and which part judges it.

A routing trace is cut into windows in time (``ExpertStats.load[w]``).  Held-out
evaluation fits a placement on windows ``fit = A:B`` and judges it on ``eval = C:D``.
Ranges are Python-style ``START:STOP`` over window indices (STOP excluded).

Default split (no ranges given, at least two windows): the last
``max(1, round(W * HOLDOUT_FRACTION))`` windows are held out and the windows before
them are the fitted part (``constants.HOLDOUT_FRACTION = 0.25``: 8 windows give
``fit 0:6``, ``held-out 6:8``; 2 windows give ``0:1`` and ``1:2``).  The comparison
command uses the same constant, so both report the same parts.
"""

from __future__ import annotations

import numpy as np

from placer import constants
from placer.errors import DataError, UsageError
from placer.stats import ExpertStats, RoutingTrace

WindowRange = tuple[int, int]


def parse_window_range(text: str, *, option: str = "--eval") -> tuple[int | None, int | None]:
    """``"A:B"`` -> ``(A, B)``; either end may be empty (``"4:"``, ``":4"``) and is then None.

    The same parser as ``placer plan --fit`` (:func:`placer.planning.parse_window_range`);
    raises UsageError naming ``option`` when the text is not ``START:STOP``.
    """
    from placer.planning import parse_window_range as parse

    return parse(text, option)


def resolve_window_range(
    rng: tuple[int | None, int | None], num_windows: int, *, option: str = "--eval"
) -> WindowRange:
    """Fill open ends with ``0`` / ``num_windows`` and check ``0 <= START < STOP <= W``."""
    start = 0 if rng[0] is None else rng[0]
    stop = num_windows if rng[1] is None else rng[1]
    if not 0 <= start < stop <= num_windows:
        raise UsageError(
            f"window range {start}:{stop} is outside the trace's {num_windows} windows",
            where=option,
            hint=f"ranges are START:STOP with 0 <= START < STOP <= {num_windows}",
        )
    return start, stop


def default_split(num_windows: int) -> tuple[WindowRange, WindowRange] | None:
    """``(fit, held_out)`` ranges of the default split, or None with fewer than 2 windows."""
    if num_windows < 2:
        return None
    held = max(1, round(num_windows * constants.HOLDOUT_FRACTION))
    held = min(held, num_windows - 1)
    return (0, num_windows - held), (num_windows - held, num_windows)


def evaluation_parts(
    num_windows: int,
    fit: tuple[int | None, int | None] | None = None,
    held_out: tuple[int | None, int | None] | None = None,
) -> list[tuple[str, WindowRange]]:
    """The parts an evaluation reports, as ``[(name, (start, stop))]``.

    - no ranges: ``[("fit", ...), ("held-out", ...)]`` by :func:`default_split`, or
      ``[("all", (0, W))]`` for a single window;
    - ``fit`` only: the fitted part, and the windows after it as held-out when any remain;
    - ``held_out`` only: that part alone;
    - both: both parts, as given (overlap is allowed: the caller may warn).
    """
    if fit is None and held_out is None:
        split = default_split(num_windows)
        if split is None:
            return [("all", (0, num_windows))]
        return [("fit", split[0]), ("held-out", split[1])]
    parts: list[tuple[str, WindowRange]] = []
    if fit is not None:
        f = resolve_window_range(fit, num_windows, option="--fit")
        parts.append(("fit", f))
        if held_out is None and f[1] < num_windows:
            parts.append(("held-out", (f[1], num_windows)))
    if held_out is not None:
        parts.append(("held-out", resolve_window_range(held_out, num_windows, option="--eval")))
    return parts


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
