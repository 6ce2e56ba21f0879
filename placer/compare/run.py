"""Running what-if scenarios: plan, evaluate and make a row of each, on the same routing data
(the steps are in :mod:`placer.compare`'s docstring)."""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from placer.compare.rows import METRIC_FIELDS, STATUS_OK, CompareRow, with_verdicts
from placer.compare.scenarios import CompareSettings, Scenario
from placer.errors import InfeasibleError, PlacerError, PlacerWarning, UsageError
from placer.evaluate import evaluate
from placer.evaluate.params import judged_part
from placer.parallel import Backend
from placer.placement import Placement
from placer.planning.build import ProblemSpec, build_problem
from placer.planning.solvers import solve
from placer.stats import ExpertStats, RoutingData
from placer.stats.windows import default_split
from placer.topology.calibration import extrapolation_note

if TYPE_CHECKING:
    from placer.evaluate import Evaluation
    from placer.model import ModelSpec
    from placer.topology import Topology


# -- outcomes -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScenarioOutcome:
    """A row and, when the scenario ran, its placement and evaluation (for pictures).

    Attributes
    ----------
    row: the figures.
    placement: the planned placement, or None.
    evaluation: ``placer.evaluate.Evaluation`` on the judged windows, or None.
    judged: what the scenario was judged on when the trace was read as a sample
        (``JudgedSample.to_dict``: ``num_tokens``, ``of_tokens``, ``sample``, ``why``),
        else None (the trace kept whole, or the scenario did not run).
    """

    row: CompareRow
    placement: Placement | None = None
    evaluation: Evaluation | None = None
    judged: dict[str, Any] | None = None


@dataclass(frozen=True)
class RoutingSplit:
    """Which windows of the routing data placements are fitted on and judged on.

    Attributes
    ----------
    routing: the whole routing data.
    fit: ``(start, stop)`` windows the solvers see.
    judge: ``(start, stop)`` windows the evaluator replays (held out, or the same).
    description: in words, e.g. ``"fitted on windows 0:6, judged on held-out windows 6:8"``.
    """

    routing: RoutingData
    fit: tuple[int, int]
    judge: tuple[int, int]
    description: str

    @property
    def judge_stats(self) -> ExpertStats:
        """The statistics of the judged windows (what the report's pictures show)."""
        stats = self.routing.stats
        if self.judge == (0, stats.num_windows):
            return stats
        return stats.select_windows(*self.judge)


def split_routing(routing: RoutingData, holdout: bool = True) -> RoutingSplit:
    """Fitted and held-out windows by ``placer evaluate``'s default split.

    With ``holdout=False`` or a single window, both parts are every window.
    """
    num_windows = routing.stats.num_windows
    split = default_split(num_windows) if holdout else None
    if split is None:
        why = "the trace has one window" if holdout else "no hold-out asked"
        every = (0, num_windows)
        return RoutingSplit(routing, every, every,
                            f"fitted and judged on all {num_windows} window(s): {why}")
    fit, judge = split
    return RoutingSplit(
        routing, fit, judge,
        f"fitted on windows {fit[0]}:{fit[1]}, judged on held-out windows {judge[0]}:{judge[1]}",
    )


# -- running --------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Context:
    """What every scenario shares; sent once to each worker process."""

    split: RoutingSplit
    model: ModelSpec
    topologies: dict[str, Topology]
    settings: CompareSettings
    keep_details: bool = True


def run_scenario(
    scenario: Scenario,
    split: RoutingSplit,
    model: ModelSpec,
    topology: Topology,
    settings: CompareSettings,
    *,
    keep_details: bool = True,
) -> ScenarioOutcome:
    """Plan and evaluate one scenario; every PlacerError becomes the row's status.

    Parameters
    ----------
    scenario: what to run.
    split: the fitted and judged routing data.
    model: ``placer.model.ModelSpec``.
    topology: ``placer.topology.Topology`` of ``scenario.topology``.
    settings: what the study shares.
    keep_details: return the placement and evaluation with the row (for pictures).
    """
    base: dict[str, Any] = {
        "scenario": scenario.label,
        "topology": scenario.topology,
        "redundant": scenario.redundant,
        "solver": scenario.solver,
        "num_gpus": int(topology.num_gpus),
        "num_nodes": int(topology.num_nodes),
    }
    try:
        problem = build_problem(split.routing, ProblemSpec(
            fit=split.fit, model=model, topology=topology, redundant=scenario.redundant,
            dtype=settings.dtype, kv_reserve_gb=settings.kv_reserve_gb,
        ))
        base["slots_per_gpu"] = int(problem.slots_per_gpu)
        started = time.perf_counter()
        result = solve(problem, scenario.solver, settings.solve_params())
        seconds = result.seconds or (time.perf_counter() - started)
        # a trace read as a sample: whole batches of the judged windows (judged_part)
        routing, params, sampled = judged_part(split.routing, split.judge, settings.eval_params(
            int(topology.num_gpus), split.judge, num_layers=split.routing.stats.num_layers))
        evaluation = evaluate(result.placement, routing, topology, model, params)
    except InfeasibleError as e:
        return ScenarioOutcome(CompareRow(status=f"does not fit: {_reason(e)}", **base))
    except PlacerError as e:
        return ScenarioOutcome(CompareRow(status=f"error: {_reason(e)}", **base))
    metrics = evaluation.metrics
    figures: dict[str, Any] = {k: _number(metrics.get(m)) for k, m in METRIC_FIELDS.items()}
    figures.update(throughput(metrics, int(topology.num_gpus)))
    row = CompareRow(status=STATUS_OK, solver_status=str(result.status),
                     solve_seconds=float(seconds), **base, **figures)
    judged = (None if sampled is None else
              sampled.to_dict(int(metrics["num_tokens"]), evaluation.source == "trace"))
    if not keep_details:
        return ScenarioOutcome(row, judged=judged)
    return ScenarioOutcome(row, result.placement, evaluation, judged)


