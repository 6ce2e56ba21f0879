"""Window ranges: which part of a trace a placement is fitted on, and which part judges it.

A routing trace is cut into windows in time (``ExpertStats.load[w]``).  Held-out
evaluation fits a placement on windows ``fit = A:B`` and judges it on ``eval = C:D``.
Ranges are Python-style ``START:STOP`` over window indices (STOP excluded); every
command parses and checks them here, with the same messages.

Default split (no ranges given, at least two windows): the last
``max(1, round(W * HOLDOUT_FRACTION))`` windows are held out and the windows before
them are the fitted part (``constants.HOLDOUT_FRACTION = 0.25``: 8 windows give
``fit 0:6``, ``held-out 6:8``; 2 windows give ``0:1`` and ``1:2``).  Plan, evaluate
and compare use the same rule, so they report the same parts.

:func:`token_windows` maps a per-token trace onto the windows of its statistics.
"""

from __future__ import annotations

import re

import numpy as np

from placer import constants
from placer.errors import DataError, Param, UsageError
from placer.stats.routing import ExpertStats, RoutingTrace

#: A resolved range ``(start, stop)``, ``0 <= start < stop <= W``.
WindowRange = tuple[int, int]
#: A range as written: either end may be open (None).
OpenRange = tuple[int | None, int | None]

_RANGE = re.compile(r"^\s*(\d*)\s*:\s*(\d*)\s*$")


def parse_window_range(text: str, *, option: str = Param("fit")) -> OpenRange:
    """``"A:B"``, ``"A:"`` or ``":B"`` -> ``(A, B)`` with None for an open end.

    ``option`` names where the text came from in the error (a flag or a field).

    >>> parse_window_range("2:5")
    (2, 5)
    >>> parse_window_range(":3")
    (None, 3)
    """
    match = _RANGE.match(text)
    if match is None or text.strip() == ":":
        raise UsageError(
            f"expected a window range START:STOP, got {text!r}", where=option,
            hint="for example 0:8 (windows 0 to 7) or 4: (window 4 onwards)",
        )
    start, stop = (int(g) if g else None for g in match.groups())
    return start, stop


def resolve_window_range(
    rng: tuple[int | None, int | None], num_windows: int, *, option: str = Param("held_out")
) -> WindowRange:
    """Fill open ends with ``0`` / ``num_windows`` and check ``0 <= START < STOP <= W``."""
    start = 0 if rng[0] is None else rng[0]
    stop = num_windows if rng[1] is None else rng[1]
    hint = f"ranges are START:STOP with 0 <= START < STOP <= {num_windows}"
    if start > stop:
        swapped = f"write it {stop}:{start}; " if start <= num_windows else ""
        raise UsageError(f"window range {start}:{stop} is reversed", where=option,
                         hint=swapped + hint)
    if start == stop:
        raise UsageError(f"window range {start}:{stop} is empty", where=option, hint=hint)
    if not 0 <= start < stop <= num_windows:
        raise UsageError(
            f"window range {start}:{stop} is outside the trace's {num_windows}"
            f" window{'s' if num_windows != 1 else ''}", where=option, hint=hint)
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
        f = resolve_window_range(fit, num_windows, option=Param("fit"))
        parts.append(("fit", f))
        if held_out is None and f[1] < num_windows:
            parts.append(("held-out", (f[1], num_windows)))
    if held_out is not None:
        held = resolve_window_range(held_out, num_windows, option=Param("held_out"))
        parts.append(("held-out", held))
    return parts


def token_windows(trace: RoutingTrace, stats: ExpertStats) -> np.ndarray:
    """``[tokens]`` int64, the window of ``stats`` each token of ``trace`` belongs to.

    Windows cut by step (``window_starts`` holds each window's first step) are matched
    by step; windows of consecutive tokens by position (cumulative ``stats.tokens``).
    The first rule whose per-window token counts equal ``stats.tokens`` wins.  A sample
    (``trace.sample``) says each token's window itself: that of its batch's first token,
    so a batch is judged whole.

    Raises DataError when neither matches (the trace and its statistics disagree).
    """
    num_windows = stats.num_windows
    if trace.sample is not None:
        if trace.sample.num_windows != num_windows:
            raise DataError(
                f"the sampled per-token trace was drawn over {trace.sample.num_windows}"
                f" windows, its statistics have {num_windows}",
                hint="judge a sample with the statistics it was read with",
            )
        return trace.sample.window.astype(np.int64, copy=False)
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
