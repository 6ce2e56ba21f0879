"""Where cpsat keeps a layout other than its own in a layer, the plan says why, layer by
layer, in the solver's report, the summary's JSON and its text: each reason comes from an
instance built for it."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
from planner_fixtures import MODEL, skewed_stats

from placer.cli.summary import summary_rows
from placer.planning.solvers import solve
from placer.planning.solvers.cpsat.search import FALLBACK_REASONS
from placer.problem import PlacementProblem, SolveParams
from placer.regime import Regime
from placer.stats import RoutingData
from placer.summary import summarize_plan
from placer.topology import load_topology

REGIME = Regime("vllm", "decode")


def _problem(seed: int, slots: int, uniform_first: bool = False) -> PlacementProblem:
    """32 experts, 2 layers on 2 x DGX H100; the first layer's load even when asked."""
    stats = skewed_stats(seed)
    if uniform_first:
        load = stats.load.copy()
        load[:, 0] = 1000
        stats = replace(stats, load=load)
    topo = load_topology("2x-dgx-h100")
    return PlacementProblem(stats=stats, num_gpus=16, slots_per_gpu=slots,
                            node_of_gpu=topo.node_of_gpu, num_groups=4, topology=topo,
                            model=MODEL)


def _planned(problem: PlacementProblem, **params):
    params = SolveParams(regime=REGIME, total_time_limit_s=1.0, **params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = solve(problem, "cpsat", params)
        base = solve(problem, "eplb", SolveParams(regime=REGIME))
        summary = summarize_plan(problem, plan, base, RoutingData(problem.stats), regime=REGIME)
    return plan, summary


CASES = {
    # the first layer's load is even: EPLB's layout is already perfect, the search finds
    # nothing better there (and, with no traffic to weigh, keeps it), the second is its own
    "search": (lambda: _problem(1, 3, uniform_first=True), {"options": {"traffic_weight": 0}},
               [0]),
    # 2 slots a GPU: in the skewed layer the evaluator times EPLB's layout as fast
    "judged": (lambda: _problem(0, 2, uniform_first=True), {}, [1]),
    # faster by the search's own figures, but by less than the judge's margin: EPLB kept
    "margin": (lambda: _problem(1, 2, uniform_first=True), {}, [0, 1]),
}


@pytest.mark.parametrize("reason", sorted(CASES))
def test_each_reason_is_named_per_layer_in_the_report_json_and_text(reason):
    make, params, layers = CASES[reason]
    plan, summary = _planned(make(), **params)
    _says(plan, summary, reason, layers)


def test_a_move_budget_of_zero_keeps_the_deployed_layers_and_says_why():
    problem = _problem(1, 3)
    deployed = solve(problem, "eplb-valid", SolveParams()).placement
    plan, summary = _planned(replace(problem, current=deployed), max_moves=0)
    assert plan.placement.same_layers(deployed)
    _says(plan, summary, "moves", [0, 1])


def _says(plan, summary, reason: str, layers: list[int]) -> None:
    """``reason`` is the reason of exactly ``layers`` in the report, the JSON and the text."""
    named = {e["layer"] for e in plan.details["layers"] if e["fallback"] == reason}
    assert sorted(named) == layers
    doc = summary.to_dict()["solver"]["fallback"][reason]
    assert doc["layer_ids"] == layers and doc["layers"] == len(layers)
    assert doc["why"] == FALLBACK_REASONS[reason]
    line = next(x for x in summary_rows(summary, output="plan.json") if x.startswith("fallback"))
    count = f"{len(layers)} layer{'s' if len(layers) != 1 else ''}"
    assert f"{FALLBACK_REASONS[reason]} in {count} ({', '.join(map(str, layers))})" in line
    if plan.status != "FALLBACK":
        assert line.startswith("fallback     ") and "kept another layout" in line
