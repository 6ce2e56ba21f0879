"""Reports state their settings and command line, and give a verdict per row in words.

placer.report.settings (the Settings section, the command line) and
placer.report.verdicts (each compared row against its baseline), then both in the
compare page built from rows alone (no planning) and in ``placer report`` end to end.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from placer.cli.main import app
from placer.compare import CompareRow, CompareSettings, Scenario, ScenarioOutcome
from placer.compare.rows import with_verdicts
from placer.evaluate import EvalParams
from placer.regime import Regime
from placer.report.settings import (
    command_line,
    compare_settings_rows,
    evaluation_settings_rows,
    settings_section,
)
from placer.report.verdicts import compare_judgements, judge, placement_judgements

BUNDLED = Path(__file__).resolve().parents[2] / "traces" / "synthetic-small.jsonl.gz"
runner = CliRunner()


def _row(scenario: str, solver: str, step_p99: float | None, *, topology: str = "dgx-h100",
         redundant: int = 0, status: str = "ok", **more) -> CompareRow:
    return CompareRow(scenario, topology, redundant, solver, status, num_gpus=8,
                      step_p99_us=step_p99, moe_layer_p99_us=None if step_p99 is None
                      else step_p99 / 10, kv_left_gb=None if step_p99 is None else 60.0, **more)


@pytest.fixture
def judged_rows() -> list[CompareRow]:
    """EPLB and CP-SAT on one node: CP-SAT 10% slower (the case a report must not hide),
    a second CP-SAT 12.3% faster, and a scenario that did not fit."""
    return with_verdicts([
        _row("eplb", "eplb", 1000.0),
        _row("cpsat slow", "cpsat", 1100.0),
        _row("cpsat fast", "cpsat", 877.0),
        _row("big", "eplb", None, redundant=64, status="does not fit: 90 GB per GPU"),
    ])


# -- the command line -----------------------------------------------------------------------
def test_command_line_is_shell_quoted_and_starts_with_placer():
    argv = ["/home/me/.venv/bin/placer", "compare", "my trace.npz", "-t", "dgx-h100",
            "--report", "out's.html"]
    assert command_line(argv) == (
        "placer compare 'my trace.npz' -t dgx-h100 --report 'out'\"'\"'s.html'")
    assert command_line(["/x/placer/__main__.py", "report", "-h"]) == "python -m placer report -h"
    assert command_line([]) == "placer"


# -- settings rows ----------------------------------------------------------------------------
def test_compare_settings_rows_state_policy_mode_seed_and_limits():
    settings = CompareSettings(model="qwen3-30b-a3b", policy="sglang", mode="low_latency",
                               seed=7, time_limit_s=30.0, layer_time_limit_s=2.5)
    scenarios = [Scenario("dgx-h100", 0, "eplb"), Scenario("dgx-h100", 0, "cpsat"),
                 Scenario("gb200-nvl72", 16, "eplb")]
    rows = dict(compare_settings_rows(settings, scenarios))
    assert rows["dispatch policy"] == "sglang (--dispatch)"
    assert rows["all-to-all mode"] == "low_latency (--mode)"
    assert rows["seed (solvers and sampling)"] == "7"
    assert rows["time limit per scenario (whole plan)"] == "30 s"
    assert rows["time limit per layer (search-based solvers)"] == "2.5 s"
    assert rows["topologies"] == "dgx-h100, gb200-nvl72"
    assert rows["redundant experts per layer"] == "0, 16"
    assert rows["solvers"] == "eplb, cpsat"
    assert rows["judged on"] == "held-out windows"


def test_compare_settings_rows_with_an_engine_say_where_policy_and_mode_come_from():
    settings = CompareSettings(model="deepseek-v3", engine="sglang", workload="decode",
                               tokens_per_gpu=64)
    rows = dict(compare_settings_rows(settings))
    target = settings.regime
    assert rows["judged as"] == target.describe()
    assert rows["dispatch policy"] == f"{target.dispatch} (from --engine sglang)"
    assert rows["all-to-all mode"] == f"{target.all_to_all} (from --workload decode)"
    assert rows["tokens per judged batch"] == "64 per GPU x the GPUs"


def test_evaluation_settings_rows_and_section_carry_version_and_command():
    params = EvalParams(policy="round_robin", mode="normal", batch_tokens=1024,
                        num_batches=32, seed=3, dtype=None, sample=True)
    rows = evaluation_settings_rows(Regime(seed=3), params, model="gpt-oss-20b",
                                    topology="dgx-h100", default_dtype="mxfp4")
    assert dict(rows)["batches"] == "32 sampled batches of 1024 tokens"
    assert dict(rows)["expert weight dtype"] == "mxfp4 (the model's)"
    assert dict(rows)["seed (sampling)"] == "3"
    section = settings_section(rows, command="placer report t.npz", version="9.9")
    table = section.blocks[0]
    assert ("placer version", "9.9") in table.rows
    assert section.blocks[-1].text == "placer report t.npz"


# -- verdicts ---------------------------------------------------------------------------------
def test_judge_says_better_worse_and_equal_plainly():
    base = {"step_p99_us": 100.0, "kv_left_gb": 50.0}
    worse = judge("cpsat", {"step_p99_us": 110.0, "kv_left_gb": 55.0}, "eplb", base)
    assert worse.line == "cpsat: step p99 +10.0% vs eplb — worse"
    assert worse.deltas["kv_left_gb"] == pytest.approx(0.1)
    better = judge("cpsat", {"step_p99_us": 87.7}, "eplb", base)
    assert better.line == "cpsat: step p99 -12.3% vs eplb — better"
    equal = judge("cpsat", {"step_p99_us": 100.05}, "eplb", base)
    assert equal.word == "equal" and equal.line.endswith("— equal (within 0.1%)")
    small = judge("cpsat", {"step_p99_us": 100.4}, "eplb", base)
    assert small.line == "cpsat: step p99 +0.40% vs eplb — worse"
    missing = judge("cpsat", {}, "eplb", base)
    assert missing.line == "cpsat: no verdict against eplb (no step p99 figure)"


def test_compare_judgements_name_the_baseline_and_never_hide_a_slower_plan(judged_rows):
    lines = [j.line for j in compare_judgements(judged_rows)]
    assert lines == [
        "eplb: the baseline",
        "cpsat slow: step p99 +10.0% vs eplb — worse",
        "cpsat fast: step p99 -12.3% vs eplb — better",
        "big: no verdict (does not fit, no figures)",
    ]


def test_compare_judgements_compute_a_delta_the_rows_do_not_carry():
    """Rows built without with_verdicts: the topology's first EPLB row is the baseline."""
    rows = [_row("cpsat", "cpsat", 90.0), _row("eplb", "eplb", 100.0),
            _row("other", "eplb", 50.0, topology="gb200-nvl72")]
    judged = compare_judgements(rows)
    assert judged[0].line == "cpsat: step p99 -10.0% vs eplb — better"
    assert judged[0].deltas["moe_layer_p99_us"] == pytest.approx(-0.1)
    assert judged[1].word == "baseline" and judged[2].word == "baseline"


