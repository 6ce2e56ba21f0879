"""Work done beside this process gives what computing it in place gives: a forked child's
answer, the caller's own when the child cannot answer, and the plan summary's explanation
rows (computed in a child while the plans are timed) equal to computing them here."""

from __future__ import annotations

import os
import warnings

from planner_fixtures import bundled_problem

from placer.parallel import Backend, Background
from placer.planning.solvers import solve
from placer.regime import Regime
from placer.summary import summarize_plan
from placer.summary.proxies import versus_eplb


def _square(value: int) -> int:
    return value * value


def _here_only(parent: int) -> int:
    if os.getpid() != parent:  # in the child: fail, so the caller computes it
        raise RuntimeError("refused in the child")
    return 7


def _square_beside(value: int) -> int:
    return int(Background(_square, value).result())


def test_background_answers_as_the_function_does():
    assert Background(_square, 12).result() == 144
    # the child raised: computed again here, where it succeeds
    assert Background(_here_only, os.getpid()).result() == 7
    # in a daemonic worker (placer compare's scenarios), which may not fork: in place
    assert Backend(jobs=2).run(_square_beside, [3, 4]) == [9, 16]


def test_the_summarys_explanation_rows_equal_those_computed_in_place():
    routing, problem = bundled_problem()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan, eplb = solve(problem, "round_robin"), solve(problem, "eplb")
        summary = summarize_plan(problem, plan, eplb, routing, regime=Regime(), fit=(0, 6))
    assert summary.versus == versus_eplb(problem, plan, eplb, routing.stats)
    assert summary.versus["round_robin"]["remote_copies_from"].startswith("evaluator, sampled")
