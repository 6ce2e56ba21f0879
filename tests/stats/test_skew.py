"""Skew figures of known loads, and where a trace's skew sits against measured routing."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from placer.stats.analysis import coefficient_of_variation, gini, max_over_mean, top_share
from placer.stats.skew import (
    GINI_MARGIN,
    RealSkew,
    classify,
    real_references,
    skew_of,
    skew_report,
)


def test_uniform_load_has_no_skew() -> None:
    x = np.full(64, 10)
    assert gini(x) == 0.0 and coefficient_of_variation(x) == 0.0
    assert max_over_mean(x) == 1.0 and top_share(x) == pytest.approx(1 / 64)


def test_one_expert_taking_everything() -> None:
    x = np.zeros(100)
    x[7] = 5
    assert gini(x) == pytest.approx(1 - 1 / 100)
    assert coefficient_of_variation(x) == pytest.approx(math.sqrt(99))
    assert max_over_mean(x) == pytest.approx(100) and top_share(x) == 1.0


def test_two_levels_by_hand() -> None:
    """Half the experts at 3, half at 1: mean 2, std 1 (CV 0.5); sum |xi - xj| over
    ordered pairs = 2 (E/2)^2 x 2 = E^2, over 2 E^2 x mean = 4 E^2: Gini 0.25."""
    x = np.array([3] * 50 + [1] * 50)
    assert coefficient_of_variation(x) == pytest.approx(0.5)
    assert gini(x) == pytest.approx(0.25)
    assert max_over_mean(x) == pytest.approx(1.5)
    assert top_share(x) == pytest.approx(3 / 200)  # ceil(1% of 100) = 1 expert of 200


def test_top_share_takes_at_least_one_expert_and_rounds_up() -> None:
    x = np.arange(1, 251)  # 250 experts: ceil(2.5) = 3
    assert top_share(x) == pytest.approx((250 + 249 + 248) / x.sum())
    assert top_share(np.array([1, 3])) == pytest.approx(0.75)


def test_skew_of_is_the_median_layer_and_sums_windows() -> None:
    layers = np.stack([np.full(32, 4), np.array([3] * 16 + [1] * 16) * 2,
                       np.array([8] + [0] * 31)])
    windows = np.stack([layers, layers])
    skew = skew_of(windows, np.array([3, 4, 5]))
    assert skew.gini.tolist() == pytest.approx([0.0, 0.25, 1 - 1 / 32])
    assert skew.median()["gini"] == pytest.approx(0.25)
    assert skew.median()["cv"] == pytest.approx(0.5)


def _ref(name: str, experts: int, median_gini: float) -> RealSkew:
    figures = {"gini": (median_gini - 0.1, median_gini, median_gini + 0.1),
               "cv": (0.5, 1.0, 1.5), "max_over_mean": (2.0, 4.0, 8.0),
               "top_share": (0.05, 0.1, 0.2)}
    return RealSkew(name, name, experts, 1000, "test", "test", figures)


@pytest.mark.parametrize(("value", "expected"), [
    (0.50 - GINI_MARGIN - 0.01, "mild"), (0.50 - GINI_MARGIN + 0.01, "real"), (0.53, "real"),
    (0.56 + GINI_MARGIN - 0.01, "real"), (0.56 + GINI_MARGIN + 0.01, "heavy")])
def test_classify_against_comparable_datasets_only(value: float, expected: str) -> None:
    refs = (_ref("a", 128, 0.50), _ref("b", 64, 0.56), _ref("small", 8, 0.10))
    load = _load_with_gini(value, 1000)
    placed = classify(skew_of(load[None, :]), refs)
    assert placed.name == expected, placed
    assert (placed.low, placed.high) == (0.50, 0.56)
    assert [r.name for r in placed.references] == ["a", "b"]


def _load_with_gini(target: float, experts: int) -> np.ndarray:
    """A load of ``experts`` values whose Gini is ``target`` to 1e-4 (a power law)."""
    low, high = 0.0, 50.0
    ranks = np.arange(1, experts + 1, dtype=np.float64)
    for _ in range(100):
        a = (low + high) / 2
        x = np.round(1e6 * ranks ** -a)
        if gini(x) < target:
            low = a
        else:
            high = a
    return x


def test_the_measured_reference_ships_and_the_bundled_trace_is_real_skew() -> None:
    refs = real_references()
    names = {r.name for r in refs}
    assert "qwen3-30b-a3b" in names
    for r in refs:
        for low, mid, high in r.figures.values():
            assert low <= mid <= high
    bundled = np.load(Path(__file__).resolve().parents[2] / "traces" / "qwen3-30b-a3b.npz")
    report = skew_report(bundled["load"])
    assert report["class"] == "real"
    qwen = next(r for r in refs if r.name == "qwen3-30b-a3b")
    assert report["median"]["gini"] == pytest.approx(qwen.figures["gini"][1], abs=1e-4)
