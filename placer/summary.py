"""What a plan is worth: estimated time under the target workload, side by side with EPLB.

:func:`summarize_plan` is the library behind ``placer plan``'s summary (and the figures
``placer compare`` and the report share).  It judges a planned placement and EPLB's on
the same routing data with the evaluator (:func:`placer.evaluate.evaluate`), under the
workload the plan is for (:class:`placer.workload.Workload`: the engine fixes the dispatch
policy, the phase the all-to-all mode, tokens per GPU the batch):

- **where**: the windows ``--fit`` left out after the fitted ones (*held-out*), else
  those before them, else the fitted windows themselves (and it says so);
- **how**: replayed on the per-token routing when the data has it (and the replay is not
  too large: :data:`REPLAY_MAX_SELECTIONS`), else batches sampled from the statistics;
- **what**: estimated MoE-layer p50/p99 (pooled over (batch, layer) pairs and each layer's
  own tail), step time (the sum over layers of one batch) p50/p99, all-to-all and expert
  compute time; per layer, which placement has the lower p99 layer time (the objective a
  planner optimizes); and a one-line verdict on step p99 (:func:`verdict`).

Below the time rows, the *explanation* rows (:func:`versus_eplb`): hot shard on the
fitted windows, remote copies per token and their proven bracket
(:func:`remote_figures`), weight moves, solve time and gap.

Pure apart from what the evaluator needs (no files, no printing); warnings of the
evaluations are said once (:class:`placer.errors.PlacerWarning`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import numpy as np

from placer import constants
from placer.errors import DataError, PlacerError, PlacerWarning
from placer.evaluate import EvalParams, Evaluation, evaluate
from placer.placement import Placement, gpu_loads, hot_shard_ratio
from placer.problem import PlacementProblem, SolveResult
from placer.stats import ExpertStats, RoutingData, format_ranges
from placer.workload import Workload

__all__ = [
    "BASELINE_SOLVER",
    "EQUAL_TOLERANCE",
    "TIME_FIGURES",
    "VERDICT_FIGURE",
    "Judged",
    "PlanSummary",
    "TimeFigure",
    "Verdict",
    "basic_metrics",
    "change_text",
    "judged_windows",
    "layers_faster",
    "remote_figures",
    "render_versus",
    "summarize_plan",
    "summary_eval_params",
    "time_figure",
    "verdict",
    "versus_eplb",
]

#: The solver every plan is compared with.
BASELINE_SOLVER = "eplb"

#: Relative difference below which two times are reported as equal (0.1%).
EQUAL_TOLERANCE = 1e-3

#: The figure of the verdict: p99 over batches of the step (sum over MoE layers).
VERDICT_FIGURE = "step_p99_us"

#: A per-token replay larger than this many (token, layer, pick) selections per
#: placement is sampled instead (a replay costs time in proportion).
REPLAY_MAX_SELECTIONS = 1 << 26

#: Sampled batches: as many as fit in this many (token, layer) pairs, within
#: [:data:`SAMPLED_BATCHES_MIN`, ``constants.DEFAULT_SAMPLED_BATCHES``]: 16 decode batches
#: of DeepSeek-V3 on 32 GPUs (4,096 tokens x 58 layers each), 2 prefill batches (131,072
#: tokens each; a summary then costs seconds per placement, as a prefill step is large).
SAMPLED_TOKEN_LAYERS_BUDGET = 1 << 22
SAMPLED_BATCHES_MIN = 2

#: ``placer plan`` keeps per-token routing for the replay when its inputs take at most
#: this many bytes on disk (kept tokens cost memory in proportion).
KEEP_TOKENS_MAX_BYTES = 256 << 20


# -- the time figures: one definition of labels, units and formats ----------------------------


@dataclass(frozen=True)
class TimeFigure:
    """How one estimated time is shown.

    Attributes
    ----------
    key: the evaluator's metric key (``placer.evaluate.METRIC_KEYS``).
    label: row label (``placer plan``'s summary, the report), without the unit.
    header: short column header with the unit (``placer compare``'s table).
    what: what it is, in a few words.
    fmt: number format.
    unit: the unit.
    """

    key: str
    label: str
    header: str
    what: str
    fmt: str = "{:.1f}"
    unit: str = "µs"

    def cell(self, value: float | None) -> str:
        """The number as shown (``-`` when missing or not finite)."""
        if value is None or not math.isfinite(float(value)):
            return "-"
        return self.fmt.format(float(value))


#: Estimated times, in the order the summary shows them.
TIME_FIGURES = (
    TimeFigure("moe_layer_p50_us", "MoE layer p50, pooled", "p50 µs",
               "MoE-layer time over every (batch, layer) pair, p50"),
    TimeFigure("moe_layer_p99_us", "MoE layer p99, pooled", "p99 µs",
               "MoE-layer time over every (batch, layer) pair, p99"),
    TimeFigure("layer_p99_us_median", "layer p99, median layer", "layer p99 µs",
               "each layer's p99 over batches, median over layers"),
    TimeFigure("layer_p99_us_worst", "layer p99, worst layer", "worst layer p99 µs",
               "each layer's p99 over batches, worst layer"),
    TimeFigure("step_p50_us", "step p50", "step p50 µs",
               "one batch through every MoE layer, p50 over batches"),
    TimeFigure("step_p99_us", "step p99", "step p99 µs",
               "one batch through every MoE layer, p99 over batches"),
    TimeFigure("all_to_all_us", "all-to-all, mean", "a2a µs",
               "dispatch + combine of the slowest GPU, mean over (batch, layer)"),
    TimeFigure("compute_us", "expert compute, mean", "compute µs",
               "expert GEMMs of the slowest GPU, mean over (batch, layer)"),
)

_FIGURES = {f.key: f for f in TIME_FIGURES}


def time_figure(key: str) -> TimeFigure:
    """The :class:`TimeFigure` of an evaluator time key (KeyError for another key)."""
    return _FIGURES[key]


# -- where and how the plan is judged ---------------------------------------------------------


@dataclass(frozen=True)
class Judged:
    """Which windows judge the plan, and how.

    Attributes
    ----------
    part: ``"held-out"`` (windows the plan was not fitted on) or ``"fitted"``.
    windows: ``(start, stop)`` judged windows.
    fitted: ``(start, stop)`` fitted windows.
    source: ``"trace"`` (per-token replay) or ``"sampled"`` (batches drawn from the
        statistics); set by the evaluation.
    why: why the part or the source is what it is (empty when there is nothing to say).
    num_batches, batch_tokens, num_tokens: what the evaluator judged (0 before).
    """

    part: str
    windows: tuple[int, int]
    fitted: tuple[int, int]
    source: str = "sampled"
    why: str = ""
    num_batches: int = 0
    batch_tokens: int = 0
    num_tokens: int = 0

    def describe(self) -> str:
        """``held-out windows 6:32 (fitted 0:6), per-token replay: 7 batches, 6656 tokens``."""
        start, stop = self.windows
        if self.part == "held-out":
            where = (f"held-out windows {start}:{stop}"
                     f" (fitted {self.fitted[0]}:{self.fitted[1]})")
        else:
            where = f"the fitted windows {start}:{stop}"
        how = "per-token replay" if self.source == "trace" else "sampled batches"
        text = (f"{where}, {how}: {self.num_batches} batch{'es' if self.num_batches != 1 else ''}"
                f" of up to {self.batch_tokens} tokens, {self.num_tokens} tokens")
        return f"{text} ({self.why})" if self.why else text

    def to_dict(self) -> dict[str, Any]:
        return {"part": self.part, "windows": list(self.windows), "fitted": list(self.fitted),
                "source": self.source, "why": self.why, "num_batches": self.num_batches,
                "batch_tokens": self.batch_tokens, "num_tokens": self.num_tokens}


def judged_windows(num_windows: int, fit: tuple[int, int] | None) -> Judged:
    """The windows that judge a plan fitted on ``fit`` (None: every window).

    The windows after the fitted ones when there are any (held-out, as ``placer
    evaluate`` reads ``--fit``), else those before them, else the fitted windows.
    """
    start, stop = (0, num_windows) if fit is None else (int(fit[0]), int(fit[1]))
    if stop < num_windows:
        return Judged("held-out", (stop, num_windows), (start, stop))
    if start > 0:
        return Judged("held-out", (0, start), (start, stop), why="the windows before the fit")
    why = ("no window held out: --fit START:STOP leaves some out" if num_windows > 1
           else "the data has one window: nothing to hold out")
    return Judged("fitted", (start, stop), (start, stop), why=why)


def summary_eval_params(
    workload: Workload, num_gpus: int, *, num_layers: int = 1, dtype: str | None = None,
    windows: tuple[int, int] | None = None, sample: bool = False, seed: int = 0,
) -> EvalParams:
    """The evaluator's parameters for a workload on ``num_gpus`` EP ranks.

    Policy, mode and batch come from the workload (``batch_tokens = tokens_per_gpu x G``);
    sampled batches: as many as :data:`SAMPLED_TOKEN_LAYERS_BUDGET` (token, layer) pairs
    hold over ``num_layers`` layers, at least :data:`SAMPLED_BATCHES_MIN`, at most
    ``constants.DEFAULT_SAMPLED_BATCHES``.  ``seed`` 0 is the engines' own (SGLang's
    static dispatch table).
    """
    batch = workload.batch_tokens(num_gpus)
    batches = min(constants.DEFAULT_SAMPLED_BATCHES,
                  max(SAMPLED_BATCHES_MIN,
                      SAMPLED_TOKEN_LAYERS_BUDGET // (batch * max(num_layers, 1))))
    return EvalParams(policy=workload.policy, mode=workload.mode, batch_tokens=batch,
                      num_batches=batches, seed=seed, dtype=dtype, windows=windows,
                      sample=sample)


# -- verdict and layers -----------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """How the plan compares with the baseline on one figure.

    Attributes
    ----------
    plan, baseline: solver names.
    figure: the evaluator key compared (:data:`VERDICT_FIGURE`).
    plan_value, baseline_value: the two figures.
    change: ``plan / baseline - 1`` (negative: the plan is faster).
    outcome: ``"faster"``, ``"slower"`` or ``"equal"`` (within :data:`EQUAL_TOLERANCE`).
    text: the line, e.g. ``verdict: cpsat is 4.1% faster than eplb on held-out step p99
        (vllm decode)``.
    """

    plan: str
    baseline: str
    figure: str
    plan_value: float
    baseline_value: float
    change: float
    outcome: str
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan, "baseline": self.baseline, "figure": self.figure,
                "plan_value": self.plan_value, "baseline_value": self.baseline_value,
                "change": self.change, "outcome": self.outcome, "text": self.text}


def change_text(change: float) -> str:
    """``-0.041`` -> ``4.1% faster``; ``0.012`` -> ``1.2% slower``; within
    :data:`EQUAL_TOLERANCE` -> ``equal (within 0.1%)``."""
    if abs(change) < EQUAL_TOLERANCE:
        return f"equal (within {EQUAL_TOLERANCE:.1%})"
    return f"{abs(change):.1%} {'faster' if change < 0 else 'slower'}"


def verdict(
    plan: str, baseline: str, plan_value: float, baseline_value: float, *,
    on: str = "", figure: str = VERDICT_FIGURE,
) -> Verdict | None:
    """The one-line verdict, or None when a figure is missing.

    ``on`` names the judged data and workload, e.g. ``"held-out step p99 (vllm decode)"``.
    """
    if not (math.isfinite(plan_value) and math.isfinite(baseline_value)) or baseline_value <= 0:
        return None
    change = plan_value / baseline_value - 1.0
    outcome = ("equal" if abs(change) < EQUAL_TOLERANCE
               else "faster" if change < 0 else "slower")
    where = f" on {on}" if on else ""
    if outcome == "equal":
        text = f"verdict: {plan} and {baseline} are equal (within {EQUAL_TOLERANCE:.1%}){where}"
    else:
        text = f"verdict: {plan} is {change_text(change)} than {baseline}{where}"
    return Verdict(plan, baseline, figure, float(plan_value), float(baseline_value),
                   float(change), outcome, text)


def layers_faster(mine: np.ndarray, theirs: np.ndarray) -> tuple[int, int, int]:
    """``(mine faster, theirs faster, equal)`` over layers: each layer's estimated p99 time
    (``per_layer["layer_time_p99_us"]``), equal within :data:`EQUAL_TOLERANCE` (relative)
    or when neither has a figure."""
    a = np.asarray(mine, dtype=np.float64)
    b = np.asarray(theirs, dtype=np.float64)
    both = np.isfinite(a) & np.isfinite(b)
    scale = np.maximum(np.abs(np.where(both, b, 1.0)), 1e-12)
    rel = np.where(both, (a - b) / scale, 0.0)
    won = both & (rel <= -EQUAL_TOLERANCE)
    lost = both & (rel >= EQUAL_TOLERANCE)
    return int(won.sum()), int(lost.sum()), int(a.size - won.sum() - lost.sum())


# -- the explanation rows: balance and remote copies ------------------------------------------


def basic_metrics(placement: Placement, stats: ExpertStats) -> dict[str, float]:
    """Hot-shard ratio (max / mean GPU load per layer) of the load summed over windows.

    Returns ``{"hot_shard_ratio_median", "hot_shard_ratio_worst", "hottest_gpu_load"}``;
    the last is the worst layer's hottest GPU load in tokens.
    """
    loads = gpu_loads(placement, stats.mean_load)  # [L, G]
    ratio = hot_shard_ratio(loads)
    return {
        "hot_shard_ratio_median": float(np.median(ratio)),
        "hot_shard_ratio_worst": float(ratio.max()),
        "hottest_gpu_load": float(loads.max()),
    }


def remote_figures(
    problem: PlacementProblem, placement: Placement, stats: ExpertStats | None = None
) -> dict[str, Any]:
    """Remote GPUs and nodes per token (normal mode, uniform source rank, mean over layers),
    the bracket the statistics prove, and how they were obtained.

    ``stats`` (default ``problem.stats``) must hold loads and pair counts over the same
    tokens: pass every window of the trace, as ``--fit`` statistics keep the pair counts
    of all windows (:func:`placer.evaluate.remote_copy_bounds`).  The estimate is

    - the closed form (``expected_remote_copies``) when it is exact: top-k <= 2 with every
      pair counted (:func:`placer.evaluate.static.pairwise_is_exact`), where it equals the
      bracket's lower end; no bracket is shown then;
    - otherwise the evaluator's sampled batches when the model and topology are known,
      drawn from the same statistics (all windows summed), and brought into the bracket
      when the sampled routing (loads matched, pairs only approximately, sampling noise)
      falls outside it (the summary says so);
    - otherwise none: the pairwise closed form is then not an estimate (top-k > 2 counts
      a triple on one GPU as three saved copies; partial pair counts miss pairs), only the
      bracket is shown.

    Returns ``{"remote_gpus_per_token", "remote_nodes_per_token",
    "remote_gpus_per_token_bounds", "remote_nodes_per_token_bounds",
    "remote_copies_from"}``; node figures are None on one node, the others None when not
    known.  Every estimate lies in its bracket, every bracket in ``[0, G - 1]``
    (``[0, N - 1]``).
    """
    from placer.evaluate.static import (
        expected_remote_copies,
        pairwise_is_exact,
        remote_copy_bounds,
    )

    stats = problem.stats if stats is None else stats
    out: dict[str, Any] = {
        "remote_gpus_per_token": None, "remote_nodes_per_token": None,
        "remote_gpus_per_token_bounds": None, "remote_nodes_per_token_bounds": None,
        "remote_copies_from": "no co-activation counts",
    }
    if stats.coact is None:
        return out
    multi = problem.num_nodes > 1
    nodes = _nodes_of(problem)
    windows = ""
    if stats.num_windows != problem.stats.num_windows:
        windows = f", all {stats.num_windows} windows (pair counts cover the whole trace)"
    try:
        bounds = remote_copy_bounds(placement, stats, nodes).mean(axis=0)  # [gpu|node, lo|hi]
        if pairwise_is_exact(stats):
            remote = expected_remote_copies(placement, stats, nodes).mean(axis=0)
            # exact means equal to the lower bound; counts no routing can have are not
            if np.allclose(remote, bounds[:, 0], rtol=1e-9, atol=1e-12):
                out["remote_gpus_per_token"] = float(bounds[0, 0])
                out["remote_nodes_per_token"] = float(bounds[1, 0]) if multi else None
                out["remote_copies_from"] = (
                    f"evaluator, closed form (exact: top-{stats.top_k}, every pair"
                    f" counted){windows}")
                return out
    except DataError as exc:
        out["remote_copies_from"] = f"not shown: {exc.message}"
        return out
    out["remote_gpus_per_token_bounds"] = _outward(bounds[0], problem.num_gpus - 1)
    if multi:
        out["remote_nodes_per_token_bounds"] = _outward(bounds[1], problem.num_nodes - 1)
    if problem.topology is None or problem.model is None:
        out["remote_copies_from"] = (
            f"bounds only (top-{stats.top_k}"
            + ("" if stats.top_k > 2 else ", pairs missing from the counts")
            + ": the pairwise closed form is not an estimate here; with --model and"
            " --topology the evaluator samples one)" + windows)
        return out
    sampled = _sampled_remote(problem, placement, stats)
    how = "evaluator, sampled batches" + windows
    moved = []
    for column, label, value in ((0, "GPUs", sampled[0]), (1, "nodes", sampled[1])):
        if column == 1 and not multi:
            continue
        low, high = out[("remote_gpus_per_token_bounds", "remote_nodes_per_token_bounds")
                        [column]]
        inside = min(max(value, low), high)
        if inside != value:
            moved.append(f"{label} {value:.3f} sampled")
        out[("remote_gpus_per_token", "remote_nodes_per_token")[column]] = inside
    if moved:
        how += f"; brought into the bounds ({', '.join(moved)})"
    out["remote_copies_from"] = how
    return out


def _sampled_remote(
    problem: PlacementProblem, placement: Placement, stats: ExpertStats
) -> tuple[float, float]:
    """Remote GPUs and nodes per token from the evaluator's sampled batches, every window
    of ``stats`` summed into one (the loads the bracket is proven for), with the
    ``random`` policy (each selection picks a replica uniformly and independently, the
    bracket's assumption; ``round_robin`` agrees only in expectation over list orders).
    ``PLAN_VERSUS_BATCHES`` batches of up to ``PLAN_VERSUS_BATCH_TOKENS``, no more tokens
    than the statistics hold."""
    whole = replace(
        stats, load=stats.load.sum(axis=0, keepdims=True),
        tokens=stats.tokens.sum(keepdims=True),
        window_starts=None if stats.window_starts is None else stats.window_starts[:1],
    )
    total = max(int(stats.total_tokens), 1)
    batches = min(constants.PLAN_VERSUS_BATCHES, total)
    metrics = evaluate(
        placement, whole, problem.topology, problem.model,
        EvalParams(policy="random", num_batches=batches,
                   batch_tokens=min(constants.PLAN_VERSUS_BATCH_TOKENS, total // batches)),
    ).metrics
    return metrics["remote_copies_per_token_gpu"], metrics["remote_copies_per_token_node"]


def _outward(span: np.ndarray, others: int) -> list[float]:
    """``[lower, upper]`` rounded outward to 6 decimals (rounding never narrows it), and
    never past ``[0, others]`` (``G - 1`` or ``N - 1``, which the bounds respect up to
    floating-point noise)."""
    low = max(float(np.floor(span[0] * 1e6) / 1e6), 0.0)
    return [low, min(max(float(np.ceil(span[1] * 1e6) / 1e6), low), float(others))]


def _nodes_of(problem: PlacementProblem) -> Any:
    """The topology, or what the closed forms read of one (``node_of_gpu``) without it."""
    return problem.topology or SimpleNamespace(node_of_gpu=problem.node_of_gpu)


def side_metrics(
    problem: PlacementProblem, result: SolveResult, gap: float | None,
    stats: ExpertStats | None = None,
) -> dict[str, Any]:
    """One column of the explanation rows: figures of ``result`` on ``problem``'s
    statistics (remote copies on ``stats``, see :func:`remote_figures`)."""
    basic = basic_metrics(result.placement, problem.stats)
    remote = remote_figures(problem, result.placement, stats)
    moves = None
    if problem.current is not None:
        moves = float(result.placement.moves_from(problem.current))
    return {
        "hot_shard_ratio_median": basic["hot_shard_ratio_median"],
        "hot_shard_ratio_worst": basic["hot_shard_ratio_worst"],
        **remote,
        "moves": moves,
        "seconds": round(result.seconds, 3),
        "gap": gap,
    }


def versus_eplb(
    problem: PlacementProblem, result: SolveResult, baseline: SolveResult,
    stats: ExpertStats | None = None,
) -> dict[str, Any]:
    """Explanation rows of ``result`` and EPLB's ``baseline`` on the same problem.

    Hot shard on the fitted windows; remote copies (normal mode, uniform source rank,
    mean over layers) and their bracket from :func:`remote_figures` on ``stats``
    (default ``problem.stats``; ``placer plan`` passes every window of the trace, where
    loads and pair counts agree), None without co-activation counts.
    """
    return {
        "columns": [result.solver, baseline.solver],
        result.solver: side_metrics(problem, result, result.gap, stats),
        baseline.solver: side_metrics(problem, baseline, None, stats),
    }


def render_versus(versus: dict[str, Any]) -> list[str]:
    """Text table of :func:`versus_eplb` (``-`` where a figure does not apply)."""
    mine, theirs = versus["columns"]
    rows = [
        ("hot shard, median layer", "hot_shard_ratio_median", "{:.4f}"),
        ("hot shard, worst layer", "hot_shard_ratio_worst", "{:.4f}"),
        ("remote GPUs per token", "remote_gpus_per_token", "{:.3f}"),
        ("remote nodes per token", "remote_nodes_per_token", "{:.3f}"),
        ("weight moves", "moves", "{:.0f}"),
        ("solve time, s", "seconds", "{:.2f}"),
        ("gap to bound", "gap", "{:.2%}"),
    ]
    lines = [f"{'explanation':24}{mine:>12}{theirs:>12}"]
    for label, key, fmt in rows:
        cells = []
        for name in (mine, theirs):
            value = versus[name][key]
            cells.append("-" if value is None else fmt.format(value))
        lines.append(f"{label:24}{cells[0]:>12}{cells[1]:>12}")
    for label, key in (("remote GPUs, bounds", "remote_gpus_per_token_bounds"),
                       ("remote nodes, bounds", "remote_nodes_per_token_bounds")):
        spans = [versus[name].get(key) for name in (mine, theirs)]
        if any(span is not None for span in spans):
            cells = [" -" if span is None else f" {_span(span)}" for span in spans]
            lines.append(f"{label:24}{cells[0]:>12}{cells[1]:>12}")
    sources = [versus[name]["remote_copies_from"] for name in (mine, theirs)]
    if sources[0] == sources[1]:
        lines.append(f"remote copies: {sources[0]}")
    else:
        lines += [f"remote copies, {name}: {how}" for name, how in zip((mine, theirs), sources,
                                                                       strict=True)]
    if any(versus[name].get("remote_gpus_per_token_bounds") for name in (mine, theirs)):
        lines.append("bounds: any routing with these loads and pair counts"
                     " (docs/evaluate.md)")
    return lines


def _span(span: list[float]) -> str:
    """``lower-upper`` at 3 decimals, rounded outward: the printed bracket still holds the
    estimate printed at 3 decimals."""
    return f"{np.floor(span[0] * 1e3) / 1e3:.3f}-{np.ceil(span[1] * 1e3) / 1e3:.3f}"


# -- the summary ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanSummary:
    """Everything ``placer plan`` reports about a plan.

    Attributes
    ----------
    output: where the placement was written.
    problem: problem size (model, topology, experts, layers, windows, GPUs, slots).
    solver: the solver's name, status, objective, bound, gap and seconds.
    metrics: :func:`basic_metrics` of the plan on the fitted windows (written with it).
    workload: what the plan is judged under; ``workload_note`` says where it came from.
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
    """

    output: str
    problem: dict[str, Any]
    solver: dict[str, Any]
    metrics: dict[str, float]
    workload: Workload
    workload_note: str = ""
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

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document (exports are added by the command)."""
        w = self.workload
        num_gpus = int(self.problem["num_gpus"])
        doc: dict[str, Any] = {
            "output": self.output,
            "problem": self.problem,
            "solver": self.solver,
            "metrics": self.metrics,
            "workload": {
                "engine": w.engine, "phase": w.phase, "tokens_per_gpu": w.tokens,
                "policy": w.policy, "mode": w.mode, "batch_tokens": w.batch_tokens(num_gpus),
                "note": self.workload_note,
            },
            "judged": None if self.judged is None else self.judged.to_dict(),
            "times": {name: dict(self.times[name]) for name in self.columns
                      if name in self.times},
            "times_note": self.times_note,
            "layers_faster": self.layers,
            "verdict": None if self.verdict is None else self.verdict.to_dict(),
        }
        if self.versus is not None:
            doc["versus"] = self.versus
        return doc

    def rows(self) -> list[str]:
        """Text lines (no colour, fit for a terminal or a log)."""
        p, s, m = self.problem, self.solver, self.metrics
        model = p["model"] or "model"
        where = f"{p['topology']}: " if p["topology"] else ""
        solver = f"{s['name']} ({s['status']}, {s['seconds']:.2f} s"
        if s["bound"] is not None and s["gap"] is not None:
            solver += f", bound {s['bound']:.6g}, gap {100 * s['gap']:.2f}%"
        solver += ")"
        judged_as = self.workload.describe()
        if self.workload_note:
            judged_as += f"; {self.workload_note}"
        lines = [
            f"placement    {self.output}",
            f"model        {model}: {p['num_experts']} experts, layers {p['layers']},"
            f" {p['num_windows']} window{'s' if p['num_windows'] != 1 else ''} fitted",
            f"cluster      {where}{p['num_gpus']} GPUs on {p['num_nodes']}"
            f" node{'s' if p['num_nodes'] > 1 else ''},"
            f" {p['slots_per_gpu']} slots per GPU ({p['num_physical_experts']} physical,"
            f" {p['num_redundant']} redundant)",
            f"solver       {solver}",
            f"hot shard    max/mean GPU load: median {m['hot_shard_ratio_median']:.4f},"
            f" worst {m['hot_shard_ratio_worst']:.4f}"
            f" (hottest GPU {m['hottest_gpu_load']:.6g} tokens)",
            f"judged as    {judged_as}",
        ]
        if self.judged is not None and self.times:
            lines.append(f"judged on    {self.judged.describe()}")
        lines.append("")
        lines += self.time_rows()
        if self.versus is not None:
            lines += ["", *render_versus(self.versus)]
        return lines

    def time_rows(self) -> list[str]:
        """The estimated times, layers faster and the verdict (or why there are none)."""
        if not self.times:
            return [f"estimated time: not shown ({self.times_note})"]
        names = [n for n in self.columns if n in self.times]
        lines = [f"{'estimated time, µs':24}" + "".join(f"{n:>12}" for n in names)]
        for fig in TIME_FIGURES:
            cells = "".join(f"{fig.cell(self.times[n].get(fig.key)):>12}" for n in names)
            lines.append(f"{fig.label:24}{cells}")
        if self.layers is not None and len(names) == 2:
            mine, theirs = names
            lines.append(
                f"layers faster: {mine} {self.layers[mine]}, {theirs} {self.layers[theirs]},"
                f" equal {self.layers['equal']} (each layer's p99, equal within"
                f" {EQUAL_TOLERANCE:.1%})")
        if self.verdict is not None:
            lines.append(self.verdict.text)
        return lines


def summarize_plan(
    problem: PlacementProblem,
    result: SolveResult,
    baseline: SolveResult | None,
    routing: RoutingData | ExpertStats,
    *,
    workload: Workload | None = None,
    workload_note: str = "",
    fit: tuple[int, int] | None = None,
    output: str = "",
    dtype: str | None = None,
    no_trace_reason: str = "",
) -> PlanSummary:
    """Summarize a plan: problem, solver, time figures against the baseline, explanation.

    Parameters
    ----------
    problem: what was solved (its statistics are the fitted windows).
    result: the plan.
    baseline: EPLB's plan of the same problem, or None (no side-by-side).
    routing: the whole routing data (every window; per-token when kept).
    workload: what to judge under (default :class:`~placer.workload.Workload`).
    workload_note: where the workload came from, in words.
    fit: ``(start, stop)`` fitted windows of ``routing`` (None: every window).
    output: where the placement was written.
    dtype: expert dtype (None: the model's).
    no_trace_reason: why ``routing`` has no per-token data, when the caller knows.
    """
    workload = workload or Workload()
    if isinstance(routing, ExpertStats):
        routing = RoutingData(routing)
    stats = problem.stats
    problem_doc = {
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
    }
    solver_doc = {
        "name": result.solver,
        "status": result.status,
        "objective": result.objective,
        "bound": result.bound,
        "gap": result.gap,
        "seconds": round(result.seconds, 3),
    }
    results = [result] if baseline is None else [result, baseline]
    columns = tuple(r.solver for r in results)
    summary = PlanSummary(
        output=str(output), problem=problem_doc, solver=solver_doc,
        metrics=basic_metrics(result.placement, stats), workload=workload,
        workload_note=workload_note, columns=columns,
    )
    if baseline is not None:
        summary = replace(summary, versus=versus_eplb(problem, result, baseline, routing.stats))
    if problem.model is None or problem.topology is None:
        missing = " and ".join(o for o, v in (("--model", problem.model),
                                               ("--topology", problem.topology)) if v is None)
        return replace(summary, times_note=f"the evaluator needs {missing}")
    return _with_times(summary, problem, results, routing, fit, dtype, no_trace_reason)


def _with_times(
    summary: PlanSummary, problem: PlacementProblem, results: list[SolveResult],
    routing: RoutingData, fit: tuple[int, int] | None, dtype: str | None,
    no_trace_reason: str,
) -> PlanSummary:
    """``summary`` with the time figures, layers faster and the verdict."""
    judged = judged_windows(routing.stats.num_windows, fit)
    why = [judged.why] if judged.why else []
    sample = False
    if routing.trace is None:
        why.append(no_trace_reason or "aggregated statistics, no per-token routing")
    else:
        selections = _selections(routing, judged.windows)
        if selections > REPLAY_MAX_SELECTIONS:
            sample = True
            why.append(f"{selections:,} selections are more than a summary replays"
                       f" ({REPLAY_MAX_SELECTIONS:,}); `placer evaluate` replays them all")
    params = summary_eval_params(summary.workload, problem.num_gpus,
                                 num_layers=problem.stats.num_layers, dtype=dtype,
                                 windows=judged.windows, sample=sample)
    evaluations: dict[str, Evaluation] = {}
    draws: dict[tuple[int, ...], np.ndarray] = {}  # both placements on the same sampled tokens
    messages: list[str] = []
    findings: list[tuple[str, Any]] = []
    order: tuple[int, str] = (0, "trace")
    try:
        for r in results:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                evaluations[r.solver] = evaluate(r.placement, routing, problem.topology,
                                                 problem.model, params, draws=draws)
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
    judged = replace(
        judged, source=first.source, why="; ".join(why) if first.source == "sampled"
        else judged.why, num_batches=int(first.metrics["num_batches"]),
        batch_tokens=int(first.params.batch_tokens or 0),
        num_tokens=int(first.metrics["num_tokens"]),
    )
    times = {name: {f.key: float(ev.metrics[f.key]) for f in TIME_FIGURES}
             for name, ev in evaluations.items()}
    summary = replace(summary, eval_params=params, judged=judged, times=times,
                      evaluations=evaluations)
    if len(results) < 2:
        return summary
    mine, theirs = (r.solver for r in results)
    won, lost, equal = layers_faster(evaluations[mine].per_layer["layer_time_p99_us"],
                                     evaluations[theirs].per_layer["layer_time_p99_us"])
    target = summary.workload
    on = f"{judged.part} step p99 ({target.engine} {target.phase})"
    return replace(
        summary, layers={mine: won, theirs: lost, "equal": equal},
        verdict=verdict(mine, theirs, times[mine][VERDICT_FIGURE],
                        times[theirs][VERDICT_FIGURE], on=on),
    )


def _selections(routing: RoutingData, windows: tuple[int, int]) -> int:
    """(token, layer, pick) selections a replay of ``windows`` goes through."""
    trace = routing.trace
    assert trace is not None
    tokens = int(routing.stats.tokens[windows[0]:windows[1]].sum())
    return tokens * int(trace.topk_ids.shape[1]) * int(trace.topk_ids.shape[2])