def test_placement_judgements_against_the_first_placement():
    evals = [SimpleNamespace(metrics={"step_p99_us": 200.0, "batch_hot_shard_p99": 1.2}),
             SimpleNamespace(metrics={"step_p99_us": 230.0, "batch_hot_shard_p99": 1.5})]
    judged = placement_judgements(["eplb", "cpsat"], evals)
    assert [j.line for j in judged] == ["eplb: the baseline",
                                        "cpsat: step p99 +15.0% vs eplb — worse"]
    assert judged[1].deltas["batch_hot_shard_p99"] == pytest.approx(0.25)


# -- in the compare page -------------------------------------------------------------------------
def test_compare_report_opens_with_verdicts_and_states_settings(judged_rows):
    from placer.report.sections import compare_report
    from placer.stats import ExpertStats
    from placer.stats.analysis import summarize

    stats = ExpertStats(load=np.array([[[5, 3, 1, 1], [2, 2, 4, 2]]]), tokens=np.array([5]),
                        layer_ids=np.array([0, 1]), top_k=2)
    settings = CompareSettings(model="gpt-oss-20b", policy="sglang", seed=11, time_limit_s=5.0)
    built = compare_report([ScenarioOutcome(r) for r in judged_rows], stats, summarize(stats),
                           dpi=30, settings=settings,
                           scenarios=[Scenario("dgx-h100", 0, "eplb")],
                           command="placer compare t.npz -m gpt-oss-20b --dispatch sglang")
    assert [s.title for s in built.sections][:3] == ["Verdict", "Scenarios", "Settings"]
    page = built.html()
    assert "<p>cpsat slow: step p99 +10.0% vs eplb — worse</p>" in page
    assert "<td>dispatch policy</td><td>sglang (--dispatch)</td>" in page
    assert "<td>seed (solvers and sampling)</td><td>11</td>" in page
    assert "<td>time limit per scenario (whole plan)</td><td>5 s</td>" in page
    assert "<code>placer compare t.npz -m gpt-oss-20b --dispatch sglang</code>" in page
    assert re.search(r"<td>placer version</td><td>\d+\.\d+", page)
    # the delta table: one row per judged scenario, the baseline named
    assert "<td>cpsat slow</td><td>eplb</td><td class=\"num\">+10.0%</td>" in page
    assert "--layer" not in page  # compare has no --layer option


# -- placer report end to end -------------------------------------------------------------------
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


def test_placer_report_states_settings_command_and_verdict(two_plans, tmp_path, monkeypatch):
    out = tmp_path / "report.html"
    args = ["report", str(BUNDLED), "-p", str(two_plans[0]), "-p", str(two_plans[1]),
            "-t", "dgx-h100", "-m", "gpt-oss-20b", "-o", str(out), "--dispatch", "sglang",
            "--seed", "5", "--dpi", "30"]
    monkeypatch.setattr(sys, "argv", ["/venv/bin/placer", *args])
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    page = out.read_text()
    assert "<td>dispatch policy</td><td>sglang (--dispatch)</td>" in page
    assert "<td>seed (sampling)</td><td>5</td>" in page
    assert f"<code>placer report {BUNDLED} -p {two_plans[0]}" in page
    verdict = re.search(r"<p>(linear: step p99 [^<]*)</p>", page)
    assert verdict is not None
    assert verdict.group(1).endswith(("— better", "— worse", "— equal (within 0.1%)"))
    judged = ("judged as    vllm decode, 128 tokens per GPU (sglang dispatch, low_latency"
              " all-to-all); engine, workload, tokens per GPU as the 2 placements record;"
              " --dispatch sglang; set with --engine/--workload")
    assert result.stdout == judged + "\n" + verdict.group(1) + "\n"  # the answer on stdout
    result = runner.invoke(app, [*args, "--json", "-q"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [(v["name"], v["baseline"], v["line"]) for v in doc["verdicts"]] == [
        ("linear", "eplb", verdict.group(1))]
    assert doc["command"].startswith("placer report ")
    assert "the layer where the hot shard of eplb is worst" in page
