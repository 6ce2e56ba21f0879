"""What each policy deploys at a rebalance: the reference EPLB, placer's moves, foresight.

``eplb``: deepseek-ai/EPLB's ``rebalance_experts`` on the window's load, every layer
re-placed (:func:`eplb_layout`), as vLLM, SGLang and TensorRT-LLM run it online.

``placer`` (:func:`placer_moves`): from the deployed placement, one layer at a time,
the move worth most on the window's load (a *move* loads one expert's weights onto one
GPU: a swap of two experts between two GPUs is two moves, giving a hot expert a replica
in the slot of an expert that keeps another is one): what it takes off the hottest GPU,
in µs of serving over the coming ``horizon`` steps, less what its copy costs (a node
peer's copy over the node's fabric, else over the NIC; :class:`MoveWorth`), repeated while
the hottest GPU gets cooler; the moves of all layers are then taken best gain per move
first within the budget.  Where a burst moved the load too far for single moves, EPLB's
whole re-placement of a layer on the window is the other candidate, taken where it is
worth more (best value per extra move first, within the budget).  A layer's change is
kept only when the evaluator times the layer faster on the window by more than its copy
costs over the horizon (decode: a step with the window's load in expectation,
:func:`expected_layer_times`; else sampled batches), and the changes together must pay
the rebalance's fixed cost.  Nothing here calls a solver: an online decision must take
milliseconds to a second, as the engines' do.

``oracle``: the faster of both, fitted on the coming interval itself (the caller passes
that interval's load as the window), moved for free.
"""

from __future__ import annotations

import heapq
import time
import warnings
from dataclasses import dataclass, replace

import numpy as np

from placer import constants
from placer.errors import PlacerWarning
from placer.evaluate import evaluate
from placer.evaluate.costs import CostModel
from placer.evaluate.counted import RunLoads, supports, times_of_loads
from placer.evaluate.params import regime_params
from placer.evaluate.traffic import Segments
from placer.model import ModelSpec
from placer.placement import Placement
from placer.placement.align import align_row
from placer.placement.migration import layer_moves
from placer.planning.solvers.eplb import eplb_placement
from placer.regime import Regime
from placer.stats import ExpertStats, RoutingData
from placer.topology import Topology

#: A move must lower the hottest GPU's load by at least this share of the mean GPU load.
MIN_GAIN = 1e-3
#: Sampled batches the judge of an online decision times each candidate on (few: the
#: decision must be fast; both placements are timed on the same tokens).
DECISION_BATCHES = 4
#: Coldest GPUs a hot GPU's experts are tried against, per move.
COLD_CANDIDATES = 4


