"""Replay serving over time: every policy's timeline timed step by step by the evaluator.

:func:`replay` reads the trace's per-step load, decides each policy's timeline
(:mod:`placer.replay.timeline`), then times every step of every timeline
(:mod:`placer.replay.timing`: the same dispatch, all-to-all and compute model as
``placer plan`` and ``placer evaluate``, under the same regime), the placement of each
step being the timeline's.  A static timeline is thus exactly ``placer evaluate`` on the
same steps.  With several jobs (or Ray), the policies are decided in parallel, then the
layers are timed in parallel (each piece reads the trace and times every timeline on its
layers).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from placer.errors import Param, TraceError, UsageError
from placer.limits import check_allocation
from placer.model import ModelSpec
from placer.parallel import Backend
from placer.placement import Placement
from placer.regime import Regime
from placer.replay.bound import bounded
from placer.replay.policies import OraclePolicy, Policy, StaticPolicy
from placer.replay.result import PolicyResult, ReplayResult
from placer.replay.steps import StepSource, step_loads
from placer.replay.timeline import Setting, Timeline, plan_timeline, static_placement
from placer.replay.timing import Progress, Timed, time_timelines
from placer.stats import format_ranges
from placer.topology import Topology


@dataclass(frozen=True)
class ReplayParams:
    """How to replay.

    Attributes
    ----------
    regime: what every step is judged under (dispatch, all-to-all, batch, seed).
    redundant: redundant experts per layer of the engines' layout and of the online
        policies (``eplb`` may set its own); ``E + redundant`` a multiple of the GPUs.
    dtype: expert dtype (None: the model's).
    segments: equal parts of the replay the figures are also given for.
    jobs: parallel processes (1: all in this process): the policies decided, then the
        layers timed, in parallel; ray: run them on Ray instead.
    """

    regime: Regime
    redundant: int = 0
    dtype: str | None = None
    segments: int = 4
    jobs: int = 1
    ray: str | None = None


def replay(source: StepSource, policies: Sequence[Policy], model: ModelSpec,
           topology: Topology, params: ReplayParams, *, initial: Placement | None = None,
           progress: Progress | None = None) -> ReplayResult:
    """Replay ``source`` under every policy (module docstring); results in policy order.

    Raises UsageError for a redundancy that does not split over the GPUs or a policy
    that does not fit the model or cluster, TraceError for trace problems.
    """
    setting = _setting(source, model, topology, params)
    start = "initial"
    if initial is None:  # the online policies start from the user's plan, if one is given
        plan = next((p for p in policies if isinstance(p, StaticPolicy)
                     and p.path is not None), None)
        if plan is not None and plan.path is not None:
            initial, start = static_placement(plan.path, setting), plan.label
    backend = Backend(jobs=params.jobs, ray=params.ray)
    if backend.jobs == 1 and backend.ray is None:
        loads = step_loads(source, model.num_experts)
        timelines = [plan_timeline(p, loads, setting, initial, start) for p in policies]
        timed = time_timelines(source, timelines, setting, progress=progress)
    else:
        groups = [g for g in np.array_split(np.arange(source.num_layers),
                                            min(source.num_layers, 2 * backend.jobs))
                  if g.size]
        counted = backend.run(_count_layers, [g.tolist() for g in groups],
                              shared=_Counting(source, model.num_experts),
                              names=[f"loads of layers {format_ranges(source.layer_ids[g])}"
                                     for g in groups])
        loads = np.zeros((source.num_steps, source.num_layers, model.num_experts),
                         dtype=np.int32)
        for part, cols in zip(counted, groups, strict=True):
            loads[:, cols] = part
        timelines = backend.run(_decide, list(policies),
                                shared=_Decisions(loads, setting, initial, start),
                                names=[f"policy {p.label}" for p in policies])
        done = [0]

        def finished(index: int, _: Any) -> None:
            done[0] += groups[index].size
            if progress is not None:
                progress(done[0] * source.num_steps // source.num_layers, source.num_steps)

        pieces = backend.run(_time_layers, [g.tolist() for g in groups],
                            shared=_Timing(source, tuple(timelines), setting),
                            on_done=finished,
                            names=[f"layers {format_ranges(source.layer_ids[g])}"
                                   for g in groups])
        timed = _joined(pieces, groups, len(timelines))
    pairs = list(zip(timelines, timed, strict=True))
    others = [(line, t) for (line, t), p in zip(pairs, policies, strict=True)
              if not isinstance(p, OraclePolicy)]
    pairs = [bounded(line, t, others, p.interval, setting) if isinstance(p, OraclePolicy)
             else (line, t) for (line, t), p in zip(pairs, policies, strict=True)]
    share = topology.calibration.rebalance_costs.async_share
    results = tuple(_result(line, timed, share) for line, timed in pairs)
    steps = source.num_steps
    parts = max(1, min(params.segments, steps))
    edges = np.linspace(0, steps, parts + 1).round().astype(int)
    info = {"trace": source.name, "model": model.name, "topology": topology.name,
            "regime": params.regime.to_dict(), "steps": steps,
            "tokens": source.num_tokens, "layers": source.num_layers,
            "model_layers": len(model.all_moe_layer_ids),
            "num_experts": model.num_experts, "num_gpus": topology.num_gpus,
            "slots_per_gpu": setting.slots_per_gpu, "redundant": params.redundant,
            "dtype": setting.dtype}
    return ReplayResult(results, info, tuple(zip(edges[:-1].tolist(), edges[1:].tolist(),
                                                 strict=True)))


@dataclass(frozen=True)
class _Counting:
    """What counting the step loads of layers elsewhere reads."""

    source: StepSource
    num_experts: int


def _count_layers(shared: _Counting, columns: list[int]) -> np.ndarray:
    """``[steps, columns, E]`` step loads of the layer ``columns`` (a piece of
    :func:`replay`)."""
    return step_loads(shared.source, shared.num_experts, columns)[:, columns]


@dataclass(frozen=True)
class _Decisions:
    """What deciding a policy elsewhere reads (sent once to each worker)."""

    loads: np.ndarray
    setting: Setting
    initial: Placement | None
    start: str


def _decide(shared: _Decisions, policy: Policy) -> Timeline:
    """One policy's timeline (a piece of :func:`replay` run elsewhere)."""
    return plan_timeline(policy, shared.loads, shared.setting, shared.initial, shared.start)


@dataclass(frozen=True)
class _Timing:
    """What timing layers elsewhere reads (sent once to each worker)."""

    source: StepSource
    timelines: tuple[Timeline, ...]
    setting: Setting


def _time_layers(shared: _Timing, columns: list[int]) -> list[Timed]:
    """Every timeline timed on the layer ``columns`` (a piece of :func:`replay`)."""
    return time_timelines(shared.source, shared.timelines, shared.setting, columns=columns)


def _joined(parts: list[list[Timed]], groups: list[np.ndarray], count: int) -> list[Timed]:
    """The timelines' times put together from the pieces' layer groups."""
    out = []
    for t in range(count):
        times = parts[0][t].layer_time_us.copy()
        hot = parts[0][t].hot_shard.copy()
        for part, cols in zip(parts[1:], groups[1:], strict=True):
            times[:, cols] = part[t].layer_time_us[:, cols]
            hot[:, cols] = part[t].hot_shard[:, cols]
        out.append(Timed(times, hot))
    return out


def _setting(source: StepSource, model: ModelSpec, topology: Topology,
             params: ReplayParams) -> Setting:
    """What every policy shares; the trace's layers checked against the model."""
    missing = sorted(set(source.layer_ids.tolist()) - set(model.all_moe_layer_ids))
    if missing:
        raise TraceError(
            f"the trace has layers {format_ranges(np.array(missing))} that are not MoE"
            f" layers of {model.name}", where=source.name,
            hint="replay with the model the trace was recorded with (`model`)")
    total = model.num_experts + params.redundant
    if params.redundant < 0 or total % topology.num_gpus:
        raise UsageError(
            f"{model.num_experts} experts + {params.redundant} redundant do not split"
            f" evenly over {topology.num_gpus} GPUs", where=Param("redundant"),
            hint=f"a redundancy that makes a multiple of {topology.num_gpus}, e.g."
            f" {-model.num_experts % topology.num_gpus}")
    most = model.num_experts * (topology.num_gpus - 1)
    if params.redundant > most:
        raise UsageError(
            f"{total // topology.num_gpus:,} slots per GPU exceed the {model.num_experts}"
            " experts: a GPU would need two replicas of one expert", where=Param("redundant"),
            hint=f"at most {most:,} redundant experts on {topology.num_gpus} GPUs")
    check_allocation(64 * source.num_layers * total, f"{source.num_layers:,} layers of"
                     f" {total:,} slots", "fewer `redundant` experts", where=Param("redundant"))
    return Setting(topology, model, params.regime, total // topology.num_gpus,
                   params.dtype or model.default_dtype, source.layer_ids)


def _result(line: Timeline, timed: Timed, share: float) -> PolicyResult:
    """A timeline and its times as the policy's result (background copies at
    ``share``)."""
    finite = np.isfinite(timed.layer_time_us)
    serving = np.where(finite.any(axis=1), np.nansum(timed.layer_time_us, axis=1), np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a step without tokens in a layer
        hot = np.nanmean(timed.hot_shard, axis=1)
    return PolicyResult(line.label, serving, line.stall_us, line.link_us, hot,
                        tuple(line.rebalances), share, tuple(line.skipped), line.start,
                        tuple(line.decisions))
