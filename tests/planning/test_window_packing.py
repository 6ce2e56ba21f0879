"""The balance pass's start: the hint's replicas packed again window by window is a valid
placement with the hint's counts, respects the GPUs an expert is allowed on, and on loads
that drift between windows balances the worst window better than EPLB's packing."""

from __future__ import annotations

from dataclasses import replace

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


def _packed_by_every_gpu(data, hint: np.ndarray) -> np.ndarray | None:
    """The packing weighing every GPU for every replica (the plain form of the rule)."""
    counts = hint.sum(axis=1)
    share = data.effective_share(counts[None, :])
    replicas = np.repeat(np.arange(data.num_experts), counts)
    order = np.argsort(-share.max(axis=0)[replicas], kind="stable")
    load = np.zeros((share.shape[0], data.num_gpus))
    room = np.full(data.num_gpus, data.slots_per_gpu)
    x = np.zeros_like(hint, dtype=bool)
    for e in replicas[order].tolist():
        free = (room > 0) & ~x[e]
        if data.allowed is not None:
            free &= data.allowed[e]
        if not free.any():
            return None
        peak = np.where(free, (load + share[:, e, None]).max(axis=0), np.inf)
        g = int(np.argmin(peak))
        x[e, g] = True
        load[:, g] += share[:, e]
        room[g] -= 1
    return x


def test_packing_equals_the_rule_weighing_every_gpu():
    """Weighing only the lowest empty GPU beside the used ones places every replica where
    weighing every GPU does (ties included: equal shares, allowed masks)."""
    prob = problem()
    hint = to_mask(solve(prob, "eplb-valid").placement)
    rng = np.random.default_rng(7)
    for row in range(prob.stats.num_layers):
        for allowed in (None, hint[row] | (rng.random(hint[row].shape) < 0.6)):
            data = layer_data(prob, row, hint[row].sum(axis=1), "max", CpsatOptions(),
                              allowed=allowed)
            fast, plain = window_packing(data, hint[row]), _packed_by_every_gpu(data, hint[row])
            assert (fast is None) == (plain is None)
            if fast is not None:
                assert np.array_equal(fast, plain)
    flat = layer_data(prob, 0, hint[0].sum(axis=1), "mean", CpsatOptions())
    flat = replace(flat, shares=np.full_like(flat.shares, 1 / flat.shares.shape[1]))
    assert np.array_equal(window_packing(flat, hint[0]), _packed_by_every_gpu(flat, hint[0]))
