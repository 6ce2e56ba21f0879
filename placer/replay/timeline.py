"""What each policy deploys over a replay, and what its rebalances cost: a timeline.

Decisions read only the recorded load of past steps (the engines' windows) or, for the
oracle, of the coming interval: never the simulated times.  So every policy's timeline
is decided first (:func:`plan_timeline`), from the per-step load, and the evaluator then
times all timelines in one pass over the tokens (:mod:`placer.replay.run`).

A rebalance's new layout takes effect only once its weights are copied
(docs/replay.md):

- **synchronous** (SGLang; vLLM before async EPLB): serving stops for the host's fixed
  work, a per-layer cost for each layer that moves, and the copies, layer after layer
  (each GPU loads its new experts from a GPU of its node that holds them, over the
  node's fabric, else over its NIC; the slowest GPU sets a layer's copy time); the new
  layout serves from that step on.
- **asynchronous** (vLLM's default since PR #43219; TensorRT-LLM): the old layout serves
  while the weights move in the background, ``layers`` layers a step; a layer switches
  the step after its copy, and the step its copy overlaps is longer by the copy's link
  time times ``async_share`` (the copy and the all-to-all share the links).  A
  rebalance due while one is still moving is skipped (as vLLM does).

The constants are the topology's ``calibration.rebalance``
(:class:`placer.topology.calibration.RebalanceCalibration`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from placer.errors import PlacementError, UsageError
from placer.model import ModelSpec
from placer.placement import Placement
from placer.placement.document import read_placement
from placer.placement.migration import copy_bytes, copy_seconds, layer_moves
from placer.planning.solvers.baselines import linear_layout
from placer.regime import Regime
from placer.replay.decide import (
    CopyCosts,
    eplb_layout,
    oracle_layout,
    placer_moves,
)
from placer.replay.policies import OnlinePolicy, OraclePolicy, Policy, StaticPolicy
from placer.topology import Topology


@dataclass(frozen=True)
class Rebalance:
    """One rebalance of a policy.

    Attributes
    ----------
    step: the step it happened at (synchronous: the new layout serves from it).
    moves: expert weights loaded onto GPUs that lacked them.
    gb: their size, GB.
    layers: layers whose weights moved.
    copy_s: link time of the copies (each layer's slowest GPU, summed over layers).
    stall_s: how long serving stopped (synchronous), seconds.
    done_step: the step from which the whole new layout serves.
    decision_s: how long deciding took (placer's measured; 0 for the others).
    """

    step: int
    moves: int
    gb: float
    layers: int
    copy_s: float
    stall_s: float
    done_step: int
    decision_s: float = 0.0

    def to_dict(self) -> dict[str, float | int]:
        return {"step": self.step, "moves": self.moves, "gb": self.gb, "layers": self.layers,
                "copy_s": self.copy_s, "stall_s": self.stall_s, "done_step": self.done_step,
                "decision_s": self.decision_s}


@dataclass
class Timeline:
    """One policy over the replay.

    Attributes
    ----------
    label: the policy as written.
    initial: the placement serving step 0.
    changes: ``(step, layer row, physical_to_logical row)`` in step order: from ``step``
        on, the layer uses that row.
    stall_us: ``[steps]`` serving stopped before each step (synchronous rebalances), µs.
    extra_us: ``[steps]`` what background copies add to each step, µs.
    rebalances: the rebalances, in order.
    """

    label: str
    initial: Placement
    changes: list[tuple[int, int, np.ndarray]] = field(default_factory=list)
    stall_us: np.ndarray = field(default_factory=lambda: np.zeros(0))
    extra_us: np.ndarray = field(default_factory=lambda: np.zeros(0))
    rebalances: list[Rebalance] = field(default_factory=list)


@dataclass(frozen=True)
class Setting:
    """What every policy of a replay shares: the cluster, the model, the regime, the
    slots per GPU the engines' layout and EPLB use, the expert dtype."""

    topology: Topology
    model: ModelSpec
    regime: Regime
    slots_per_gpu: int
    dtype: str
    layer_ids: np.ndarray

    @property
    def num_gpus(self) -> int:
        return int(self.topology.num_gpus)


def default_placement(setting: Setting, slots_per_gpu: int | None = None) -> Placement:
    """The engines' default layout (vLLM's linear map, redundant slots in index order)."""
    slots = slots_per_gpu or setting.slots_per_gpu
    row = linear_layout(setting.model.num_experts, setting.num_gpus, slots)
    return Placement(np.tile(row, (setting.layer_ids.size, 1)), setting.layer_ids,
                     setting.model.num_experts, setting.num_gpus)


def plan_timeline(policy: Policy, loads: np.ndarray, setting: Setting,
                  initial: Placement | None = None) -> Timeline:
    """The timeline of ``policy`` on the replay's per-step ``loads`` (``[steps, layers,
    E]``), starting from ``initial`` (default: the engines' layout)."""
    steps = loads.shape[0]
    if isinstance(policy, StaticPolicy):
        placement = (static_placement(policy.path, setting) if policy.path is not None
                     else default_placement(setting))
        return _empty(policy.label, placement, steps)
    if isinstance(policy, OraclePolicy):
        return _oracle(policy, loads, setting, initial or default_placement(setting))
    slots = setting.slots_per_gpu
    if policy.redundant is not None:
        total = setting.model.num_experts + policy.redundant
        if total % setting.num_gpus:
            raise UsageError(
                f"{setting.model.num_experts} experts + {policy.redundant} redundant do not"
                f" split evenly over {setting.num_gpus} GPUs", where=policy.label,
                hint=f"redundant must make experts + redundant a multiple of"
                f" {setting.num_gpus}")
        slots = total // setting.num_gpus
    start = initial if initial is not None and initial.slots_per_gpu == slots \
        else default_placement(setting, slots)
    return _online(policy, loads, setting, start)


def static_placement(path: Path, setting: Setting) -> Placement:
    """A placement JSON for the replay's model and cluster."""
    placement = read_placement(path)
    placement.check_model(setting.model, where=str(path))
    if placement.num_gpus != setting.num_gpus:
        raise PlacementError(
            f"the placement is for {placement.num_gpus} GPUs, the topology has"
            f" {setting.num_gpus}", where=str(path),
            hint="replay on the topology the placement was planned for")
    rows = [placement.layer_row(int(i)) for i in setting.layer_ids]
    return Placement(placement.physical_to_logical[rows], setting.layer_ids,
                     placement.num_experts, placement.num_gpus)


def _empty(label: str, placement: Placement, steps: int) -> Timeline:
    return Timeline(label, placement, [], np.zeros(steps), np.zeros(steps), [])


def _online(policy: OnlinePolicy, loads: np.ndarray, setting: Setting,
            current: Placement) -> Timeline:
    """eplb or placer: decide every ``interval`` steps on the last ``window`` steps."""
    steps = loads.shape[0]
    line = _empty(policy.label, current, steps)
    costs = setting.topology.calibration.rebalance_costs
    busy_until = 0
    for t in range(policy.first, steps, policy.interval):
        if t < busy_until or t == 0:
            continue  # a background copy is still moving (vLLM skips), or no load yet
        window = loads[max(0, t - policy.window) : t].sum(axis=0)
        if not window.any():
            continue
        started = time.perf_counter()
        if policy.kind == "eplb":
            new = eplb_layout(window, setting.layer_ids, setting.num_gpus,
                              current.slots_per_gpu, setting.model, setting.topology)
            decision_s = 0.0
        else:
            copy = CopyCosts(costs.host_ms * 1e3 * (not policy.asynchronous),
                             costs.layer_ms * 1e3 if not policy.asynchronous else 0.0,
                             1.0 if not policy.asynchronous else costs.async_share)
            decision = placer_moves(current, window, topology=setting.topology,
                                    model=setting.model, regime=setting.regime,
                                    dtype=setting.dtype,
                                    interval=policy.horizon or policy.window,
                                    max_moves=policy.max_moves, costs=copy)
            new = decision.placement
            decision_s = time.perf_counter() - started
        busy_until = _deploy(line, t, current, new, policy, setting, decision_s)
        current = new
    return line


def _deploy(line: Timeline, step: int, current: Placement, new: Placement,
            policy: OnlinePolicy, setting: Setting, decision_s: float) -> int:
    """Record the move from ``current`` to ``new`` decided at ``step``; returns the step
    from which the new layout serves whole."""
    moves = layer_moves(new, current)  # [layers]
    changed = np.flatnonzero(moves > 0)
    if changed.size == 0:
        return step
    costs = setting.topology.calibration.rebalance_costs
    expert_bytes = float(setting.model.expert_bytes(setting.dtype))
    local, remote = copy_bytes(new, current, expert_bytes, setting.topology.node_of_gpu)
    layer_copy_s = copy_seconds(local, remote, setting.topology).max(axis=1)  # [layers]
    steps = line.stall_us.size
    gb = float(moves.sum()) * expert_bytes / 1e9
    copy_s = float(layer_copy_s[changed].sum())
    if not policy.asynchronous:
        stall = costs.host_ms / 1e3 + costs.layer_ms / 1e3 * changed.size + copy_s
        line.stall_us[step] += stall * 1e6
        for row in changed:
            line.changes.append((step, int(row), new.physical_to_logical[row].copy()))
        done = step
    else:
        stall = 0.0
        for j, row in enumerate(changed):
            moving = step + j // policy.layers
            if moving < steps:
                line.extra_us[moving] += costs.async_share * layer_copy_s[row] * 1e6
            line.changes.append((moving + 1, int(row), new.physical_to_logical[row].copy()))
        done = step + (changed.size - 1) // policy.layers + 1
    line.rebalances.append(Rebalance(step, int(moves.sum()), gb, int(changed.size), copy_s,
                                     stall, done, decision_s))
    line.changes.sort(key=lambda c: c[0])
    return done


def _oracle(policy: OraclePolicy, loads: np.ndarray, setting: Setting,
            current: Placement) -> Timeline:
    """Every ``interval`` steps, the faster of EPLB and placer fitted on the coming
    interval itself, moved for free."""
    steps = loads.shape[0]
    line = _empty(policy.label, current, steps)
    expert_bytes = float(setting.model.expert_bytes(setting.dtype))
    for t in range(0, steps, policy.interval):
        coming = loads[t : t + policy.interval].sum(axis=0)
        if not coming.any():
            continue
        new = oracle_layout(current, coming, topology=setting.topology, model=setting.model,
                            regime=setting.regime)
        moves = layer_moves(new, current)
        if not moves.any():
            continue
        for row in np.flatnonzero(moves > 0):
            line.changes.append((t, int(row), new.physical_to_logical[row].copy()))
        gb = float(moves.sum()) * expert_bytes / 1e9  # moved, for free
        line.rebalances.append(Rebalance(t, int(moves.sum()), gb,
                                         int((moves > 0).sum()), 0.0, 0.0, t))
        current = new
    return line
