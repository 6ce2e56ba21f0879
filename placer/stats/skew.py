"""How skewed a trace's routing is, placed against measured routing.

A static plan's gain over EPLB follows the skew of the load it balances, so a figure of
placer's is worth as much as the skew it was measured at.  Four figures per layer of the
load summed over windows (``x = load[l]``, ``E`` experts):

- *Gini* (:func:`~placer.stats.analysis.gini`): 0 uniform, ``1 - 1/E`` one expert takes all;
- *CV* (:func:`~placer.stats.analysis.coefficient_of_variation`) ``= std(x) / mean(x)``;
- *max/mean* ``= max(x) / mean(x)``;
- *top-1% share* (:func:`~placer.stats.analysis.top_share`): the share of the load of
  the ``ceil(E / 100)`` most loaded experts.

A trace's skew is its median layer's figures (:class:`Skew`).  The reference is measured
routing, summarized in ``placer/data/real_skew.json`` (regenerated with
``python -m bench real_skew`` from the bundled Qwen3-30B-A3B statistics and, where present,
the other measured traces the benchmarks read): each dataset's per-layer range and median
of the four figures.  :func:`classify` says whether a trace is milder than every measured
dataset of comparable expert count, within their range, or heavier; Gini decides (it is
bounded, so comparable across expert counts of 32 and more), the other figures are shown.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

from placer.stats.analysis import coefficient_of_variation, gini, max_over_mean, top_share

#: Measured datasets with fewer experts per layer than this are shown but do not set the
#: range a trace is classified against (with 8 experts, one expert is 12.5% of the choice).
MIN_COMPARABLE_EXPERTS = 32
#: A trace whose median-layer Gini is within this of the measured datasets' medians counts
#: as within their range.
GINI_MARGIN = 0.03
#: The classes, mildest first.
CLASSES = ("mild", "real", "heavy")
FIGURES = ("gini", "cv", "max_over_mean", "top_share")


@dataclass(frozen=True)
class Skew:
    """The four skew figures of each layer (``[layers]`` each) and the expert count."""

    layer_ids: np.ndarray
    num_experts: int
    gini: np.ndarray
    cv: np.ndarray
    max_over_mean: np.ndarray
    top_share: np.ndarray

    def median(self) -> dict[str, float]:
        """The median layer's value of each figure (layers with no load left out)."""
        return {name: _median(getattr(self, name)) for name in FIGURES}

    def to_dict(self) -> dict[str, Any]:
        return {"num_experts": self.num_experts, "median": self.median(),
                "per_layer": {name: [_finite(v) for v in getattr(self, name)]
                              for name in FIGURES}}


def skew_of(load: np.ndarray, layer_ids: np.ndarray | None = None) -> Skew:
    """:class:`Skew` of ``load``: ``[layers, experts]``, or ``[windows, layers, experts]``
    (summed over windows)."""
    x = np.asarray(load)
    if x.ndim == 3:
        x = x.sum(axis=0)
    ids = np.arange(x.shape[0]) if layer_ids is None else np.asarray(layer_ids)
    return Skew(
        layer_ids=ids, num_experts=int(x.shape[1]),
        gini=np.array([gini(row) if row.sum() > 0 else math.nan for row in x]),
        cv=np.array([coefficient_of_variation(row) for row in x]),
        max_over_mean=np.array([max_over_mean(row) for row in x]),
        top_share=np.array([top_share(row) for row in x]),
    )


@dataclass(frozen=True)
class RealSkew:
    """One measured dataset's skew: ``(min, median, max)`` over its layers of each figure."""

    name: str
    model: str
    num_experts: int
    tokens: int
    what: str
    source: str
    figures: dict[str, tuple[float, float, float]]

    @property
    def comparable(self) -> bool:
        return self.num_experts >= MIN_COMPARABLE_EXPERTS


def real_references() -> tuple[RealSkew, ...]:
    """The measured datasets of ``placer/data/real_skew.json``."""
    text = resources.files("placer").joinpath("data/real_skew.json").read_text("utf-8")
    return tuple(RealSkew(
        name=d["name"], model=d["model"], num_experts=int(d["num_experts"]),
        tokens=int(d["tokens"]), what=d["what"], source=d["source"],
        figures={k: (float(v[0]), float(v[1]), float(v[2])) for k, v in d["figures"].items()},
    ) for d in json.loads(text)["datasets"])


@dataclass(frozen=True)
class SkewClass:
    """Where a trace's skew sits: ``name`` one of :data:`CLASSES`; ``low``, ``high`` the
    measured datasets' median-layer Gini range it was placed against (without the
    margin), ``references`` those datasets."""

    name: str
    gini: float
    low: float
    high: float
    references: tuple[RealSkew, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"class": self.name, "gini_median": _finite(self.gini),
                "real_gini_medians": [self.low, self.high],
                "references": [r.name for r in self.references]}


def classify(skew: Skew, references: tuple[RealSkew, ...] | None = None) -> SkewClass:
    """Place ``skew``'s median-layer Gini against the medians of the comparable measured
    datasets (:data:`MIN_COMPARABLE_EXPERTS`), with :data:`GINI_MARGIN` either side."""
    chosen = tuple(r for r in (references or real_references()) if r.comparable)
    medians = [r.figures["gini"][1] for r in chosen]
    low, high = min(medians), max(medians)
    value = skew.median()["gini"]
    if value < low - GINI_MARGIN:
        name = "mild"
    elif value > high + GINI_MARGIN:
        name = "heavy"
    else:
        name = "real"
    return SkewClass(name=name, gini=value, low=low, high=high, references=chosen)


def _median(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if finite.size else math.nan


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def skew_report(load: np.ndarray, layer_ids: np.ndarray | None = None) -> dict[str, Any]:
    """What ``placer stats`` and ``placer plan`` say of a trace's skew, as data: the
    median layer's figures, the class (:func:`classify`) and every measured dataset's
    medians (``comparable``: whether it set the range)."""
    skew = skew_of(load, layer_ids)
    placed = classify(skew)
    return {
        "median": {k: _finite(v) for k, v in skew.median().items()},
        "num_experts": skew.num_experts,
        **placed.to_dict(),
        "measured": [{"name": r.name, "num_experts": r.num_experts, "tokens": r.tokens,
                      "what": r.what, "comparable": r.comparable,
                      "median": {k: v[1] for k, v in r.figures.items()}}
                     for r in real_references()],
    }
