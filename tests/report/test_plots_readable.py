"""Every picture reads at a glance at the default resolution: no text under 8 px, every
panel titled and both axes labelled, at the sizes real deployments give.

The sizes are the ones that went wrong before: a placement map of 8 GPUs x 32 slots
(DeepSeek-V3's 256 experts on one node), a co-activation map of 288 slots (256 + 32 on
a GB200 NVL72), and per-GPU load bars of an 8-GPU baseline next to a 72-GPU scenario.
Text sizes come from matplotlib's objects (points x dpi / 72), so this runs everywhere;
tests/report/test_report_chromium.py checks the same pages as a browser shows them.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from placer import constants
from placer.report import (
    coactivation_heatmap,
    expert_load_heatmap,
    gpu_load_bars,
    hot_shard_tail,
    placement_map,
    smallest_text_px,
    text_sizes_px,
    whatif_chart,
)
from placer.report.plots import MIN_FONT_PT

#: The readability floor the pictures keep at ``constants.REPORT_DPI``.
MIN_TEXT_PX = 8.0


@pytest.fixture(scope="module")
def rng() -> np.random.Generator:
    return np.random.default_rng(17)


@pytest.fixture(scope="module")
def deepseek_layer(rng) -> dict[str, np.ndarray]:
    """One DeepSeek-V3-sized layer: 256 experts with heavy-tailed load, their pair
    counts, one slot each over 8 GPUs (32 slots), and 256 + 32 slots over 72 GPUs."""
    load = rng.lognormal(6.0, 1.0, size=256)
    upper = np.triu(rng.poisson(3.0, size=(256, 256)), 1)
    return {
        "load": load,
        "coact": (upper + upper.T).astype(np.float64),
        "one_node": rng.permutation(256),
        "nvl72": np.concatenate([rng.permutation(256), rng.choice(256, 32, replace=False)]),
    }


@pytest.fixture(scope="module")
def pictures(deepseek_layer, rng) -> dict[str, object]:
    """Every picture function at the sizes above, drawn once."""
    d = deepseek_layer
    g8 = rng.uniform(8.0, 12.0, size=(12, 8))
    g72 = rng.uniform(4.0, 16.0, size=(12, 72))
    return {
        "expert load, 61 layers x 256 experts": expert_load_heatmap(
            rng.lognormal(5.0, 1.0, size=(58, 256)), layer_ids=np.arange(3, 61)),
        "placement map, 8 GPUs x 32 slots": placement_map(d["one_node"], 8, d["load"],
                                                          layer_id=3),
        "placement map, 72 GPUs x 4 slots": placement_map(
            d["nvl72"], 72, d["load"], node_of_gpu=np.zeros(72, dtype=int), layer_id=3),
        "co-activation, 8 GPUs": coactivation_heatmap(d["coact"], d["one_node"], 8,
                                                      load=d["load"], layer_id=3),
        "co-activation, 288 slots": coactivation_heatmap(d["coact"], d["nvl72"], 72,
                                                         load=d["load"], layer_id=3),
        "per-GPU load, 8 vs 72 GPUs": gpu_load_bars(
            [g8, g72], ["baseline: dgx-h100 R=0 eplb", "lowest p99: gb200-nvl72 R=32 cpsat"]),
        "per-GPU load, 2 x 8 GPUs": gpu_load_bars([g8, g8[::-1]], ["eplb", "cpsat"]),
        "what-if": whatif_chart(["dgx-h100 R=0 eplb", "gb200-nvl72 R=0 eplb",
                                 "gb200-nvl72 R=32 cpsat"], np.array([160.0, np.nan, 60.0]),
                                np.array([65.0, np.nan, 170.0]), notes=["", "error", ""]),
        "hot-shard tail": hot_shard_tail([1 + rng.gamma(2, 0.1, (40, 8)),
                                          1 + rng.gamma(2, 0.3, (40, 8))], ["eplb", "cpsat"]),
    }


def test_no_text_under_8_px_at_the_default_dpi(pictures):
    assert MIN_FONT_PT * constants.REPORT_DPI / 72 >= MIN_TEXT_PX
    for name, fig in pictures.items():
        sizes = text_sizes_px(fig, constants.REPORT_DPI)
        assert sizes, name
        small = [(text, round(px, 1)) for text, px in sizes if px < MIN_TEXT_PX]
        assert not small, f"{name}: text under {MIN_TEXT_PX} px: {small[:5]}"


def test_every_panel_has_a_title_and_both_axis_labels(pictures):
    for name, fig in pictures.items():
        titled = bool(fig.get_suptitle())
        panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]
        assert panels, name
        for ax in panels:
            assert ax.get_xlabel(), f"{name}: a panel without an x label"
            # a panel sharing its y axis with a labelled neighbour (what-if) counts as labelled
            siblings = ax.get_shared_y_axes().get_siblings(ax)
            assert any(a.get_ylabel() for a in siblings), f"{name}: a panel without a y label"
            assert titled or ax.get_title(), f"{name}: a panel without a title"
        bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
        assert all(b.get_ylabel() for b in bars), f"{name}: a colour bar without a unit"


def test_placement_map_of_8_gpus_x_32_slots_prints_legible_ids(deepseek_layer):
    fig = placement_map(deepseek_layer["one_node"], 8, deepseek_layer["load"], layer_id=3)
    ax = fig.axes[0]
    assert len(ax.texts) == 256
    assert min(t.get_fontsize() for t in ax.texts) >= MIN_FONT_PT
    # every id fits inside its cell: no two neighbouring labels overlap
    fig.draw_without_rendering()
    boxes = [t.get_window_extent() for t in ax.texts[:32]]  # GPU 0's row
    assert all(a.x1 <= b.x0 for a, b in pairwise(boxes))


def test_placement_map_too_dense_to_label_says_so(rng):
    load = rng.lognormal(5.0, 1.0, size=1024)
    fig = placement_map(rng.permutation(1024), 32, load, layer_id=3)
    ax = fig.axes[0]
    assert not ax.texts
    assert "expert ids not printed: 1024 slots" in ax.get_title()
    assert smallest_text_px(fig) >= MIN_TEXT_PX


def test_coactivation_of_288_slots_outlines_gpus_instead_of_a_grid(deepseek_layer):
    d = deepseek_layer
    dense = coactivation_heatmap(d["coact"], d["nvl72"], 72, load=d["load"])
    ax = dense.axes[0]
    assert not ax.lines  # no full-length lines across 288 slots
    assert len(ax.patches) == 72  # one outline per GPU block on the diagonal
    assert all(p.get_linewidth() <= 1.0 for p in ax.patches)
    small = coactivation_heatmap(d["coact"], d["one_node"], 8, load=d["load"])
    lines = small.axes[0].lines
    assert len(lines) == 2 * 7 and all(line.get_linewidth() <= 1.0 for line in lines)
