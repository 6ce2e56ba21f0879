"""Pictures (placer.report.plots) and the self-contained HTML page (placer.report.html).

Pictures are checked through matplotlib's objects (axes, labels, titles), not
pixels; each is also rendered to PNG once to prove it draws.
"""

from __future__ import annotations

import base64
import re
import sys
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from placer.cli.main import app
from placer.errors import PlacerError, UsageError
from placer.report import (
    Picture,
    Section,
    SideBySide,
    Table,
    Text,
    coactivation_heatmap,
    expert_load_heatmap,
    figure_png,
    gpu_load_bars,
    hot_shard_tail,
    placement_map,
    render_html,
    require_matplotlib,
    same_gpu_share,
    whatif_chart,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def tiny_layer():
    """One layer of 6 experts on 3 GPUs with 3 slots each (3 redundant experts).

    GPU 0 holds experts {0, 1, 5}, GPU 1 {2, 3, 0}, GPU 2 {4, 5, 1}; expert 0 is
    the hottest. Co-activation is strong between 0 and 1 (same GPU) and between
    2 and 4 (different GPUs).
    """
    p2l = np.array([0, 1, 5, 2, 3, 0, 4, 5, 1])
    load = np.array([60, 30, 10, 10, 10, 20])
    coact = np.zeros((6, 6), dtype=np.int64)
    for i, j, n in [(0, 1, 20), (2, 4, 10), (3, 5, 2), (0, 2, 4)]:
        coact[i, j] = coact[j, i] = n
    return p2l, load, coact


def _labels(fig) -> list[tuple[str, str]]:
    return [(ax.get_xlabel(), ax.get_ylabel()) for ax in fig.axes]


def _renders(fig) -> None:
    png = figure_png(fig, dpi=40)
    assert png.startswith(PNG_MAGIC) and len(png) > 1000


# -- pictures ---------------------------------------------------------------------------
def test_expert_load_heatmap_axes_and_units():
    load = np.arange(1, 4 * 8 + 1).reshape(4, 8)
    fig = expert_load_heatmap(load, layer_ids=[3, 4, 5, 6])
    image_ax, bar_ax = fig.axes
    assert (image_ax.get_xlabel(), image_ax.get_ylabel()) == (
        "logical expert (id)", "layer (absolute index)")
    assert bar_ax.get_ylabel() == "load / layer mean (log scale)"
    assert [t.get_text() for t in image_ax.get_yticklabels()] == ["3", "4", "5", "6"]
    image = image_ax.images[0]
    shown = image.get_array()
    np.testing.assert_allclose(shown.mean(axis=1), 1.0)  # each layer relative to its mean
    assert image.norm(1.0) == pytest.approx(
        np.log(1.0 / image.norm.vmin) / np.log(image.norm.vmax / image.norm.vmin))  # log scale
    _renders(fig)


def test_expert_load_heatmap_log_scale_spreads_a_heavy_tailed_layer():
    """Log-normal load (a few hot experts, most a little under the mean): on a linear
    scale the median cell sits at the dark end; here it sits mid-scale, and
    never-routed experts take the darkest colour."""
    rng = np.random.default_rng(3)
    load = rng.lognormal(mean=5.0, sigma=1.0, size=(12, 64))
    load[:, :2] = 0.0
    image = expert_load_heatmap(load).axes[0].images[0]
    rel = load / load.mean(axis=1, keepdims=True)
    assert np.median(rel) / rel.max() < 0.1  # what a linear scale would show
    assert 0.3 < float(image.norm(np.median(rel))) < 0.7
    assert float(image.norm(0.0)) == 0.0


def test_gpu_load_bars_one_panel_per_layer_two_series():
    even = np.full((5, 4), 10.0)
    skewed = np.array([[10, 10, 10, 10]] * 4 + [[40, 0, 0, 0]], dtype=float)
    fig = gpu_load_bars([skewed, even], ["linear", "eplb"], layer_ids=[1, 2, 3, 4, 5],
                        max_panels=2)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 2
    assert all(_ == ("GPU (rank)", "load / mean") for _ in _labels(fig) if _[0])
    assert visible[1].get_title() == "layer 5"  # worst layer of the first series kept
    # each panel's legend says whose max / mean is whose
    assert [t.get_text() for t in visible[1].get_legend().get_texts()] == [
        "linear: max/mean 4.00", "eplb: max/mean 1.00"]
    assert len(visible[0].patches) == 2 * 4  # two bars per GPU
    assert fig.get_suptitle() == "Per-GPU load in the layers where the hot shard of linear is worst"
    _renders(fig)


def test_gpu_load_bars_different_gpu_counts_get_their_own_axes():
    """8 GPUs next to 72: never one rank axis; one column per placement, titles say which."""
    rng = np.random.default_rng(1)
    small = rng.uniform(9, 11, size=(4, 8))
    large = rng.uniform(5, 15, size=(4, 72))
    fig = gpu_load_bars([small, large], ["eplb on dgx-h100", "cpsat on gb200-nvl72"],
                        layer_ids=[10, 11, 12, 13], max_panels=4)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 2 * 2  # half as many layers, one column per GPU count
    left, right = axes[0], axes[1]
    assert len(left.patches) == 8 and len(right.patches) == 72
    assert left.get_xlim()[1] < 8 and right.get_xlim()[1] > 71
    assert left.get_title().startswith("layer ") and "eplb on dgx-h100" in left.get_title()
    assert "8 GPUs, max/mean" in left.get_title()
    assert "cpsat on gb200-nvl72" in right.get_title() and "72 GPUs" in right.get_title()
    assert left.get_shared_y_axes().joined(left, right)
    _renders(fig)


def test_gpu_load_bars_explicit_layers_and_bad_row():
    g = np.ones((3, 2))
    fig = gpu_load_bars([g], ["only"], layers=[2])
    assert fig.axes[0].get_title() == "layer 2"
    assert fig.get_suptitle() == "Per-GPU load by layer"
    with pytest.raises(UsageError, match=r"layer row 3 is outside \[0, 3\)$"):
        gpu_load_bars([g], ["only"], layers=[3])
    with pytest.raises(UsageError, match=r"2 labels for 1 series$"):
        gpu_load_bars([g], ["a", "b"])


def test_coactivation_heatmap_blocks_and_order(tiny_layer):
    p2l, load, coact = tiny_layer
    fig = coactivation_heatmap(coact, p2l, 3, load=load, node_of_gpu=[0, 0, 1], layer_id=7)
    ax, bar = fig.axes
    assert ax.get_xlabel() == "GPU (its slots ordered by load)"
    assert ax.get_ylabel() == "GPU (its slots ordered by load)"
    assert bar.get_ylabel() == "tokens (selecting both experts)"
    assert ax.get_title() == "Co-activation, layer 7: 67% of co-selected pairs on one GPU"
    # two boundaries, each drawn once horizontally and once vertically
    assert len(ax.lines) == 4
    shown = np.asarray(ax.images[0].get_array())
    # GPU 0 ordered by load: experts 0 (60), 1 (30), 5 (20)
    assert shown[0, 1] == coact[0, 1] and shown[0, 2] == coact[0, 5]
    _renders(fig)


def _same_gpu_share_brute(coact, p2l, num_gpus):
    slots = len(p2l) // num_gpus
    gpus_of = {e: {s // slots for s, x in enumerate(p2l) if x == e} for e in set(p2l)}
    inside = total = 0
    for i, j in combinations(range(coact.shape[0]), 2):
        total += coact[i, j]
        if gpus_of[i] & gpus_of[j]:
            inside += coact[i, j]
    return inside / total if total else 0.0


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(2, 4), st.integers(0, 3), st.randoms(use_true_random=False))
def test_same_gpu_share_matches_brute_force(num_gpus, slots, spare, rnd):
    num_experts = max(num_gpus * slots - spare, slots)
    extra = num_gpus * slots - num_experts
    experts = list(range(num_experts))
    # replicas go to GPUs that do not hold the expert yet
    p2l = experts + [rnd.randrange(num_experts) for _ in range(extra)]
    rnd.shuffle(p2l)
    grid = [p2l[g * slots:(g + 1) * slots] for g in range(num_gpus)]
    if any(len(set(row)) < slots for row in grid):
        return  # not a valid placement; nothing to compare
    upper = np.triu(np.array([[rnd.randrange(5) for _ in range(num_experts)]
                              for _ in range(num_experts)]), 1)
    coact = upper + upper.T
    got = same_gpu_share(coact, np.array(p2l), num_gpus)
    assert got == pytest.approx(_same_gpu_share_brute(coact, p2l, num_gpus))


def test_placement_map_cells_and_labels(tiny_layer):
    p2l, load, _ = tiny_layer
    fig = placement_map(p2l, 3, load, layer_id=7)
    ax, bar = fig.axes
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("slot on GPU", "GPU (rank)")
    assert bar.get_ylabel() == "slot load / mean slot load"
    grid = np.asarray(ax.images[0].get_array())
    assert grid.shape == (3, 3)
    # expert 0 has two replicas: each carries 30 of its 60 tokens; 140 tokens over 9 slots
    assert grid[0, 0] == pytest.approx(30 / (140 / 9))
    cells = [t.get_text() for t in ax.texts]
    assert cells[:3] == ["0*", "1*", "5*"] and cells[3] == "2"
    assert ax.get_title() == "Placement map, layer 7: hottest GPU 1.18 x mean"
    _renders(fig)


def test_placement_map_rejects_unknown_expert(tiny_layer):
    p2l, load, _ = tiny_layer
    with pytest.raises(UsageError, match=r"physical_to_logical holds ids outside \[0, 4\)$"):
        placement_map(p2l, 3, load[:4])
    with pytest.raises(UsageError, match=r"9 slots do not split evenly over 2 GPUs$"):
        placement_map(p2l, 2, load)


def test_whatif_chart_marks_missing_scenarios():
    fig = whatif_chart(["a R=0", "a R=16", "b R=0"], np.array([300.0, 250.0, np.nan]),
                       np.array([20.0, 15.5, np.nan]), notes=["", "", "does not fit"])
    time_ax, kv_ax = fig.axes
    assert time_ax.get_xlabel() == "MoE-layer p99 (µs)"
    assert kv_ax.get_xlabel() == "KV cache left per GPU (GB)"
    assert time_ax.get_ylabel() == "scenario"
    assert [t.get_text() for t in time_ax.get_yticklabels()] == ["a R=0", "a R=16", "b R=0"]
    assert len(time_ax.patches) == 2
    assert "does not fit" in [t.get_text() for t in kv_ax.texts]
    _renders(fig)
    with pytest.raises(UsageError, match=r"p99_us and kv_left_gb need 3 values, one per label$"):
        whatif_chart(["a", "b", "c"], np.ones(2), np.ones(3))


def test_hot_shard_tail_two_placements():
    rng = np.random.default_rng(0)
    a = 1 + rng.gamma(2.0, 0.2, size=(50, 4))
    b = 1 + rng.gamma(2.0, 0.05, size=(50, 4))
    fig = hot_shard_tail([a, b], ["eplb", "cpsat"])
    hist, tail = fig.axes
    assert hist.get_xlabel() == "hot-shard ratio (max / mean GPU load)"
    assert hist.get_ylabel() == "share of (batch, layer) pairs"
    assert tail.get_ylabel() == "share of pairs at or above x"
    assert tail.get_yscale() == "log"
    legend = [t.get_text() for t in tail.get_legend().get_texts()]
    assert legend == [f"eplb (p99 {np.percentile(a, 99):.2f})",
                      f"cpsat (p99 {np.percentile(b, 99):.2f})"]
    _renders(fig)


def test_plot_rejects_wrong_dimensions():
    with pytest.raises(UsageError) as info:
        expert_load_heatmap(np.ones(3))
    assert str(info.value) == "load: load must have 2 dimensions, got shape (3,)"


def test_missing_matplotlib_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(PlacerError) as info:
        require_matplotlib()
    assert info.value.message == "pictures need matplotlib, which is not installed"
    assert info.value.hint == "pip install 'placer[plots]'"


# -- HTML ---------------------------------------------------------------------------------
@pytest.fixture
def small_png() -> bytes:
    """A tiny real PNG drawn by matplotlib."""
    return figure_png(expert_load_heatmap(np.ones((2, 3))), dpi=20)


def test_render_html_is_self_contained_and_has_every_section(small_png):
    page = render_html(
        "placer <report>",
        [
            Section("Summary", blocks=(Text("tokens & layers"), Table(
                ("metric", "value"), (("tokens", "1,024"), ("layers", "12"))))),
            Section("Placements", blocks=(SideBySide(
                (Picture(small_png, "A"), Picture(small_png, "B")), titles=("eplb", "cpsat")),)),
        ],
        subtitle="trace.jsonl",
    )
    assert page.startswith("<!DOCTYPE html>")
    assert "<title>placer &lt;report&gt;</title>" in page
    assert "tokens &amp; layers" in page
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page)
    assert not re.search(r"(https?:)?//[a-z0-9]", text, re.IGNORECASE)
    assert not re.search(r"<(script|link|iframe)\b", page)
    for anchor in ('id="summary"', 'id="placements"', 'href="#summary"', 'href="#placements"'):
        assert anchor in page
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 2 and base64.b64decode(images[0]) == small_png
    assert '<td class="num">1,024</td>' in page and "<td>layers</td>" in page
    assert "<h3>eplb</h3>" in page and "<h3>cpsat</h3>" in page


def test_picture_and_table_validate_themselves():
    with pytest.raises(ValueError, match="PNG bytes"):
        Picture(b"GIF89a", "not a png")
    with pytest.raises(ValueError, match="row 0 has 1 cells for 2 columns"):
        Table(("a", "b"), (("1",),))


# -- placer report end to end -----------------------------------------------------------------
BUNDLED = Path(__file__).resolve().parents[2] / "traces" / "synthetic-small.jsonl.gz"
runner = CliRunner()


@pytest.fixture(scope="module")
def two_plans(tmp_path_factory) -> tuple[Path, Path]:
    """EPLB with 8 redundant experts and the linear baseline on dgx-h100 (bundled trace)."""
    folder = tmp_path_factory.mktemp("plans")
    paths = (folder / "eplb.json", folder / "linear.json")
    for path, solver, redundant in zip(paths, ("eplb", "linear"), ("8", "0"), strict=True):
        result = runner.invoke(app, ["plan", str(BUNDLED), "-t", "dgx-h100", "-m", "gpt-oss-20b",
                                     "--solver", solver, "--redundant", redundant,
                                     "-o", str(path)])
        assert result.exit_code == 0, result.stderr
    return paths


def test_placer_report_writes_every_section(two_plans, tmp_path):
    out, pngs = tmp_path / "report.html", tmp_path / "png"
    pngs.mkdir()  # placer creates no folder, --png-dir's neither
    result = runner.invoke(app, [
        "report", str(BUNDLED), "-p", str(two_plans[0]), "-p", str(two_plans[1]),
        "-t", "dgx-h100", "-m", "gpt-oss-20b", "-o", str(out), "--png-dir", str(pngs),
        "--dpi", "30", "--layer", "2"])
    assert result.exit_code == 0, result.stderr
    assert f"wrote {out}" in result.stderr
    page = out.read_text()
    for title in ("Verdict", "Settings", "Trace summary", "Placements", "Placement maps",
                  "Co-activation and GPU boundaries", "Per-GPU load", "Per-batch hot shard"):
        assert f"<h2>{title}</h2>" in page, title
    assert "<th>eplb</th><th>linear</th>" in page
    assert "<p>Layer 2, as asked.</p>" in page
    assert "<h2>Verdict</h2>" in page and "<h2>Settings</h2>" in page
    assert "<td>redundant experts per layer</td><td class=\"num\">8</td>" in page
    without_images = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page)
    assert not re.search(r"(https?:)?//[a-z0-9]", without_images, re.IGNORECASE)
    # expert load, 2 maps, 2 co-activation maps, per-GPU load, tail
    files = sorted(p.name for p in pngs.glob("*.png"))
    assert page.count("data:image/png;base64,") == len(files) == 7
    assert "placement-map-eplb-layer2.png" in files


