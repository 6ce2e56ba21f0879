"""The plan summary as text: what ``placer plan`` prints of a
:class:`placer.summary.PlanSummary` (the library returns the figures; this renders them,
with what only the command knows: where the placement was written and where the regime
came from)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from placer.stats.skew import GINI_MARGIN
from placer.summary import TIME_FIGURES, PlanSummary
from placer.summary.figures import EQUAL_TOLERANCE, Judged
from placer.summary.plan import BATCH_FLOOR_FIGURE, FLOOR_FIGURE

if TYPE_CHECKING:
    from placer.evaluate import PartEvaluation

#: Column header of the floor (:func:`placer.evaluate.time_bound`) in the time rows.
FLOOR_COLUMN = "floor"


def summary_rows(summary: PlanSummary, *, output: str, regime_note: str = "",
                 frontier: bool = False) -> list[str]:
    """The summary's text lines (no colour, fit for a terminal or a log): ``output``
    where the placement was written, ``regime_note`` where the regime came from, and
    with ``frontier`` the re-plan's move frontier at the end."""
    p, s, m = summary.problem, summary.solver, summary.metrics
    model = p["model"] or "model"
    where = f"{p['topology']}: " if p["topology"] else ""
    solver = f"{s['name']} ({s['status']}, {s['seconds']:.2f} s"
    if s["bound"] is not None and s["gap"] is not None:
        solver += f", bound {s['bound']:.6g}, gap {100 * s['gap']:.2f}%"
    solver += ")"
    judged_as = summary.regime.describe()
    if regime_note:
        judged_as += f"; {regime_note}"
    lines = [
        f"placement    {output}",
        f"model        {model}: {p['num_experts']} experts, layers {p['layers']},"
        f" {p['num_windows']} window{'s' if p['num_windows'] != 1 else ''} fitted",
        f"cluster      {where}{p['num_gpus']} GPUs on {p['num_nodes']}"
        f" node{'s' if p['num_nodes'] > 1 else ''},"
        f" {p['slots_per_gpu']} slots per GPU ({p['num_physical_experts']} physical,"
        f" {p['num_redundant']} redundant)",
        f"solver       {solver}",
        *fallback_rows(s),
        f"hot shard    max/mean GPU load: median {m['hot_shard_ratio_median']:.4f},"
        f" worst {m['hot_shard_ratio_worst']:.4f}"
        f" (hottest GPU {m['hottest_gpu_load']:.6g} tokens)",
        f"judged as    {judged_as}",
    ]
    if summary.judged is not None and summary.times:
        lines.append(f"judged on    {judged_text(summary.judged)}")
    if summary.calibration_note:
        lines.append(f"calibration  {summary.calibration_note}")
    lines += traffic_rows(p.get("skew"))
    lines += replan_rows(summary.replan)
    lines.append("")
    lines += time_rows(summary)
    if summary.versus is not None:
        lines += ["", *versus_rows(summary.versus)]
    if frontier:
        lines += frontier_rows(summary.replan)
    return lines

#: Where each skew class sits against measured routing (no gain is promised).
_SKEW_PLACE = {"mild": "milder than measured routing", "real": "within measured routing's range",
               "heavy": "heavier than measured routing"}


