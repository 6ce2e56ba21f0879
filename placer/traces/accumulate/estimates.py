"""Pair counts counted on a sample of the tokens (``read_routing``'s ``pair_tokens``),
fitted to the loads, which every token is counted in: :func:`fit_pairs`.

Sampled counts are unbiased estimates, but each has its own noise, and the loads bound
them exactly: a pair is counted at most as often as either of its experts is selected,
and an expert has at most ``k - 1`` partners in a token (``k - 1`` exactly when every
token of the layer selects ``k`` experts), and at most ``k`` in the next layer.  An
estimate past a bound is counts no routing can have, which the figures built on both
refuse (the remote-copy bracket of ``placer plan``).  So, layer by layer:

1. where every token selects ``k`` experts, the co-activation is scaled, symmetrically,
   until each expert's partners sum to ``(k - 1) x`` its load (iterative proportional
   fitting: each count times ``sqrt(r_i r_j)``, ``r`` the partner sums' shortfall);
2. every count is capped at the smaller load of its two experts, and a row whose sum
   passes its bound is scaled down (each count by the smaller factor of its two
   experts: both rows stay within their bounds);
3. counts are rounded down (and pairs that reach 0 dropped).

Layer affinity (ordered pairs of consecutive layers) gets steps 2 and 3, its rows bound
by ``k x`` the load in the first layer and its columns in the second.
"""

from __future__ import annotations

import numpy as np

from placer.stats import PairCounts

#: Rounds of the symmetric proportional fitting (step 1), and its tolerance on the ratio
#: of a partner sum to its target.
FIT_ROUNDS = 50
FIT_TOLERANCE = 1e-6


def fit_pairs(coact: PairCounts | None, affinity: PairCounts | None, load: np.ndarray,
              k: int, num_tokens: int) -> tuple[PairCounts | None, PairCounts | None]:
    """Co-activation (one row per layer) and layer affinity (one row per consecutive
    pair of layers) counted on a sample, fitted to ``load`` (``[layers, E]``, every
    token's selections over all windows) of ``num_tokens`` tokens with rows of ``k``
    experts (see the module)."""
    load = np.asarray(load, dtype=np.float64)
    if coact is not None:
        rows = []
        for r in range(coact.num_rows):
            complete = abs(float(load[r].sum()) - k * num_tokens) < 0.5
            rows.append(_fit_row(coact, r, load[r], load[r], k - 1, k - 1, fit=complete))
        coact = _assembled(coact, rows)
    if affinity is not None:
        rows = [_fit_row(affinity, r, load[r], load[r + 1], k, k, fit=False)
                for r in range(affinity.num_rows)]
        affinity = _assembled(affinity, rows)
    return coact, affinity


def _fit_row(pairs: PairCounts, row: int, load_a: np.ndarray, load_b: np.ndarray,
             per_a: int, per_b: int, *, fit: bool) -> tuple[np.ndarray, np.ndarray]:
    """Keys and counts of one row, fitted: partners of expert ``i`` (first of a pair)
    within ``per_a x load_a[i]``, of ``j`` (second) within ``per_b x load_b[j]``;
    ``fit``: first scaled to those sums (a symmetric row)."""
    i, j, counts = pairs.pairs(row)
    e = pairs.num_experts
    c = counts.astype(np.float64)
    sym = pairs.symmetric

    def sums() -> tuple[np.ndarray, np.ndarray]:
        a = np.bincount(i, weights=c, minlength=e)
        b = np.bincount(j, weights=c, minlength=e)
        return (a + b, a + b) if sym else (a, b)

    if fit and sym and c.size:
        target = per_a * load_a
        for _ in range(FIT_ROUNDS):
            got, _ = sums()
            ratio = np.divide(target, got, out=np.ones(e), where=got > 0)
            if np.abs(ratio[got > 0] - 1.0).max(initial=0.0) <= FIT_TOLERANCE:
                break
            c *= np.sqrt(ratio[i] * ratio[j])
    np.minimum(c, np.minimum(load_a[i], load_b[j]), out=c)
    got_a, got_b = sums()
    fa = np.minimum(1.0, np.divide(per_a * load_a, got_a, out=np.ones(e), where=got_a > 0))
    fb = np.minimum(1.0, np.divide(per_b * load_b, got_b, out=np.ones(e), where=got_b > 0))
    if sym:
        c *= np.minimum(fa[i], fa[j])
    else:
        c *= np.minimum(fa[i], fb[j])
    whole = np.floor(c + 1e-9).astype(np.int64)
    keep = whole > 0
    return (i * e + j)[keep], whole[keep]


def _assembled(pairs: PairCounts, rows: list[tuple[np.ndarray, np.ndarray]]) -> PairCounts:
    return PairCounts.from_rows(pairs.num_experts, [k for k, _ in rows], [c for _, c in rows],
                                symmetric=pairs.symmetric)
