"""What a replay found: per policy, step by step and in figures, and the verdict.

A step's time is the sum over MoE layers of the evaluator's layer time (as every command's
``step`` figures), plus what rebalancing costs at that step: a synchronous rebalance's
stall lengthens the step it interrupts (the tokens of that step wait for it), a
background copy the step it overlaps (``async_share`` times its link time).
``step_mean_us`` is therefore the mean time per step a user pays, stalls included;
``serving_mean_us`` the same without them.

How much a background copy slows serving is the least known constant, so the verdict is
also given over :data:`SHARES` of it (:meth:`ReplayResult.share_verdict`): each result
re-timed at another share costs nothing (the copies' link time per step is kept), the
decisions staying those made at the topology's share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from placer.evaluate.balance import nan_percentile
from placer.replay.timeline import Rebalance

#: Figures of each policy, in the order tables show them.
FIGURES = ("step_mean_us", "step_p50_us", "step_p99_us", "serving_mean_us", "stall_s",
           "rebalances", "skipped", "moves", "gb_moved", "hot_shard_mean", "decision_s_max")

#: Shares of a background copy's link time the verdict is checked over.
SHARES = (0.25, 0.5, 1.0)


@dataclass(frozen=True)
class PolicyResult:
    """One policy over the replay.

    Attributes
    ----------
    label: the policy as written.
    serving_us: ``[steps]`` MoE time of each step (sum over layers), µs.
    stall_us: ``[steps]`` synchronous stalls (decisions, host work, copies), µs.
    link_us: ``[steps]`` link time of the background copies each step overlaps, µs.
    hot_shard: ``[steps]`` mean over layers of each step's hottest / mean GPU load.
    rebalances: what the policy moved, and when.
    async_share: share of ``link_us`` that lengthens the step (the topology's).
    skipped: steps a rebalance was due at while one was deciding or moving.
    decisions: ``(due step, seconds)`` of every decision, those that moved nothing too.
    start: where the policy started (``default``, ``initial``: the placement given, a
        static policy's label).
    """

    label: str
    serving_us: np.ndarray
    stall_us: np.ndarray
    link_us: np.ndarray
    hot_shard: np.ndarray
    rebalances: tuple[Rebalance, ...] = ()
    async_share: float = 1.0
    skipped: tuple[int, ...] = ()
    start: str = "-"
    decisions: tuple[tuple[int, float], ...] = ()

    @property
    def kind(self) -> str:
        return self.label.split(":", 1)[0]

    @property
    def extra_us(self) -> np.ndarray:
        """``[steps]`` what background copies add to each step, µs."""
        return self.async_share * self.link_us

    def at_share(self, share: float) -> PolicyResult:
        """The same timeline with background copies at another ``async_share``."""
        return replace(self, async_share=share)

    @property
    def step_us(self) -> np.ndarray:
        """``[steps]`` what each step costs, rebalancing included, µs."""
        return self.serving_us + self.stall_us + self.extra_us

    def figures(self, lo: int = 0, hi: int | None = None) -> dict[str, float]:
        """The figures over steps ``lo:hi`` (default all)."""
        sl = slice(lo, hi)
        step = self.step_us[sl]
        inside = [r for r in self.rebalances if lo <= r.step < (hi or len(self.step_us))]
        return {
            "step_mean_us": _mean(step),
            "step_p50_us": nan_percentile(step, 50),
            "step_p99_us": nan_percentile(step, 99),
            "serving_mean_us": _mean(self.serving_us[sl]),
            "stall_s": float(np.nansum(self.stall_us[sl])) / 1e6,
            "rebalances": float(len(inside)),
            "skipped": float(sum(lo <= t < (hi or len(self.step_us)) for t in self.skipped)),
            "moves": float(sum(r.moves for r in inside)),
            "gb_moved": float(sum(r.gb for r in inside)),
            "hot_shard_mean": _mean(self.hot_shard[sl]),
            "decision_s_max": max((s for t, s in self.decisions
                                   if lo <= t < (hi or len(self.step_us))), default=0.0),
        }

    def to_dict(self, segments: list[tuple[int, int]]) -> dict[str, Any]:
        return {
            "policy": self.label,
            "started_from": self.start,
            "figures": self.figures(),
            "skipped_steps": list(self.skipped),
            "decisions": [{"due_step": t, "seconds": s} for t, s in self.decisions],
            "segments": [{"steps": [lo, hi], **self.figures(lo, hi)} for lo, hi in segments],
            "rebalances": [r.to_dict() for r in self.rebalances],
        }


@dataclass(frozen=True)
class ReplayResult:
    """Every policy of one replay, and what the replay was.

    Attributes
    ----------
    policies: one result per policy, in the order given.
    info: the replay's settings (trace, model, topology, regime, slots per GPU, steps).
    segments: ``(first, stop)`` steps of each segment the figures are also given for.
    """

    policies: tuple[PolicyResult, ...]
    info: dict[str, Any] = field(default_factory=dict)
    segments: tuple[tuple[int, int], ...] = ()

    @property
    def oracle(self) -> PolicyResult | None:
        return next((p for p in self.policies if p.kind == "oracle"), None)

    def versus_oracle(self, result: PolicyResult) -> float | None:
        """``mean / oracle mean - 1`` (None without an oracle row)."""
        oracle = self.oracle
        if oracle is None or result is oracle:
            return None
        base = oracle.figures()["step_mean_us"]
        return result.figures()["step_mean_us"] / base - 1 if base > 0 else None

    def best(self, kind: str | None = None) -> PolicyResult | None:
        """The policy (of ``kind``) with the lowest mean step time, oracle aside."""
        rows = [p for p in self.policies if p.kind != "oracle" and (kind is None
                                                                     or p.kind == kind)]
        return min(rows, key=lambda p: p.figures()["step_mean_us"], default=None)

    def verdict(self) -> str:
        """One line: the fastest policy, against the best engine setting and the oracle."""
        best = self.best()
        if best is None:
            return "verdict: no policy to compare"
        mean = best.figures()["step_mean_us"]
        parts = [f"verdict: {best.label} has the lowest mean step time, {mean:,.1f} µs"
                 " (rebalancing included)"]
        eplb = self.best("eplb")
        if eplb is not None and eplb is not best:
            parts.append(f"{_change(mean, eplb.figures()['step_mean_us'])} the best engine"
                         f" setting ({eplb.label})")
        static = self.best("static")
        if static is not None and static is not best:
            parts.append(f"{_change(mean, static.figures()['step_mean_us'])} {static.label}")
        gap = self.versus_oracle(best)
        if gap is not None:
            parts.append(f"{gap:+.1%} against foresight ({self.oracle.label})"  # type: ignore[union-attr]
                         )
        return "; ".join(parts)

    def at_share(self, share: float) -> ReplayResult:
        """Every policy with background copies at another ``async_share``."""
        return replace(self, policies=tuple(p.at_share(share) for p in self.policies))

    def by_share(self) -> list[tuple[float, PolicyResult]]:
        """The fastest policy (oracle aside) at each of :data:`SHARES`."""
        out = []
        for share in SHARES:
            best = self.at_share(share).best()
            if best is not None:
                out.append((share, best))
        return out

    def share_verdict(self) -> str:
        """One line: whether the fastest policy stays the fastest over :data:`SHARES`."""
        rows = self.by_share()
        if not rows:
            return "verdict over async_share: no policy to compare"
        moving = any(p.link_us.any() for p in self.policies)
        shares = ", ".join(f"{s:g}" for s, _ in rows)
        figures = " / ".join(f"{p.figures()['step_mean_us']:,.1f}" for _, p in rows)
        if not moving:
            return ("verdict over async_share: no policy copies in the background, so the"
                    " share does not matter")
        if len({p.label for _, p in rows}) == 1:
            return (f"verdict over async_share {shares}: holds, {rows[0][1].label} is the"
                    f" fastest at each ({figures} µs); decisions as made at the topology's"
                    f" {self.policies[0].async_share:g}")
        parts = [f"{s:g}: {p.label} ({p.figures()['step_mean_us']:,.1f} µs)" for s, p in rows]
        return (f"verdict over async_share: flips, the fastest at {'; '.join(parts)};"
                f" decisions as made at the topology's {self.policies[0].async_share:g}")

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.info,
            "policies": [p.to_dict(list(self.segments)) for p in self.policies],
            "versus_oracle": {p.label: self.versus_oracle(p) for p in self.policies
                              if p.kind != "oracle"},
            "verdict": self.verdict(),
            "async_share": self.policies[0].async_share if self.policies else None,
            "by_async_share": [
                {"async_share": share,
                 "fastest": best.label,
                 "step_mean_us": {p.label: p.figures()["step_mean_us"]
                                  for p in self.at_share(share).policies},
                 "step_p99_us": {p.label: p.figures()["step_p99_us"]
                                 for p in self.at_share(share).policies}}
                for share, best in self.by_share()],
            "share_verdict": self.share_verdict(),
        }


def _mean(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else math.nan


def _change(value: float, base: float) -> str:
    """``12.3% below`` / ``4.0% above`` / ``equal to``."""
    if not base:
        return "unlike"
    change = value / base - 1
    if abs(change) < 5e-4:
        return "equal to"
    return f"{abs(change):.1%} {'below' if change < 0 else 'above'}"


#: Columns of the policy table: (header, figure key or a special, format).
COLUMNS = (
    ("policy", "", ""), ("step mean µs", "step_mean_us", "{:,.1f}"),
    ("p50 µs", "step_p50_us", "{:,.1f}"), ("p99 µs", "step_p99_us", "{:,.1f}"),
    ("serving µs", "serving_mean_us", "{:,.1f}"), ("stall s", "stall_s", "{:.2f}"),
    ("rebalances", "rebalances", "{:.0f}"), ("skipped", "skipped", "{:.0f}"),
    ("moves", "moves", "{:,.0f}"), ("GB moved", "gb_moved", "{:,.1f}"),
    ("hot shard", "hot_shard_mean", "{:.3f}"), ("vs oracle", "", ""),
    ("decide s", "decision_s_max", "{:.3f}"), ("started from", "", ""),
)


def table(result: ReplayResult) -> list[str]:
    """The policy table, one line a policy (figures over the whole replay)."""
    return aligned(policy_cells(result))


def segment_table(result: ReplayResult) -> list[str]:
    """Mean step time (rebalancing included) of each policy in each segment."""
    return aligned(segment_cells(result))


def policy_cells(result: ReplayResult) -> list[list[str]]:
    """The policy table's cells, the header first."""
    rows = [[h for h, _, _ in COLUMNS]]
    for p in result.policies:
        figures = p.figures()
        cells = []
        for header, key, fmt in COLUMNS:
            if header == "policy":
                cells.append(p.label)
            elif header == "vs oracle":
                gap = result.versus_oracle(p)
                cells.append("-" if gap is None else f"{gap:+.1%}")
            elif header == "started from":
                cells.append(p.start)
            else:
                value = figures[key]
                cells.append("-" if not math.isfinite(value) else fmt.format(value))
        rows.append(cells)
    return rows


def segment_cells(result: ReplayResult) -> list[list[str]]:
    """The segment table's cells, the header first."""
    head = ["policy", *(f"steps {lo}-{hi - 1} µs" for lo, hi in result.segments)]
    rows = [head]
    for p in result.policies:
        rows.append([p.label, *(f"{p.figures(lo, hi)['step_mean_us']:,.1f}"
                                for lo, hi in result.segments)])
    return rows


def aligned(rows: list[list[str]]) -> list[str]:
    """Rows as lines: the first column left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [r[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(r[1:], widths[1:],
                                                                      strict=True))]
        lines.append("  ".join(cells).rstrip())
    return lines
