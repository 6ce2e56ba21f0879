"""What each policy deploys over a replay, and what its rebalances cost: a timeline.

Decisions read only the recorded load of past steps (the engines' windows) or, for the
oracle, of the coming interval: never the simulated times.  So every policy's timeline
is decided first (:func:`plan_timeline`), from the per-step load, and the evaluator then
times all timelines in one pass over the tokens (:mod:`placer.replay.run`).

A rebalance's new layout takes effect only once it is decided and its weights are
copied (docs/replay.md):

- **synchronous** (SGLang; vLLM with ``use_async`` off): serving stops for the
  decision's compute time, the host's fixed work, a per-layer cost for each layer that
  moves, and the copies, layer after layer (each GPU loads its new experts from a GPU
  of its node that holds them, over the node's fabric, else over its NIC; the slowest
  GPU sets a layer's copy time); the new layout serves from that step on.
- **asynchronous** (vLLM's default since PR #43219; TensorRT-LLM): the old layout serves
  while the decision computes (it lands at the first step that starts once its compute
  time has passed in serving time, :mod:`placer.replay.clock`) and while the weights
  then move in the background, ``layers`` layers a step; a layer switches the step
  after its copy, and the step its copy overlaps is longer by the copy's link time
  times ``async_share`` (the copy and the all-to-all share the links).

A rebalance due while one is still deciding or moving is skipped (as vLLM does) and
counted.

The constants are the topology's ``calibration.rebalance``
(:class:`placer.topology.calibration.RebalanceCalibration`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from placer.errors import PlacementError, UsageError
from placer.placement import Placement
from placer.placement.document import read_placement
from placer.placement.migration import copy_bytes, copy_seconds, layer_moves
from placer.planning.solvers.baselines import linear_layout
from placer.replay.clock import landing_step
from placer.replay.decide import (
    CopyCosts,
    eplb_layout,
    oracle_layout,
    placer_moves,
)
from placer.replay.policies import (
    EPLB_MS_PER_LAYER,
    OnlinePolicy,
    OraclePolicy,
    Policy,
    StaticPolicy,
)
from placer.replay.setting import Setting


@dataclass(frozen=True)
class Rebalance:
    """One rebalance of a policy.

    Attributes
    ----------
    step: the step it landed at (synchronous: the new layout serves from it;
        asynchronous: its copies start), once its decision's compute time has passed.
    moves: expert weights loaded onto GPUs that lacked them.
    gb: their size, GB.
    layers: layers whose weights moved.
    copy_s: link time of the copies (each layer's slowest GPU, summed over layers).
    stall_s: how long serving stopped (synchronous), seconds.
    done_step: the step from which the whole new layout serves.
    decision_s: the decision's compute time charged (placer's measured or the policy's
        ``decide-ms``; eplb's reference figure; 0 for the oracle), seconds.
    due_step: the step it was due at (its window ends before it; ``step`` when the
        decision takes no serving time).
    """

    step: int
    moves: int
    gb: float
    layers: int
    copy_s: float
    stall_s: float
    done_step: int
    decision_s: float = 0.0
    due_step: int | None = None

    def to_dict(self) -> dict[str, float | int]:
        return {"step": self.step, "due_step": self.step if self.due_step is None
                else self.due_step, "moves": self.moves, "gb": self.gb,
                "layers": self.layers, "copy_s": self.copy_s, "stall_s": self.stall_s,
                "done_step": self.done_step, "decision_s": self.decision_s}


@dataclass
class Timeline:
    """One policy over the replay.

    Attributes
    ----------
    label: the policy as written.
    initial: the placement serving step 0.
    changes: ``(step, layer row, physical_to_logical row)`` in step order: from ``step``
        on, the layer uses that row.
    stall_us: ``[steps]`` serving stopped during each step (synchronous rebalances: the
        decision, the host's work, the copies), µs.
    link_us: ``[steps]`` link time of the background copies each step overlaps, µs (the
        step is longer by ``async_share`` times it).
    rebalances: the rebalances, in order.
    skipped: steps a rebalance was due at while one was still deciding or moving.
    decisions: ``(due step, seconds)`` of every decision, those that moved nothing too.
    start: where the timeline started, in words (``default``, ``initial``: the placement
        given, a static policy's label).
    """

    label: str
    initial: Placement
    changes: list[tuple[int, int, np.ndarray]] = field(default_factory=list)
    stall_us: np.ndarray = field(default_factory=lambda: np.zeros(0))
    link_us: np.ndarray = field(default_factory=lambda: np.zeros(0))
    rebalances: list[Rebalance] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    start: str = "default"
    decisions: list[tuple[int, float]] = field(default_factory=list)


def default_placement(setting: Setting, slots_per_gpu: int | None = None) -> Placement:
    """The engines' default layout (vLLM's linear map, redundant slots in index order)."""
    slots = slots_per_gpu or setting.slots_per_gpu
    row = linear_layout(setting.model.num_experts, setting.num_gpus, slots)
    return Placement(np.tile(row, (setting.layer_ids.size, 1)), setting.layer_ids,
                     setting.model.num_experts, setting.num_gpus)


def plan_timeline(policy: Policy, loads: np.ndarray, setting: Setting,
                  initial: Placement | None = None, start: str = "initial") -> Timeline:
    """The timeline of ``policy`` on the replay's per-step ``loads`` (``[steps, layers,
    E]``), starting from ``initial`` (``start`` says where it comes from; default: the
    engines' layout)."""
    steps = loads.shape[0]
    if isinstance(policy, StaticPolicy):
        placement = (static_placement(policy.path, setting) if policy.path is not None
                     else default_placement(setting))
        return _empty(policy.label, placement, steps, "-")
    if isinstance(policy, OraclePolicy):
        if initial is None:
            return _oracle(policy, loads, setting, default_placement(setting), "default")
        return _oracle(policy, loads, setting, initial, start)
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
    if initial is not None and initial.slots_per_gpu == slots:
        return _online(policy, loads, setting, initial, start)
    return _online(policy, loads, setting, default_placement(setting, slots),
                   "default" if initial is None else f"default ({slots} slots a GPU)")


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


def _empty(label: str, placement: Placement, steps: int, start: str) -> Timeline:
    return Timeline(label, placement, [], np.zeros(steps), np.zeros(steps), [], [], start)


def _online(policy: OnlinePolicy, loads: np.ndarray, setting: Setting,
            current: Placement, start: str) -> Timeline:
    """eplb or placer: decide every ``interval`` steps on the last ``window`` steps; a
    decision lands once its compute time has passed (asynchronous) or stops serving for
    it (synchronous); a rebalance due while one decides or copies is skipped."""
    steps = loads.shape[0]
    line = _empty(policy.label, current, steps, start)
    costs = setting.topology.calibration.rebalance_costs
    busy_until = 0
    for t in range(policy.first, steps, policy.interval):
        if t == 0:
            continue  # no load recorded yet
        if t < busy_until:
            line.skipped.append(t)  # one is still deciding or moving (vLLM skips)
            continue
        window = loads[max(0, t - policy.window) : t].sum(axis=0)
        if not window.any():
            continue
        started = time.perf_counter()
        if policy.kind == "eplb":
            new = eplb_layout(window, setting.layer_ids, setting.num_gpus,
                              current.slots_per_gpu, setting.model, setting.topology)
        else:
            copy = CopyCosts(costs.host_ms * 1e3 * (not policy.asynchronous),
                             costs.layer_ms * 1e3 if not policy.asynchronous else 0.0,
                             1.0 if not policy.asynchronous else costs.async_share)
            new = placer_moves(current, window, topology=setting.topology,
                               model=setting.model, regime=setting.regime,
                               dtype=setting.dtype,
                               interval=policy.horizon or policy.window,
                               max_moves=policy.max_moves, costs=copy).placement
        decision_s = decision_seconds(policy, setting.layer_ids.size,
                                      time.perf_counter() - started)
        line.decisions.append((t, decision_s))
        if policy.asynchronous:
            land = landing_step(current, loads, setting, t, decision_s)
            if land >= steps:
                busy_until = steps  # still deciding when the replay ends
                continue
        else:
            land = t
            line.stall_us[t] += decision_s * 1e6  # serving stops while it decides
        busy_until = _deploy(line, t, land, current, new, policy, setting, decision_s)
        current = new
    return line


def decision_seconds(policy: OnlinePolicy, layers: int, measured: float) -> float:
    """The compute time charged for one decision over ``layers`` MoE layers: the
    policy's ``decide-ms`` per layer, else eplb's :data:`EPLB_MS_PER_LAYER`, else
    placer's ``measured`` seconds."""
    if policy.decide_ms is not None:
        return policy.decide_ms * layers / 1e3
    if policy.kind == "eplb":
        return EPLB_MS_PER_LAYER * layers / 1e3
    return measured


def _deploy(line: Timeline, due: int, step: int, current: Placement, new: Placement,
            policy: OnlinePolicy, setting: Setting, decision_s: float) -> int:
    """Record the move from ``current`` to ``new`` decided from step ``due`` and landed
    at ``step``; returns the step from which the new layout serves whole (``step`` when
    nothing moves)."""
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
                line.link_us[moving] += layer_copy_s[row] * 1e6
            line.changes.append((moving + 1, int(row), new.physical_to_logical[row].copy()))
        done = step + (changed.size - 1) // policy.layers + 1
    line.rebalances.append(Rebalance(step, int(moves.sum()), gb, int(changed.size), copy_s,
                                     stall, done, decision_s, due))
    line.changes.sort(key=lambda c: c[0])
    return done


def _oracle(policy: OraclePolicy, loads: np.ndarray, setting: Setting,
            current: Placement, start: str) -> Timeline:
    """Every ``interval`` steps, the faster of EPLB and placer fitted on the coming
    interval itself, moved for free (the replay then makes it a bound:
    :mod:`placer.replay.bound`)."""
    steps = loads.shape[0]
    line = _empty(policy.label, current, steps, start)
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