def test_placer_report_usage_errors(two_plans, tmp_path):
    base = ["report", str(BUNDLED), "-p", str(two_plans[0]), "-t", "dgx-h100",
            "-m", "gpt-oss-20b", "-o", str(tmp_path / "r.html")]
    result = runner.invoke(app, [*base, "--name", "a", "--name", "b"])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == "error: --name: 2 --name for 1 --placement"
    result = runner.invoke(app, [*base, "--dpi", "5"])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == "error: --dpi: expected a value >= 20, got 5"
    assert not (tmp_path / "r.html").exists()


def test_placer_report_without_matplotlib_says_how_to_install(two_plans, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = runner.invoke(app, ["report", str(BUNDLED), "-p", str(two_plans[0]),
                                 "-t", "dgx-h100", "-m", "gpt-oss-20b",
                                 "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "error: pictures need matplotlib, which is not installed",
        "hint: pip install 'placer[plots]'",
    ]


def test_compare_report_with_no_scenario_that_ran_keeps_table_and_notes():
    """Two rows that never ran: the page has the table, the notes, the chart and the trace."""
    from placer.compare import CompareRow, ScenarioOutcome
    from placer.report.sections import compare_report
    from placer.stats import ExpertStats
    from placer.stats.analysis import summarize

    stats = ExpertStats(load=np.array([[[5, 3, 1, 1], [2, 2, 4, 2]]]), tokens=np.array([5]),
                        layer_ids=np.array([0, 1]), top_k=2)
    rows = [CompareRow("a R=0 eplb", "a", 0, "eplb", "does not fit: 9 slots need 90 GB",
                       num_gpus=8),
            CompareRow("a R=4 eplb", "a", 4, "eplb", "error: 12 slots do not split")]
    built = compare_report([ScenarioOutcome(r) for r in rows], stats, summarize(stats), dpi=30)
    assert [s.title for s in built.sections] == ["Verdict", "Scenarios", "Settings",
                                                 "Trace summary"]
    assert [name for name, _ in built.pictures] == ["what-if", "expert-load"]
    page = built.html()
    assert "<td>does not fit [1]</td>" in page and "<td>error [2]</td>" in page
    assert "<p>[1] 9 slots need 90 GB</p>" in page and "<p>[2] 12 slots do not split</p>" in page
    assert "<p>a R=0 eplb: no verdict (does not fit, no figures)</p>" in page
