"""Whether a replay is long enough for a rebalance to pay back what it costs.

A rebalance costs serving time once (a synchronous stall, or the share of a background
copy's link time that lengthens the steps it overlaps) and gains a little on every step
after it (the new layout serves faster than the static one).  Both come from the replay's
own figures, per online policy that rebalanced:

- cost per rebalance: the policy's stalls plus its copies' added time, over the replay,
  divided by its rebalances;
- gain per step: the best static policy's serving time minus the online policy's, per
  step, over the steps from the first rebalance on (before it both serve the same layout
  when the online policy starts from the static one);
- break-even: cost / gain steps, and that many steps at the policy's serving time in
  seconds.

A replay shorter than every online policy's break-even cannot show a rebalance paying
back, so a static verdict then says as much about the trace's length as about the
policies (:func:`too_short`); a break-even longer than the policy's interval means no
rebalance at that cadence pays back, however long the trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from placer.replay.policies import OnlinePolicy, parse_policy
from placer.replay.result import PolicyResult, ReplayResult


@dataclass(frozen=True)
class Payback:
    """One online policy's cost and gain over the best static policy.

    Attributes
    ----------
    policy: the online policy's label.
    static: the static policy it is measured against.
    cost_s: what one rebalance costs serving, on average, seconds.
    gain_us: serving time saved per step after the first rebalance, µs (<= 0: none).
    steps: steps after which a rebalance pays back (inf without a gain).
    seconds: those steps' serving time, seconds (inf without a gain).
    first: the step of the policy's first rebalance.
    """

    policy: str
    static: str
    cost_s: float
    gain_us: float
    steps: float
    seconds: float
    first: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "static": self.static, "cost_s": self.cost_s,
                "gain_us_per_step": self.gain_us,
                "break_even_steps": None if math.isinf(self.steps) else self.steps,
                "break_even_s": None if math.isinf(self.seconds) else self.seconds,
                "first_rebalance_step": self.first}


def paybacks(result: ReplayResult) -> list[Payback]:
    """Each online policy that rebalanced, against the best static policy."""
    static = result.best("static")
    if static is None:
        return []
    rows = []
    for p in result.policies:
        if p.kind not in ("eplb", "placer") or not p.rebalances:
            continue
        rows.append(_payback(p, static))
    return rows


def _payback(p: PolicyResult, static: PolicyResult) -> Payback:
    cost_us = float(np.nansum(p.stall_us) + np.nansum(p.extra_us)) / len(p.rebalances)
    first = min(r.step for r in p.rebalances)
    after = slice(first, None)
    gained = static.serving_us[after] - p.serving_us[after]
    finite = gained[np.isfinite(gained)]
    gain = float(finite.mean()) if finite.size else math.nan
    if not gain > 0:
        return Payback(p.label, static.label, cost_us / 1e6, gain, math.inf, math.inf, first)
    steps = cost_us / gain
    serving = p.serving_us[np.isfinite(p.serving_us)]
    per_step = float(serving.mean()) if serving.size else 0.0
    return Payback(p.label, static.label, cost_us / 1e6, gain, steps, steps * per_step / 1e6,
                   first)


def too_short(result: ReplayResult, steps: int) -> str | None:
    """A note when no online policy's rebalance pays back within the replay's ``steps``
    (None when one does, or when no online policy rebalanced): a rebalance pays back when
    its break-even fits between the policy's first rebalance and the replay's end."""
    rows = paybacks(result)
    if not rows or any(r.first + r.steps <= steps for r in rows):
        return None
    serving = [p.serving_us[np.isfinite(p.serving_us)] for p in result.policies
               if p.kind == "static"]
    length_s = float(serving[0].sum()) / 1e6 if serving and serving[0].size else math.nan
    gaining = [r for r in rows if math.isfinite(r.steps)]
    head = (f"this replay ({steps:,} steps, about {length_s:.2g} s of serving) is too short"
            " for any rebalance to pay back its cost")
    if not gaining:
        return (head + f": no online policy's layout served faster than {rows[0].static}"
                " after its first rebalance")
    r = min(gaining, key=lambda x: x.first + x.steps)
    interval = _interval(r.policy)
    if interval is not None and r.steps > interval:
        return (head + f": the quickest, {r.policy}, costs {r.cost_s:.3g} s a rebalance and"
                f" gains {r.gain_us:,.1f} µs a step over {r.static}, so it breaks even after"
                f" {math.ceil(r.steps):,} steps (about {r.seconds:.3g} s of serving), more than"
                f" its interval of {interval:,}: at this cadence no rebalance pays back however"
                " long the trace")
    return (head + f": the quickest, {r.policy}, costs {r.cost_s:.3g} s a rebalance and gains"
            f" {r.gain_us:,.1f} µs a step over {r.static}, so it breaks even"
            f" {math.ceil(r.steps):,} steps (about {r.seconds:.3g} s of serving) after its"
            f" first rebalance at step {r.first:,}; a longer trace may reverse the verdict")


def _interval(label: str) -> int | None:
    """The steps between an online policy's rebalances (None for other policies)."""
    policy = parse_policy(label)
    return policy.interval if isinstance(policy, OnlinePolicy) else None
