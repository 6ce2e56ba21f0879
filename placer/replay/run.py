"""Replay serving over time: every policy's timeline timed step by step by the evaluator.

:func:`replay` reads the trace's per-step load, decides each policy's timeline
(:mod:`placer.replay.timeline`), then walks the tokens once in chunks of whole steps and
times every step of every timeline with the evaluator's own simulation
(:func:`placer.evaluate.simulate.simulate`: the same dispatch, all-to-all and compute
model as ``placer plan`` and ``placer evaluate``, under the same regime), the placement
of each step being the timeline's.  Steps the same placement serves in two timelines are
timed once.  A static timeline is thus exactly ``placer evaluate`` on the same steps.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from placer import constants
from placer.errors import Param, PlacerWarning, TraceError, UsageError
from placer.evaluate.batches import sorted_batches
from placer.evaluate.dispatch import STATIC_POLICIES, static_dispatch_table
from placer.evaluate.params import EvalParams, regime_params
from placer.evaluate.simulate import simulate
from placer.evaluate.traffic import Fabric
from placer.model import ModelSpec
from placer.parallel import Backend
from placer.placement import Placement
from placer.regime import Regime
from placer.replay.policies import Policy
from placer.replay.result import PolicyResult, ReplayResult
from placer.replay.steps import Chunk, StepSource, step_loads
from placer.replay.timeline import Setting, Timeline, plan_timeline
from placer.stats import format_ranges
from placer.topology import Topology

#: Progress callback: ``(steps done, steps in all)``.
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Timed:
    """What the evaluator says of one timeline, step by step.

    Attributes
    ----------
    layer_time_us: ``[steps, layers]`` MoE-layer time of each step (max over GPUs of
        dispatch + compute + combine), µs.
    hot_shard: ``[steps, layers]`` hottest / mean GPU load of each step.
    """

    layer_time_us: np.ndarray
    hot_shard: np.ndarray


class _Cache:
    """Simulations already run, by (placement rows, first step, steps): a step range that
    two timelines serve with the same placement is timed once."""

    def __init__(self) -> None:
        self.results: dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray]] = {}
        self.tables: dict[str, np.ndarray] = {}


def time_timelines(source: StepSource, timelines: Sequence[Timeline], setting: Setting,
                   *, progress: Progress | None = None) -> list[Timed]:
    """Time every step of every timeline (module docstring)."""
    steps, layers = source.num_steps, source.num_layers
    out = [Timed(np.full((steps, layers), np.nan), np.full((steps, layers), np.nan))
           for _ in timelines]
    params = regime_params(setting.regime, setting.num_gpus, dtype=setting.dtype)
    fabric = Fabric.from_topology(setting.topology, params.mode)
    states = [_State(t) for t in timelines]
    cache = _Cache()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlacerWarning)  # said once by the caller
        for chunk in source.chunks():
            for state, timed in zip(states, out, strict=True):
                for first, last, placement in state.segments(chunk):
                    times, hot = _simulated(chunk, first, last, placement, setting, params,
                                            fabric, cache)
                    timed.layer_time_us[first:last] = times
                    timed.hot_shard[first:last] = hot
            if progress is not None:
                progress(chunk.first_step + chunk.num_steps, steps)
    return out


class _State:
    """A timeline's placement as the replay walks its steps in order."""

    def __init__(self, timeline: Timeline) -> None:
        self.rows = timeline.initial.physical_to_logical.copy()
        self.initial = timeline.initial
        self.changes = timeline.changes
        self.next = 0

    def segments(self, chunk: Chunk) -> list[tuple[int, int, Placement]]:
        """``(first step, stop step, placement)`` of the chunk's runs of one placement."""
        start, stop = chunk.first_step, chunk.first_step + chunk.num_steps
        out = []
        at = start
        while at < stop:
            while self.next < len(self.changes) and self.changes[self.next][0] <= at:
                _, row, values = self.changes[self.next]
                self.rows[row] = values
                self.next += 1
            end = stop
            if self.next < len(self.changes):
                end = min(stop, max(at + 1, self.changes[self.next][0]))
            out.append((at, end, Placement(self.rows.copy(), self.initial.layer_ids,
                                           self.initial.num_experts, self.initial.num_gpus)))
            at = end
        return out


