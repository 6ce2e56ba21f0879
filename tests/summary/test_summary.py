"""``placer.summary``: the plan summary's time figures are the evaluator's, on the judged
windows and under the workload's parameters; verdict and layer counts in words."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from placer.cli.summary import judged_text, summary_rows, time_rows
from placer.evaluate import EvalParams, evaluate
from placer.evaluate.dispatch import CODE_POLICIES
from placer.evaluate.params import regime_params
from placer.model import load_model
from placer.planning.build import ProblemSpec, build_problem
from placer.planning.solvers import solve
from placer.regime import Regime
from placer.stats import RoutingData
from placer.summary import (
    EQUAL_TOLERANCE,
    TIME_FIGURES,
    judged_windows,
    layers_faster,
    summarize_plan,
    time_figure,
    verdict,
)
from placer.topology import load_topology
from placer.traces import read_routing

SYNTH = Path(__file__).resolve().parents[2] / "traces" / "synthetic-small.jsonl.gz"


@pytest.fixture(scope="module")
def synth():
    """The bundled synthetic trace (gpt-oss-20b shape, 32 windows), per-token, on a DGX H100."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        routing = read_routing(SYNTH, keep_tokens=True)
    return routing, load_model("gpt-oss-20b"), load_topology("dgx-h100")


def _plans(routing, model, topology, fit=(0, 6)):
    problem = build_problem(routing, ProblemSpec(model=model, topology=topology, redundant=8,
                                                 fit=fit))
    return problem, solve(problem, "round_robin"), solve(problem, "eplb")


def _summarize(synth, workload, fit=(0, 6), routing=None):
    full, model, topology = synth
    problem, plan, base = _plans(full, model, topology, fit)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return problem, plan, base, summarize_plan(
            problem, plan, base, routing or full, regime=workload, fit=fit)


@pytest.mark.parametrize("workload", [Regime(), Regime("sglang", "prefill", 512)],
                         ids=["vllm-decode", "sglang-prefill"])
def test_times_are_the_evaluators_on_the_held_out_windows(synth, workload):
    routing, model, topology = synth
    problem, plan, base, summary = _summarize(synth, workload)
    params = summary.eval_params
    assert params is not None and params.windows == (6, 32)
    assert (params.policy, params.mode) == (workload.dispatch, workload.all_to_all)
    assert params.batch_tokens == workload.tokens * 8 and not params.sample
    assert summary.judged.part == "held-out" and summary.judged.source == "trace"
    assert judged_text(summary.judged).startswith(
        "held-out windows 6:32 (fitted 0:6), per-token replay: ")
    layers = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for result in (plan, base):
            direct = evaluate(result.placement, routing, topology, model, params)
            for fig in TIME_FIGURES:
                assert summary.times[result.solver][fig.key] == direct.metrics[fig.key]
            layers[result.solver] = direct.per_layer["layer_time_p99_us"]
    won, lost, equal = layers_faster(layers["round_robin"], layers["eplb"])
    assert summary.layers == {"round_robin": won, "eplb": lost, "equal": equal}
    assert won + lost + equal == problem.stats.num_layers
    step = summary.times["round_robin"]["step_p99_us"] / summary.times["eplb"]["step_p99_us"]
    assert np.isclose(summary.verdict.change, step - 1)
    if workload.dispatch in CODE_POLICIES:  # each plan's per-batch floor, under its step p99
        for result in (plan, base):
            floor = summary.batch_floor[result.solver]
            assert 0 < floor <= summary.times[result.solver]["step_p99_us"] * (1 + 1e-12)
        assert summary.to_dict()["batch_floor"] == summary.batch_floor
        lines = summary_rows(summary, output="plan.json")
        line = next(x for x in lines if x.startswith("per-batch floor ("))
        assert f"eplb {summary.batch_floor['eplb']:,.1f} µs" in line
    else:  # SGLang's tables depend on where replicas sit: no such floor
        assert summary.batch_floor is None
        lines = summary_rows(summary, output="plan.json")
        assert not any(x.startswith("per-batch floor (") for x in lines)
    assert summary.verdict.text.endswith(
        f"than eplb on held-out step p99 ({workload.engine} {workload.workload})"
    ) or " are equal " in summary.verdict.text


