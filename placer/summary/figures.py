"""Time figures of a summary: labels, units and formats defined once; where and how a
plan is judged; the verdict and the per-layer count."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from placer.metrics import Metric, metric

#: The solver every plan is compared with.
BASELINE_SOLVER = "eplb"

#: Relative difference below which two times are reported as equal (0.1%).
EQUAL_TOLERANCE = 1e-3

#: The figure of the verdict: p99 over batches of the step (sum over MoE layers).
VERDICT_FIGURE = "step_p99_us"

#: ``placer plan`` reads per-token routing for its judge as a
#: :class:`placer.traces.TokenSample`: the whole trace up to this many (token, layer,
#: pick) selections (as much as a judgement replays), ...
JUDGE_WHOLE_SELECTIONS = 1 << 26
#: ... else this many whole batches per window (memory: at most ``MAX_WINDOWS`` batches).
JUDGE_BATCHES_PER_WINDOW = 1


# -- the time figures: one definition of labels, units and formats ----------------------------


#: How an estimated time is shown: the metric table's entry (:mod:`placer.metrics`).
TimeFigure = Metric

#: Estimated times, in the order the summary shows them.
TIME_FIGURES: tuple[Metric, ...] = tuple(metric(key) for key in (
    "moe_layer_p50_us", "moe_layer_p99_us", "layer_p99_us_median", "layer_p99_us_worst",
    "step_p50_us", "step_p99_us", "step_mean_us", "all_to_all_us", "compute_us",
))

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
    why: why the part is what it is (empty when there is nothing to say).
    source_why: why the tokens are sampled, or which part of a sampled trace was
        replayed, when they are (else empty).
    num_batches, batch_tokens, num_tokens: what the evaluator judged (0 before).
    ranks_why: the trace's source ranks dealt over every GPU, when they were
        (:func:`placer.evaluate.batches.attention_ranks`; else empty).
    of_tokens: tokens the judged windows hold in all (``num_tokens`` of them were
        judged); 0 before.
    sample: how a sampled per-token trace was judged (``trace_tokens``,
        ``batches_held`` in the judged windows, ``batches_judged``, ``per_window``,
        ``seed``: :func:`placer.summary.judge_sample`), or None when the trace was kept
        whole (or there is none).
    """

    part: str
    windows: tuple[int, int]
    fitted: tuple[int, int]
    source: str = "sampled"
    why: str = ""
    source_why: str = ""
    num_batches: int = 0
    batch_tokens: int = 0
    num_tokens: int = 0
    ranks_why: str = ""
    of_tokens: int = 0
    sample: dict[str, int] | None = None

    @property
    def reasons(self) -> str:
        """Why the part and the source are what they are, in one string."""
        return "; ".join(text for text in (self.why, self.source_why, self.ranks_why) if text)

    def to_dict(self) -> dict[str, Any]:
        return {"part": self.part, "windows": list(self.windows), "fitted": list(self.fitted),
                "source": self.source, "why": self.reasons, "num_batches": self.num_batches,
                "batch_tokens": self.batch_tokens, "num_tokens": self.num_tokens,
                "of_tokens": self.of_tokens, "sample": self.sample}


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
    why = ("no window held out: `fit` START:STOP leaves some out" if num_windows > 1
           else "the data has one window: nothing to hold out")
    return Judged("fitted", (start, stop), (start, stop), why=why)


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

    ``on`` names the judged data and regime, e.g. ``"held-out step p99 (vllm decode)"``.
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