def traffic_rows(skew: dict[str, Any] | None) -> list[str]:
    """How skewed the fitted windows are, one line (``placer.stats.skew.skew_report``)."""
    if not skew or skew["median"]["gini"] is None:
        return []
    m = skew["median"]

    def num(value: float | None, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    low, high = skew["real_gini_medians"]
    return [f"traffic      fitted windows' median layer: Gini {num(m['gini'], 2)},"
            f" CV {num(m['cv'], 2)}, max/mean {num(m['max_over_mean'], 1)}:"
            f" {_SKEW_PLACE[skew['class']]} (Gini {low:.2f}-{high:.2f} ± {GINI_MARGIN:.2f})"]


def fallback_rows(solver: dict[str, Any]) -> list[str]:
    """Why layers kept a layout other than the solver's own (the baseline's, the deployed
    one), reason by reason with the layers named, one line; none when every layer is the
    solver's own."""
    reasons = solver.get("fallback") or {}
    if not reasons:
        return []
    why = "; ".join(f"{r['why']} in {_layers(r)}"
                    for r in sorted(reasons.values(), key=lambda r: -r["layers"]))
    repaired = (solver.get("repaired_layers") or {}).get(solver.get("baseline") or "")
    if repaired and solver["status"] == "FALLBACK":
        why += (f"; {solver['baseline']}'s layout holds an expert twice on a GPU in {repaired}"
                f" layer{'s' if repaired != 1 else ''}, kept here with the second replica"
                " swapped onto another GPU")
    if solver["status"] == "FALLBACK":
        return [f"fallback     no layer is CP-SAT's own: {why}"]
    kept = sum(r["layers"] for r in reasons.values())
    return [f"fallback     {kept} layer{'s' if kept != 1 else ''} kept another layout: {why}"]


def _layers(reason: dict[str, Any]) -> str:
    """``2 layers (3, 7)``: a reason's layer count and, when known, which (at most 8)."""
    count = reason["layers"]
    text = f"{count} layer{'s' if count != 1 else ''}"
    ids = reason.get("layer_ids") or []
    if ids:
        shown = ", ".join(str(i) for i in ids[:8]) + (", ..." if len(ids) > 8 else "")
        text += f" ({shown})"
    return text


def judged_text(judged: Judged) -> str:
    """Where and how a plan was judged, in words: ``held-out windows 6:32 (fitted 0:6),
    per-token replay: 7 batches of up to 1024 tokens, 6656 tokens`` (``6656 of 60000
    tokens`` when a sampled trace was judged on part of the windows' tokens)."""
    start, stop = judged.windows
    if judged.part == "held-out":
        where = (f"held-out windows {start}:{stop}"
                 f" (fitted {judged.fitted[0]}:{judged.fitted[1]})")
    else:
        where = f"the fitted windows {start}:{stop}"
    how = "per-token replay" if judged.source == "trace" else "sampled batches"
    of = f" of {judged.of_tokens}" if judged.of_tokens > judged.num_tokens else ""
    text = (f"{where}, {how}: {judged.num_batches} batch{'es' if judged.num_batches != 1 else ''}"
            f" of up to {judged.batch_tokens} tokens, {judged.num_tokens}{of} tokens")
    return f"{text} ({judged.reasons})" if judged.reasons else text


def judged_doc(part: PartEvaluation) -> dict[str, Any]:
    """What a part was judged on, with plan's ``judged`` fields: ``num_tokens`` replayed
    or sampled, ``of_tokens`` the windows hold (the same unless a trace read as a sample
    was replayed), ``sample`` (how the sample was judged, or None: the trace was kept
    whole) and ``why`` (in words, or "")."""
    num = int(part.evaluations[0][1].metrics["num_tokens"]) if part.evaluations else 0
    note = part.judged_sample
    if note is None:
        return {"num_tokens": num, "of_tokens": num, "sample": None, "why": ""}
    return note.to_dict(num, part.source == "trace")


def judged_line(part: PartEvaluation) -> str:
    """A part judged on a trace read as a sample, in words (plan's): ``judged on windows
    6:32: 1024 of 6656 tokens (the trace's 8,192 tokens are too many to keep: ...)``;
    "" when the trace was kept whole."""
    if part.judged_sample is None:
        return ""
    doc = judged_doc(part)
    of = f" of {doc['of_tokens']}" if doc["of_tokens"] > doc["num_tokens"] else ""
    start, stop = part.windows
    return f"judged on windows {start}:{stop}: {doc['num_tokens']}{of} tokens ({doc['why']})"


def time_rows(summary: PlanSummary) -> list[str]:
    """The estimated times, layers faster and the verdict (or why there are none)."""
    if not summary.times:
        return [f"estimated time: not shown ({summary.times_note})"]
    names = [n for n in summary.columns if n in summary.times]
    floor = summary.floor or {}
    lines = [f"{'estimated time, µs':24}" + "".join(f"{n:>12}" for n in names)
             + (f"{FLOOR_COLUMN:>12}" if summary.floor is not None else "")]
    for fig in TIME_FIGURES:
        cells = "".join(f"{fig.cell(summary.times[n].get(fig.key)):>12}" for n in names)
        if summary.floor is not None:
            cells += f"{fig.cell(floor.get(fig.key)):>12}"
        lines.append(f"{fig.label:24}{cells}")
    if summary.layers is not None and len(names) == 2:
        mine, theirs = names
        lines.append(
            f"layers faster: {mine} {summary.layers[mine]}, {theirs} {summary.layers[theirs]},"
            f" equal {summary.layers['equal']} (each layer's p99, equal within"
            f" {EQUAL_TOLERANCE:.1%})")
    if summary.verdict is not None:
        lines.append(summary.verdict.text)
    gaps = summary.gaps()
    if gaps:
        slots = summary.problem["slots_per_gpu"]
        within = ", ".join(f"{name} {gap:.1%}" for name, gap in gaps.items())
        lines.append(
            f"{FLOOR_COLUMN}: no placement with {slots} slots per GPU has a mean step below"
            f" {floor[FLOOR_FIGURE]:,.1f} µs on these tokens under this model; above it:"
            f" {within} (docs/planner.md, the floor)")
        lines += _traffic_row(summary, names)
    lines += _batch_floor_row(summary, names)
    return lines

def _batch_floor_row(summary: PlanSummary, names: list[str]) -> list[str]:
    """Each plan's step p99 against the per-batch floor of its replica counts."""
    floors = summary.batch_floor or {}
    shown = [n for n in names if n in floors and math.isfinite(floors[n])
             and n in summary.times]
    if not shown:
        return []
    policy = summary.eval_params.policy if summary.eval_params is not None else ""
    least = ", ".join(f"{n} {floors[n]:,.1f} µs" for n in shown)
    above = ", ".join(
        f"{n} {max(0.0, 1 - floors[n] / summary.times[n][BATCH_FLOOR_FIGURE]):.1%}"
        for n in shown)
    return [f"per-batch floor ({policy}, each plan's replica counts): step p99 at least"
            f" {least}; above it: {above} (docs/planner.md, the floor)"]

def _traffic_row(summary: PlanSummary, names: list[str]) -> list[str]:
    """Where the floor is loose: the remote copies per token it counts beside each
    plan's own (empty when the evaluations or the floor's counts are absent)."""
    floor = summary.floor or {}
    keys = ("remote_copies_per_token_gpu", "remote_copies_per_token_node")
    least = [floor.get(k, math.nan) for k in keys]
    if not all(math.isfinite(v) for v in least) or not summary.evaluations:
        return []
    plans = [f"{n} {summary.evaluations[n].metrics[keys[0]]:.2f} and"
             f" {summary.evaluations[n].metrics[keys[1]]:.2f}"
             for n in names if n in summary.evaluations]
    return [f"{FLOOR_COLUMN}'s traffic: at least {least[0]:.2f} copies per token to another"
            f" GPU and {least[1]:.2f} to another node; {', '.join(plans)}"]


def versus_rows(versus: dict[str, Any]) -> list[str]:
    """Text table of :func:`placer.summary.versus_eplb` (``-`` where a figure does not
    apply)."""
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


def replan_rows(doc: dict[str, Any] | None) -> list[str]:
    """Text lines of :func:`placer.summary.replan.replan_doc`."""
    if doc is None:
        return []
    lines = [f"re-plan      {doc['describe']}"]
    if "current_cost" in doc:
        before, after, best = doc["current_cost"], doc["cost_after"], doc["best_cost"]
        change = after / before - 1.0 if before else 0.0
        why = (f"budget {doc['budget']:,} moves" if doc.get("budget") is not None else
               f"the fewest moves within {doc['tolerance']:.1%} of the best re-plan")
        lines.append(
            f"             {why}; the best re-plan needs {doc['best_moves']:,} moves"
            f" ({best:,.1f})")
        lines.append(
            f"             {doc['cost']} on the fitted windows: current {before:,.1f},"
            f" re-planned {after:,.1f} ({change:+.2%})")
    return lines


def frontier_rows(doc: dict[str, Any] | None) -> list[str]:
    """The move frontier of :func:`placer.summary.replan.replan_doc` (budget -> estimated
    time), after a blank line; empty without one."""
    lines: list[str] = []
    if doc is not None and doc.get("frontier"):
        lines += ["", f"{'move budget':>12}{'moves':>10}{'estimate':>14}{'vs current':>12}"]
        before = doc["current_cost"]
        for row in doc["frontier"]:
            change = row["cost"] / before - 1.0 if before else 0.0
            lines.append(f"{row['budget']:>12,}{row['moves']:>10,}{row['cost']:>14,.1f}"
                         f"{change:>+12.2%}")
        lines.append(f"(estimate: {doc['cost']}, fitted windows; whole layers re-planned or kept,"
                     " the most gain per budget)")
    return lines
