"""``placer.planning.run.plan_routing``: the library behind ``placer plan`` gives the same
problem, plan, baseline and summary as building, solving and summarizing by hand."""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from placer.model import load_model
from placer.planning.build import ProblemSpec, build_problem
from placer.planning.run import plan_routing
from placer.planning.solvers import solve
from placer.problem import SolveParams
from placer.summary import summarize_plan
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


def test_plan_routing_is_build_solve_and_summarize(synth):
    routing, model, topology = synth
    params = SolveParams(jobs=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = ProblemSpec(model=model, topology=topology, redundant=8, fit=(0, None))
        run = plan_routing(routing, spec, "round_robin", params)
        problem = build_problem(routing, spec)
        plan, base = solve(problem, "round_robin", params), solve(problem, "eplb", params)
        by_hand = summarize_plan(problem, plan, base, routing, regime=params.regime,
                                 fit=(0, 32))
    assert run.problem.slots_per_gpu == problem.slots_per_gpu
    assert np.array_equal(run.result.placement.physical_to_logical,
                          plan.placement.physical_to_logical)
    assert run.baseline is not None and run.baseline.solver == "eplb"
    # the solve seconds differ from run to run; every figure of the summary does not
    assert run.summary.problem == by_hand.problem
    assert run.summary.times == by_hand.times and run.summary.times
    assert run.summary.judged == by_hand.judged and run.summary.layers == by_hand.layers
    assert run.auto is None
    assert set(run.metrics) and run.metrics == run.summary.metrics


def test_plan_routing_with_eplb_has_no_baseline_and_reports_progress(synth):
    routing, model, topology = synth
    entered = []

    @contextmanager
    def progress():
        entered.append(True)
        yield lambda done, total: None

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = plan_routing(routing, ProblemSpec(model=model, topology=topology, redundant=8),
                           "eplb", SolveParams(jobs=1), progress=progress())
    assert run.baseline is None and run.summary.columns == ("eplb",)
    assert entered == [True]
