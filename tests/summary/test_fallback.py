"""A FALLBACK plan's summary names why it kept the baseline's layout, and every summary
says how skewed the fitted traffic is, in text and JSON."""

from __future__ import annotations

import warnings

import pytest
from planner_fixtures import MODEL, skewed_stats

from placer.cli.summary import fallback_rows, summary_rows, traffic_rows
from placer.planning.solvers import solve
from placer.problem import PlacementProblem, SolveParams
from placer.regime import Regime
from placer.stats import RoutingData
from placer.stats.skew import skew_report
from placer.summary import summarize_plan
from placer.topology import load_topology


@pytest.fixture(scope="module")
def fallback():
    """8 GPUs with 8 slots for 32 heavily skewed experts: EPLB's layout (repaired of its
    duplicates) is timed as fast as any CP-SAT found, so every layer keeps it."""
    topo = load_topology("dgx-h100")
    problem = PlacementProblem(stats=skewed_stats(), num_gpus=8, slots_per_gpu=8,
                               node_of_gpu=topo.node_of_gpu, num_groups=4, topology=topo,
                               model=MODEL)
    regime = Regime("vllm", "decode")
    params = SolveParams(regime=regime, time_limit_s=1.0)
    plan, base = solve(problem, "cpsat", params), solve(problem, "eplb", params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary = summarize_plan(problem, plan, base, RoutingData(problem.stats),
                                 regime=regime)
    return plan, summary


def test_the_solver_records_each_fallback_layers_reason(fallback):
    plan, _ = fallback
    assert plan.status == "FALLBACK"
    layers = plan.details["layers"]
    reasons = plan.details["fallback"]
    assert sum(r["layers"] for r in reasons.values()) == len(layers)
    assert {e["fallback"] for e in layers} == set(reasons) == {"judged"}
    assert "evaluator" in reasons["judged"]["why"]


def test_the_summary_says_why_in_text_and_json(fallback):
    _, summary = fallback
    doc = summary.to_dict()["solver"]
    assert doc["status"] == "FALLBACK"
    assert doc["fallback"]["judged"]["layers"] == 2
    lines = summary_rows(summary, output="plan.json")
    line = next(x for x in lines if x.startswith("fallback"))
    assert line.startswith("fallback     no layer is CP-SAT's own: the evaluator times the kept"
                           " layout at least as fast as every candidate in 2 layers")
    repaired = summary.to_dict()["solver"]["repaired_layers"]["eplb"]
    assert line.endswith(f"eplb's layout holds an expert twice on a GPU in {repaired} layers,"
                         " kept here with the second replica swapped onto another GPU")
    assert lines.index(line) == next(i for i, x in enumerate(lines) if x.startswith("solver")) + 1


def test_a_plan_of_cpsats_own_names_no_reason(fallback):
    _, summary = fallback
    own = dict(summary.to_dict()["solver"], status="FEASIBLE")
    # a plan with some layers kept says which and why; one of its own in every layer, nothing
    assert fallback_rows(own)[0].startswith("fallback     2 layers kept another layout: the"
                                            " evaluator times")
    assert fallback_rows(dict(own, fallback=None)) == []
    assert fallback_rows(dict(own, status="FALLBACK", fallback=None)) == []


def test_the_summary_says_how_skewed_the_fitted_windows_are(fallback):
    """The skew line: the fitted windows' median layer against measured routing."""
    _, summary = fallback
    skew = summary.to_dict()["problem"]["skew"]
    expected = skew_report(skewed_stats().load)
    assert skew["class"] == expected["class"] and skew["median"] == expected["median"]
    lines = summary_rows(summary, output="plan.json")
    line = next(x for x in lines if x.startswith("traffic"))
    m = skew["median"]
    assert f"Gini {m['gini']:.2f}, CV {m['cv']:.2f}, max/mean {m['max_over_mean']:.1f}" in line
    assert line.endswith(f"(Gini {skew['real_gini_medians'][0]:.2f}-"
                         f"{skew['real_gini_medians'][1]:.2f} ± 0.03)")
    assert traffic_rows(None) == []


@pytest.mark.parametrize(("gini", "name", "words"), [
    (0.20, "mild", "milder than measured routing"),
    (0.53, "real", "within measured routing's range"),
    (0.80, "heavy", "heavier than measured routing"),
])
def test_the_skew_line_places_the_class(gini, name, words):
    skew = {"median": {"gini": gini, "cv": 1.0, "max_over_mean": 4.0, "top_share": 0.1},
            "class": name, "real_gini_medians": [0.51, 0.56]}
    assert traffic_rows(skew) == [
        f"traffic      fitted windows' median layer: Gini {gini:.2f}, CV 1.00, max/mean 4.0:"
        f" {words} (Gini 0.51-0.56 ± 0.03)"]