def compare(
    routing: RoutingData,
    scenarios: Sequence[Scenario],
    settings: CompareSettings,
    *,
    jobs: int = 1,
    ray: str | None = None,
    on_done: Callable[[int, ScenarioOutcome], None] | None = None,
    keep_details: bool = True,
) -> list[ScenarioOutcome]:
    """Run every scenario on the same routing data; outcomes in scenario order.

    Parameters
    ----------
    routing: the trace (statistics, and per-token routing when kept).
    scenarios: what to compare (:func:`expand_scenarios`).
    settings: what the scenarios share.
    jobs: scenarios run at once in separate processes (1 = in this process).
    ray: run the scenarios on Ray instead (:class:`placer.parallel.Backend`: ``"local"``
        or a cluster's address); the table is the same as a local run's.
    on_done: called as ``on_done(index, outcome)`` when a scenario finishes (in
        completion order), e.g. to advance a progress bar.
    keep_details: keep placements and evaluations (for pictures).

    Raises
    ------
    UsageError: unknown model, topology or solver names, or ``jobs < 1``; these
        stop the study before anything runs. Problems of one scenario become rows.
    """
    backend = Backend(jobs=jobs, ray=ray)
    context = prepare(routing, scenarios, settings, keep_details=keep_details)
    outcomes: list[ScenarioOutcome | None] = backend.run(
        _run_safely, scenarios, shared=context, on_done=on_done,
        names=[f"scenario {s.label}" for s in scenarios])
    done = [o for o in outcomes if o is not None]
    judged = context.split
    on = "held-out step p99" if judged.judge != judged.fit else "step p99"
    rows = with_verdicts([o.row for o in done], on)
    return [replace(o, row=row) for o, row in zip(done, rows, strict=True)]


def prepare(
    routing: RoutingData,
    scenarios: Sequence[Scenario],
    settings: CompareSettings,
    *,
    keep_details: bool = True,
) -> _Context:
    """Load the model and every topology once and split the data; name errors stop here."""
    from placer.model import load_model
    from placer.topology import load_topology

    check_names(scenarios, settings)
    model = load_model(settings.model)
    topologies = {}
    for s in scenarios:
        if s.topology not in topologies:
            topologies[s.topology] = load_topology(s.topology)
    regime = settings.regime
    mode = regime.all_to_all
    notes = {extrapolation_note(mode, regime.tokens, t.calibration.source)
             for t in topologies.values()} - {""}
    for note in sorted(notes):  # a what-if across modes compares an extrapolated figure
        warnings.warn(note, PlacerWarning, stacklevel=3)
    split = split_routing(routing, settings.holdout)
    return _Context(split, model, topologies, settings, keep_details)


def check_names(scenarios: Sequence[Scenario], settings: CompareSettings) -> None:
    """Raise UsageError for an unknown solver or a missing model (cheap; before reading data)."""
    from placer.planning.solvers import solver_names

    known = solver_names()
    for s in scenarios:
        if s.solver not in known:
            raise UsageError(f"unknown solver {s.solver!r}", where="--solver",
                             hint=f"choose one of: {', '.join(known)}")
    if not settings.model:
        raise UsageError("no model to plan for", where="--model",
                         hint="give --model NAME (see `placer model list`) or 'model:' in the"
                              " scenario file")


def _run_safely(context: _Context, scenario: Scenario) -> ScenarioOutcome:
    """:func:`run_scenario`, where even an unexpected exception becomes an ``error:`` row."""
    topology = context.topologies[scenario.topology]
    try:
        return run_scenario(scenario, context.split, context.model, topology, context.settings,
                            keep_details=context.keep_details)
    except Exception as e:  # a bug in one scenario must not lose the others' rows
        row = CompareRow(scenario=scenario.label, topology=scenario.topology,
                         redundant=scenario.redundant, solver=scenario.solver,
                         status=f"error: {type(e).__name__}: {e}",
                         num_gpus=int(topology.num_gpus), num_nodes=int(topology.num_nodes))
        return ScenarioOutcome(row)


def throughput(metrics: dict[str, Any], num_gpus: int) -> dict[str, float | None]:
    """``tokens_per_step`` (mean tokens of a judged batch) and ``tokens_per_s_per_gpu``
    (``tokens_per_step / step_mean_us / num_gpus``, per second) of an evaluation's metrics;
    None where a figure is missing or the step takes no time."""
    tokens = _number(metrics.get("num_tokens"))
    batches = _number(metrics.get("num_batches"))
    step_us = _number(metrics.get("step_mean_us"))
    per_step = tokens / batches if tokens is not None and batches else None
    rate = None
    if per_step is not None and step_us and num_gpus > 0:
        rate = per_step / (step_us * 1e-6) / num_gpus
    return {"tokens_per_step": per_step, "tokens_per_s_per_gpu": rate}


def _reason(error: PlacerError) -> str:
    text = error.message
    return f"{text} ({error.hint})" if error.hint and len(error.hint) < 80 else text


def _number(value: Any) -> float | None:
    if value is None:
        return None
    value = float(np.asarray(value))
    return value if math.isfinite(value) else None
