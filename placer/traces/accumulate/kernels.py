"""Counting kernels of :class:`~placer.traces.accumulate.Accumulator`: load and pair
counts into flat matrices, and row checks on expert arrays."""

from __future__ import annotations

import numpy as np


def load_into(
    flat: np.ndarray, base: np.ndarray, x: np.ndarray, has_none: bool, scratch: np.ndarray
) -> None:
    """``flat[base[r] + x[i, r]] += 1`` for every column ``r`` and ``x[i, r] >= 0``.

    ``x [k, n]`` expert ids (-1 none), ``base [n]``; ``scratch``: intp work space of at
    least ``BLOCK_CODES`` entries.
    """
    k, n = x.shape
    step = max(1, BLOCK_CODES // k)
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        codes = scratch[: k * (hi - lo)].reshape(k, hi - lo)
        np.add(base[lo:hi], x[:, lo:hi], out=codes)
        np.add.at(flat, codes[x[:, lo:hi] >= 0] if has_none else codes.reshape(-1), 1)


def pairs_into(
    flat: np.ndarray, a: np.ndarray, b: np.ndarray, width: int, scratch: np.ndarray, *,
    triangle: bool, weight: int = 1,
) -> None:
    """``flat[a[i, r] * width + b[j, r]] += weight`` for every column ``r`` and pair
    ``(i, j)``.

    ``a [ka, n]``, ``b [kb, n]`` expert ids (>= 0) one column per row of experts;
    ``flat`` a ``[width, width]`` count matrix, flattened; ``triangle``: ``a`` is ``b``
    and only pairs ``j > i`` count (pairs within one row).  Codes are made in blocks of
    at most ``BLOCK_CODES`` in ``scratch`` (intp, ``3 x BLOCK_CODES``), so they stay in
    cache and nothing is allocated.  ``np.add.at`` (one pass) beats ``np.bincount`` (a
    min/max pass, a count, then an add) and a GEMM on one-hot rows (``2 x E^2`` flops
    a row against ``k^2`` increments).
    """
    ka, n = a.shape
    kb = b.shape[0]
    codes, head = scratch[:BLOCK_CODES], scratch[BLOCK_CODES:]
    step = max(1, BLOCK_CODES // (max(kb - 1, 1) if triangle else ka * kb))
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        m = hi - lo
        ha = head[: ka * m].reshape(ka, m)
        np.multiply(a[:, lo:hi], width, out=ha, dtype=np.intp)
        if triangle:
            for i in range(ka - 1):
                out = codes[: (kb - 1 - i) * m].reshape(kb - 1 - i, m)
                np.add(ha[i], b[i + 1 :, lo:hi], out=out)
                np.add.at(flat, codes[: out.size], weight)
        else:
            out3 = codes[: ka * kb * m].reshape(ka, kb, m)
            np.add(ha[:, None, :], b[None, :, lo:hi], out=out3)
            np.add.at(flat, codes[: ka * kb * m], weight)


#: Codes per np.add.at call of :func:`pairs_into` and :func:`load_into` (512 KB).
BLOCK_CODES = 1 << 16


def has_duplicate(xt: np.ndarray) -> bool:
    """Whether some row names an expert twice: ``xt [k, ...]`` expert-major, -1 = none."""
    for i in range(xt.shape[0] - 1):
        eq = xt[i + 1 :] == xt[i]
        if eq.any() and (eq & (xt[i] >= 0)).any():
            return True
    return False


def sorted_by(major: np.ndarray, minor: np.ndarray) -> bool:
    """Whether rows are in ``(major, minor)`` order, ``minor`` strictly rising within a
    run of equal ``major``."""
    step = major[1:] - major[:-1]
    return bool((step >= 0).all() and ((step > 0) | (minor[1:] > minor[:-1])).all())
