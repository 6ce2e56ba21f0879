"""How many redundant experts to buy: ``placer plan --redundant auto``.

Replicating hot experts evens the load but every slot a GPU holds is one more expert's
weights to read per layer (at decode batch sizes an expert GEMM is memory-bound: the
read, not the tokens, sets its time) and memory the KV cache no longer has.  So more
redundancy is not always faster.  :func:`choose_redundancy` tries every slot count the
memory allows (``S = ceil(E / G)`` up to the capacity bound, ``R = G * S - E``), places
each with the EPLB baseline (the greedy every engine ships, seconds for a whole model)
and times it with the evaluator under the regime, on the fitted windows and the
same sampled tokens for every candidate.  The answer is the fewest redundant experts
whose estimated step time is within ``tolerance`` of the fastest: time first, then KV
cache.  The planner then plans that redundancy with its own solver.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from placer.errors import InfeasibleError, Param, UsageError
from placer.evaluate.judge import layer_times
from placer.model.slots import fewest_slots_per_gpu
from placer.planning.build import ProblemSpec, build_problem
from placer.planning.solvers import solve
from placer.problem import PlacementProblem, SolveParams
from placer.regime import Regime
from placer.stats import ExpertStats, RoutingData

#: Candidates within this share of the fastest count as equally fast (fewer slots win).
DEFAULT_TOLERANCE = 0.005
#: Most slot counts tried (spread evenly between the fewest and the most).
MAX_CANDIDATES = 8


@dataclass(frozen=True)
class RedundancyOption:
    """One candidate.

    Attributes
    ----------
    redundant: redundant experts per layer ``R``.  slots_per_gpu: ``S``.
    step_us: estimated step time (sum over layers of each layer's p99 over sampled
        batches), microseconds, of the EPLB baseline placement at this redundancy.
    kv_left_gb: memory left for the KV cache on the tightest GPU, GB (None unknown).
    """

    redundant: int
    slots_per_gpu: int
    step_us: float
    kv_left_gb: float | None


@dataclass(frozen=True)
class RedundancyChoice:
    """What ``--redundant auto`` chose, and why.

    Attributes
    ----------
    chosen: the option planned.
    options: every candidate tried, fewest slots first.
    tolerance: candidates within this share of the fastest counted as equal.
    regime: what the times were estimated under.
    """

    chosen: RedundancyOption
    options: tuple[RedundancyOption, ...]
    tolerance: float
    regime: Regime

    @property
    def reason(self) -> str:
        """One line: the choice, against the fastest and the no-redundancy option."""
        fastest = min(self.options, key=lambda o: o.step_us)
        least = self.options[0]
        parts = [f"`redundant` auto: {self.chosen.redundant} redundant experts"
                 f" ({self.chosen.slots_per_gpu} slots per GPU): EPLB's layers take"
                 f" {self.chosen.step_us:.1f} µs per step (each layer's p99 over batches"
                 f" sampled from the fitted windows, summed: the planner's judge, not the"
                 f" summary's held-out figures) under {self.regime.engine}"
                 f" {self.regime.workload}"]
        if fastest is not self.chosen:
            parts.append(f"within {100 * self.tolerance:.1f}% of the fastest"
                         f" ({fastest.redundant}: {fastest.step_us:.1f} µs) with fewer slots")
        if least is not self.chosen:
            gain = 1 - self.chosen.step_us / least.step_us
            parts.append(f"{100 * gain:.1f}% faster than {least.redundant} redundant")
        elif len(self.options) > 1:
            parts.append("replicas would cost more weight reads than they save")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "redundant": self.chosen.redundant,
            "slots_per_gpu": self.chosen.slots_per_gpu,
            "reason": self.reason,
            "options": [
                {"redundant": o.redundant, "slots_per_gpu": o.slots_per_gpu,
                 "step_us": o.step_us, "kv_left_gb": o.kv_left_gb}
                for o in self.options
            ],
        }


def slot_candidates(num_experts: int, num_gpus: int, max_slots: int) -> list[int]:
    """Slot counts to try: ``S0 = ceil(E / G)``, then ``S0 + 1, S0 + 2, S0 + 4, ...``
    (the extra slots doubling: engines deploy a few redundant slots per GPU, and each
    slot costs a weight read, so the interesting range is near ``S0``), at most
    :data:`MAX_CANDIDATES` of them and never above ``min(max_slots, E)``."""
    low = fewest_slots_per_gpu(num_experts, num_gpus)
    high = max(low, min(max_slots, num_experts))
    picks = [low]
    extra = 1
    while low + extra <= high and len(picks) < MAX_CANDIDATES:
        picks.append(low + extra)
        extra *= 2
    return picks


def choose_redundancy(
    problems: dict[int, PlacementProblem],
    regime: Regime,
    *,
    kv_left_gb: Mapping[int, float | None] | None = None,
    seed: int = 0,
    tolerance: float = DEFAULT_TOLERANCE,
) -> RedundancyChoice:
    """Pick the slots per GPU whose EPLB plan the evaluator times fastest.

    Parameters
    ----------
    problems: slots per GPU -> the planning problem at that size (same statistics,
        topology and model; built by :func:`placer.planning.build.build_problem`).
    regime: the engine and batch regime to time under.
    kv_left_gb: slots per GPU -> KV cache left, GB, for the report.
    """
    if not problems:
        raise UsageError("no slot count to try", where=Param("redundant"))
    first = next(iter(problems.values()))
    if first.topology is None or first.model is None:
        raise UsageError(
            "`redundant` auto needs the model and the topology to time candidates",
            where=Param("redundant"), hint="pass `model` and `topology`, or give a number",
        )
    if not 0 <= tolerance < 1:
        raise UsageError(f"expected a tolerance in [0, 1), got {tolerance}")
    draws: dict[tuple[int, ...], np.ndarray] = {}
    options = []
    for slots in sorted(problems):
        problem = problems[slots]
        baseline = solve(problem, "eplb", SolveParams(seed=seed, regime=regime)).placement
        step = float(layer_times(baseline, problem, regime, seed, draws).sum())
        options.append(RedundancyOption(
            redundant=problem.num_redundant, slots_per_gpu=slots, step_us=step,
            kv_left_gb=(kv_left_gb or {}).get(slots),
        ))
    fastest = min(o.step_us for o in options)
    chosen = next(o for o in options if o.step_us <= fastest * (1 + tolerance))
    return RedundancyChoice(chosen, tuple(options), tolerance, regime)


def auto_problems(
    routing: RoutingData | ExpertStats, spec: ProblemSpec, max_slots: int
) -> dict[int, PlacementProblem]:
    """``{S: problem with S slots per GPU}`` (``spec`` at each count) for every
    candidate slot count up to ``max_slots`` that fits in memory (building one that
    does not raises InfeasibleError, and ends the list)."""
    stats = routing.stats if isinstance(routing, RoutingData) else routing
    gpus = spec.topology.num_gpus if spec.topology is not None else spec.num_gpus or 0
    out: dict[int, PlacementProblem] = {}
    for slots in slot_candidates(stats.num_experts, gpus, max_slots):
        try:
            out[slots] = build_problem(routing, spec.with_slots(slots))
        except InfeasibleError:
            break
    return out


def auto_redundancy(
    routing: RoutingData | ExpertStats, spec: ProblemSpec, regime: Regime, *, seed: int = 0,
) -> RedundancyChoice:
    """Time every slot count the memory allows and choose one (``--redundant auto``);
    ``spec``'s own slot and redundancy counts are not used.

    The memory bound and the KV cache left at each count come from
    :func:`placer.model.capacity.plan_capacity`; the evaluator that times the candidates
    needs ``spec``'s model and topology.
    """
    from placer.model.capacity import plan_capacity

    if spec.model is None or spec.topology is None:
        raise UsageError("`redundant` auto times candidates with the evaluator, which needs"
                         " the model and the topology", where=Param("redundant"),
                         hint="pass `model` and `topology`, or give a number")
    capacity = plan_capacity(spec.model, spec.topology, spec.dtype,
                             kv_reserve_gb=spec.kv_reserve_gb)
    problems = auto_problems(routing, spec, capacity.slots_per_gpu)
    kv = {s: float(capacity.kv_left_gb_at(s)) for s in problems}
    return choose_redundancy(problems, regime, kv_left_gb=kv, seed=seed)
