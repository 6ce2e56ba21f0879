"""Work started early gives what computing it in place gives: the floor a plan's summary
shows equals the floor :func:`placer.summary.plan.plan_floor` computes alone (in a
forked child or here), and a child that cannot answer leaves the answer to the caller."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from placer.model import load_model
from placer.parallel import Background
from placer.planning.build import build_problem
from placer.planning.solvers import solve
from placer.regime import Regime
from placer.summary import summarize_plan
from placer.summary.plan import plan_floor
from placer.topology import load_topology
from placer.traces import read_routing

SYNTH = Path(__file__).resolve().parents[2] / "traces" / "synthetic-small.jsonl.gz"


def _square(value: int) -> int:
    return value * value


def _pid_or_fail(parent: int) -> int:
    if os.getpid() != parent:  # in the child: fail, so the caller computes it
        raise RuntimeError("refused in the child")
    return 7


def test_background_answers_as_the_function_does():
    assert Background(_square, 12).result() == 144
    # the child raised: computed again here, where it succeeds
    assert Background(_pid_or_fail, os.getpid()).result() == 7


@pytest.mark.parametrize("keep_tokens", [True, False], ids=["replayed", "sampled"])
def test_the_floor_started_early_equals_the_summarys(keep_tokens):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        routing = read_routing(SYNTH, keep_tokens=keep_tokens)
        problem = build_problem(routing, model=load_model("gpt-oss-20b"),
                                topology=load_topology("dgx-h100"), redundant=8, fit=(0, 6))
        plan, eplb = solve(problem, "round_robin"), solve(problem, "eplb")
        regime = Regime("vllm", "decode")
        summary = summarize_plan(problem, plan, eplb, routing, regime=regime, fit=(0, 6))
        early = Background(plan_floor, problem, routing, regime, (0, 6), None).result()
        given = summarize_plan(problem, plan, eplb, routing, regime=regime, fit=(0, 6),
                               floor=lambda: early)
    assert summary.floor is not None
    assert early == summary.floor == given.floor
    assert given.times == summary.times
