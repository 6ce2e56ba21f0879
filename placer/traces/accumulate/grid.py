"""Windows of a trace: aligned ranges of a key (step or token index), merged pairwise.

A window is ``[start, start + width)`` of the key, with ``start = base + i * width``.
Keys arrive chunk by chunk; :meth:`WindowGrid.fit` makes room for a chunk's keys.  When
more than ``constants.MAX_WINDOWS`` windows would be needed, adjacent windows are merged
pairwise (``(0, 1), (2, 3), ...``) and the width doubles, so a trace of any length ends
with at most ``MAX_WINDOWS`` windows of equal width.  Example: steps ``0..99`` one at a
time give 50 windows of 2 steps; 1,000 tokens give 63 windows of 16.  Keys below the base
add windows in front (the base moves down by whole widths), so keys may come in any
order; the grid is aligned to the first key seen.
"""

from __future__ import annotations

import numpy as np

from placer import constants

__all__ = ["WindowGrid", "merge_pairs", "window_count_for"]


def merge_pairs(arr: np.ndarray) -> np.ndarray:
    """Sum adjacent entries along axis 0: windows ``(0, 1), (2, 3), ...``."""
    if arr.shape[0] % 2:
        arr = np.concatenate([arr, np.zeros((1, *arr.shape[1:]), dtype=arr.dtype)])
    return arr[0::2] + arr[1::2]


def window_count_for(num_keys: int, width: int = 1) -> tuple[int, int]:
    """(windows, width) that ``num_keys`` consecutive keys end with, from ``width``."""
    count = -(-num_keys // width)
    while count > constants.MAX_WINDOWS:
        width *= 2
        count = -(-num_keys // width)
    return count, width


class WindowGrid:
    """The windows of one accumulation and the arrays that have a window axis.

    Attributes
    ----------
    base: key where window 0 starts.
    width: keys per window.
    count: windows.
    merged_from: the width before the first merge, or None.
    """

    def __init__(self, width: int = 1) -> None:
        self.base = 0
        self.width = width
        self.count = 0
        self.started = False
        self.merged_from: int | None = None

    def fit(
        self, kmin: int, kmax: int, arrays: list[np.ndarray], *, align: bool
    ) -> list[np.ndarray]:
        """Make windows for keys ``kmin..kmax``; returns ``arrays`` (window axis 0) reshaped.

        ``align``: the first call puts window 0 at ``kmin`` (steps); else at key 0 (tokens).
        """
        if not self.started:
            self.started = True
            self.base = kmin if align else 0
        base, width, count = self.base, self.width, self.count
        while True:
            pre = -(-(base - kmin) // width) if kmin < base else 0
            need = max(count, (kmax - base) // width + 1) + pre
            if need <= constants.MAX_WINDOWS:
                break
            if self.merged_from is None:
                self.merged_from = width
            arrays = [merge_pairs(a) for a in arrays]
            count = -(-count // 2)
            width *= 2
        if pre:
            arrays = [np.concatenate([np.zeros((pre, *a.shape[1:]), a.dtype), a]) for a in arrays]
            base -= pre * width
            count += pre
        if need > count:
            arrays = [
                np.concatenate([a, np.zeros((need - count, *a.shape[1:]), a.dtype)])
                for a in arrays
            ]
            count = need
        self.base, self.width, self.count = base, width, count
        return arrays

    def index(self, keys: np.ndarray) -> np.ndarray:
        """Window of each key (keys must have been fitted)."""
        return (keys - self.base) // self.width

    def starts(self) -> np.ndarray:
        """``[windows]`` int64 first key of each window."""
        return self.base + np.arange(self.count, dtype=np.int64) * self.width


class Windows:
    """The windows of one accumulation: how tokens fall in them, the grid, and the tokens
    of each window.

    Parameters
    ----------
    window_tokens: windows of this many consecutive tokens, or None (the trace's steps,
        else tokens in order).

    Attributes
    ----------
    mode: ``"fixed"`` (``window_tokens``), ``"step"`` (keys are steps) or ``"order"``
        (keys are token indices); None until :meth:`start`.
    grid: the :class:`WindowGrid`.
    tokens: ``[windows]`` int64, tokens of each window.
    """

    def __init__(self, window_tokens: int | None = None) -> None:
        self.window_tokens = window_tokens
        self.mode: str | None = None
        self.grid = WindowGrid()
        self.tokens = np.zeros(0, dtype=np.int64)

    def start(self, has_step: bool) -> None:
        """Choose the mode when the first tokens come (``has_step``: they all have one)."""
        if self.window_tokens is not None:
            self.mode = "fixed"
            self.grid = WindowGrid(self.window_tokens)
        elif has_step:
            self.mode = "step"
        else:
            self.mode = "order"

    def fit(self, kmin: int, kmax: int, load: np.ndarray) -> np.ndarray:
        """Make windows for keys ``kmin..kmax`` (merging pairwise past MAX_WINDOWS);
        returns ``load`` (window axis 0) refitted with them."""
        load, self.tokens = self.grid.fit(
            kmin, kmax, [load, self.tokens], align=self.mode == "step"
        )
        return load

    def index(self, keys: np.ndarray) -> np.ndarray:
        """Window of each key (keys must have been fitted)."""
        return self.grid.index(keys)

    def add_tokens(self, windows: np.ndarray) -> None:
        """Count one token in each of ``windows`` (fitted window indices)."""
        self.tokens += np.bincount(windows, minlength=self.grid.count)
