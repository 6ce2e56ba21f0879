"""The study charts: what-if scenarios side by side, and the hot-shard tail of placements.

Arrays in, a matplotlib ``Figure`` out, as :mod:`placer.report.plots` (whose colours and
checks they share).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from placer.errors import UsageError
from placer.report.mpl import new_figure
from placer.report.plots import SERIES_COLOURS, check_series


def whatif_chart(
    labels: Sequence[str],
    p99_us: np.ndarray,
    kv_left_gb: np.ndarray,
    *,
    notes: Sequence[str] | None = None,
) -> Any:
    """MoE-layer p99 time and KV-cache memory left, one bar pair per scenario.

    Parameters
    ----------
    labels: ``[scenarios]`` scenario names (y axis).
    p99_us: ``[scenarios]`` estimated MoE-layer p99 time, microseconds; NaN where
        the scenario has no figure (it does not fit, or it failed).
    kv_left_gb: ``[scenarios]`` memory per GPU left for the KV cache, GB; NaN
        where unknown.
    notes: ``[scenarios]`` short text written where a bar is missing
        (``"does not fit"``); default ``"no result"``.

    Returns
    -------
    Figure with two axes sharing the scenario axis: x ``MoE-layer p99 (µs)`` and
    ``KV cache left per GPU (GB)``.
    """
    labels = [str(s) for s in labels]
    p99 = np.asarray(p99_us, dtype=np.float64)
    kv = np.asarray(kv_left_gb, dtype=np.float64)
    n = len(labels)
    if p99.shape != (n,) or kv.shape != (n,):
        raise UsageError(f"p99_us and kv_left_gb need {n} values, one per label", where="labels")
    if notes is not None and len(notes) != n:
        raise UsageError(f"notes need {n} values, one per label", where="notes")
    notes = list(notes) if notes is not None else ["no result"] * n
    longest = max((len(s) for s in labels), default=10)
    fig = new_figure(min(7.0 + longest * 0.07, 14.0), 1.4 + 0.38 * max(n, 1))
    ax_time, ax_kv = fig.subplots(1, 2, sharey=True)
    y = np.arange(n)
    panels = (
        (ax_time, p99, "MoE-layer p99 (µs)", "{:.0f}", SERIES_COLOURS[0]),
        (ax_kv, kv, "KV cache left per GPU (GB)", "{:.1f}", SERIES_COLOURS[2]),
    )
    for ax, values, xlabel, fmt, colour in panels:
        finite = np.isfinite(values)
        ax.barh(y[finite], values[finite], color=colour, height=0.6)
        top = float(values[finite].max()) if finite.any() else 1.0
        for i in range(n):
            if finite[i]:
                ax.text(values[i] + top * 0.01, i, fmt.format(values[i]), va="center",
                        fontsize="small")
            else:
                ax.text(top * 0.02, i, notes[i], va="center", fontsize="small",
                        color="#b00020", style="italic")
        ax.set_xlim(0, top * 1.18 if top > 0 else 1.0)
        ax.set_xlabel(xlabel)
        ax.grid(axis="x", alpha=0.3)
    ax_time.set_yticks(y, labels)
    ax_time.set_ylim(n - 0.5, -0.5)
    ax_time.set_ylabel("scenario")
    fig.suptitle("What-if: tail time and memory left")
    return fig


# -- per-batch hot shard tail ------------------------------------------------------------
def hot_shard_tail(
    batch_hot_shard: Sequence[np.ndarray],
    labels: Sequence[str],
) -> Any:
    """Distribution of the per-batch hot-shard ratio, with its tail, for several placements.

    Parameters
    ----------
    batch_hot_shard: one ``[batches, layers]`` array per placement, the hottest
        GPU's load over the mean GPU load in each (batch, layer) (``load / mean``).
    labels: one name per placement (legend).

    Returns
    -------
    Figure with two axes: a histogram (x ``hot-shard ratio (max / mean GPU
    load)``, y ``share of (batch, layer) pairs``) and the tail as a
    complementary CDF on a log scale (y ``share of pairs at or above x``), with
    each placement's p99 marked.
    """
    series = [np.asarray(b, dtype=np.float64).ravel() for b in batch_hot_shard]
    check_series(series, labels, "batch_hot_shard")
    series = [s[np.isfinite(s)] for s in series]
    if any(s.size == 0 for s in series):
        raise UsageError("every batch_hot_shard array needs at least one value",
                         where="batch_hot_shard")
    fig = new_figure(11.0, 4.2)
    ax_hist, ax_tail = fig.subplots(1, 2)
    low = min(float(s.min()) for s in series)
    high = max(float(s.max()) for s in series)
    bins = np.linspace(low, high if high > low else low + 1.0, 41)
    for i, (s, label) in enumerate(zip(series, labels, strict=True)):
        colour = SERIES_COLOURS[i]
        weights = np.full(s.size, 1.0 / s.size)
        ax_hist.hist(s, bins=bins, weights=weights, histtype="stepfilled", alpha=0.35,
                     color=colour, edgecolor=colour, linewidth=1.2, label=label)
        xs = np.sort(s)
        ccdf = 1.0 - np.arange(xs.size) / xs.size
        ax_tail.step(xs, ccdf, where="post", color=colour, linewidth=1.5,
                     label=f"{label} (p99 {np.percentile(s, 99):.2f})")
        ax_tail.axvline(float(np.percentile(s, 99)), color=colour, linestyle=":", linewidth=1.0)
    ax_hist.set_xlabel("hot-shard ratio (max / mean GPU load)")
    ax_hist.set_ylabel("share of (batch, layer) pairs")
    ax_hist.legend(fontsize="small")
    ax_tail.set_yscale("log")
    ax_tail.set_xlabel("hot-shard ratio (max / mean GPU load)")
    ax_tail.set_ylabel("share of pairs at or above x")
    ax_tail.axhline(0.01, color="0.4", linestyle="--", linewidth=0.8)
    ax_tail.legend(fontsize="small", loc="lower left")
    ax_tail.grid(alpha=0.3, which="both")
    fig.suptitle("Per-batch hot shard: distribution and tail")
    return fig


# -- helpers ----------------------------------------------------------------------------
