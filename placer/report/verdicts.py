"""The answer first: each scenario or placement against its baseline, in one line.

A report must never show a plan slower than the baseline without saying so.
Each compared row gets a line such as ``cpsat: step p99 -12.3% vs eplb — better``
(``worse`` and ``equal`` are said as plainly), and a table of deltas against the
same baseline: step p99, MoE-layer p99, per-batch hot shard p99, KV cache left.

The compare rows are read through ``CompareRow.as_dict()`` so that the figures a
row carries (``versus_baseline``, ``baseline``, ``outcome``) are used as they are;
a delta the row does not carry is computed here from the two rows' figures.  The
baseline is the row named by ``baseline``; a row that names none (rows built
without ``placer.compare.rows.with_verdicts``) is judged against its topology's
first EPLB row, or its first row when no EPLB row ran.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from placer.report.html import Section, Table, Text
from placer.summary import BASELINE_SOLVER, EQUAL_TOLERANCE

#: Figures shown as deltas against the baseline: (row field / metric key, header,
#: True when lower is better).
DELTA_FIGURES = (
    ("step_p99_us", "Δ step p99", True),
    ("moe_layer_p99_us", "Δ MoE-layer p99", True),
    ("batch_hot_shard_p99", "Δ batch hot shard p99", True),
    ("kv_left_gb", "Δ KV cache left", False),
)

#: The word of each outcome, stated plainly.
WORDS = {"faster": "better", "slower": "worse", "equal": "equal"}


@dataclass(frozen=True)
class Judgement:
    """One row against its baseline.

    Attributes
    ----------
    name: the row (scenario or placement label).
    baseline: the baseline's name; None when there is none (the row is one, or
        nothing ran to compare with).
    change: ``step p99 / baseline's - 1`` (negative: faster), or None.
    deltas: per :data:`DELTA_FIGURES` key, ``value / baseline's - 1`` or None.
    line: the one-line verdict.
    word: ``better``, ``worse``, ``equal``, ``baseline`` or ``no verdict``.
    """

    name: str
    baseline: str | None
    change: float | None
    deltas: dict[str, float | None]
    line: str
    word: str


def judge(name: str, figures: Mapping[str, Any], baseline: str | None,
          base_figures: Mapping[str, Any] | None, *, change: float | None = None,
          why_not: str = "") -> Judgement:
    """The verdict of one row.

    Parameters
    ----------
    name: the row's name.
    figures: its figures by :data:`DELTA_FIGURES` key (missing or None: no figure).
    baseline, base_figures: the baseline's name and figures; None when the row has no
        baseline (``why_not`` then says why).
    change: the step p99 change when the caller already has it (a compare row's
        ``versus_baseline``); computed from the figures otherwise.
    why_not: the reason shown when no verdict can be given.
    """
    if baseline is None or base_figures is None:
        reason = why_not or "no baseline ran"
        return Judgement(name, None, None, {}, f"{name}: no verdict ({reason})", "no verdict")
    if baseline == name:
        return Judgement(name, None, None, {}, f"{name}: the baseline", "baseline")
    deltas = {key: _change(figures.get(key), base_figures.get(key))
              for key, _, _ in DELTA_FIGURES}
    if change is None:
        change = deltas["step_p99_us"]
    else:
        deltas["step_p99_us"] = change
    if change is None:
        reason = why_not or "no step p99 figure"
        return Judgement(name, baseline, None, deltas, f"{name}: no verdict against {baseline}"
                         f" ({reason})", "no verdict")
    outcome = ("equal" if abs(change) < EQUAL_TOLERANCE
               else "faster" if change < 0 else "slower")
    word = WORDS[outcome]
    tail = f" (within {EQUAL_TOLERANCE:.1%})" if outcome == "equal" else ""
    return Judgement(name, baseline, change, deltas,
                     f"{name}: step p99 {_percent(change)} vs {baseline} — {word}{tail}", word)


def compare_judgements(rows: Sequence[Any]) -> list[Judgement]:
    """One :class:`Judgement` per compare row, in order (rows: ``CompareRow``)."""
    dicts = [r.as_dict() for r in rows]
    by_name = {d["scenario"]: d for d in dicts}
    first_on: dict[str, dict[str, Any]] = {}
    for d in dicts:
        if d["status"] != "ok" or not _finite(d.get("step_p99_us")):
            continue
        held = first_on.get(d["topology"])
        if held is None or (d["solver"] == BASELINE_SOLVER and held["solver"] != BASELINE_SOLVER):
            first_on[d["topology"]] = d
    out = []
    for d in dicts:
        name = d["scenario"]
        if d["status"] != "ok":
            kind = d["status"].partition(":")[0]
            out.append(judge(name, d, None, None, why_not=f"{kind}, no figures"))
            continue
        base = by_name.get(d.get("baseline") or "")
        if d.get("verdict") == "baseline" or d.get("outcome") == "baseline":
            base = d
        base = base or first_on.get(d["topology"])
        if base is None:
            out.append(judge(name, d, None, None,
                             why_not="no scenario on this topology has a step p99"))
            continue
        change = d.get("versus_baseline") if base is not d else None
        out.append(judge(name, d, base["scenario"], base,
                         change=change if _finite(change) else None))
    return out


def placement_judgements(names: Sequence[str], evaluations: Sequence[Any]) -> list[Judgement]:
    """One :class:`Judgement` per placement of ``placer report``, against the first."""
    figures = [dict(getattr(e, "metrics", {}) or {}) if e is not None else {}
               for e in evaluations]
    if not names:
        return []
    base_name, base = names[0], figures[0]
    out = [judge(base_name, base, base_name, base)]
    for name, fig in zip(names[1:], figures[1:], strict=True):
        out.append(judge(name, fig, base_name, base))
    return out


def verdict_section(judgements: Sequence[Judgement], *, intro: str = "") -> Section:
    """The *Verdict* section: the one-line verdicts, then the table of deltas."""
    lines = [Text(j.line) for j in judgements]
    judged = [j for j in judgements if j.baseline is not None]
    blocks: list[Any] = list(lines)
    if judged:
        header = ("placement or scenario", "against", *(h for _, h, _ in DELTA_FIGURES),
                  "verdict")
        cells = tuple(
            (j.name, j.baseline or "-",
             *(_percent(j.deltas.get(key)) for key, _, _ in DELTA_FIGURES), j.word)
            for j in judged)
        blocks.append(Table(header, cells, caption="Change against the baseline (negative:"
                            " lower; lower is better for times and hot shard, higher for KV"
                            " cache left)"))
    return Section("Verdict", tuple(blocks), intro=intro)


def _change(value: Any, base: Any) -> float | None:
    if not (_finite(value) and _finite(base)) or float(base) == 0.0:
        return None
    return float(value) / float(base) - 1.0


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _percent(value: float | None) -> str:
    """``+12.3%``; two decimals under 1% so a small change does not read as ``+0.0%``."""
    if value is None:
        return "-"
    return f"{value:+.2%}" if abs(value) < 0.01 else f"{value:+.1%}"
