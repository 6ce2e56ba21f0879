"""What a decision's candidate layouts are worth: layer times on the window, and copies.

A layer's change is worth the window's expected layer time it saves over the policy's
horizon, less what its copy costs the serving (:class:`CopyCosts`).  Decode's all-to-all
is timed per selection, deterministically, from the window's load in expectation
(:func:`expected_layer_times`); normal mode, which deduplicates each token's
destinations, is timed on a few sampled batches (:func:`judged_layer_times`).  Both
are the evaluator's own models: an online decision is judged as the replay judges it.
"""

from __future__ import annotations

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
from placer.online.moves import MoveWorth
from placer.placement import Placement
from placer.placement.migration import copy_bytes, copy_seconds, layer_moves
from placer.regime import Regime
from placer.stats import ExpertStats, RoutingData
from placer.topology import Topology
from placer.topology.calibration import RebalanceCalibration

#: Sampled batches the judge of an online decision times each candidate on (few: the
#: decision must be fast; both placements are timed on the same tokens).
DECISION_BATCHES = 4


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
        warnings.simplefilter("ignore", PlacerWarning)  # the caller says them once
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
class CopyCosts:
    """What a layer's weight moves cost the serving, µs: ``fixed`` once per rebalance that
    moves anything (synchronous: the host's work), ``per_layer`` per layer that moves,
    and ``link_share`` of the copy's link time (1 synchronous: serving waits for it; the
    background share when asynchronous)."""

    fixed_us: float
    per_layer_us: float
    link_share: float

    @classmethod
    def of(cls, calibration: RebalanceCalibration, asynchronous: bool) -> CopyCosts:
        """The costs a rebalance pays under a topology's ``calibration.rebalance``: in the
        background, ``async_share`` of the copies' link time only; synchronous, the host's
        work, each layer's and every copy, as a stall."""
        if asynchronous:
            return cls(0.0, 0.0, calibration.async_share)
        return cls(calibration.host_ms * 1e3, calibration.layer_ms * 1e3, 1.0)


@dataclass(frozen=True)
class RowsValue:
    """What deploying some rows is worth, per layer (0 where a row stays as deployed).

    Attributes
    ----------
    value: ``[layers]`` µs of serving saved over the horizon, net of the copy's cost.
    moves: ``[layers]`` weight moves.
    saved: ``[layers]`` µs a step saves, the copy left out (the layer's expected time
        on the window before, less after).
    """

    value: np.ndarray
    moves: np.ndarray
    saved: np.ndarray


@dataclass
class NetValue:
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

    def of(self, rows: np.ndarray) -> RowsValue:
        """What deploying ``rows`` (``[layers, P]``) is worth, layer by layer."""
        current = self.current
        value = np.zeros(current.num_layers)
        saved = np.zeros(current.num_layers)
        moves = np.zeros(current.num_layers, dtype=np.int64)
        proposal = Placement(rows, current.layer_ids, current.num_experts, current.num_gpus)
        moved = layer_moves(proposal, current)
        sub = np.flatnonzero(moved > 0)
        if sub.size == 0:
            return RowsValue(value, moves, saved)
        old, new = rows_of(current, sub), rows_of(proposal, sub)
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
        saved[sub] = before - after
        return RowsValue(value, moves, saved)


def move_worth(current: Placement, load: np.ndarray, times: np.ndarray | None, *,
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


def rows_of(placement: Placement, rows: np.ndarray) -> Placement:
    """``placement`` restricted to layer rows ``rows``."""
    return Placement(placement.physical_to_logical[rows], placement.layer_ids[rows],
                     placement.num_experts, placement.num_gpus)