def test_no_held_out_windows_judges_the_fitted_ones_and_says_so(synth):
    _, _, _, summary = _summarize(synth, Regime(), fit=None)
    assert summary.judged.part == "fitted" and summary.eval_params.windows == (0, 32)
    assert "no window held out" in judged_text(summary.judged)
    assert summary.verdict.text.endswith("on fitted step p99 (vllm decode)")


def test_aggregated_statistics_are_sampled(synth):
    routing, model, topology = synth
    stats_only = RoutingData(routing.stats)
    _, plan, _, summary = _summarize(synth, Regime(), routing=stats_only)
    assert summary.judged.source == "sampled"
    assert "aggregated statistics, no per-token routing" in summary.judged.source_why
    assert summary.judged.source_why in summary.judged.to_dict()["why"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        direct = evaluate(plan.placement, stats_only, topology, model, summary.eval_params)
    assert summary.times["round_robin"] == {f.key: direct.metrics[f.key] for f in TIME_FIGURES}


def test_text_and_json_carry_the_same_figures(synth):
    _, _, _, summary = _summarize(synth, Regime())
    lines = summary_rows(summary, output="plan.json", regime_note="from --engine")
    assert lines[0] == "placement    plan.json"
    assert lines[5] == ("judged as    vllm decode, 128 tokens per GPU (vllm_hash dispatch,"
                        " low_latency all-to-all); from --engine")
    header = lines.index(f"{'estimated time, µs':24}{'round_robin':>12}{'eplb':>12}"
                         f"{'floor':>12}")
    floor = summary.floor
    for i, fig in enumerate(TIME_FIGURES, start=header + 1):
        assert lines[i] == (f"{fig.label:24}{fig.cell(summary.times['round_robin'][fig.key]):>12}"
                            f"{fig.cell(summary.times['eplb'][fig.key]):>12}"
                            f"{fig.cell(floor.get(fig.key)):>12}")
    assert lines[header + len(TIME_FIGURES) + 1].startswith("layers faster: round_robin ")
    assert lines[header + len(TIME_FIGURES) + 2] == summary.verdict.text
    gap = summary.gaps()
    assert lines[header + len(TIME_FIGURES) + 3].endswith(
        f"above it: round_robin {gap['round_robin']:.1%}, eplb {gap['eplb']:.1%}"
        " (docs/planner.md, the floor)")
    traffic = lines[header + len(TIME_FIGURES) + 4]
    gpu, node = floor["remote_copies_per_token_gpu"], floor["remote_copies_per_token_node"]
    assert traffic.startswith(f"floor's traffic: at least {gpu:.2f} copies per token to"
                              f" another GPU and {node:.2f} to another node; round_robin ")
    for name in ("round_robin", "eplb"):
        metrics = summary.evaluations[name].metrics
        assert metrics["remote_copies_per_token_gpu"] >= gpu
        assert (f"{name} {metrics['remote_copies_per_token_gpu']:.2f} and"
                f" {metrics['remote_copies_per_token_node']:.2f}") in traffic
    doc = summary.to_dict()
    assert doc["floor"] == floor and doc["gap_to_floor"] == gap
    assert doc["times"] == summary.times
    assert doc["verdict"]["text"] == summary.verdict.text
    assert doc["layers_faster"] == summary.layers
    assert doc["judged"]["windows"] == [6, 32] and doc["judged"]["part"] == "held-out"
    assert doc["regime"] == {"engine": "vllm", "workload": "decode", "tokens_per_gpu": 128,
                             "policy": "vllm_hash", "mode": "low_latency", "seed": 0,
                             "batch_tokens": 1024}  # the command adds where it came from
    assert doc["versus"]["columns"] == ["round_robin", "eplb"]


def test_without_baseline_or_model(synth):
    routing, model, topology = synth
    problem, plan, _ = _plans(routing, model, topology)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        alone = summarize_plan(problem, plan, None, routing, fit=(0, 6))
    assert alone.columns == ("round_robin",) and alone.verdict is None and alone.versus is None
    assert alone.layers is None and set(alone.times) == {"round_robin"}
    bare = build_problem(routing, ProblemSpec(num_gpus=8, redundant=8, fit=(0, 6)))
    summary = summarize_plan(bare, solve(bare, "linear"), solve(bare, "eplb"), routing)
    assert summary.times == {} and summary.verdict is None
    assert time_rows(summary) == [
        "estimated time: not shown (the evaluator needs `model` and `topology`)"]


@pytest.mark.parametrize("mine,theirs,text", [
    (95.9, 100.0, "verdict: cpsat is 4.1% faster than eplb on held-out step p99 (vllm decode)"),
    (101.2, 100.0, "verdict: cpsat is 1.2% slower than eplb on held-out step p99 (vllm decode)"),
    (100.05, 100.0,
     "verdict: cpsat and eplb are equal (within 0.1%) on held-out step p99 (vllm decode)"),
    (99.95, 100.0,
     "verdict: cpsat and eplb are equal (within 0.1%) on held-out step p99 (vllm decode)"),
])
def test_verdict_wording(mine, theirs, text):
    result = verdict("cpsat", "eplb", mine, theirs, on="held-out step p99 (vllm decode)")
    assert result is not None and result.text == text
    assert result.outcome == ("equal" if abs(mine / theirs - 1) < EQUAL_TOLERANCE
                              else "faster" if mine < theirs else "slower")


def test_verdict_needs_both_figures():
    assert verdict("cpsat", "eplb", float("nan"), 100.0) is None
    assert verdict("cpsat", "eplb", 1.0, 0.0) is None


def test_layers_faster_counts_with_the_tolerance():
    mine = np.array([90.0, 110.0, 100.05, 100.0, np.nan])
    theirs = np.array([100.0, 100.0, 100.0, 100.0, np.nan])
    assert layers_faster(mine, theirs) == (1, 1, 3)


@pytest.mark.parametrize("windows,fit,part,judged", [
    (32, (0, 6), "held-out", (6, 32)),
    (32, (6, 32), "held-out", (0, 6)),
    (32, None, "fitted", (0, 32)),
    (32, (0, 32), "fitted", (0, 32)),
    (1, None, "fitted", (0, 1)),
])
def test_judged_windows(windows, fit, part, judged):
    result = judged_windows(windows, fit)
    assert (result.part, result.windows) == (part, judged)


def test_eval_params_of_a_workload():
    decode = regime_params(Regime(), 16, num_layers=48)
    assert (decode.policy, decode.mode, decode.batch_tokens, decode.num_batches) == (
        "vllm_hash", "low_latency", 2048, 16)
    prefill = regime_params(Regime("sglang", "prefill"), 16, num_layers=48,
                                  dtype="fp8")
    assert (prefill.policy, prefill.mode, prefill.batch_tokens, prefill.num_batches) == (
        "sglang", "normal", 65536, 2)
    assert regime_params(Regime(workload="prefill"), 8, num_layers=4).num_batches == 16
    assert prefill.dtype == "fp8" and prefill.seed == 0
    assert isinstance(prefill, EvalParams)


def test_one_definition_of_time_labels():
    assert time_figure("moe_layer_p99_us").header == "p99 µs"
    assert time_figure("all_to_all_us").cell(12.345) == "12.3"
    assert time_figure("step_p99_us").cell(float("nan")) == "-"
    assert all(len(f.label) <= 24 for f in TIME_FIGURES)
