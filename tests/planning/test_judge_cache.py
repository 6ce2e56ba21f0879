"""The judge's caches give what computing afresh gives: each distinct layer timed once
(whole placements under static tables) equals timing every candidate whole, and the
summary's explanation rows sampled once for both columns equal two samplings."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest
from planner_fixtures import MODEL, bundled_problem, skewed_stats

from placer.evaluate import evaluate
from placer.evaluate.judge import LayerJudge, layer_times
from placer.planning.solvers import solve
from placer.problem import PlacementProblem, SolveParams
from placer.regime import Regime
from placer.summary import summarize_plan
from placer.summary.proxies import remote_figures, versus_eplb
from placer.topology import load_topology


def problem() -> PlacementProblem:
    """32 experts on 16 GPUs (2 x DGX H100) with 3 slots each: 16 redundant."""
    topo = load_topology("2x-dgx-h100")
    return PlacementProblem(
        stats=skewed_stats(), num_gpus=topo.num_gpus, slots_per_gpu=3,
        node_of_gpu=topo.node_of_gpu, num_groups=4, topology=topo, model=MODEL,
    )


@pytest.mark.parametrize("workload", [Regime("vllm", "decode"), Regime("sglang", "decode")])
def test_each_layer_timed_once_equals_every_candidate_timed_whole(workload):
    prob = problem()
    eplb = solve(prob, "eplb", SolveParams()).placement
    valid = solve(prob, "eplb-valid", SolveParams()).placement
    rows = eplb.physical_to_logical.copy()
    rows[::2] = valid.physical_to_logical[::2]  # a merge: half its layers from each
    merged = replace(eplb, physical_to_logical=rows)
    judge = LayerJudge(prob, workload, seed=4)
    judge.prefetch([eplb, valid], jobs=2)  # half the layers timed in a forked child
    for candidate in (eplb, valid, merged, eplb):
        cached = judge(candidate)
        fresh = layer_times(candidate, prob, workload, seed=4)
        assert np.array_equal(cached, fresh)
    assert judge.coupled == (workload.dispatch == "sglang")


@pytest.fixture(scope="module")
def bundled():
    """The bundled synthetic trace (gpt-oss-20b, top-4, pair counts) on a DGX H100."""
    return bundled_problem()


def test_remote_figures_on_shared_draws_equal_fresh_ones(bundled):
    routing, prob = bundled
    draws: dict = {}
    for solver in ("eplb", "round_robin"):
        placement = solve(prob, solver).placement
        shared = remote_figures(prob, placement, routing.stats, draws=draws)
        assert shared["remote_copies_from"].startswith("evaluator, sampled")
        assert shared == remote_figures(prob, placement, routing.stats)
    assert draws


def test_a_plan_that_is_eplb_is_measured_once_with_the_same_figures(bundled):
    routing, prob = bundled
    eplb = solve(prob, "eplb")
    plan = replace(eplb, solver="cpsat", seconds=1.5)
    rows = versus_eplb(prob, plan, eplb, routing.stats)
    alone = remote_figures(prob, eplb.placement, routing.stats)
    for key, value in alone.items():
        assert rows["cpsat"][key] == rows["eplb"][key] == value
    assert rows["cpsat"]["seconds"] == 1.5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary = summarize_plan(prob, plan, eplb, routing, fit=(0, 6))
        fresh = evaluate(eplb.placement, routing, *prob.cluster(), summary.eval_params)
    assert summary.times["cpsat"] == summary.times["eplb"]
    assert summary.times["eplb"]["step_p99_us"] == fresh.metrics["step_p99_us"]