def uniform_nodes(topology: Topology) -> int:
    """Nodes for EPLB's hierarchical policy: only when GPUs form equal consecutive
    blocks (as the eplb solver decides)."""
    node = np.asarray(topology.node_of_gpu, dtype=np.int64)
    nodes = int(node.max()) + 1
    if nodes <= 1 or node.size % nodes:
        return 1
    return nodes if np.array_equal(node, np.repeat(np.arange(nodes), node.size // nodes)) else 1


def eplb_layout(load: np.ndarray, layer_ids: np.ndarray, num_gpus: int, slots_per_gpu: int,
                model: ModelSpec, topology: Topology) -> Placement:
    """The reference EPLB's placement of ``load`` (``[layers, E]``)."""
    placement, _ = eplb_placement(load.astype(np.float64), layer_ids, num_gpus, slots_per_gpu,
                                  num_groups=model.num_groups,
                                  num_nodes=uniform_nodes(topology))
    return placement


@dataclass(frozen=True)
class LayerPlan:
    """One layer's proposed moves, cumulatively: after the ``i``-th, the row is
    ``rows[i]``, the moves made ``moves[i]``, the hottest GPU's load ``peak[i]``
    (``peak[0]``, ``moves[0] = 0``, ``rows[0]``: as deployed)."""

    rows: list[np.ndarray]
    moves: list[int]
    peak: list[float]
    mean: float


@dataclass(frozen=True)
class MoveWorth:
    """What a move of one layer is worth and what it costs, in µs of serving, so that
    the greedy takes the move that pays most rather than the one that evens most.

    Attributes
    ----------
    us_per_load: µs of serving saved over the policy's horizon per selection taken off
        the hottest GPU (the layer's time is about proportional to its hottest GPU).
    copy_us: ``[E, G]`` µs the copy of expert ``e`` onto GPU ``g`` costs the serving: over
        the node's fabric when a GPU of ``g``'s node holds ``e``, else over its NIC.
    """

    us_per_load: float
    copy_us: np.ndarray


def improve_layer(row: np.ndarray, weight: np.ndarray, num_gpus: int,
                  max_moves: int | None = None, worth: MoveWorth | None = None) -> LayerPlan:
    """Moves that lower the hottest GPU's load of one layer, greedily (module docstring).

    ``row``: ``[P]`` the deployed physical_to_logical; ``weight``: ``[E]`` the window's
    load.  A GPU's load is the sum over its slots of the expert's load over its replica
    count (round robin's even split).  ``worth``: each step takes the move whose saving
    minus its copy is largest, and stops when none pays; None: the move that lowers the
    hottest GPU most (moves free).
    """
    experts = row.astype(np.int64).copy()
    num_experts = weight.size
    slots = experts.size // num_gpus
    gpu_of_slot = np.arange(experts.size) // slots
    count = np.bincount(experts, minlength=num_experts).astype(np.float64)
    plan = LayerPlan([experts.copy()], [0], [], float(weight.sum()) / num_gpus)
    load = np.bincount(gpu_of_slot, weights=weight[experts] / count[experts],
                       minlength=num_gpus)
    plan.peak.append(float(load.max()))
    eps = MIN_GAIN * max(plan.mean, 1e-12)
    moves = 0
    budget = max_moves if max_moves is not None else 8 * experts.size
    while moves < budget:
        step = _best_step(experts, weight, count, load, gpu_of_slot, num_gpus, slots, eps,
                          budget - moves, worth)
        if step is None:
            break
        experts, count, load, cost = step
        moves += cost
        plan.rows.append(experts.copy())
        plan.moves.append(moves)
        plan.peak.append(float(load.max()))
    return plan


def _best_step(experts: np.ndarray, weight: np.ndarray, count: np.ndarray, load: np.ndarray,
               gpu_of_slot: np.ndarray, num_gpus: int, slots: int, eps: float,
               left: int, worth: MoveWorth | None,
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
    """The candidate move worth most (:func:`improve_layer`; None when none helps): the
    swaps of the hottest GPU's experts with those of the coldest GPUs, and a replica of
    its hottest expert in a cold GPU's slot of an expert that keeps another, all scored
    at once."""
    hot = int(np.argmax(load))
    by_load = np.argsort(load, kind="stable")
    cold = by_load[by_load != hot][:COLD_CANDIDATES]
    if cold.size == 0:
        return None
    share = weight / count
    on = np.zeros((weight.size, num_gpus), dtype=bool)
    on[experts, gpu_of_slot] = True
    scale = worth.us_per_load if worth is not None else 1.0
    hot_slots = hot * slots + np.arange(slots)
    cold_slots = cold[:, None] * slots + np.arange(slots)[None, :]  # [C, S]
    ex, ey = experts[hot_slots], experts[cold_slots]  # [S], [C, S]
    # the highest load of the GPUs other than the hot one and each cold one
    top = by_load[::-1][:3]
    rest = np.array([float(load[next((g for g in top if g not in (hot, c)), hot)])
                     if num_gpus > 2 else 0.0 for c in cold])
    best_swap = best_rep = (-np.inf, 0.0, (0, 0), cold.size)
    if left >= 2:
        diff = share[ex][None, :, None] - share[ey][:, None, :]  # [C, S, S] hot loses
        ok = (~on[ex][:, cold].T)[:, :, None] & (~on[ey, hot])[:, None, :] & (diff > 0)
        if ok.any():
            peak = np.maximum(np.maximum(load[hot] - diff, load[cold][:, None, None] + diff),
                              rest[:, None, None])
            copy = 0.0 if worth is None else np.maximum(
                worth.copy_us[ex][:, cold].T[:, :, None], worth.copy_us[ey, hot][:, None, :])
            score = np.where(ok, (load[hot] - peak) * scale - copy, -np.inf)
            c, i, j = np.unravel_index(int(np.argmax(score)), score.shape)
            best_swap = (float(score[c, i, j]), float(peak[c, i, j]),
                         (int(hot_slots[i]), int(cold_slots[c, j])), int(c))
    # a replica of the hot GPU's hottest expert, in a slot of an expert that keeps another
    x = int(ex[np.argmax(share[ex])])
    spare = (count[ey] >= 2) & ~on[x, cold][:, None]  # [C, S]
    if spare.any():
        c_idx, j_idx = np.nonzero(spare)
        new = _replicated_loads(load, on, weight, count, x, cold[c_idx], ey[c_idx, j_idx])
        peaks = new.max(axis=1)
        copy_x = 0.0 if worth is None else worth.copy_us[x, cold[c_idx]]
        scores = (load[hot] - peaks) * scale - copy_x
        k = int(np.argmax(scores))
        best_rep = (float(scores[k]), float(peaks[k]),
                    (int(cold_slots[c_idx[k], j_idx[k]]), x), int(c_idx[k]))
    # the better of both; on a tie, the move of the colder GPU, a swap before a replica
    swap = best_swap[0] > best_rep[0] or (best_swap[0] == best_rep[0]
                                          and best_swap[3] <= best_rep[3])
    score_, peak_, where, _ = best_swap if swap else best_rep
    rest_peak = float(np.delete(load, hot).max()) if num_gpus > 1 else 0.0
    if not np.isfinite(score_) or peak_ > load[hot] - eps or peak_ > max(load[hot], rest_peak):
        return None
    experts = experts.copy()
    if swap:
        a, b = where
        experts[a], experts[b] = experts[b], experts[a]
    else:
        experts[where[0]] = where[1]
    count = np.bincount(experts, minlength=weight.size).astype(np.float64)
    load = np.bincount(gpu_of_slot, weights=weight[experts] / count[experts],
                       minlength=num_gpus)
    return experts, count, load, 2 if swap else 1


def _replicated_loads(load: np.ndarray, on: np.ndarray, weight: np.ndarray,
                      count: np.ndarray, x: int, c: np.ndarray, z: np.ndarray) -> np.ndarray:
    """``[candidates, G]`` GPU loads after each GPU ``c`` gives a slot of its expert ``z``
    (each holding another replica) to expert ``x`` (``on``: ``[E, G]`` which GPUs hold
    which experts)."""
    base = load - on[x] * (weight[x] / count[x] - weight[x] / (count[x] + 1))
    wz, cz = weight[z], count[z]
    new = base[None, :] + on[z] * (wz / (cz - 1) - wz / cz)[:, None]
    new[np.arange(z.size), c] += weight[x] / (count[x] + 1) - wz / (cz - 1)
    return new


def allocate(plans: list[LayerPlan], max_moves: int | None) -> list[int]:
    """How many of each layer's moves to take: best gain per move first, within the
    budget (``None``: all of every layer).  Returns ``[layers]`` an index into each
    plan's steps."""
    if max_moves is None:
        return [len(p.rows) - 1 for p in plans]
    taken = [0] * len(plans)
    heap: list[tuple[float, int]] = []
    for layer, p in enumerate(plans):
        if len(p.rows) > 1:
            heapq.heappush(heap, (-_rate(p, 0), layer))
    left = max_moves
    while heap:
        _, layer = heapq.heappop(heap)
        p, i = plans[layer], taken[layer]
        cost = p.moves[i + 1] - p.moves[i]
        if cost > left:
            continue  # this layer's next step does not fit; others may
        left -= cost
        taken[layer] = i + 1
        if i + 2 < len(p.rows):
            heapq.heappush(heap, (-_rate(p, i + 1), layer))
    return taken


def _rate(plan: LayerPlan, i: int) -> float:
    """Gain per move of a layer's ``i``-th step: the hottest GPU's drop over the mean
    GPU load (comparable across layers), per move."""
    return (plan.peak[i] - plan.peak[i + 1]) / max(plan.mean, 1e-12) / (
        plan.moves[i + 1] - plan.moves[i])


def window_stats(load: np.ndarray, layer_ids: np.ndarray, top_k: int) -> ExpertStats:
    """The window's load (``[layers, E]``) as statistics the judge samples from."""
    tokens = int(load.sum(axis=1).max()) // max(top_k, 1)
    return ExpertStats(load=load[None].astype(np.int64), tokens=np.array([max(tokens, 1)]),
                       layer_ids=layer_ids.astype(np.int64), top_k=top_k)


def judged_layer_times(placement: Placement, stats: ExpertStats, topology: Topology,
                       model: ModelSpec, regime: Regime,
                       draws: dict[tuple[int, ...], np.ndarray]) -> np.ndarray:
    """``[layers]`` estimated p99 layer time, µs, of ``placement`` on batches sampled from
    ``stats`` (:data:`DECISION_BATCHES` of the regime's step; ``draws`` shared so two
    placements meet the same tokens)."""
    params = regime_params(regime, placement.num_gpus, num_layers=stats.num_layers,
                           sample=True)
    params = replace(params, num_batches=DECISION_BATCHES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlacerWarning)  # the replay says them once
        result = evaluate(placement, RoutingData(stats), topology, model, params, draws=draws)
    return np.asarray(result.per_layer["layer_time_p99_us"], dtype=np.float64)


def expected_layer_times(placement: Placement, load: np.ndarray, topology: Topology,
                         model: ModelSpec, regime: Regime,
                         dtype: str) -> np.ndarray | None:
    """``[layers]`` MoE-layer time, µs, of a step whose selections are the window's load
    in expectation (``load`` ``[layers, E]`` scaled to one step of the regime, spread
    evenly over the source ranks), each expert's selections split evenly over its
    replicas: round robin's split, and in expectation the fair shares of SGLang's static
    table (its nearest-replica preference left out).  Deterministic and fast (no sampled
    tokens, no table drawn): what an online decision can afford.  None where the
    regime's all-to-all is not per selection (normal mode deduplicates each token's
    destinations: the sampled judge decides there)."""
    params = regime_params(regime, placement.num_gpus, dtype=dtype)
    if not supports(params.policy, params.mode):
        return None
    costs = CostModel.of(topology, model, params.mode, dtype)
    gpus, slots = placement.num_gpus, placement.num_physical
    step_tokens = float(params.batch_tokens or constants.DEFAULT_BATCH_TOKENS)
    totals = np.maximum(load.sum(axis=1, keepdims=True), 1e-12)
    per_source = load / totals * step_tokens * model.top_k / gpus  # [layers, E]
    segments = Segments(np.zeros(0, dtype=np.int64), np.zeros(gpus, dtype=np.int64),
                        np.arange(gpus, dtype=np.int64), 1)
    counts_of = placement.replica_counts
    parts = []
    for row in range(placement.num_layers):
        p2l = placement.physical_to_logical[row]
        split = per_source[row][p2l] / counts_of[row][p2l]
        counts = np.broadcast_to(split, (gpus, slots)).copy()
        parts.append(RunLoads.of(counts, segments, gpus))
    # every layer timed in one pass of the traffic and phase models
    return np.array([times[0] for times, _ in times_of_loads(parts, costs)],
                    dtype=np.float64).reshape(placement.num_layers)


@dataclass(frozen=True)
class Decision:
    """A rebalance decided: the placement to deploy and how long deciding took."""

    placement: Placement
    seconds: float


@dataclass(frozen=True)
class CopyCosts:
    """What a layer's weight moves cost the serving, µs: ``fixed`` once per rebalance that
    moves anything (synchronous: the host's work), ``per_layer`` per layer that moves,
    and ``link_share`` of the copy's link time (1 synchronous: serving waits for it; the
    background share when asynchronous)."""

    fixed_us: float
    per_layer_us: float
    link_share: float


def placer_moves(current: Placement, load: np.ndarray, *, topology: Topology,
                 model: ModelSpec, regime: Regime, dtype: str, interval: int,
                 max_moves: int | None, costs: CopyCosts) -> Decision:
    """placer's online re-plan of ``current`` for ``load`` (``[layers, E]``, the window),
    its moves paying for their copy within ``interval`` steps (the policy's horizon;
    module docstring)."""
    started = time.perf_counter()
    net = _NetValue(current, load, topology, model, regime, dtype, interval, costs)
    worth = _move_worth(current, load, net.now, topology=topology, model=model,
                        dtype=dtype, interval=interval, costs=costs)
    plans = [improve_layer(current.physical_to_logical[row], load[row].astype(np.float64),
                           current.num_gpus, max_moves,
                           None if worth is None else worth[row])
             for row in range(current.num_layers)]
    taken = allocate(plans, max_moves)
    greedy = current.physical_to_logical.copy()
    for row, i in enumerate(taken):
        greedy[row] = plans[row].rows[i]
    value, moves = net.of(greedy)
    final = np.where((value > 0)[:, None], greedy, current.physical_to_logical)
    value, moves = np.where(value > 0, value, 0.0), np.where(value > 0, moves, 0)
    # a layer the greedy cannot even out (a burst moved the load far) may pay for EPLB's
    # whole re-placement on the window instead, best value per extra move first
    full = eplb_layout(load, current.layer_ids, current.num_gpus, current.slots_per_gpu,
                       model, topology).physical_to_logical
    full = np.stack([align_row(full[row], current.physical_to_logical[row],
                               current.num_experts, topology)
                     for row in range(current.num_layers)])  # fewer moves, same layout
    value_full, moves_full = net.of(full)
    better = np.flatnonzero(value_full > value)
    extra = moves_full[better] - moves[better]
    rate = (value_full[better] - value[better]) / np.maximum(extra, 1)
    used = int(moves.sum())
    for i in np.argsort(-rate, kind="stable"):
        row = int(better[i])
        if max_moves is None or used + int(extra[i]) <= max_moves:
            final[row], used = full[row], used + int(extra[i])
            value[row] = value_full[row]
    if value.sum() <= costs.fixed_us:
        final = current.physical_to_logical  # together they do not pay the fixed cost
    placement = Placement(final.copy(), current.layer_ids, current.num_experts,
                          current.num_gpus)
    return Decision(placement, time.perf_counter() - started)


@dataclass
class _NetValue:
    """What deploying other rows would be worth, layer by layer: the window's expected
    layer time saved over the horizon, less the copy's cost (:class:`CopyCosts`)."""

    current: Placement
    load: np.ndarray
    topology: Topology
    model: ModelSpec
    regime: Regime
    dtype: str
    interval: int
    costs: CopyCosts
    now: np.ndarray | None = None  # [layers] expected times of ``current`` (decode)

    def __post_init__(self) -> None:
        self.now = expected_layer_times(self.current, self.load, self.topology, self.model,
                                        self.regime, self.dtype)

    def of(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``([layers], [layers])`` net value (µs) and moves of deploying ``rows``; 0 and
        0 for the layers ``rows`` leaves as they are."""
        from placer.placement.migration import copy_bytes, copy_seconds

        current = self.current
        value = np.zeros(current.num_layers)
        moves = np.zeros(current.num_layers, dtype=np.int64)
        proposal = Placement(rows, current.layer_ids, current.num_experts, current.num_gpus)
        moved = layer_moves(proposal, current)
        sub = np.flatnonzero(moved > 0)
        if sub.size == 0:
            return value, moves
        old, new = _rows(current, sub), _rows(proposal, sub)
        args = (self.load[sub], self.topology, self.model, self.regime, self.dtype)
        before = None if self.now is None else self.now[sub]
        after = None if self.now is None else expected_layer_times(new, *args)
        if before is None or after is None:
            stats = window_stats(self.load[sub], current.layer_ids[sub], self.model.top_k)
            draws: dict[tuple[int, ...], np.ndarray] = {}
            before = judged_layer_times(old, stats, self.topology, self.model, self.regime,
                                        draws)
            after = judged_layer_times(new, stats, self.topology, self.model, self.regime,
                                       draws)
        local, remote = copy_bytes(new, old, float(self.model.expert_bytes(self.dtype)),
                                   self.topology.node_of_gpu)
        copy_us = copy_seconds(local, remote, self.topology).max(axis=1) * 1e6
        cost = self.costs.per_layer_us + self.costs.link_share * copy_us
        value[sub] = (before - after) * self.interval - cost
        moves[sub] = moved[sub]
        return value, moves


def _move_worth(current: Placement, load: np.ndarray, times: np.ndarray | None, *,
                topology: Topology, model: ModelSpec, dtype: str, interval: int,
                costs: CopyCosts) -> list[MoveWorth] | None:
    """Each layer's :class:`MoveWorth`: its expected time ``times`` (``[layers]``) per
    selection of its hottest GPU over ``interval`` steps, and each expert's copy onto
    each GPU from the deployed placement (None without ``times``: normal all-to-all)."""
    if times is None:
        return None
    node = np.asarray(topology.node_of_gpu, dtype=np.int64)
    injection = np.asarray(topology.achieved_injection_gbps, dtype=np.float64)
    expert_bytes = float(model.expert_bytes(dtype))
    with np.errstate(divide="ignore"):
        fabric_us = expert_bytes / (injection[:, 1] * 1e9) * 1e6  # [G]
        nic_us = expert_bytes / (injection[:, 2] * 1e9) * 1e6
    fabric_us = np.where(np.isfinite(fabric_us), fabric_us, nic_us)
    out = []
    held = current.expert_gpu_mask  # [layers, E, G]
    members = [node == n for n in range(int(node.max()) + 1)]
    for row in range(current.num_layers):
        in_node = np.stack([held[row][:, m].any(axis=1) for m in members], axis=1)  # [E, N]
        copy = np.where(in_node[:, node], fabric_us[None], nic_us[None]) * costs.link_share
        p2l = current.physical_to_logical[row]
        count = np.bincount(p2l, minlength=current.num_experts).astype(np.float64)
        share = load[row].astype(np.float64)[p2l] / count[p2l]
        peak = float(np.bincount(np.arange(p2l.size) // current.slots_per_gpu,
                                 weights=share).max())
        out.append(MoveWorth(float(times[row]) / max(peak, 1e-12) * interval, copy))
    return out


def _rows(placement: Placement, rows: np.ndarray) -> Placement:
    """``placement`` restricted to layer rows ``rows``."""
    return Placement(placement.physical_to_logical[rows], placement.layer_ids[rows],
                     placement.num_experts, placement.num_gpus)


def oracle_layout(current: Placement, load: np.ndarray, *, topology: Topology,
                  model: ModelSpec, regime: Regime) -> Placement:
    """The faster, layer by layer, of EPLB and placer's moves fitted on ``load`` (the
    coming interval itself), moves free."""
    eplb = eplb_layout(load, current.layer_ids, current.num_gpus, current.slots_per_gpu,
                       model, topology)
    mine = current.physical_to_logical.copy()
    for row in range(current.num_layers):
        plan = improve_layer(mine[row], load[row].astype(np.float64), current.num_gpus)
        mine[row] = plan.rows[-1]
    moved = Placement(mine, current.layer_ids, current.num_experts, current.num_gpus)
    stats = window_stats(load, current.layer_ids, model.top_k)
    draws: dict[tuple[int, ...], np.ndarray] = {}
    t_eplb = judged_layer_times(eplb, stats, topology, model, regime, draws)
    t_mine = judged_layer_times(moved, stats, topology, model, regime, draws)
    best = np.where((t_eplb < t_mine)[:, None], eplb.physical_to_logical, mine)
    return Placement(best, current.layer_ids, current.num_experts, current.num_gpus)
