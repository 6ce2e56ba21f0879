"""The engine-neutral face of placer's online policy: arrays in, a physical-to-logical map out.

An engine that rebalances online holds, at each rearrangement, the window's load per layer
and logical expert and the deployed physical-to-logical map; :func:`rebalance` takes
exactly these (numpy arrays, no engine types), with the cluster and the model, and returns
the map to deploy and a :class:`RebalanceRecord` of what the decision moves and expects.
The replay's ``placer`` policy and the vLLM plugin (:mod:`placer.online.vllm`) both run
this code.

Shapes, for DeepSeek-V3 on 4 x DGX H100 with 32 redundant experts: ``load`` ``[58, 256]``
(59 rows with the MTP layer), ``deployed`` ``[58, 288]`` (32 GPUs x 9 slots); the
returned map has the deployed map's shape, an expert that stays on its GPU in its slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from placer.errors import Param, PlacementError, UsageError
from placer.model import ModelSpec
from placer.online.policy import placer_moves
from placer.online.value import CopyCosts
from placer.placement import Placement
from placer.placement.migration import layer_moves
from placer.regime import Regime
from placer.topology import Topology

#: Steps a decision's moves must pay for their copy within, when not given: vLLM's
#: default EPLB window (``EPLBConfig.window_size``), the load taken to hold as long again.
DEFAULT_HORIZON = 1000


@dataclass(frozen=True)
class OnlineSettings:
    """How placer's policy decides.

    Attributes
    ----------
    max_moves: weight moves allowed per rebalance (None: as many as pay).
    horizon: steps the moves must pay for their copy within (the load of the window is
        taken to hold that long), >= 1.
    regime: the engine and batch regime serving runs (its dispatch and all-to-all judge
        the candidates).
    dtype: the experts' dtype (None: the model's default).
    asynchronous: weights move in the background while the old layout serves (vLLM's
        default): a copy costs the topology's ``async_share`` of its link time; else
        serving stops for the host's work, each layer's and every copy.
    """

    max_moves: int | None = None
    horizon: int = DEFAULT_HORIZON
    regime: Regime = field(default_factory=lambda: Regime("vllm", "decode"))
    dtype: str | None = None
    asynchronous: bool = True

    def __post_init__(self) -> None:
        if self.max_moves is not None and self.max_moves < 0:
            raise UsageError(f"expected max_moves >= 0, got {self.max_moves}",
                             where=Param("max_moves"), hint="e.g. 64, or none for no limit")
        if self.horizon < 1:
            raise UsageError(f"expected horizon >= 1, got {self.horizon}",
                             where=Param("horizon"), hint="steps, e.g. 1000")

    def costs(self, topology: Topology) -> CopyCosts:
        """What moving weights costs the serving under these settings, from the
        topology's ``calibration.rebalance`` (as the replay charges a rebalance)."""
        return CopyCosts.of(topology.calibration.rebalance_costs, self.asynchronous)


@dataclass(frozen=True)
class RebalanceRecord:
    """What one decision moves and what it expects.

    Attributes
    ----------
    physical_to_logical: ``[layers, P]`` int64, the map to deploy (the deployed one when
        nothing pays).
    moves: expert weights loaded onto GPUs that lacked them.
    layers: layers whose weights move.
    bytes: bytes those moves copy (``moves`` x one expert's bytes in the dtype).
    gain_us: µs of serving predicted saved over the horizon, net of the copies' cost.
    step_saved_us: µs a step is predicted to save once the new map serves.
    seconds: how long deciding took, wall clock.
    """

    physical_to_logical: np.ndarray
    moves: int
    layers: int
    bytes: float
    gain_us: float
    step_saved_us: float
    seconds: float


def rebalance(load: np.ndarray, deployed: np.ndarray, *, topology: Topology,
              model: ModelSpec, settings: OnlineSettings | None = None,
              layer_ids: np.ndarray | None = None) -> RebalanceRecord:
    """placer's online decision on plain arrays (module docstring).

    Parameters
    ----------
    load: ``[layers, E]`` selections of each logical expert over the window (any
        non-negative numbers: only their proportions within a layer matter).
    deployed: ``[layers, P]`` the deployed physical-to-logical map, ``P`` a multiple of
        the topology's GPUs (GPU ``g`` holds slots ``g*S .. g*S+S-1``).
    topology, model: the cluster and the model served.
    settings: budget, horizon, regime (:class:`OnlineSettings`; None: its defaults).
    layer_ids: ``[layers]`` the rows' layer ids (None: the model's MoE layers, with its
        MTP layers when there are as many rows).
    """
    settings = settings or OnlineSettings()
    current = _deployed(load, deployed, topology, model, layer_ids)
    weight = np.asarray(load, dtype=np.float64)
    dtype = settings.dtype or model.default_dtype
    if not weight.any():
        return RebalanceRecord(current.physical_to_logical.copy(), 0, 0, 0.0, 0.0, 0.0, 0.0)
    decision = placer_moves(current, weight, topology=topology, model=model,
                            regime=settings.regime, dtype=dtype, interval=settings.horizon,
                            max_moves=settings.max_moves, costs=settings.costs(topology))
    moves = layer_moves(decision.placement, current)
    return RebalanceRecord(decision.placement.physical_to_logical, int(moves.sum()),
                           int((moves > 0).sum()),
                           float(moves.sum()) * float(model.expert_bytes(dtype)),
                           decision.gain_us, decision.step_saved_us, decision.seconds)


def _deployed(load: np.ndarray, deployed: np.ndarray, topology: Topology, model: ModelSpec,
              layer_ids: np.ndarray | None) -> Placement:
    """The deployed map as a validated placement, its shape checked against the load,
    the cluster and the model."""
    load, deployed = np.asarray(load), np.asarray(deployed)
    if load.ndim != 2 or deployed.ndim != 2 or load.shape[0] != deployed.shape[0]:
        raise PlacementError(
            f"expected load [layers, experts] and a map [layers, slots] with as many"
            f" layers, got {load.shape} and {deployed.shape}", where=Param("load"),
            hint="pass the window's load and the deployed map of the same layers")
    if load.shape[1] != model.num_experts:
        raise PlacementError(
            f"the load has {load.shape[1]} experts, {model.name} has {model.num_experts}",
            where=Param("load"), hint="configure the model being served")
    if not np.isfinite(load).all() or (load < 0).any():
        raise PlacementError("the load has negative or non-finite entries",
                             where=Param("load"), hint="pass selection counts")
    if deployed.shape[1] % topology.num_gpus:
        raise PlacementError(
            f"{deployed.shape[1]} slots do not split over the {topology.num_gpus} GPUs of"
            f" {topology.name}", where=Param("deployed"),
            hint="configure the topology being served (its GPUs are the EP ranks)")
    rows = deployed.shape[0]
    if layer_ids is None:
        ids = model.moe_layer_ids if rows != len(model.all_moe_layer_ids) \
            else model.all_moe_layer_ids
        layer_ids = np.asarray(ids if len(ids) == rows else range(rows), dtype=np.int64)
    return Placement(deployed.astype(np.int64), layer_ids, model.num_experts,
                     topology.num_gpus)
