"""The cpsat search budget is deterministic work: the same inputs and seed give the same
placement with any ``jobs`` and under CPU load; the wall clock is a safety cap that says
when it stopped the search."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest

from placer.errors import PlacerWarning
from placer.model import load_model
from placer.planning.build import ProblemSpec, build_problem
from placer.planning.solvers import solve
from placer.planning.solvers.cpsat import solver as cpsat_solver
from placer.problem import SolveParams
from placer.topology import load_topology
from placer.traces import read_routing

TRACE = "traces/synthetic-small.jsonl.gz"
#: A budget the search spends before its step counts stop it, and a wall cap out of reach
#: of any load (the cap itself is tested below).
BINDING = {"total_time_limit_s": 0.6, "wall_factor": 1000.0}


@pytest.fixture(scope="module")
def problem():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        routing = read_routing(TRACE, top_k=4)
    return build_problem(routing, ProblemSpec(model=load_model("gpt-oss-20b"),
                                              topology=load_topology("2x-dgx-h100"),
                                              redundant=16))


def _plan(problem, **params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return solve(problem, "cpsat", SolveParams(**{**BINDING, **params}))


@pytest.fixture(scope="module")
def reference(problem):
    return _plan(problem, jobs=1)


def test_the_budget_is_work_and_binds(reference) -> None:
    details = reference.details
    # the deterministic budget stopped every layer (so it is what the tests below vary)
    assert details["work_limit_hit_layers"] == reference.placement.num_layers
    assert details["wall_limit_hit_layers"] == 0 and details["reproducible"]
    per_layer = 0.6 * 0.7 * 2 / reference.placement.num_layers
    # (the last step may run a little past its deterministic limit: CP-SAT checks it often)
    assert all(per_layer - 0.1 < layer["work"] <= per_layer + 0.02
               for layer in details["layers"])


def test_same_plan_with_one_or_two_jobs(problem, reference) -> None:
    two = _plan(problem, jobs=2)
    assert two.placement.physical_to_logical.tobytes() == \
        reference.placement.physical_to_logical.tobytes()
    assert two.details["reproducible"]


def test_same_plan_under_cpu_load(problem, reference) -> None:
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(2)]
    try:
        loaded = _plan(problem, jobs=2)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert loaded.details["reproducible"]
    assert loaded.placement.physical_to_logical.tobytes() == \
        reference.placement.physical_to_logical.tobytes()


def test_a_bigger_budget_searches_more(problem, reference) -> None:
    more = _plan(problem, jobs=1, total_time_limit_s=1.2)
    assert more.details["work"] > reference.details["work"] * 1.5


def test_the_wall_cap_stops_the_search_and_says_so(problem, monkeypatch) -> None:
    # a wall cap far below the work: the plan is valid, not reproducible, and says so
    monkeypatch.setattr(cpsat_solver, "MIN_LAYER_WALL_S", 0.0)
    with pytest.warns(PlacerWarning, match="wall-clock safety cap stopped the search"):
        capped = solve(problem, "cpsat", SolveParams(total_time_limit_s=5.0,
                                                     wall_factor=1e-4))
    assert capped.details["wall_limit_hit_layers"] > 0
    assert not capped.details["reproducible"]
    assert capped.placement.meta["reproducible"] is False
    assert np.all(capped.placement.replicas_on_gpu.sum(axis=1) > 0)
