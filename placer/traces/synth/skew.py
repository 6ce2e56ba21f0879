"""Skew presets: per-layer Zipf exponents whose loads have measured routing's skew.

A preset is a distribution of per-layer Gini (:mod:`placer.stats.skew`):

- ``real``: the measured datasets of comparable expert count
  (:data:`placer.stats.skew.MIN_COMPARABLE_EXPERTS`), averaged: per-layer Gini from the
  mean of their lowest layers, through the mean of their medians, to the mean of their
  highest (from ``placer/data/real_skew.json``);
- ``mild`` and ``heavy``: the same spread, its median moved to :data:`MILD_MEDIAN` and
  :data:`HEAVY_MEDIAN` (kept within ``[0, 0.95]``).

Each layer gets a target from the preset's quantile function (piecewise linear through
low, median and high), at evenly spaced quantiles dealt to the layers in a seeded order,
and the Zipf exponent whose load reaches that Gini under the trace's own routing (experts,
top-k, groups, clusters, topics, drift): :func:`calibrated_zipf` generates a short sample
of one layer at a grid of exponents and interpolates (Gini grows with the exponent).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from placer.errors import UsageError
from placer.stats.analysis import gini
from placer.stats.skew import real_references
from placer.traces.synth.generate import check_memory, synthesize
from placer.traces.synth.params import SynthParams

#: The presets, mildest first.
SKEW_PRESETS = ("mild", "real", "heavy")
#: Median-layer Gini of the ``mild`` and ``heavy`` presets (measured routing sits at
#: 0.51-0.56; independent checks of placer used 0.28 and 0.60 as mild and heavy).
MILD_MEDIAN = 0.30
HEAVY_MEDIAN = 0.70
#: The popularity shape of the presets: with Gini matched, measured routing's CV and
#: max/mean follow a lognormal's (Zipf's tail puts one expert far above the rest).
PRESET_SHAPE = "lognormal"
#: Tokens of the sample each exponent of the grid is measured on, and the grid.
CALIBRATION_TOKENS = 8192
ZIPF_GRID = tuple(round(0.15 * i, 2) for i in range(21))  # 0 .. 3 (sigma up to 3 too)


def preset_spread(name: str) -> tuple[float, float, float]:
    """``(low, median, high)`` per-layer Gini of preset ``name``."""
    if name not in SKEW_PRESETS:
        raise UsageError(f"unknown skew preset {name!r}", where="skew",
                         hint=f"use one of {', '.join(SKEW_PRESETS)}")
    chosen = [r for r in real_references() if r.comparable]
    low, mid, high = (float(np.mean([r.figures["gini"][i] for r in chosen])) for i in range(3))
    if name == "real":
        return low, mid, high
    shift = (MILD_MEDIAN if name == "mild" else HEAVY_MEDIAN) - mid
    return tuple(float(np.clip(v + shift, 0.0, 0.95)) for v in (low, mid, high))  # type: ignore[return-value]


def preset_targets(name: str, num_layers: int, seed: int) -> np.ndarray:
    """``[layers]`` target Gini of each layer under preset ``name``."""
    low, mid, high = preset_spread(name)
    u = (np.arange(num_layers) + 0.5) / num_layers
    curve = np.where(u < 0.5, low + (mid - low) * 2 * u, mid + (high - mid) * (2 * u - 1))
    order = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(2,))).permutation(
        num_layers)
    targets: np.ndarray = curve[order]
    return targets


def calibrated_zipf(params: SynthParams, targets: np.ndarray) -> tuple[float, ...]:
    """Per-layer Zipf exponents of ``params`` whose loads reach ``targets`` (Gini)."""
    curve = zipf_curve(params)
    # Gini grows with the exponent; ties at the ends (saturation) keep the first
    reached, first = np.unique(np.maximum.accumulate(curve), return_index=True)
    grid = np.asarray(ZIPF_GRID)[first]
    return tuple(round(float(z), 4) for z in np.interp(targets, reached, grid))


def zipf_curve(params: SynthParams) -> np.ndarray:
    """``[grid]`` Gini of one layer's load at each exponent of :data:`ZIPF_GRID`, on a
    sample of ``params`` (its middle layer's depth, at most
    :data:`CALIBRATION_TOKENS` tokens)."""
    middle = params.layer_ids[len(params.layer_ids) // 2]
    overlap = params.topic_overlap
    if isinstance(overlap, tuple):
        overlap = overlap[len(overlap) // 2]
    elif overlap is None and params.topics:
        overlap = float(params.topic_overlap_per_layer()[len(params.layer_ids) // 2])
    out = []
    for zipf in ZIPF_GRID:
        sample = replace(params, layer_ids=(middle,), zipf=zipf, topic_overlap=overlap,
                         num_tokens=min(params.num_tokens, CALIBRATION_TOKENS), weights=False)
        load = np.zeros(params.num_experts, dtype=np.int64)
        for chunk in synthesize(sample):
            ids = chunk.topk_ids[:, 0, :].ravel().astype(np.int64)
            load += np.bincount(ids[ids >= 0], minlength=params.num_experts)
        out.append(gini(load))
    return np.asarray(out)


def with_skew(params: SynthParams, preset: str) -> SynthParams:
    """``params`` with the lognormal popularity and per-layer deviations of skew preset
    ``preset`` (:data:`SKEW_PRESETS`); ``params`` too large for memory is refused before
    the calibration's samples (:func:`~placer.traces.synth.generate.check_memory`)."""
    check_memory(params)
    targets = preset_targets(preset, params.num_layers, params.seed)
    shaped = replace(params, popularity=PRESET_SHAPE)
    return replace(shaped, zipf=calibrated_zipf(shaped, targets))
