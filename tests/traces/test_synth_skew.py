"""Skew presets of the synthetic traces land in their ranges of per-layer Gini, and the
lognormal popularity leaves the original Zipf traces as they were."""

from __future__ import annotations

import numpy as np
import pytest

from placer.stats.skew import classify, real_references, skew_of
from placer.traces.synth import SynthParams, synthesize, write_synth
from placer.traces.synth.skew import (
    SKEW_PRESETS,
    preset_spread,
    preset_targets,
    with_skew,
)


def _load(params: SynthParams) -> np.ndarray:
    load = np.zeros((params.num_layers, params.num_experts), dtype=np.int64)
    for chunk in synthesize(params):
        for row in range(params.num_layers):
            load[row] += np.bincount(chunk.topk_ids[:, row, :].ravel().astype(np.int64),
                                     minlength=params.num_experts)
    return load


BASE = SynthParams(num_tokens=16384, layer_ids=tuple(range(8)), num_experts=128, top_k=8,
                   clusters=4, drift=0.02, tokens_per_step=1024, seed=3)


@pytest.mark.parametrize("preset", SKEW_PRESETS)
def test_each_preset_lands_in_its_class_and_spread(preset: str) -> None:
    params = with_skew(BASE, preset)
    assert params.popularity == "lognormal" and len(params.zipf) == 8
    skew = skew_of(_load(params))
    low, mid, high = preset_spread(preset)
    assert skew.median()["gini"] == pytest.approx(mid, abs=0.04)
    assert np.nanmin(skew.gini) >= low - 0.05 and np.nanmax(skew.gini) <= high + 0.05
    assert classify(skew).name == preset


def test_the_real_preset_is_the_measured_datasets_spread() -> None:
    comparable = [r for r in real_references() if r.comparable]
    low, mid, high = preset_spread("real")
    assert mid == pytest.approx(np.mean([r.figures["gini"][1] for r in comparable]))
    assert low < mid < high
    mild, heavy = preset_spread("mild"), preset_spread("heavy")
    assert mild[1] < mid < heavy[1]  # ordered by median
    assert heavy[2] - heavy[0] == pytest.approx(high - low)


def test_targets_are_evenly_spread_quantiles_dealt_by_seed() -> None:
    a, b = preset_targets("real", 9, seed=0), preset_targets("real", 9, seed=1)
    assert sorted(a.tolist()) == pytest.approx(sorted(b.tolist()))
    assert a.tolist() != b.tolist()
    low, mid, high = preset_spread("real")
    assert np.median(a) == pytest.approx(mid)
    assert low < a.min() and a.max() < high


def test_zipf_traces_are_unchanged_by_the_lognormal_shape(tmp_path) -> None:
    """The default shape writes no popularity field: the bundled traces' bytes hold."""
    params = SynthParams(num_tokens=512, layer_ids=(0, 1), num_experts=16, top_k=2, seed=0)
    assert "synth_popularity" not in params.header()
    lognormal = SynthParams(num_tokens=512, layer_ids=(0, 1), num_experts=16, top_k=2,
                            seed=0, popularity="lognormal")
    assert lognormal.header()["synth_popularity"] == "lognormal"
    result = write_synth(tmp_path / "t.npz", params)
    assert result["skew"]["class"] in ("mild", "real", "heavy")
    assert result["skew"]["median"]["gini"] == pytest.approx(
        skew_of(_load(params)).median()["gini"])
