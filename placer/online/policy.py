"""placer's online decision: from the deployed placement, the moves that pay on the window.

From the deployed placement, one layer at a time, the move worth most on the window's
load (:mod:`placer.online.moves`), repeated while the hottest GPU gets cooler; the moves
of all layers are then taken best gain per move first within the budget.  Where a burst
moved the load too far for single moves, EPLB's whole re-placement of a layer on the
window (its GPUs renumbered to move least) is the other candidate, taken where it is
worth more (best value per extra move first, within the budget).  A layer's change is
kept only when it saves more of the window's expected layer time over the horizon than
its copy costs (:mod:`placer.online.value`), and the changes together must pay the
rebalance's fixed cost.  An expert that stays on its GPU keeps its slot.  Nothing here
calls a solver: an online decision must take milliseconds to a second, as the engines'
do.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from placer.model import ModelSpec
from placer.online.moves import allocate, improve_layer
from placer.online.value import CopyCosts, NetValue, move_worth
from placer.placement import Placement
from placer.placement.align import align_row, keep_slots
from placer.planning.solvers.eplb import eplb_placement
from placer.regime import Regime
from placer.topology import Topology


@dataclass(frozen=True)
class Decision:
    """A rebalance decided.

    Attributes
    ----------
    placement: the placement to deploy (the deployed one when nothing pays).
    seconds: how long deciding took, wall clock.
    gain_us: µs of serving the change is predicted to save over the horizon, net of its
        copies and the rebalance's fixed cost (0 when nothing moves).
    step_saved_us: µs a step is predicted to save once the change serves (the window's
        expected MoE-layer times, summed over the layers that change).
    """

    placement: Placement
    seconds: float
    gain_us: float = 0.0
    step_saved_us: float = 0.0


def uniform_nodes(topology: Topology) -> int:
    """Nodes for EPLB's hierarchical policy: only when GPUs form equal consecutive
    blocks (as the eplb solver decides)."""
    node = np.asarray(topology.node_of_gpu, dtype=np.int64)
    nodes = int(node.max()) + 1
    if nodes <= 1 or node.size % nodes:
        return 1
    return nodes if np.array_equal(node, np.repeat(np.arange(nodes), node.size // nodes)) else 1


def eplb_rows(current: Placement, load: np.ndarray, model: ModelSpec,
              topology: Topology) -> np.ndarray:
    """``[layers, P]`` the reference EPLB's layout of ``load``, each layer's GPUs
    renumbered (and slots kept) to move least from ``current``: the same layout."""
    fresh, _ = eplb_placement(load.astype(np.float64), current.layer_ids, current.num_gpus,
                              current.slots_per_gpu, num_groups=model.num_groups,
                              num_nodes=uniform_nodes(topology))
    return np.stack([align_row(fresh.physical_to_logical[row],
                               current.physical_to_logical[row], current.num_experts,
                               topology)
                     for row in range(current.num_layers)])


def placer_moves(current: Placement, load: np.ndarray, *, topology: Topology,
                 model: ModelSpec, regime: Regime, dtype: str, interval: int,
                 max_moves: int | None, costs: CopyCosts) -> Decision:
    """placer's online re-plan of ``current`` for ``load`` (``[layers, E]``, the window),
    its moves paying for their copy within ``interval`` steps (the policy's horizon) and
    at most ``max_moves`` of them (None: no limit); module docstring."""
    started = time.perf_counter()
    deployed = current.physical_to_logical
    net = NetValue(current, load, topology, model, regime, dtype, interval, costs)
    worth = move_worth(current, load, net.now, topology=topology, model=model,
                       dtype=dtype, interval=interval, costs=costs)
    plans = [improve_layer(deployed[row], load[row].astype(np.float64),
                           current.num_gpus, max_moves,
                           None if worth is None else worth[row])
             for row in range(current.num_layers)]
    taken = allocate(plans, max_moves)
    greedy = deployed.copy()
    for row, i in enumerate(taken):
        if i:  # an expert that leaves its GPU and comes back keeps its slot
            greedy[row] = keep_slots(plans[row].rows[i], deployed[row], current.num_gpus)
    rows = net.of(greedy)
    pays = rows.value > 0
    final = np.where(pays[:, None], greedy, deployed)
    value = np.where(pays, rows.value, 0.0)
    moves = np.where(pays, rows.moves, 0)
    saved = np.where(pays, rows.saved, 0.0)
    # a layer the greedy cannot even out (a burst moved the load far) may pay for EPLB's
    # whole re-placement on the window instead, best value per extra move first
    full = eplb_rows(current, load, model, topology)
    whole = net.of(full)
    better = np.flatnonzero(whole.value > value)
    extra = whole.moves[better] - moves[better]
    rate = (whole.value[better] - value[better]) / np.maximum(extra, 1)
    used = int(moves.sum())
    for i in np.argsort(-rate, kind="stable"):
        row = int(better[i])
        if max_moves is None or used + int(extra[i]) <= max_moves:
            final[row], used = full[row], used + int(extra[i])
            value[row], saved[row] = whole.value[row], whole.saved[row]
    gain = float(value.sum()) - costs.fixed_us
    if gain <= 0:
        final, gain, saved = deployed, 0.0, np.zeros_like(saved)  # it does not pay
    placement = Placement(final.copy(), current.layer_ids, current.num_experts,
                          current.num_gpus)
    return Decision(placement, time.perf_counter() - started, gain, float(saved.sum()))
