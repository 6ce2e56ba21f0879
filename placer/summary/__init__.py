"""What a plan is worth: estimated time under the target workload, side by side with EPLB.

:func:`summarize_plan` is the library behind ``placer plan``'s summary (and the figures
``placer compare`` and the report share).  It judges a planned placement and EPLB's on
the same routing data with the evaluator (:func:`placer.evaluate.evaluate`), under the
workload the plan is for (:class:`placer.regime.Regime`: the engine fixes the dispatch
policy, the phase the all-to-all mode, tokens per GPU the batch):

- **where**: the windows ``--fit`` left out after the fitted ones (*held-out*), else
  those before them, else the fitted windows themselves (and it says so);
- **how**: replayed on the per-token routing when the data has it (and the replay is not
  too large: :data:`REPLAY_MAX_SELECTIONS`), else batches sampled from the statistics; a
  trace read as a sample (:class:`placer.traces.TokenSample`: whole batches per window)
  is replayed on at most as many of its batches as sampling would draw, spread over the
  judged windows (:func:`judge_sample`), and the summary says how many of the windows'
  tokens that is;
- **what**: estimated MoE-layer p50/p99 (pooled over (batch, layer) pairs and each layer's
  own tail), step time (the sum over layers of one batch) p50/p99, all-to-all and expert
  compute time; per layer, which placement has the lower p99 layer time (the objective a
  planner optimizes); and a one-line verdict on step p99 (:func:`verdict`).

Below the time rows, the *explanation* rows (:func:`versus_eplb`): hot shard on the
fitted windows, remote copies per token and their proven bracket
(:func:`remote_figures`), weight moves, solve time and gap.

Pure apart from what the evaluator needs (no files, no printing: ``placer plan`` renders
the figures as text, :mod:`placer.cli.summary`); warnings of the evaluations are said
once (:class:`placer.errors.PlacerWarning`).
"""


from placer.evaluate.params import judge_sample
from placer.summary.figures import (
    BASELINE_SOLVER,
    EQUAL_TOLERANCE,
    JUDGE_BATCHES_PER_WINDOW,
    JUDGE_WHOLE_SELECTIONS,
    TIME_FIGURES,
    VERDICT_FIGURE,
    Judged,
    TimeFigure,
    Verdict,
    change_text,
    judged_windows,
    layers_faster,
    time_figure,
    verdict,
)
from placer.summary.plan import PlanSummary, summarize_plan
from placer.summary.proxies import basic_metrics, remote_figures, versus_eplb

__all__ = [
    "BASELINE_SOLVER",
    "EQUAL_TOLERANCE",
    "JUDGE_BATCHES_PER_WINDOW",
    "JUDGE_WHOLE_SELECTIONS",
    "TIME_FIGURES",
    "VERDICT_FIGURE",
    "Judged",
    "PlanSummary",
    "TimeFigure",
    "Verdict",
    "basic_metrics",
    "change_text",
    "judge_sample",
    "judged_windows",
    "layers_faster",
    "remote_figures",
    "summarize_plan",
    "time_figure",
    "verdict",
    "versus_eplb",
]
