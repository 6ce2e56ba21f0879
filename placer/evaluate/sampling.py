"""Batches sampled from aggregated statistics, when no per-token trace is at hand.

Each sampled token draws its ``top_k`` experts of a layer without replacement:

1. the first expert from the window's load distribution ``p[e] = load[w, l, e] / sum``;
2. every further expert from the mixture ``mean over already drawn i of Q[i, :]``
   restricted to experts not drawn yet, where ``Q[i, :]`` is the co-activation
   conditional of expert ``i``::

       Q[i, j] = coact[i, j] / ((top_k - 1) * load_all[i])  +  residual[i] * p[j]
       residual[i] = 1 - sum_j coact[i, j] / ((top_k - 1) * load_all[i])   (clipped at 0)

   (``load_all`` is the load over all windows, as co-activation is counted over all
   windows).  With complete co-activation a selection of ``i`` co-occurs with ``top_k -
   1`` others, so the first conditional draw keeps every expert's marginal share; the
   residual spreads what thresholded or missing pairs leave out by load.  Without
   co-activation ``Q[i, :] = p``: successive sampling proportional to load.

The restricted mixture is sampled exactly: by rejection first (pick one drawn expert
uniformly, draw from its row, redraw on a repeat), and for the tokens still without a
pick after ``SAMPLING_MAX_ROUNDS`` rounds, directly from the restricted weights (if the
mixture puts no mass on undrawn experts, from ``p`` restricted).  A window-layer whose
load is zero yields no selections (-1); one with fewer than ``top_k`` loaded experts
yields that many.

Known bias: drawing without replacement in proportion to the *marginal* loads
under-represents the hottest experts when they are chosen by most tokens (an expert
picked by every token has share ``1/top_k`` of the first draw, not 1).  Co-activation
corrects part of it; per-token traces need no sampling.
"""

from __future__ import annotations

import numpy as np

from placer import constants

#: Keep ``row + u`` below ``row + 1`` in the flattened inverse-CDF lookup.
_U_MAX = 1.0 - 1e-9
#: Tokens per chunk when drawing densely after rejection gave up.
_EXACT_CHUNK = 4096


def conditional_matrix(
    coact: np.ndarray, load_all: np.ndarray, p: np.ndarray, top_k: int
) -> np.ndarray:
    """``[E, E]`` float64 rows ``Q[i, :]``, each a distribution over experts (see module).

    Parameters
    ----------
    coact: ``[E, E]`` same-token pair counts of the layer (over all windows).
    load_all: ``[E]`` load of the layer over all windows.
    p: ``[E]`` the window's load distribution (sums to 1).
    """
    coact = np.asarray(coact, dtype=np.float64)
    expected = (top_k - 1) * np.asarray(load_all, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(expected[:, None] > 0, coact / expected[:, None], 0.0)
    np.fill_diagonal(q, 0.0)
    rowsum = q.sum(axis=1)
    over = rowsum > 1.0
    q[over] /= rowsum[over, None]
    residual = np.clip(1.0 - q.sum(axis=1), 0.0, 1.0)
    q += residual[:, None] * p[None, :]
    return q


def _flat_cdf(rows: np.ndarray) -> np.ndarray:
    """Row r's CDF shifted by r, flattened: one ``searchsorted`` samples any row."""
    sums = rows.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        cdf = np.where(sums > 0, np.cumsum(rows, axis=1) / np.where(sums > 0, sums, 1), 1.0)
    cdf[:, -1] = 1.0
    return (np.arange(rows.shape[0], dtype=np.float64)[:, None] + cdf).ravel()


def _draw(
    flat: np.ndarray, row: np.ndarray, num_experts: int, rng: np.random.Generator
) -> np.ndarray:
    u = np.minimum(rng.random(row.size), _U_MAX)
    idx = np.searchsorted(flat, row + u, side="right")
    return np.minimum(idx - row * num_experts, num_experts - 1)


def sample_topk(
    p: np.ndarray,
    q: np.ndarray | None,
    num_tokens: int,
    top_k: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """``[num_tokens, top_k]`` int64 sampled expert ids, -1 where none (see module).

    Parameters
    ----------
    p: ``[E]`` non-negative weights of the window's experts (need not sum to 1).
    q: ``[E, E]`` conditional rows from :func:`conditional_matrix`, or None.
    """
    p = np.asarray(p, dtype=np.float64)
    num_experts = p.size
    out = np.full((num_tokens, top_k), -1, dtype=np.int64)
    picks = min(top_k, int(np.count_nonzero(p > 0)))
    if picks == 0 or num_tokens == 0:
        return out
    p = p / p.sum()
    rows = np.vstack([q, p[None]]) if q is not None else p[None]
    flat = _flat_cdf(rows)
    p_row = rows.shape[0] - 1
    out[:, 0] = _draw(flat, np.full(num_tokens, p_row), num_experts, rng)
    rounds = constants.SAMPLING_MAX_ROUNDS
    for s in range(1, picks):
        need = np.arange(num_tokens)
        for _ in range(rounds):
            if q is not None:
                parent = out[need, rng.integers(0, s, need.size)]
            else:
                parent = np.full(need.size, p_row)
            j = _draw(flat, parent, num_experts, rng)
            repeat = (out[need, :s] == j[:, None]).any(axis=1)
            out[need[~repeat], s] = j[~repeat]
            need = need[repeat]
            if need.size == 0:
                break
        for lo in range(0, need.size, _EXACT_CHUNK):
            chunk = need[lo : lo + _EXACT_CHUNK]
            out[chunk, s] = _draw_exact(out[chunk, :s], rows, p_row, q is not None, rng)
    return out


def _draw_exact(
    drawn: np.ndarray, rows: np.ndarray, p_row: int, mixture: bool, rng: np.random.Generator
) -> np.ndarray:
    """One pick per token from the restricted mixture, computed densely (``[n, E]``)."""
    n, s = drawn.shape
    if mixture:
        weights = np.zeros((n, rows.shape[1]))
        for j in range(s):
            weights += rows[drawn[:, j]]
    else:
        weights = np.repeat(rows[p_row][None], n, axis=0)
    weights[np.arange(n)[:, None], drawn] = 0.0
    empty = weights.sum(axis=1) <= 0
    if empty.any():  # all the mixture's mass is on drawn experts: fall back to the load
        weights[empty] = rows[p_row]
        weights[np.flatnonzero(empty)[:, None], drawn[empty]] = 0.0
    cdf = np.cumsum(weights, axis=1)
    u = rng.random(n) * cdf[:, -1]
    pick: np.ndarray = np.minimum((cdf <= u[:, None]).sum(axis=1), rows.shape[1] - 1)
    return pick


def sampled_batch_windows(window_range: tuple[int, int], num_batches: int) -> np.ndarray:
    """``[num_batches]`` int64 window each sampled batch is drawn from.

    Batches are spread over the range's windows in order, in equal shares:
    batch ``b`` uses window ``start + (b * num_windows) // num_batches``.
    """
    start, stop = window_range
    b = np.arange(num_batches, dtype=np.int64)
    return start + (b * (stop - start)) // num_batches
