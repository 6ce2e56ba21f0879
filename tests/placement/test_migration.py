"""Re-planning: weight moves, their cost, the move budget, and the migration term's sign."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from evaluate_fixtures import cluster, tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st

from placer import constants
from placer.placement import Placement
from placer.placement.migration import Frontier, layer_moves, move_cost, moves_from
from placer.planning.solvers import solve
from placer.planning.solvers.cpsat import layer_data
from placer.planning.solvers.cpsat.model import LayerModel
from placer.problem import PlacementProblem, SolveParams
from placer.stats import ExpertStats


def placement(*rows: list[int], num_gpus: int = 2, num_experts: int = 4) -> Placement:
    return Placement(np.array(rows), np.arange(len(rows)), num_experts, num_gpus)


# -- counting moves ------------------------------------------------------------------------------
def test_kept_slots_cost_nothing_and_moved_ones_cost_one_each() -> None:
    current = placement([0, 1, 2, 3], [0, 1, 2, 3])
    assert layer_moves(current, current).tolist() == [0, 0]
    # slots reordered within a GPU: nothing moves
    assert layer_moves(placement([1, 0, 3, 2], [0, 1, 2, 3]), current).tolist() == [0, 0]
    # experts 1 and 2 swap GPUs: each lands on a GPU that lacked it
    assert layer_moves(placement([0, 2, 1, 3], [0, 1, 2, 3]), current).tolist() == [2, 0]
    # a second replica of an expert a GPU holds is copied on the GPU: no move
    before = placement([0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 0, 1], num_gpus=3)
    twice = placement([0, 0, 2, 3, 1, 1], [0, 1, 2, 3, 0, 1], num_gpus=3)
    assert layer_moves(twice, before).tolist() == [0, 0]
    # ... but a duplicate of an expert the GPU lacked is one move
    assert layer_moves(placement([2, 2, 0, 3, 1, 1], [0, 1, 2, 3, 0, 1], num_gpus=3),
                       before).tolist() == [2, 0]
    assert moves_from(twice, before) == 0


def test_move_cost_is_the_moved_weights_and_their_copy_time() -> None:
    model = tiny_model(num_experts=4, top_k=2)
    topology = cluster((1, 1))
    current = placement([0, 1, 2, 3], [0, 1, 2, 3])
    moved = placement([0, 2, 1, 3], [0, 1, 2, 3])
    cost = move_cost(moved, current, model, topology)
    per_expert = model.expert_bytes(model.default_dtype)
    assert cost.moves == 2
    assert cost.gb == pytest.approx(2 * per_expert / constants.GB)
    # one expert per GPU from the other node, over a 10 GB/s NIC
    assert cost.copy_s == pytest.approx(per_expert / 10e9)
    # the same GPUs on one node copy over the 100 GB/s fabric
    assert move_cost(moved, current, model, cluster((2,))).copy_s == pytest.approx(
        per_expert / 100e9)
    assert move_cost(current, current, model, topology).copy_s == 0.0
    assert "2 weight moves of 8 slots (25.0%)" in cost.describe(8)


# -- the frontier --------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.floats(-3, 10, allow_nan=False)),
                min_size=1, max_size=7))
def test_frontier_is_the_exact_knapsack(items: list[tuple[int, float]]) -> None:
    moves = np.array([m for m, _ in items])
    gain = np.array([g for _, g in items])
    frontier = Frontier.of(moves, gain)
    for budget in range(frontier.max_moves + 2):
        best = max(
            (sum(gain[list(s)]) for r in range(len(items) + 1)
             for s in itertools.combinations(range(len(items)), r)
             if sum(moves[list(s)]) <= budget),
        )
        picked = frontier.chosen(budget)
        assert moves[picked].sum() <= budget
        assert gain[picked].sum() == pytest.approx(max(best, 0.0), abs=1e-9)


def test_fewest_moves_within_tolerance() -> None:
    frontier = Frontier.of(np.array([10, 1, 5]), np.array([1.0, 5.0, 0.2]))
    # the best gain is 6.2 with 16 moves; giving up 0.25 needs only layers 0 and 1 (11)
    assert frontier.fewest_within(0.25, 1.0) == 11
    assert frontier.fewest_within(0.0, 1.0) == 16
    assert frontier.fewest_within(2.0, 1.0) == 1  # 5.0 alone is within 2.0 of 6.2
    assert frontier.points([0, 1, 16]) == [(0, 0.0), (1, 5.0), (16, pytest.approx(6.2))]


# -- the migration term of the CP-SAT model ------------------------------------------------------
def _even_problem(current: Placement) -> PlacementProblem:
    """Every expert equally loaded: every placement with one replica each balances
    perfectly, so only the migration term tells them apart."""
    load = np.full((1, 1, 8), 100, dtype=np.int64)
    stats = ExpertStats(load=load, tokens=np.array([400]), layer_ids=np.array([0]), top_k=2)
    return PlacementProblem(stats=stats, num_gpus=4, slots_per_gpu=2,
                            node_of_gpu=np.zeros(4, dtype=np.int64), current=current)


@pytest.mark.parametrize("weight", [1.0, 3.0])
def test_migration_term_keeps_the_current_placement(weight: float) -> None:
    current = Placement(np.array([[0, 1, 2, 3, 4, 5, 6, 7]]), np.array([0]), 8, 4)
    problem = _even_problem(current)
    data = layer_data(problem, 0, np.ones(8, dtype=np.int64), "mean")
    start = np.zeros((8, 4), dtype=bool)  # a different, equally balanced start
    for e, g in enumerate([1, 1, 2, 2, 3, 3, 0, 0]):
        start[e, g] = True
    assert data.moves(start) == 8
    model = LayerModel(data, start, np.arange(4), mode="cost", scale=data.scale, cap=2.0,
                       traffic_weight=0.0, migration_weight=weight)
    result = model.solve(dtime=5.0, wall=10.0, seed=0)
    assert result.x is not None
    assert data.moves(result.x) == 0
    np.testing.assert_array_equal(result.x, current.expert_gpu_mask[0])


def test_replan_respects_the_move_budget_exactly() -> None:
    """A budget of fewer moves than the best re-plan needs is never exceeded."""
    rng = np.random.default_rng(3)
    load = rng.integers(1, 2000, size=(2, 3, 16)).astype(np.int64)
    stats = ExpertStats(load=load, tokens=np.array([8000, 8000]), layer_ids=np.arange(3),
                        top_k=2)
    current = Placement(np.stack([rng.permutation(np.r_[np.arange(16), [0, 1, 2, 3]])
                                  for _ in range(3)]), np.arange(3), 16, 4)
    problem = PlacementProblem(stats=stats, num_gpus=4, slots_per_gpu=5,
                               node_of_gpu=np.zeros(4, dtype=np.int64), current=current)
    # the budget, not the quality, is checked: a short search is enough
    fast = {"time_limit_s": 0.5, "options": {"patience": 2, "balance_iterations": 4}}
    free = solve(problem, "cpsat", SolveParams(**fast, move_tolerance=0.0))
    full = int(layer_moves(free.placement, current).sum())
    assert full > 0 and free.replan["moves"] == full
    for budget in (0, full // 2, full - 1):
        result = solve(problem, "cpsat", SolveParams(**fast, max_moves=budget))
        used = int(layer_moves(result.placement, current).sum())
        assert used <= budget
        assert result.replan["budget"] == budget
        assert result.replan["moves"] == used


def test_replan_from_a_placement_with_duplicates() -> None:
    """DeepSeek's EPLB may put an expert twice on one GPU: re-planning from such a deployed
    placement keeps slots where it can and loses no expert (a regression: the slot
    assignment once kept both copies and dropped another expert)."""
    from placer.planning.solvers.cpsat.solver import _mask_to_row

    before = np.array([0, 0, 1, 2, 3, 4])  # GPU 0 holds expert 0 twice
    mask = np.zeros((5, 2), dtype=bool)
    mask[[0, 1, 4], 0] = True
    mask[[2, 3, 4], 1] = True
    row = _mask_to_row(mask, 3, before)
    assert sorted(row[:3].tolist()) == [0, 1, 4] and sorted(row[3:].tolist()) == [2, 3, 4]
    assert row[0] == 0 and row[3:5].tolist() == [2, 3]  # kept slots stay put

    rng = np.random.default_rng(5)
    load = (1000 / np.arange(1, 9) ** 1.5 * rng.uniform(0.9, 1.1, size=(2, 1, 8))).astype(np.int64)
    stats = ExpertStats(load=load, tokens=np.array([900, 900]), layer_ids=np.array([0]), top_k=2)
    current = Placement(np.array([[0, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2]]), np.array([0]), 8, 4)
    assert current.replicas_on_gpu.max() == 2
    problem = PlacementProblem(stats=stats, num_gpus=4, slots_per_gpu=3,
                               node_of_gpu=np.zeros(4, dtype=np.int64), current=current)
    result = solve(problem, "cpsat", SolveParams(time_limit_s=2.0, move_tolerance=0.0,
                                                 options={"patience": 2}))
    assert (result.placement.replica_counts >= 1).all()


def test_colocation_term_puts_co_activated_experts_together() -> None:
    """Pairs (0, 1) and (2, 3) always come together and every placement balances alike:
    the traffic term alone must bring each pair onto one GPU (a sign error, or a term that
    drops out, leaves them split as in the start)."""
    load = np.full((1, 1, 4), 100, dtype=np.int64)
    coact = np.zeros((1, 4, 4), dtype=np.int64)
    coact[0, 0, 1] = coact[0, 1, 0] = coact[0, 2, 3] = coact[0, 3, 2] = 100
    stats = ExpertStats(load=load, tokens=np.array([200]), layer_ids=np.array([0]), top_k=2,
                        coact=coact)
    problem = PlacementProblem(stats=stats, num_gpus=2, slots_per_gpu=2,
                               node_of_gpu=np.zeros(2, dtype=np.int64))
    data = layer_data(problem, 0, np.ones(4, dtype=np.int64), "mean")
    start = np.zeros((4, 2), dtype=bool)
    start[[0, 2], 0] = start[[1, 3], 1] = True  # both pairs split
    model = LayerModel(data, start, np.arange(2), mode="cost", scale=data.scale, cap=2.0,
                       traffic_weight=1.0, migration_weight=0.0)
    result = model.solve(dtime=5.0, wall=10.0, seed=0)
    assert result.x is not None
    assert (result.x[0] == result.x[1]).all() and (result.x[2] == result.x[3]).all()
    assert data.traffic(result.x) < data.traffic(start)
    # the model rewards each pair that shares a GPU: its optimum is below the split's 0
    assert result.objective < 0
