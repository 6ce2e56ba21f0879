"""The plan summary: :class:`PlanSummary` and :func:`summarize_plan`."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from placer.errors import PlacerError, PlacerWarning
from placer.evaluate import EvalParams, Evaluation, evaluate
from placer.evaluate.batches import dealt_note
from placer.evaluate.params import judged_part, regime_params, replay_or_sample
from placer.parallel import Background
from placer.problem import PlacementProblem, SolveResult
from placer.regime import Regime
from placer.stats import ExpertStats, RoutingData, format_ranges
from placer.stats.skew import skew_report
from placer.summary.figures import (
    TIME_FIGURES,
    VERDICT_FIGURE,
    Judged,
    Verdict,
    judged_windows,
    layers_faster,
    verdict,
)
from placer.summary.floors import BATCH_FLOOR_FIGURE as BATCH_FLOOR_FIGURE
from placer.summary.floors import plan_floors
from placer.summary.proxies import basic_metrics, versus_eplb
from placer.summary.replan import replan_doc
from placer.topology.calibration import extrapolation_note

#: The figure the gap to the floor is measured on: the mean step, whose floor holds one
#: placement to every batch (the per-batch floors of the percentiles let it follow each
#: batch, so they are looser).
FLOOR_FIGURE = "step_mean_us"

# -- the summary ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanSummary:
    """Everything ``placer plan`` reports about a plan.

    Attributes
    ----------
    problem: problem size (model, topology, experts, layers, windows, GPUs, slots).
    solver: the solver's name, status, objective, bound, gap and seconds.
    metrics: :func:`basic_metrics` of the plan on the fitted windows (written with it).
    regime: what the plan is judged under.
    eval_params: the evaluator's parameters of the time figures (None when not estimated).
    judged: where and how the time figures were obtained (None when not estimated).
    columns: the plan's solver, then the baseline's when there is one.
    times: solver -> time figures (:data:`TIME_FIGURES` keys); empty when not estimated,
        and ``times_note`` says why.
    layers: ``{plan: n, baseline: n, "equal": n}`` layers where each has the lower
        estimated p99 layer time; None without a baseline.
    verdict: on :data:`VERDICT_FIGURE`; None without a baseline or figures.
    versus: the explanation rows (:func:`versus_eplb`); None without a baseline.
    evaluations: solver -> the :class:`~placer.evaluate.Evaluation` behind ``times``.
    replan: what re-planning from ``problem.current`` costs and gains
        (:func:`placer.summary.replan.replan_doc`); None without a deployed placement.
    floor: the same time figures' floor for every placement with this many slots per GPU
        on the same tokens (:func:`placer.evaluate.time_bound`; the figures it bounds
        only); None when not estimated.
    calibration_note: where the regime lies outside what the link model was calibrated
        on (:func:`placer.topology.calibration.extrapolation_note`), else "".
    batch_floor: solver -> the step p99 no placement with that plan's replica counts can
        beat on the same batches under a position rule (vLLM's hash, TensorRT-LLM's
        blocks, round robin: :func:`placer.evaluate.hot_floor.counts_floor`, each batch's
        hottest GPU, under ``floor``'s cells); None under other dispatch.
    """

    problem: dict[str, Any]
    solver: dict[str, Any]
    metrics: dict[str, float]
    regime: Regime
    eval_params: EvalParams | None = None
    judged: Judged | None = None
    columns: tuple[str, ...] = ()
    times: dict[str, dict[str, float]] = field(default_factory=dict)
    times_note: str = ""
    layers: dict[str, int] | None = None
    verdict: Verdict | None = None
    versus: dict[str, Any] | None = None
    evaluations: dict[str, Evaluation] = field(default_factory=dict, repr=False,
                                               compare=False)
    floor: dict[str, float] | None = None
    replan: dict[str, Any] | None = None
    calibration_note: str = ""
    batch_floor: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document (where the placement was written, where the regime came
        from and the exports are the command's to add)."""
        w = self.regime
        num_gpus = int(self.problem["num_gpus"])
        doc: dict[str, Any] = {
            "problem": self.problem,
            "solver": self.solver,
            "metrics": self.metrics,
            "regime": {**w.to_dict(), "batch_tokens": w.batch_tokens(num_gpus)},
            "judged": None if self.judged is None else self.judged.to_dict(),
            "times": {name: dict(self.times[name]) for name in self.columns
                      if name in self.times},
            "times_note": self.times_note,
            "layers_faster": self.layers,
            "verdict": None if self.verdict is None else self.verdict.to_dict(),
            "floor": None if self.floor is None else dict(self.floor),
            "gap_to_floor": self.gaps(),
            "batch_floor": self.batch_floor,
            "replan": self.replan,
            "calibration_note": self.calibration_note,
        }
        if self.versus is not None:
            doc["versus"] = self.versus
        return doc

    def gaps(self) -> dict[str, float]:
        """Solver -> how far its mean step is above the floor, as a share of its own
        (0: no placement can do better on these tokens); empty without a floor."""
        if self.floor is None or not math.isfinite(self.floor.get(FLOOR_FIGURE, math.nan)):
            return {}
        bound = self.floor[FLOOR_FIGURE]
        out = {}
        for name in self.columns:
            value = self.times.get(name, {}).get(FLOOR_FIGURE, math.nan)
            if math.isfinite(value) and value > 0:
                out[name] = max(0.0, 1.0 - bound / value)
        return out


def summarize_plan(
    problem: PlacementProblem,
    result: SolveResult,
    baseline: SolveResult | None,
    routing: RoutingData | ExpertStats,
    *,
    regime: Regime | None = None,
    fit: tuple[int, int] | None = None,
    dtype: str | None = None,
) -> PlanSummary:
    """Summarize a plan: problem, solver, time figures against the baseline, explanation.

    Parameters
    ----------
    problem: what was solved (its statistics are the fitted windows).
    result: the plan.
    baseline: EPLB's plan of the same problem, or None (no side-by-side).
    routing: the whole routing data (every window; per-token when kept).
    regime: what to judge under (default :class:`~placer.regime.Regime`).
    fit: ``(start, stop)`` fitted windows of ``routing`` (None: every window).
    dtype: expert dtype (None: the model's).
    """
    regime = regime or Regime()
    if isinstance(routing, ExpertStats):
        routing = RoutingData(routing)
    results = [result] if baseline is None else [result, baseline]
    summary = PlanSummary(
        problem=_problem_doc(problem), solver=_solver_doc(result),
        metrics=basic_metrics(result.placement, problem.stats), regime=regime,
        columns=tuple(r.solver for r in results),
        replan=replan_doc(problem, result, dtype),
    )
    if problem.model is None or problem.topology is None:
        missing = " and ".join(o for o, v in (("`model`", problem.model),
                                               ("`topology`", problem.topology)) if v is None)
        if baseline is not None:
            summary = replace(summary, versus=versus_eplb(problem, result, baseline,
                                                          routing.stats))
        return replace(summary, times_note=f"the evaluator needs {missing}")
    # the explanation rows (sampled batches, evaluated twice) in a forked child while this
    # process times the plans on the judged windows and their floor: the same figures, on
    # both cores
    versus = None if baseline is None else Background(
        versus_eplb, problem, result, baseline, routing.stats)
    try:
        summary = _with_times(summary, problem, results, routing, fit, dtype)
        return summary if versus is None else replace(summary, versus=versus.result())
    finally:
        if versus is not None:
            versus.cancel()


def _problem_doc(problem: PlacementProblem) -> dict[str, Any]:
    """The summary's problem size."""
    stats = problem.stats
    return {
        "model": getattr(problem.model, "name", None),
        "topology": getattr(problem.topology, "name", None),
        "num_experts": stats.num_experts,
        "layers": format_ranges(stats.layer_ids),
        "num_layers": stats.num_layers,
        "num_windows": stats.num_windows,
        "num_gpus": problem.num_gpus,
        "num_nodes": problem.num_nodes,
        "slots_per_gpu": problem.slots_per_gpu,
        "num_physical_experts": problem.num_physical,
        "num_redundant": problem.num_redundant,
        # the fitted windows' skew against measured routing (median layer, class)
        "skew": {k: v for k, v in skew_report(problem.stats.load, problem.stats.layer_ids)
                 .items() if k != "measured"},
    }


def _solver_doc(result: SolveResult) -> dict[str, Any]:
    """The summary's solver line."""
    return {
        "name": result.solver,
        "status": result.status,
        "objective": result.objective,
        "objective_unit": result.objective_unit or None,
        "bound": result.bound,
        "gap": result.gap,
        "hot_shard": result.hot_shard,
        "baseline": result.baseline,
        "seconds": round(result.seconds, 3),
        # why layers kept the baseline's layout (cpsat): reason -> {"layers", "why"}
        "fallback": result.details.get("fallback") or None,
        # candidate -> layers that held an expert twice on a GPU and competed repaired
        "repaired_layers": result.details.get("repaired_layers") or None,
    }


def _with_times(
    summary: PlanSummary, problem: PlacementProblem, results: list[SolveResult],
    routing: RoutingData, fit: tuple[int, int] | None, dtype: str | None,
) -> PlanSummary:
    """``summary`` with the time figures, layers faster and the verdict."""
    judged, sampled_why, params, routing = _judging(summary.regime, problem, routing, fit,
                                                    dtype)
    evaluations: dict[str, Evaluation] = {}
    draws: dict[tuple[int, ...], np.ndarray] = {}  # both placements on the same sampled tokens
    messages: list[str] = []
    findings: list[tuple[str, Any]] = []
    order: tuple[int, str] = (0, "trace")
    said: dict[str, list[Any]] = {}
    try:
        for r in results:
            # a plan that is EPLB's placement (the judge kept it) is evaluated once
            same = next((name for name in evaluations
                         if _placement_of(results, name).same_layers(r.placement)), None)
            if same is not None:
                evaluations[r.solver], caught = evaluations[same], said[same]
            else:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    evaluations[r.solver] = evaluate(r.placement, routing, *problem.cluster(),
                                                     params, draws=draws)
                said[r.solver] = caught
            for w in caught:
                bias = getattr(w.message, "bias", None)
                if bias is not None:
                    findings.append((r.solver if len(results) > 1 else "", bias))
                    order = (int(getattr(w.message, "top_k", 0)),
                             str(getattr(w.message, "source", "trace")))
                elif str(w.message) not in messages:
                    messages.append(str(w.message))
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    except PlacerError as exc:
        return replace(summary, times_note=f"the evaluator refused: {exc.message}")
    if findings:
        from placer.evaluate.dispatch import order_bias_message

        warnings.warn(order_bias_message(findings, *order), PlacerWarning, stacklevel=3)
    first = evaluations[results[0].solver]
    num_tokens = int(first.metrics["num_tokens"])
    judged = replace(
        judged, source=first.source,
        source_why=sampled_why if first.source == "sampled" else judged.source_why,
        num_batches=int(first.metrics["num_batches"]),
        batch_tokens=int(first.params.batch_tokens or 0),
        num_tokens=num_tokens,
        ranks_why=dealt_note(first.dealt_ranks, problem.num_gpus) if first.dealt_ranks else "",
        of_tokens=(judged.of_tokens if judged.sample is not None and first.source == "trace"
                   else num_tokens),
    )
    times = {name: {f.key: float(ev.metrics[f.key]) for f in TIME_FIGURES}
             for name, ev in evaluations.items()}
    topology = problem.topology
    assert topology is not None
    bound, batch_floor = plan_floors(routing, problem, results, params, draws)
    summary = replace(summary, eval_params=params, judged=judged, times=times,
                      evaluations=evaluations,
                      floor=None if bound is None else bound.metrics(),
                      batch_floor=batch_floor,
                      calibration_note=extrapolation_note(
                          params.mode, summary.regime.tokens, topology.calibration.source))
    if len(results) < 2:
        return summary
    mine, theirs = (r.solver for r in results)
    won, lost, equal = layers_faster(evaluations[mine].per_layer["layer_time_p99_us"],
                                     evaluations[theirs].per_layer["layer_time_p99_us"])
    target = summary.regime
    on = f"{judged.part} step p99 ({target.engine} {target.workload})"
    return replace(
        summary, layers={mine: won, theirs: lost, "equal": equal},
        verdict=verdict(mine, theirs, times[mine][VERDICT_FIGURE],
                        times[theirs][VERDICT_FIGURE], on=on),
    )


def _judging(
    regime: Regime, problem: PlacementProblem, routing: RoutingData,
    fit: tuple[int, int] | None, dtype: str | None,
) -> tuple[Judged, str, EvalParams, RoutingData]:
    """Where and how the summary judges: the windows (and why there), why the tokens
    are sampled when they are, the evaluator's parameters and the routing it replays
    (a sampled trace cut to the batches judged), by the rule every judge follows:
    :func:`placer.evaluate.params.judged_part`."""
    judged = judged_windows(routing.stats.num_windows, fit)
    params = regime_params(regime, problem.num_gpus, num_layers=problem.stats.num_layers,
                           dtype=dtype, windows=judged.windows)
    replayed, params, note = judged_part(routing, judged.windows, params)
    if note is None:  # kept whole: replayed unless too large, and why
        return judged, replay_or_sample(routing, judged.windows)[1], params, routing
    judged = replace(judged, of_tokens=note.of_tokens, sample=note.sample)
    if params.sample:  # no held batch fits: batches drawn from the statistics
        return judged, note.why, params, routing
    return replace(judged, source_why=note.why), "", params, replayed


def _placement_of(results: list[SolveResult], solver: str) -> Any:
    """The placement of the result named ``solver``."""
    return next(r.placement for r in results if r.solver == solver)
