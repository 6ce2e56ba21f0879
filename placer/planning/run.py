"""One plan from routing data to its summary: :func:`plan_routing`, the library of ``placer plan``.

Build the problem (:func:`placer.planning.build.build_problem`), choose the redundancy
when asked (:func:`placer.planning.redundancy.auto_redundancy`), solve it, solve the
reference EPLB once for the side-by-side, and summarize
(:func:`placer.summary.summarize_plan`).  Reading the inputs
and writing the placement and engine files are the caller's.

Every step that may take more than a second is said as it starts, to a caller that asks
(``progress`` for the layers, ``phase`` for the rest: the redundancy search, the solver's
judge after its last layer, the summary), so a long plan never goes quiet.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field, replace

from placer.evaluate.judge import can_judge
from placer.placement.types import DUPLICATES_KEY, duplicates_record, said_pairs
from placer.planning.build import ProblemSpec, build_problem
from placer.planning.redundancy import RedundancyChoice, auto_redundancy
from placer.planning.solvers import solve
from placer.problem import PlacementProblem, SolveParams, SolveResult
from placer.stats import RoutingData
from placer.summary.figures import BASELINE_SOLVER
from placer.summary.plan import PlanSummary, summarize_plan
from placer.summary.proxies import basic_metrics

#: Context manager giving a ``report(done, total)`` callback while the layers are solved.
Progress = AbstractContextManager[Callable[[int, int], None] | None]
#: ``phase(name)``: a context manager around one step of the plan, named by one of the
#: names below, entered as the step starts and left when it ends (the caller has the words).
Phase = Callable[[str], AbstractContextManager[None]]

#: The steps :func:`plan_routing` says: the redundancy search (each candidate slot count
#: placed with EPLB and timed) ...
AUTO_PHASE = "redundancy"
#: ... after the last layer, the solver's judge (each layer's plan, its hint and EPLB timed
#: by the evaluator) ...
JUDGE_PHASE = "judge"
#: ... or, when there is no judge (no model or topology to time with), the placement put
#: together from its layers ...
FINISH_PHASE = "solve"
#: ... and the summary (the plan and EPLB timed on the judged windows, and the floor).
SUMMARY_PHASE = "summary"
#: Every step, in the order they may come.
PHASES = (AUTO_PHASE, JUDGE_PHASE, FINISH_PHASE, SUMMARY_PHASE)


@dataclass(frozen=True)
class PlanRun:
    """What :func:`plan_routing` made.

    Attributes
    ----------
    problem: the problem solved (with the chosen slots per GPU).
    result: the solver's result; ``result.placement`` is the plan.
    baseline: the reference EPLB's result; None when EPLB is the solver.
    metrics: :func:`placer.summary.basic_metrics` of the plan on the fitted windows.
    summary: the plan's summary (:class:`placer.summary.PlanSummary`).
    auto: what automatic redundancy chose and why; None when the count was given.
    timings: wall seconds of ``planning_s`` (from the call until the solver's last layer
        is planned: the problem, the redundancy search, the hint, the layer search) and
        ``after_planning_s`` (the rest: the solver's judge, EPLB's side-by-side, the
        summary with its floor).
    """

    problem: PlacementProblem
    result: SolveResult
    baseline: SolveResult | None
    metrics: dict[str, float]
    summary: PlanSummary
    auto: RedundancyChoice | None = None
    timings: dict[str, float] = field(default_factory=dict)


def plan_routing(
    routing: RoutingData,
    spec: ProblemSpec,
    solver: str,
    params: SolveParams,
    *,
    auto: bool = False,
    progress: Progress | None = None,
    phase: Phase | None = None,
) -> PlanRun:
    """Plan ``routing`` as ``spec`` describes the problem, with ``solver`` under
    ``params`` (its regime is the one the plan is made for and judged under), and
    summarize the plan against the reference EPLB.

    Parameters
    ----------
    routing: the trace's statistics (and per-token routing when kept for the replay).
    spec: the problem (:class:`placer.planning.build.ProblemSpec`).
    auto: choose the slots per GPU with :func:`placer.planning.redundancy.auto_redundancy`
        (needs the spec's model and topology; its slot and redundancy counts are unused).
    progress: entered around the solve; its callback is ``params.progress``.
    phase: entered around each other step that may be long (:data:`AUTO_PHASE`; after the
        solver's last layer, :data:`JUDGE_PHASE` while it finishes; :data:`SUMMARY_PHASE`).
    """
    started = time.perf_counter()
    step: Phase = phase or (lambda name: nullcontext())
    choice = None
    if auto:
        with step(AUTO_PHASE):
            choice = auto_redundancy(routing, spec, params.regime, seed=params.seed)
        spec = spec.with_slots(choice.chosen.slots_per_gpu)
    problem = build_problem(routing, spec)
    searched: list[float] = []  # when the last layer was planned

    def after_search() -> None:
        searched.append(time.perf_counter())

    result = _solve(problem, solver, params, progress, step, after_search)
    if not searched:
        after_search()
    say_duplicates(problem, result)
    with step(SUMMARY_PHASE):
        baseline = _baseline(problem, solver, params)
        metrics = basic_metrics(result.placement, problem.stats)
        summary = summarize_plan(problem, result, baseline, routing, regime=params.regime,
                                 fit=spec.fitted(routing.stats.num_windows), dtype=spec.dtype)
    ended = time.perf_counter()
    planned = searched[0]
    return PlanRun(problem, result, baseline, metrics, summary, choice, timings={
        "planning_s": planned - started, "after_planning_s": ended - planned})


def say_duplicates(problem: PlacementProblem, result: SolveResult) -> None:
    """The plan's GPUs that hold an expert twice, said once with how the plan came to hold
    them (:meth:`placer.placement.Placement.warn_duplicates`), and recorded in its
    ``meta`` so that reading the written plan back does not say them again.  Layers a
    re-plan keeps as deployed keep what the deployed placement recorded: said when it was
    planned or read."""
    placement = result.placement
    pairs = set(placement.duplicate_pairs)
    if not pairs:
        return
    current = problem.current
    if current is not None and pairs <= said_pairs(current.meta):
        placement.meta[DUPLICATES_KEY] = duplicates_record(
            placement, "kept as deployed (`current`)")
        return
    why = None
    if result.solver == BASELINE_SOLVER and not placement.forced_duplicates:
        why = ("as DeepSeek's reference EPLB packs replicas by load alone (`solver`"
               " eplb-valid or cpsat keeps them apart)")
    placement.warn_duplicates(why=why, stacklevel=3)


def _baseline(problem: PlacementProblem, solver: str, params: SolveParams) -> SolveResult | None:
    """EPLB once, for the side-by-side (the cpsat solver still solves its own hint); None
    when EPLB is the solver."""
    return None if solver == BASELINE_SOLVER else solve(problem, BASELINE_SOLVER,
                                                        params.shared())


def _solve(problem: PlacementProblem, solver: str, params: SolveParams,
           progress: Progress | None, step: Phase,
           after_search: Callable[[], None]) -> SolveResult:
    """``solve`` with ``progress`` around it, and after the last layer it reports, the
    step the solver takes then (its judge) until it returns; ``after_search()`` is
    called as the last layer is reported (not at all when the solver reports none)."""
    entered: list[bool] = []
    # the layers' progress ends before the step after the last layer does (left last)
    with (ExitStack() as after_layers,
          progress if progress is not None else nullcontext(None) as report):
        def layers(done: int, total: int) -> None:
            if report is not None:
                report(done, total)
            if done >= total > 0 and not entered:
                # the solver goes on after its last layer: its judge times them all
                entered.append(True)
                after_search()
                after_layers.enter_context(
                    step(JUDGE_PHASE if can_judge(problem) else FINISH_PHASE))

        return solve(problem, solver, replace(params, progress=layers))
