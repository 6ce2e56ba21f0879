"""Which scenario to deploy, and why: the recommendation rule of a comparison.

The rule (:func:`recommend`), over the rows that ran with a step p99 and a throughput:

- **with a latency target** (``--p99-target-us T``): the scenarios whose estimated step
  p99 is at most ``T`` qualify; the recommendation is the one with the fewest GPUs, then
  the highest throughput per GPU, then the fewest redundant experts (less memory), then
  the first listed.  When none qualifies there is no recommendation, and the reason
  names the lowest step p99 there is;
- **without a target**: the scenarios whose step p99 is within ``slack`` percent
  (``--p99-slack``, default 10) of the lowest qualify; the recommendation is the one with
  the highest throughput per GPU (``tokens_per_s_per_gpu``), then the fewest GPUs, the
  fewest redundant experts, the first listed.  So a cluster that is much faster per step
  wins unless a smaller one serves more per GPU at nearly the same latency.

Throughputs within ``placer.summary.EQUAL_TOLERANCE`` (0.1%) of the highest count as a tie.
Throughput per GPU is tokens per step over the estimated *mean* step time and the GPUs;
latency is the step *p99*.  Both count the MoE layers only (placer's cost model), which
is enough to rank scenarios of one model on one trace.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from placer.compare.rows import CompareRow
from placer.compare.scenarios import DEFAULT_P99_SLACK_PCT
from placer.metrics import metric
from placer.summary import EQUAL_TOLERANCE


@dataclass(frozen=True)
class Recommendation:
    """The scenario to deploy, or why there is none.

    Attributes
    ----------
    scenario: the recommended scenario's label, or None.
    rule: the rule applied, in words.
    reason: why this scenario (or why none), in words.
    p99_target_us: the latency target, None without one.
    p99_slack_pct: the slack over the lowest p99 (applied without a target).
    candidates: labels of the scenarios that qualified, in row order.
    """

    scenario: str | None
    rule: str
    reason: str
    p99_target_us: float | None
    p99_slack_pct: float
    candidates: tuple[str, ...] = ()

    @property
    def line(self) -> str:
        """The closing line of the table: ``recommended: <scenario> — <reason>``."""
        return f"recommended: {self.scenario or 'none'} — {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "rule": self.rule, "reason": self.reason,
                "p99_target_us": self.p99_target_us, "p99_slack_pct": self.p99_slack_pct,
                "candidates": list(self.candidates)}


def recommend(
    rows: Sequence[CompareRow],
    *,
    p99_target_us: float | None = None,
    p99_slack_pct: float = DEFAULT_P99_SLACK_PCT,
) -> Recommendation:
    """The scenario to deploy by the module's rule (pure; rows as :func:`placer.compare.compare`
    returns them)."""
    if p99_target_us is not None:
        rule = (f"fewest GPUs with step p99 <= {_us(p99_target_us)}, then the highest"
                " throughput per GPU")
    else:
        rule = (f"highest throughput per GPU among the scenarios with step p99 within"
                f" {p99_slack_pct:g}% of the lowest")

    def answer(scenario: str | None, reason: str, candidates: tuple[str, ...] = ()) -> (
            Recommendation):
        return Recommendation(scenario, rule, reason, p99_target_us, p99_slack_pct,
                              candidates)

    ran = [(i, r) for i, r in enumerate(rows) if _usable(r)]
    if not ran:
        why = "no scenario was judged" if not rows else "no scenario ran to a step time"
        return answer(None, f"{why}; see the status column")
    fastest_i, fastest = min(ran, key=lambda ir: (_p99(ir[1]), ir[0]))
    lowest = f"{_us(_p99(fastest))}, {fastest.scenario}"
    if p99_target_us is not None:
        fit = [(i, r) for i, r in ran if _p99(r) <= p99_target_us]
        if not fit:
            return answer(None, f"no scenario meets step p99 <= {_us(p99_target_us)};"
                                f" the lowest is {lowest}")
        gpus = min(_gpus(r) for _, r in fit)
        fewest = [(i, r) for i, r in fit if _gpus(r) == gpus]
        i, best, ties = _most_per_gpu(fewest)
        reason = (f"the fewest GPUs ({gpus}) with step p99 <= {_us(p99_target_us)}:"
                  f" {_us(_p99(best))}, {_per_gpu(_rate(best))} tokens/s per GPU")
        if len(fewest) > 1:
            reason += f", the most of the {len(fewest)} on {gpus} GPUs"
        return answer(best.scenario, reason + _ties(ties), tuple(r.scenario for _, r in fit))
    bound = _p99(fastest) * (1 + p99_slack_pct / 100)
    near = [(i, r) for i, r in ran if _p99(r) <= bound]
    i, best, ties = _most_per_gpu(near)
    if len(near) == 1:
        reason = (f"the lowest step p99 ({_us(_p99(best))}), {_per_gpu(_rate(best))} tokens/s"
                  f" per GPU; no other scenario within {p99_slack_pct:g}% of it")
    else:
        over = _p99(best) / _p99(fastest) - 1
        own = ("the lowest itself" if i == fastest_i else
               f"{_us(_p99(best))}, level with the lowest ({lowest})"
               if over < EQUAL_TOLERANCE else
               f"{_us(_p99(best))}, {over:+.1%} over the lowest ({lowest})")
        reason = (f"the most tokens/s per GPU ({_per_gpu(_rate(best))}) of the {len(near)}"
                  " scenarios"
                  f" with step p99 within {p99_slack_pct:g}% of the lowest; its step p99:"
                  f" {own}")
    return answer(best.scenario, reason + _ties(ties), tuple(r.scenario for _, r in near))


def _most_per_gpu(
    rows: list[tuple[int, CompareRow]],
) -> tuple[int, CompareRow, int]:
    """The row with the most tokens/s per GPU; rates within ``EQUAL_TOLERANCE`` of the most
    are a tie, broken by fewer GPUs, fewer redundant experts, then row order.  Returns
    ``(index, row, number of tied rows)``."""
    top = max(_rate(r) for _, r in rows)
    tied = [(i, r) for i, r in rows if _rate(r) >= top * (1 - EQUAL_TOLERANCE)]
    i, best = min(tied, key=lambda ir: (_gpus(ir[1]), ir[1].redundant, ir[0]))
    return i, best, len(tied)


def _ties(count: int) -> str:
    if count < 2:
        return ""
    return (f"; {count} scenarios within {EQUAL_TOLERANCE:.1%} of that throughput: the fewest"
            " GPUs, then the fewest redundant experts")


def _us(value: float) -> str:
    """A step time as the table shows it (:mod:`placer.metrics`), with its unit."""
    entry = metric("step_p99_us")
    return f"{entry.cell(value)} {entry.unit}"


def _per_gpu(value: float) -> str:
    return metric("tokens_per_s_per_gpu").cell(value)


def _usable(row: CompareRow) -> bool:
    values = (row.step_p99_us, row.tokens_per_s_per_gpu)
    return row.ok and all(v is not None and math.isfinite(v) for v in values)


def _p99(row: CompareRow) -> float:
    assert row.step_p99_us is not None
    return row.step_p99_us


def _rate(row: CompareRow) -> float:
    assert row.tokens_per_s_per_gpu is not None
    return row.tokens_per_s_per_gpu


def _gpus(row: CompareRow) -> int:
    return int(row.num_gpus or 0)
