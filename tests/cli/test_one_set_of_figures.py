"""One placement, one trace, one regime: one set of figures, whichever command judges it.

``placer plan`` (its summary's held-out figures), ``placer evaluate`` (its held-out part),
``placer compare`` (its row, judged on the held-out part of the default split) and
``placer report`` (judged on the same windows) must print the same numbers for the same
placement under the same ``--engine/--workload/--tokens-per-gpu`` flags, for a decode
and a prefill regime, on per-token routing and on aggregated statistics.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from placer.cli.main import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
SYNTHETIC = ROOT / "traces" / "synthetic-small.jsonl.gz"  # 32 windows: 24 fitted, 8 held out
QWEN3 = ROOT / "traces" / "qwen3-30b-a3b.npz"  # aggregated, one window

#: Figures every command prints (evaluator metric keys).
FIGURES = ("step_p50_us", "step_p99_us", "step_mean_us", "moe_layer_p50_us", "moe_layer_p99_us",
           "layer_p99_us_median", "layer_p99_us_worst", "all_to_all_us", "compute_us")

CASES = {
    # trace, model, topology, redundant, the plan's --fit (the default split's fitted part)
    "per-token": (SYNTHETIC, "gpt-oss-20b", "dgx-h100", "8", ["--fit", "0:24"]),
    "aggregated": (QWEN3, "qwen3-30b-a3b", "2x-dgx-h100", "16", []),
}
REGIMES = {
    "sglang decode": ["--engine", "sglang", "--workload", "decode"],
    "vllm prefill": ["--engine", "vllm", "--workload", "prefill", "--tokens-per-gpu", "512"],
}


def _run(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--json", "-q"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("regime", list(REGIMES))
@pytest.mark.parametrize("case", list(CASES))
def test_plan_evaluate_compare_and_report_print_the_same_figures(case, regime, tmp_path):
    pytest.importorskip("matplotlib")  # placer report draws pictures
    trace, model, topology, redundant, fit = CASES[case]
    flags = REGIMES[regime]
    common = [str(trace), "-m", model, "-t", topology, *flags]
    placement = tmp_path / "eplb.json"
    planned = _run("plan", *common, "-r", redundant, "-s", "eplb", *fit, "-o", str(placement))
    plan_figures = planned["times"]["eplb"]
    windows = planned["judged"]["windows"]

    evaluated = _run("evaluate", str(trace), "-p", str(placement), *flags, *fit)
    part = next(p for p in evaluated["parts"] if p["windows"] == windows)
    evaluate_figures = part["placements"][0]["metrics"]

    compared = _run("compare", *common, "-r", redundant, "-s", "eplb")
    (row,) = compared["rows"]
    assert compared["regime"] == {k: v for k, v in planned["regime"].items()
                                  if k not in ("batch_tokens", "note")}

    reported = _run("report", str(trace), "-p", str(placement), *flags,
                    "-o", str(tmp_path / "r.html"), "--dpi", "30")
    assert reported["windows"] == windows
    report_figures = reported["placements"][0]["metrics"]

    for key in FIGURES:
        value = plan_figures[key]
        assert evaluate_figures[key] == pytest.approx(value, rel=1e-12), ("evaluate", key)
        assert report_figures[key] == pytest.approx(value, rel=1e-12), ("report", key)
        if key in row:
            assert row[key] == pytest.approx(value, rel=1e-12), ("compare", key)
    assert row["step_p99_us"] == pytest.approx(plan_figures["step_p99_us"], rel=1e-12)
    assert evaluated["regime"]["engine"] == reported["regime"]["engine"] == flags[1]
