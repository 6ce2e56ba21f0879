"""The skews the benchmarks report at, and how each row states the skew it was measured on.

A static plan's gain over EPLB follows the skew of the load it balances, so every synthetic
configuration of ``bench latency`` and ``bench replay`` runs at the three skew presets of
``placer synth --skew`` (:mod:`placer.traces.synth.skew`), with the same seeds: ``real``
(measured routing's per-layer spread, the headline), ``mild`` and ``heavy`` (a sensitivity
check: heavier than any measured routing).  Each row states the skew of the trace it was
measured on (median layer's Gini / CV / max÷mean, :mod:`placer.stats.skew`).

Sources: the figures these sections *report* come from ``placer synth --skew`` traces and
real data; the planner's tuned defaults are justified by ``bench tuning`` on a different
source, ``placer synth --from`` traces fitted to measured load files (docs/performance.md,
"Tuning and reporting sources").
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: The presets, in report order: the headline first, then the sensitivity range.
SKEWS = ("real", "mild", "heavy")
#: The presets from mildest to heaviest: the columns of the scaling tables.
MILDEST_FIRST = ("mild", "real", "heavy")
#: What the tables call each preset.
SKEW_LABELS = {"real": "real", "mild": "mild", "heavy": "heavy (sensitivity)",
               None: "real data"}
#: Where the reported figures and the tuned defaults come from (said in each section).
REPORT_SOURCE = ("reported on `placer synth --skew mild|real|heavy` traces (same seeds) and"
                 " real data; the planner's defaults were tuned on another source,"
                 " `placer synth --from` traces fitted to measured load files"
                 " (`python -m bench tuning`)")
TUNING_SOURCE = ("tuned on `placer synth --from` traces fitted to measured load files; the"
                 " figures `bench latency` and `bench replay` report come from another"
                 " source (`placer synth --skew` traces and real data)")


def chosen_skews(variable: str) -> tuple[str, ...]:
    """The presets named in environment variable ``variable`` (comma-separated), in
    :data:`SKEWS` order; all three when it is unset or empty."""
    named = {s.strip() for s in os.environ.get(variable, "").split(",") if s.strip()}
    unknown = named - set(SKEWS)
    if unknown:
        raise ValueError(f"{variable}: unknown skew(s) {', '.join(sorted(unknown))};"
                         f" use {', '.join(SKEWS)}")
    return tuple(s for s in SKEWS if not named or s in named)


@dataclass(frozen=True)
class Measured:
    """A trace's skew: its median layer's figures and class (:mod:`placer.stats.skew`)."""

    gini: float
    cv: float
    max_over_mean: float
    cls: str

    def cell(self) -> str:
        """``0.53 / 1.02 / 4.9 (real)``."""
        if not math.isfinite(self.gini):
            return "-"
        return (f"{self.gini:.2f} / {self.cv:.2f} / {self.max_over_mean:.1f}"
                f" ({self.cls})")


def measure(load: Any, layer_ids: Any = None) -> Measured:
    """The skew of ``load`` (``[layers, E]`` or ``[windows, layers, E]``)."""
    from placer.stats.skew import classify, skew_of

    skew = skew_of(load, layer_ids)
    median = skew.median()
    return Measured(gini=median["gini"], cv=median["cv"],
                    max_over_mean=median["max_over_mean"], cls=classify(skew).name)


def in_preset_range(measured: Measured, preset: str, margin: float = 0.05) -> bool:
    """Whether ``measured``'s median-layer Gini lies within ``preset``'s spread of
    per-layer Gini (:func:`placer.traces.synth.skew.preset_spread`), give or take
    ``margin``, and near its median."""
    from placer.traces.synth.skew import preset_spread

    low, mid, high = preset_spread(preset)
    return low - margin <= measured.gini <= high + margin and abs(measured.gini - mid) <= margin


def skew_order(skew: str | None) -> int:
    """Rows in report order: real data, real skew, mild, heavy."""
    return 0 if skew is None else 1 + SKEWS.index(skew)


def scaling_table(rows: Sequence[Any]) -> list[str]:
    """How gain scales with skew: one line per (configuration, engine) of the synthetic
    rows, cpsat's step p99 against EPLB's at each skew with the measured Gini; ``rows``
    carry ``key``, ``config``, ``engine``, ``skew``, ``measured`` and ``change``."""
    synthetic = [r for r in rows if getattr(r, "skew", None)]
    if not synthetic:
        return []
    lines = ["How the gain scales with skew (synthetic rows; cpsat's held-out step p99 against"
             " EPLB's, measured median-layer Gini in brackets; heavy = sensitivity only,"
             " heavier than any measured routing):", "",
             "| configuration | engine | mild | real | heavy (sensitivity) |",
             "|---|---|---:|---:|---:|"]
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for r in synthetic:
        seen.setdefault((r.base_label, r.engine), {})[r.skew] = r
    for (label, engine), by_skew in seen.items():
        cells = []
        for skew in MILDEST_FIRST:
            r = by_skew.get(skew)
            cells.append("not run" if r is None else
                         f"{r.change:+.1%} ({r.measured.gini:.2f})")
        lines.append(f"| {label} | {engine} | " + " | ".join(cells) + " |")
    return lines
