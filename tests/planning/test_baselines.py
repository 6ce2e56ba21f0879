"""Baseline layouts, and invariants every registered solver must keep."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placer.placement import Placement, gpu_loads
from placer.planning.solvers import solve, solver_names
from placer.planning.solvers.baselines import linear_layout, round_robin_layout
from placer.problem import PlacementProblem, SolveParams
from placer.stats import ExpertStats


@pytest.fixture
def eight_experts_four_gpus() -> PlacementProblem:
    """8 experts on 4 GPUs, 2 slots each (no replicas); expert e has load e + 1."""
    load = np.arange(1, 9, dtype=np.int64)[None, None]
    stats = ExpertStats(load=load, tokens=np.array([36]), layer_ids=np.array([5]), top_k=1)
    return PlacementProblem(stats=stats, num_gpus=4, slots_per_gpu=2, node_of_gpu=np.zeros(4))


def test_linear_is_contiguous_blocks(eight_experts_four_gpus):
    result = solve(eight_experts_four_gpus, "linear")
    assert result.placement.physical_to_logical.tolist() == [[0, 1, 2, 3, 4, 5, 6, 7]]
    assert gpu_loads(result.placement, eight_experts_four_gpus.stats.mean_load).tolist() == [
        [3.0, 7.0, 11.0, 15.0]
    ]
    assert result.objective == 15.0
    assert result.status == "HEURISTIC"


def test_round_robin_deals_experts_to_gpus(eight_experts_four_gpus):
    result = solve(eight_experts_four_gpus, "round_robin")
    # GPU 0 holds {0, 4}, GPU 1 {1, 5}, ...
    assert result.placement.physical_to_logical.tolist() == [[0, 4, 1, 5, 2, 6, 3, 7]]
    assert result.objective == 12.0  # GPU 3: loads 4 + 8


def test_linear_with_redundant_slots_follows_vllm_initial_map():
    """vLLM's EPLB starts from [0..E-1] + [i % E for i in range(R)]."""
    assert linear_layout(4, 2, 3).tolist() == [0, 1, 2, 3, 0, 1]
    assert linear_layout(6, 4, 3).tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5]
    # experts do not divide over GPUs: 5 experts on 2 GPUs need one extra slot
    assert linear_layout(5, 2, 3).tolist() == [0, 1, 2, 3, 4, 0]


def test_round_robin_with_redundant_slots():
    """Replicas of 0, 1, ... go to the next GPU in turn that has room and lacks them."""
    assert round_robin_layout(4, 2, 2).tolist() == [0, 2, 1, 3]
    # base GPU0 {0, 2}, GPU1 {1, 3}; replica of 0 skips GPU 0, replica of 1 lands on GPU 0
    assert round_robin_layout(4, 2, 3).tolist() == [0, 2, 1, 1, 3, 0]
    # 5 experts on 2 GPUs: GPU0 {0, 2, 4}, GPU1 {1, 3} + replica of 0
    assert round_robin_layout(5, 2, 3).tolist() == [0, 2, 4, 1, 3, 0]


def test_baseline_layouts_are_valid_for_every_small_shape():
    """Exhaustive over E <= 20, G <= 8 and every S that engines accept."""
    for num_gpus in range(1, 9):
        for num_experts in range(1, 21):
            for slots in range(-(-num_experts // num_gpus), num_experts + 1):
                for layout in (linear_layout, round_robin_layout):
                    row = layout(num_experts, num_gpus, slots)
                    Placement(row[None], np.array([0]), num_experts, num_gpus)  # validates


# -- invariants of every registered solver ---------------------------------------------


@st.composite
def problems(draw) -> PlacementProblem:
    """A random problem: 1-2 layers, up to 12 experts, 1-4 GPUs on 1-2 nodes, 1-3 windows."""
    nodes = draw(st.sampled_from([1, 2]))
    num_gpus = nodes * draw(st.integers(1, 2))
    num_experts = draw(st.integers(max(2, num_gpus), 12))
    low = -(-num_experts // num_gpus)
    slots = draw(st.integers(low, min(num_experts, low + 2)))
    layers = draw(st.integers(1, 2))
    windows = draw(st.integers(1, 3))
    load = np.array(
        draw(
            st.lists(
                st.integers(0, 300), min_size=windows * layers * num_experts,
                max_size=windows * layers * num_experts,
            )
        ),
        dtype=np.int64,
    ).reshape(windows, layers, num_experts)
    groups = draw(st.sampled_from([g for g in (1, 2, 4) if num_experts % g == 0]))
    stats = ExpertStats(
        load=load,
        tokens=load.sum(axis=(1, 2)),
        layer_ids=np.arange(layers) * 2 + 1,
        top_k=1,
    )
    return PlacementProblem(
        stats=stats,
        num_gpus=num_gpus,
        slots_per_gpu=slots,
        node_of_gpu=np.repeat(np.arange(nodes), num_gpus // nodes),
        num_groups=groups,
    )


#: Quick solvers get many examples; search-based ones a few, with a short time limit.
_QUICK = {"linear", "round_robin", "eplb", "eplb-valid"}


@pytest.mark.parametrize("name", solver_names())
def test_every_solver_returns_a_valid_placement(name):
    examples = 40 if name in _QUICK else 6
    params = SolveParams(time_limit_s=0.5, seed=1)

    @given(problems())
    @settings(max_examples=examples, deadline=None)
    def check(problem: PlacementProblem) -> None:
        result = solve(problem, name, params)
        placement = result.placement
        stats = problem.stats
        # a Placement validates itself; check the invariants explicitly as well
        assert placement.physical_to_logical.shape == (stats.num_layers, problem.num_physical)
        assert placement.slots_per_gpu == problem.slots_per_gpu
        assert placement.layer_ids.tolist() == stats.layer_ids.tolist()
        counts = placement.replica_counts
        assert (counts >= 1).all()
        assert counts.sum(axis=1).tolist() == [problem.num_physical] * stats.num_layers
        if name != "eplb":  # the reference EPLB may put an expert twice on a GPU
            per_gpu = placement.physical_to_logical.reshape(stats.num_layers, problem.num_gpus, -1)
            for layer in per_gpu:
                for gpu in layer:
                    assert len(set(gpu.tolist())) == problem.slots_per_gpu
        assert result.solver == name
        if name in _QUICK:
            hottest = gpu_loads(placement, stats.mean_load).max()
            assert result.objective == pytest.approx(hottest)

    check()
