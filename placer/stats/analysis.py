"""Figures that describe routing statistics: skew, hot experts, pairs, drift, affinity.

Everything here is pure: functions take :class:`~placer.stats.ExpertStats` (or numpy
arrays) and return numbers or JSON-ready dicts.  ``placer stats`` renders
:func:`summarize`'s result.

Definitions (``x = load[l]`` of one layer, ``E`` experts, ``k = top_k``):

- *selections* ``S = sum(x)``: (token, expert) selections in the layer;
  *tokens of the layer* ``T = S / k`` (exact when every token selects ``k`` experts).
- *max/mean* ``= max(x) / mean(x)``; 1 for a uniform load.
- *CV* ``= std(x) / mean(x)``, the coefficient of variation; 0 for a uniform load.
- *top-1% share*: the share of ``S`` of the ``ceil(E / 100)`` most loaded experts.
- *Gini* ``= sum_ij |x_i - x_j| / (2 E^2 mean(x))``, in ``[0, 1 - 1/E]``: 0 uniform,
  ``1 - 1/E`` when one expert takes all the load.
- *normalized entropy* ``= -sum_i p_i ln p_i / ln E`` with ``p = x / S``, in ``[0, 1]``:
  1 uniform, 0 when one expert takes all the load.
- *share* of an expert ``= x_i / S``.
- *lift* of a same-layer pair ``= P(i, j) / (P(i) P(j))`` with per-token probabilities
  ``P(i) = x_i / T`` and ``P(i, j) = coact_ij / T``, i.e. ``coact_ij * T / (x_i x_j)``;
  1 means the pair meets as often as independent choices would, above 1 more often.
- *hot set* of a window: the ``N`` experts with the most load (ties: lower id first);
  *hot-set Jaccard* between consecutive windows ``= |A & B| / |A | B|`` (1: unchanged).
- *load TV* between consecutive windows: total-variation distance
  ``0.5 * sum_i |p_i - q_i|`` of the normalized loads (0: identical, 1: disjoint).
  Windows with no load in the layer are left out of drift.
- *affinity lift* of ``(i in layer row l, j in row l + 1)``
  ``= P(i, j) / (P(i) P(j))`` with ``P(i, j) = A_ij / T_pair``, ``T_pair = sum(A) / k^2``
  (tokens seen in both layers), ``P(i) = load[l, i] / T_l``, ``P(j) = load[l+1, j] / T_l+1``.
- *co-activation coverage* ``= sum(coact) / ((k - 1) S)``: 1 for complete pair counts of
  tokens with ``k`` distinct experts; less when the pair counts were thresholded.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from placer import constants
from placer.errors import Param, UsageError
from placer.stats import ExpertStats, PairCounts

__all__ = [
    "affinity_lift",
    "coefficient_of_variation",
    "gini",
    "hot_set",
    "jaccard",
    "max_over_mean",
    "normalized_entropy",
    "pair_lift",
    "summarize",
    "top_pairs",
    "top_share",
    "total_variation",
]

SUMMARY_FORMAT = "placer-stats-summary"
SUMMARY_VERSION = 1


# -- per-vector figures ----------------------------------------------------------------


def max_over_mean(load: np.ndarray) -> float:
    """``max / mean`` of ``load: [experts]``; NaN when the load is all zero."""
    x = np.asarray(load, dtype=np.float64)
    mean = x.mean() if x.size else 0.0
    return float(x.max() / mean) if mean > 0 else math.nan


def gini(load: np.ndarray) -> float:
    """Gini coefficient of ``load: [experts]``, in ``[0, 1 - 1/E]``; 0 when all zero.

    Computed from the sorted values: ``G = 2 sum_i i x_(i) / (E S) - (E + 1) / E`` with
    ``i = 1..E`` ascending, equal to ``sum_ij |x_i - x_j| / (2 E^2 mean)``.
    """
    x = np.sort(np.asarray(load, dtype=np.float64).ravel())
    n, total = x.size, x.sum()
    if n == 0 or total <= 0:
        return 0.0
    ranks = np.arange(1, n + 1, dtype=np.float64)
    g = 2.0 * float((ranks * x).sum()) / (n * total) - (n + 1) / n
    return min(max(g, 0.0), 1.0)


def coefficient_of_variation(load: np.ndarray) -> float:
    """``std / mean`` of ``load: [experts]``; NaN when the load is all zero."""
    x = np.asarray(load, dtype=np.float64).ravel()
    mean = x.mean() if x.size else 0.0
    return float(x.std() / mean) if mean > 0 else math.nan


def top_share(load: np.ndarray, fraction: float = 0.01) -> float:
    """Share of the load of the ``ceil(fraction x E)`` most loaded experts (at least one);
    NaN when the load is all zero."""
    x = np.asarray(load, dtype=np.float64).ravel()
    total = x.sum()
    if total <= 0:
        return math.nan
    n = max(1, math.ceil(fraction * x.size))
    return float(np.sort(x)[::-1][:n].sum() / total)


def normalized_entropy(load: np.ndarray) -> float:
    """Shannon entropy of ``load / sum(load)`` over ``ln(E)``, in ``[0, 1]``.

    1 for one expert (nothing to balance) and NaN when the load is all zero.
    """
    x = np.asarray(load, dtype=np.float64).ravel()
    total = x.sum()
    if total <= 0:
        return math.nan
    if x.size <= 1:
        return 1.0
    p = x[x > 0] / total
    h = float(-(p * np.log(p)).sum() / math.log(x.size))
    return min(max(h, 0.0), 1.0)


def hot_set(load: np.ndarray, n: int) -> np.ndarray:
    """Ids of the ``n`` experts with the most load, ties broken by lower id, ``[n]`` int64."""
    x = np.asarray(load).ravel()
    order = np.lexsort((np.arange(x.size), -x.astype(np.float64)))
    return order[: min(n, x.size)].astype(np.int64)


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """``|a & b| / |a | b|`` of two id sets; 1 when both are empty."""
    sa, sb = set(np.asarray(a).tolist()), set(np.asarray(b).tolist())
    union = sa | sb
    return len(sa & sb) / len(union) if union else 1.0


def total_variation(load_a: np.ndarray, load_b: np.ndarray) -> float:
    """Total-variation distance ``0.5 sum |p - q|`` of two loads, each normalized to sum 1."""
    a = np.asarray(load_a, dtype=np.float64)
    b = np.asarray(load_b, dtype=np.float64)
    sa, sb = a.sum(), b.sum()
    if sa <= 0 or sb <= 0:
        return math.nan
    return float(0.5 * np.abs(a / sa - b / sb).sum())


# -- pairs ------------------------------------------------------------------------------


def pair_lift(coact: np.ndarray, load: np.ndarray, top_k: int) -> np.ndarray:
    """Lift of every same-layer pair: ``coact_ij * T / (load_i load_j)``, ``T = sum(load) / k``.

    Parameters
    ----------
    coact: ``[experts, experts]`` int, tokens selecting both experts.
    load: ``[experts]`` int, selections of each expert.
    top_k: experts selected per token.

    Returns
    -------
    ``[experts, experts]`` float64; NaN where an expert of the pair has no load.
    """
    x = np.asarray(load, dtype=np.float64)
    tokens = x.sum() / top_k
    denom = np.outer(x, x)
    with np.errstate(divide="ignore", invalid="ignore"):
        lift = np.asarray(coact, dtype=np.float64) * tokens / denom
    lift[denom <= 0] = math.nan
    return lift


def affinity_lift(
    affinity: np.ndarray, load_a: np.ndarray, load_b: np.ndarray, top_k: int
) -> np.ndarray:
    """Lift of cross-layer pairs ``(i in layer a, j in the next layer b)``.

    Parameters
    ----------
    affinity: ``[experts, experts]`` int, tokens selecting ``i`` in layer a and ``j`` in b.
    load_a, load_b: ``[experts]`` int, selections in each layer.
    top_k: experts selected per token per layer.

    Returns
    -------
    ``[experts, experts]`` float64 ``(A_ij / T_pair) / ((a_i / T_a) (b_j / T_b))`` with
    ``T_pair = sum(A) / k^2`` and ``T_a = sum(a) / k``; NaN where a load is zero.
    """
    a = np.asarray(load_a, dtype=np.float64)
    b = np.asarray(load_b, dtype=np.float64)
    aff = np.asarray(affinity, dtype=np.float64)
    t_pair = aff.sum() / top_k**2
    t_a, t_b = a.sum() / top_k, b.sum() / top_k
    denom = np.outer(a, b) * t_pair
    with np.errstate(divide="ignore", invalid="ignore"):
        lift = aff * t_a * t_b / denom
    lift[denom <= 0] = math.nan
    return lift


def top_pairs(counts: np.ndarray, n: int, *, symmetric: bool = True) -> list[tuple[int, int]]:
    """The ``n`` pairs with the highest positive count, ties broken by lower ids.

    Parameters
    ----------
    counts: ``[experts, experts]``; when ``symmetric`` only ``i < j`` is considered.
    n: how many pairs at most.
    """
    c = np.asarray(counts)
    if symmetric:
        i, j = np.triu_indices(c.shape[0], k=1)
    else:
        i, j = np.indices(c.shape).reshape(2, -1)
    best = _top_of(i, j, c[i, j], n)
    return [(int(i[o]), int(j[o])) for o in best]


def _top_of(i: np.ndarray, j: np.ndarray, vals: np.ndarray, n: int) -> np.ndarray:
    """Indices of the ``n`` pairs ``(i, j)`` with the highest positive ``vals``, ties
    broken by lower ids (see :func:`top_pairs`)."""
    keep = np.flatnonzero(vals > 0)
    if keep.size > n:
        # Cut to candidates first: the n-th largest value and everything tied with it.
        cut = np.partition(vals[keep], keep.size - n)[keep.size - n]
        keep = keep[vals[keep] >= cut]
    order = np.lexsort((j[keep], i[keep], -vals[keep].astype(np.float64)))[:n]
    out: np.ndarray = keep[order]
    return out


# -- the summary --------------------------------------------------------------------------


def summarize(
    stats: ExpertStats,
    *,
    top: int = 5,
    layers: list[int] | np.ndarray | None = None,
    hot_set_size: int | None = None,
) -> dict[str, Any]:
    """All figures of ``placer stats`` as a JSON-ready dict.

    Parameters
    ----------
    stats: the statistics to describe.
    top: hottest experts and strongest pairs listed per layer (and overall).
    layers: absolute layer ids to keep (default all); unknown ids raise UsageError.
    hot_set_size: ``N`` of the hot sets compared between windows; default
        ``ceil(E * constants.DRIFT_HOT_SET_FRACTION)``.

    Returns
    -------
    ``{"format", "version", "totals", "overall", "layers": [...], "affinity", "warnings"}``;
    see docs/stats.md for every key.  Undefined figures (no load, one window) are None.
    """
    if top < 1:
        raise UsageError(f"top must be at least 1, got {top}", where=Param("top"))
    if hot_set_size is not None and hot_set_size < 1:
        raise UsageError(f"hot set size must be at least 1, got {hot_set_size}")
    totals = _totals(stats)
    if layers is not None:
        stats = stats.select_layers(list(layers))
    e = stats.num_experts
    n_hot = hot_set_size or max(1, math.ceil(e * constants.DRIFT_HOT_SET_FRACTION))
    n_hot = min(n_hot, e)
    warnings: list[str] = list(stats.warnings)
    if stats.provenance.synthetic and not any("synthetic" in w for w in warnings):
        warnings.append("the input declares itself synthetic: figures describe a generator")

    total_load = stats.mean_load
    per_layer = []
    for row in range(stats.num_layers):
        entry = _layer_entry(stats, row, total_load, top, n_hot)
        per_layer.append(entry)
        if entry["selections"] == 0:
            warnings.append(f"layer {entry['layer']} has no load")
    coverage = [x["coact_coverage"] for x in per_layer if x["coact_coverage"] is not None]
    if coverage and min(coverage) < constants.COACT_COVERAGE_WARN:
        warnings.append(
            f"co-activation is partial (coverage {min(coverage):.2f} of (top_k - 1) x load at "
            "worst): pair counts were thresholded, lifts of missing pairs are unknown"
        )
    if stats.num_windows < 2:
        warnings.append("one window only: drift needs at least two (try `window_tokens`)")

    affinity = None
    if stats.layer_affinity is not None and stats.layer_affinity.num_rows > 0:
        affinity = _affinity(stats.layer_affinity, stats, total_load, top)
    return {
        "format": SUMMARY_FORMAT,
        "version": SUMMARY_VERSION,
        "totals": totals,
        "overall": _overall(per_layer, total_load, stats, top, affinity, n_hot),
        "layers": per_layer,
        "affinity": affinity,
        "warnings": warnings,
    }


def _totals(stats: ExpertStats) -> dict[str, Any]:
    prov = stats.provenance
    return {
        "tokens": stats.total_tokens,
        "selections": int(stats.load.sum()),
        "rows_read": prov.rows_read,
        "rows_skipped": {reason: int(n) for reason, n in prov.rows_skipped},
        "rows_skipped_total": prov.skipped_total,
        "windows": stats.num_windows,
        "layers": stats.num_layers,
        "experts": stats.num_experts,
        "top_k": stats.top_k,
        "sources": list(prov.sources),
        "format": prov.format,
        "model": prov.model,
        "synthetic": prov.synthetic,
        "has_coact": stats.coact is not None,
        "has_layer_affinity": stats.layer_affinity is not None,
    }


def _nan_to_none(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _layer_entry(
    stats: ExpertStats, row: int, total_load: np.ndarray, top: int, n_hot: int
) -> dict[str, Any]:
    x = total_load[row]
    k = stats.top_k
    selections = int(x.sum())
    hottest = [
        {"expert": int(i), "load": int(x[i]), "share": x[i] / selections if selections else None}
        for i in hot_set(x, top)
    ]
    pairs = None
    coverage = None
    if stats.coact is not None:
        # from the sparse pairs, as pair_lift and top_pairs of the dense matrix would
        i, j, c = stats.coact.pairs(row)
        xf = np.asarray(x, dtype=np.float64)
        tokens = xf.sum() / k
        pairs = [
            {"experts": [int(i[o]), int(j[o])], "count": int(c[o]),
             "lift": _ratio(float(c[o]) * tokens, float(xf[i[o]] * xf[j[o]]))}
            for o in _top_of(i, j, c, top)
        ]
        if selections and k > 1:
            coverage = float(c.sum() * 2 / ((k - 1) * selections))
    return {
        "layer": int(stats.layer_ids[row]),
        "selections": selections,
        "tokens": selections / k,
        "max_load": int(x.max()) if x.size else 0,
        "mean_load": selections / x.size if x.size else 0.0,
        "max_over_mean": _nan_to_none(max_over_mean(x)),
        "gini": gini(x),
        "cv": _nan_to_none(coefficient_of_variation(x)),
        "top_share": _nan_to_none(top_share(x)),
        "entropy": _nan_to_none(normalized_entropy(x)),
        "hottest": hottest,
        "pairs": pairs,
        "coact_coverage": coverage,
        "drift": _drift(stats.load[:, row], n_hot),
    }


def _drift(load_by_window: np.ndarray, n_hot: int) -> dict[str, Any] | None:
    """Drift of one layer over ``load_by_window: [windows, experts]``; None with < 2 windows."""
    windows = [w for w in load_by_window if w.sum() > 0]
    if len(windows) < 2:
        return None
    jac = [jaccard(hot_set(a, n_hot), hot_set(b, n_hot)) for a, b in itertools.pairwise(windows)]
    tv = [total_variation(a, b) for a, b in itertools.pairwise(windows)]
    return {
        "windows_compared": len(windows),
        "hot_set_size": n_hot,
        "hot_set_jaccard_mean": float(np.mean(jac)),
        "hot_set_jaccard_min": float(np.min(jac)),
        "load_tv_mean": float(np.mean(tv)),
        "load_tv_max": float(np.max(tv)),
    }


def _affinity(
    layer_affinity: PairCounts, stats: ExpertStats, total_load: np.ndarray, top: int
) -> list[dict[str, Any]]:
    """Strongest cross-layer pairs for each pair of consecutive layer rows (from the
    sparse pairs, as :func:`affinity_lift` and :func:`top_pairs` of the dense matrix)."""
    out = []
    k = stats.top_k
    for row in range(layer_affinity.num_rows):
        i, j, c = layer_affinity.pairs(row)
        a = np.asarray(total_load[row], dtype=np.float64)
        b = np.asarray(total_load[row + 1], dtype=np.float64)
        t_pair = float(c.sum()) / k**2
        t_a, t_b = a.sum() / k, b.sum() / k
        out.append(
            {
                "layer": int(stats.layer_ids[row]),
                "next_layer": int(stats.layer_ids[row + 1]),
                "pairs": [
                    {"experts": [int(i[o]), int(j[o])], "count": int(c[o]),
                     "lift": _ratio(float(c[o]) * t_a * t_b,
                                    float(a[i[o]] * b[j[o]]) * t_pair)}
                    for o in _top_of(i, j, c, top)
                ],
            }
        )
    return out


def _ratio(num: float, denom: float) -> float | None:
    """``num / denom``, None where ``denom <= 0`` or the ratio is not finite (as the
    NaN cells of :func:`pair_lift` and :func:`affinity_lift`)."""
    return _nan_to_none(num / denom) if denom > 0 else None


def _stat(values: list[float | None], layer_ids: list[int]) -> dict[str, Any]:
    pairs = [(v, lid) for v, lid in zip(values, layer_ids, strict=True) if v is not None]
    if not pairs:
        keys = ("median", "mean", "min", "max", "min_layer", "max_layer")
        return dict.fromkeys(keys)
    vals = np.array([v for v, _ in pairs])
    return {
        "median": float(np.median(vals)),
        "mean": float(vals.mean()),
        "min": float(vals.min()),
        "max": float(vals.max()),
        "min_layer": pairs[int(vals.argmin())][1],
        "max_layer": pairs[int(vals.argmax())][1],
    }


def _overall(
    per_layer: list[dict[str, Any]],
    total_load: np.ndarray,
    stats: ExpertStats,
    top: int,
    affinity: list[dict[str, Any]] | None,
    n_hot: int,
) -> dict[str, Any]:
    ids = [x["layer"] for x in per_layer]
    sel = total_load.sum(axis=1, keepdims=True).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(sel > 0, total_load / np.where(sel > 0, sel, 1), 0.0)
    flat = hot_set(share.ravel(), top)
    e = stats.num_experts
    hottest = [
        {
            "layer": int(stats.layer_ids[f // e]),
            "expert": int(f % e),
            "load": int(total_load.ravel()[f]),
            "share": float(share.ravel()[f]),
        }
        for f in flat
    ]
    drifts = [x["drift"] for x in per_layer]
    drift = None
    if any(d is not None for d in drifts):
        drift = {
            "hot_set_size": n_hot,
            "hot_set_jaccard_mean": _stat(
                [d["hot_set_jaccard_mean"] if d else None for d in drifts], ids
            ),
            "hot_set_jaccard_min": _stat(
                [d["hot_set_jaccard_min"] if d else None for d in drifts], ids
            ),
            "load_tv_mean": _stat([d["load_tv_mean"] if d else None for d in drifts], ids),
            "load_tv_max": _stat([d["load_tv_max"] if d else None for d in drifts], ids),
        }
    strongest = None
    if affinity is not None:
        every = [
            {"layer": a["layer"], "next_layer": a["next_layer"], **p}
            for a in affinity
            for p in a["pairs"]
        ]
        every.sort(key=lambda p: (-p["count"], p["layer"], *p["experts"]))
        strongest = every[:top]
    return {
        "max_over_mean": _stat([x["max_over_mean"] for x in per_layer], ids),
        "gini": _stat([x["gini"] for x in per_layer], ids),
        "cv": _stat([x["cv"] for x in per_layer], ids),
        "top_share": _stat([x["top_share"] for x in per_layer], ids),
        "entropy": _stat([x["entropy"] for x in per_layer], ids),
        "hottest": hottest,
        "drift": drift,
        "affinity": strongest,
    }
