"""The balance pass's start: the hint's replicas packed again window by window is a valid
placement with the hint's counts, respects the GPUs an expert is allowed on, and on loads
that drift between windows balances the worst window better than EPLB's packing."""

from __future__ import annotations

import numpy as np
from planner_fixtures import MODEL, skewed_stats

from placer.planning.solvers import solve
from placer.planning.solvers.cpsat import CpsatOptions, layer_data
from placer.planning.solvers.cpsat.packing import window_packing
from placer.planning.solvers.cpsat.solver import to_mask
from placer.problem import PlacementProblem
from placer.topology import load_topology


def problem() -> PlacementProblem:
    topo = load_topology("2x-dgx-h100")
    return PlacementProblem(
        stats=skewed_stats(windows=6), num_gpus=topo.num_gpus, slots_per_gpu=3,
        node_of_gpu=topo.node_of_gpu, num_groups=4, topology=topo, model=MODEL,
    )


def test_packing_keeps_the_counts_fills_every_gpu_and_balances_better():
    prob = problem()
    hint = to_mask(solve(prob, "eplb-valid").placement)
    better = 0
    for row in range(prob.stats.num_layers):
        data = layer_data(prob, row, hint[row].sum(axis=1), "max", CpsatOptions())
        packed = window_packing(data, hint[row])
        assert packed is not None
        assert (packed.sum(axis=0) == prob.slots_per_gpu).all()
        assert np.array_equal(packed.sum(axis=1), hint[row].sum(axis=1))
        better += data.balance(packed) < data.balance(hint[row])
    assert better >= prob.stats.num_layers // 2


def test_packing_respects_the_allowed_gpus_or_gives_up():
    prob = problem()
    hint = to_mask(solve(prob, "eplb-valid").placement)[0]
    data = layer_data(prob, 0, hint.sum(axis=1), "max", CpsatOptions(), allowed=hint.copy())
    packed = window_packing(data, hint)
    assert packed is None or not (packed & ~hint).any()
    nowhere = np.zeros_like(hint)
    nowhere[:, 0] = True  # every expert allowed on GPU 0 alone: no packing
    data = layer_data(prob, 0, hint.sum(axis=1), "max", CpsatOptions(), allowed=nowhere)
    assert window_packing(data, hint) is None