def _simulated(chunk: Chunk, first: int, last: int, placement: Placement, setting: Setting,
               params: EvalParams, fabric: Fabric,
               cache: _Cache) -> tuple[np.ndarray, np.ndarray]:
    """``([steps, layers], [steps, layers])`` layer times and hot shards of steps
    ``first:last`` of ``chunk`` under ``placement``."""
    key = hashlib.blake2b(placement.physical_to_logical.tobytes(), digest_size=16).hexdigest()
    if (key, first, last) in cache.results:
        return cache.results[(key, first, last)]
    lo = int(np.searchsorted(chunk.step, first))
    hi = int(np.searchsorted(chunk.step, last))
    rank = None if chunk.rank is None else chunk.rank[lo:hi]
    batches, order = sorted_batches(hi - lo, setting.num_gpus, step=chunk.step[lo:hi] - first,
                                    rank=rank, batch_tokens=None,
                                    default_batch_tokens=constants.DEFAULT_BATCH_TOKENS)
    ids = chunk.topk_ids[lo:hi][order]

    def experts_of(row: int) -> np.ndarray:
        return ids[:, row].astype(np.int64)

    table = None
    if params.policy in STATIC_POLICIES:
        table = cache.tables.get(key)
        if table is None:
            table = cache.tables[key] = static_dispatch_table(
                placement, params.seed, policy=params.policy,
                node_of_gpu=np.asarray(setting.topology.node_of_gpu, dtype=np.int64))
    sim = simulate(placement, batches, experts_of, fabric, setting.topology, setting.model,
                   setting.dtype, params, table)
    result = (sim.layer_time_us, sim.batch_hot_shard)
    cache.results[(key, first, last)] = result
    return result


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
    jobs: policies decided and timed in parallel processes (1: in this process, steps
        that policies share timed once); ray: run them on Ray instead.
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
    loads = step_loads(source, model.num_experts)
    shared = _Shared(source, loads, setting, initial)
    backend = Backend(jobs=params.jobs, ray=params.ray)
    if backend.jobs == 1 and backend.ray is None:
        timelines = [plan_timeline(p, loads, setting, initial) for p in policies]
        timed = time_timelines(source, timelines, setting, progress=progress)
        pairs = list(zip(timelines, timed, strict=True))
    else:
        done = [0]

        def finished(_: int, __: Any) -> None:
            done[0] += 1
            if progress is not None:
                progress(done[0] * source.num_steps // len(policies), source.num_steps)

        pairs = backend.run(_one_policy, list(policies), shared=shared, on_done=finished)
    results = tuple(_result(line, timed) for line, timed in pairs)
    steps = source.num_steps
    parts = max(1, min(params.segments, steps))
    edges = np.linspace(0, steps, parts + 1).round().astype(int)
    info = {"trace": source.name, "model": model.name, "topology": topology.name,
            "regime": params.regime.to_dict(), "steps": steps,
            "tokens": source.num_tokens, "layers": source.num_layers,
            "num_experts": model.num_experts, "num_gpus": topology.num_gpus,
            "slots_per_gpu": setting.slots_per_gpu, "redundant": params.redundant,
            "dtype": setting.dtype}
    return ReplayResult(results, info, tuple(zip(edges[:-1].tolist(), edges[1:].tolist(),
                                                 strict=True)))


@dataclass(frozen=True)
class _Shared:
    """What every policy's piece reads (sent once to each worker)."""

    source: StepSource
    loads: np.ndarray
    setting: Setting
    initial: Placement | None


def _one_policy(shared: _Shared, policy: Policy) -> tuple[Timeline, Timed]:
    """Decide and time one policy (a piece of :func:`replay` run elsewhere)."""
    line = plan_timeline(policy, shared.loads, shared.setting, shared.initial)
    return line, time_timelines(shared.source, [line], shared.setting)[0]


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
    return Setting(topology, model, params.regime, total // topology.num_gpus,
                   params.dtype or model.default_dtype, source.layer_ids)


def _result(line: Timeline, timed: Timed) -> PolicyResult:
    """A timeline and its times as the policy's result."""
    finite = np.isfinite(timed.layer_time_us)
    serving = np.where(finite.any(axis=1), np.nansum(timed.layer_time_us, axis=1), np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a step without tokens in a layer
        hot = np.nanmean(timed.hot_shard, axis=1)
    return PolicyResult(line.label, serving, line.stall_us, line.extra_us, hot,
                        tuple(line.rebalances))
