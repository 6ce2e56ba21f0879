"""What each policy deploys at a rebalance: the reference EPLB, placer's moves, foresight.

``eplb``: deepseek-ai/EPLB's ``rebalance_experts`` on the window's load, every layer
re-placed (:func:`eplb_layout`), as vLLM, SGLang and TensorRT-LLM run it online.

``placer`` (:func:`placer_moves`): placer's online policy, the library's own
(:mod:`placer.online`: from the deployed placement, the moves, or a layer's whole EPLB
re-placement, that pay for their copy within the horizon on the window's load).

``oracle``: the faster of both, fitted on the coming interval itself (the caller passes
that interval's load as the window), moved for free.
"""

from __future__ import annotations

import numpy as np

from placer.model import ModelSpec
from placer.online.moves import MoveWorth, improve_layer
from placer.online.policy import Decision, placer_moves, uniform_nodes
from placer.online.value import (
    CopyCosts,
    expected_layer_times,
    judged_layer_times,
    window_stats,
)
from placer.placement import Placement
from placer.planning.solvers.eplb import eplb_placement
from placer.regime import Regime
from placer.topology import Topology

#: placer's own policy lives in :mod:`placer.online`; the replay takes it from here
__all__ = ["CopyCosts", "Decision", "MoveWorth", "eplb_layout", "expected_layer_times",
           "improve_layer", "oracle_layout", "placer_moves"]


def eplb_layout(load: np.ndarray, layer_ids: np.ndarray, num_gpus: int, slots_per_gpu: int,
                model: ModelSpec, topology: Topology) -> Placement:
    """The reference EPLB's placement of ``load`` (``[layers, E]``)."""
    placement, _ = eplb_placement(load.astype(np.float64), layer_ids, num_gpus, slots_per_gpu,
                                  num_groups=model.num_groups,
                                  num_nodes=uniform_nodes(topology))
    return placement


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
