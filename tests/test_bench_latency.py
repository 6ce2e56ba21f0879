"""Smoke test of bench/latency.py's helpers on tiny synthetic data (no ../shared/data)."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the bench package
import bench.latency as latency


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """A tiny gpt-oss-20b-shaped trace (2 layers x 32 experts, top-4, 8 steps), written
    by ``synth_trace`` and read with per-token routing kept."""
    path = tmp_path_factory.mktemp("latency") / "tiny.npz"
    overrides = {"layer_ids": (0, 1), "num_tokens": 2048, "tokens_per_step": 256,
                 "num_ranks": 4, "zipf": 1.0, "clusters": 4, "seed": 3}
    written = latency.synth_trace(path, "gpt-oss-20b", **overrides)
    assert written == path and path.exists()
    mtime = path.stat().st_mtime_ns
    assert latency.synth_trace(path, "gpt-oss-20b", **overrides) == path  # reused
    assert path.stat().st_mtime_ns == mtime
    return latency.read(path, "gpt-oss-20b", keep_tokens=True)


def test_h100_node_sizes() -> None:
    assert latency.h100_node(4).num_gpus == 4
    assert latency.h100_node(8).name == "dgx-h100"


def test_compare_engines_rows_and_rendering(tiny) -> None:
    from placer.model import load_model

    assert tiny.trace is not None and tiny.stats.num_windows == 8
    rows = latency.compare_engines(
        "tiny", "tiny 4x9", tiny, load_model("gpt-oss-20b"), latency.h100_node(4),
        slots_per_gpu=9, fit=(0, 6), jobs=1, time_limit_s=1.0,
    )
    assert [r.engine for r in rows] == ["sglang", "vllm", "trtllm"]
    assert rows[0].extra["batch_floor"] is None  # SGLang's tables: no position rule
    for r in rows[1:]:  # the per-batch floors of EPLB's and cpsat's counts: never above
        eplb_floor, cpsat_floor = r.extra["batch_floor"]
        assert 0 < eplb_floor <= r.eplb_step_p99 and 0 < cpsat_floor <= r.cpsat_step_p99
    for r in rows:
        assert r.judged.startswith("held-out windows 6:8 (fitted 0:6), per-token replay")
        for value in (r.eplb_step_p99, r.eplb_layer_p99, r.cpsat_step_p99, r.cpsat_layer_p99):
            assert math.isfinite(value) and value > 0
        assert r.change == pytest.approx(r.cpsat_step_p99 / r.eplb_step_p99 - 1)
        assert r.verdict in ("faster", "slower", "equal")
        assert r.seconds > 0

    table = latency.render_table(rows)
    assert table[0].startswith("| configuration | engine | skew: Gini / CV / max÷mean (class) |"
                               " EPLB step p99")
    from placer.metrics import metric  # headings and numbers as every placer table shows them

    assert f"cpsat {metric('layer_p99_us_median').header} |" in table[0]
    assert f"| {metric('step_p99_us').cell(rows[0].eplb_step_p99)} |" in table[2]
    assert table[2].startswith("| tiny 4x9 | sglang | - |")  # no skew measured: a dash
    assert len(table) == 2 + len(rows)
    assert all(line.count("|") == table[0].count("|") for line in table)

    copies = rows[1].extra["copies"]  # the floor's traffic under every plan's
    assert list(copies) == ["floor", "eplb", "cpsat"]
    for i in range(2):
        assert 0 <= copies["floor"][i] <= min(copies["eplb"][i], copies["cpsat"][i])
    assert latency.render_traffic(rows) == []  # decode rows only
    traffic = latency.render_traffic([replace(rows[1], engine="vllm prefill")])
    assert traffic[2].startswith("| configuration | to another GPU: floor / EPLB / cpsat |")
    assert len(traffic) == 5 and traffic[4].startswith(
        f"| tiny 4x9 | {copies['floor'][0]:.2f} / {copies['eplb'][0]:.2f} /")


def test_closing_line_counts_and_targets() -> None:
    def row(key: str, engine: str, eplb: float, cpsat: float) -> object:
        return latency.Row(config=key.upper(), engine=engine, judged="", eplb_step_p99=eplb,
                           eplb_layer_p99=1.0, cpsat_step_p99=cpsat, cpsat_layer_p99=1.0,
                           change=cpsat / eplb - 1, verdict="", seconds=0.0, key=key)

    rows = [row("a", "sglang", 100, 80), row("a", "vllm", 100, 95),
            row("b", "sglang", 100, 101), row("b", "vllm", 100, 90)]
    line = latency.closing_line(rows, {"a": 0.10, "b": 0.05, "c": 0.05})
    assert line.startswith("cpsat's held-out step p99 <= EPLB's on 3 of 4 rows")
    assert "A >= 10% lower on every engine: not met (sglang 20.0% lower, vllm 5.0% lower)" in line
    assert "B >= 5% lower on every engine: not met (sglang 1.0% higher, vllm 10.0% lower)" in line
    assert "c >= 5% lower: not run" in line
    met = latency.closing_line(rows[:1], {"a": 0.10})
    assert "A >= 10% lower on every engine: met" in met


# -- the three skews --------------------------------------------------------------------------

from bench import skews  # noqa: E402


def test_synthetic_configurations_run_at_every_skew_with_the_same_seeds() -> None:
    configs = latency._synthetic()
    assert [c.skew for c in configs] == [s for s in skews.SKEWS for _ in latency.SYNTH]
    assert skews.SKEWS[0] == "real"  # the headline first
    names = [c.name for c in configs]
    assert len(set(names)) == len(names) and "deepseek-v3-real" in names
    for key, (name, _, overrides) in latency.SYNTH.items():
        mine = latency.skew_overrides(key)
        assert "zipf" not in mine  # the skew is the preset's, never a fixed exponent
        assert mine == {k: v for k, v in overrides.items() if k != "zipf"}
        assert mine["seed"] == 1
        paths = {latency.synth_path(key, s) for s in skews.SKEWS}
        assert len(paths) == len(skews.SKEWS) and latency.OUT / name not in paths
    # a key selects every skew, a name one
    assert [c.name for c in latency.selected(configs, {"deepseek-v3"})] == [
        f"deepseek-v3-{s}" for s in skews.SKEWS]
    assert [c.name for c in latency.selected(configs, {"kimi-k2-heavy"})] == ["kimi-k2-heavy"]
    assert latency.selected(configs, set()) == configs


@pytest.fixture(scope="module")
def three_skews(tmp_path_factory: pytest.TempPathFactory):
    """A tiny DeepSeek-V3-shaped trace (4 layers, group-limited) at each preset, with the
    same overrides and seed, as ``_synthetic`` writes them."""
    folder = tmp_path_factory.mktemp("skews")
    model = latency.SYNTH["deepseek-v3"][1]
    tiny = {**latency.skew_overrides("deepseek-v3"), "layer_ids": (3, 4, 5, 6), "num_tokens": 8192,
            "tokens_per_step": 1024}
    out = {}
    for skew in skews.SKEWS:
        path = latency.synth_trace(folder / f"{skew}.npz", model, skew=skew, **tiny)
        out[skew] = latency.read(path, model, coact=False)
    return out


def test_each_generated_trace_has_its_presets_skew(three_skews) -> None:
    ginis = []
    for skew, routing in three_skews.items():
        measured = skews.measure(routing.stats.load, routing.stats.layer_ids)
        assert measured.cls == skew, (skew, measured)
        assert skews.in_preset_range(measured, skew), (skew, measured)
        ginis.append(measured.gini)
    by_name = dict(zip(three_skews, ginis, strict=True))
    assert by_name["mild"] < by_name["real"] < by_name["heavy"]


def test_rows_state_their_skew_and_the_targets_read_real_rows_only() -> None:
    def row(skew: str | None, change: float, gini: float) -> latency.Row:
        r = latency.Row(config=f"X, {skew} skew", engine="vllm", judged="",
                        eplb_step_p99=100.0, eplb_layer_p99=1.0,
                        cpsat_step_p99=100.0 * (1 + change), cpsat_layer_p99=1.0,
                        change=change, verdict="", seconds=0.0, key="deepseek-v3",
                        extra={"batch_floor": (90.0, 85.0)})
        r.skew, r.base_label = skew, "X"
        r.measured = skews.Measured(gini=gini, cv=1.0, max_over_mean=5.0,
                                    cls=skew or "real")
        return r

    rows = [row("real", -0.05, 0.53), row("mild", -0.01, 0.30), row("heavy", -0.20, 0.70)]
    assert latency.headline(rows) == rows[:1]
    line = latency.round_robin_targets_line(rows)
    assert "X, real skew vllm: 5.0% lower" in line and "mild" not in line
    assert "EPLB 10.0% above its per-batch floor, cpsat 10.5% above its own (met)" in line
    closing = latency.closing_line(rows, {"deepseek-v3": 0.10})
    assert "on 3 of 3 rows" in closing and "(vllm 5.0% lower)" in closing
    table = skews.scaling_table(rows)
    assert table[-1] == "| X | vllm | -1.0% (0.30) | -5.0% (0.53) | -20.0% (0.70) |"
    assert latency._skew_cell(rows[2]).endswith("(heavy) sensitivity")
    cells = latency.render_table(rows)
    assert all(line.count("|") == cells[0].count("|") for line in cells)
    assert "| 0.53 / 1.00 / 5.0 (real) |" in cells[2]
