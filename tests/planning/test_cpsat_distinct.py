"""No plan of cpsat's holds an expert twice on one GPU where the slots allow it: the
candidates it is judged against (EPLB's reference layout above all) compete repaired."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from planner_fixtures import MODEL, SYNTH, skewed_stats

from placer.model import load_model
from placer.placement import Placement
from placer.planning.solvers import solve
from placer.planning.solvers.cpsat.distinct import without_duplicates
from placer.planning.solvers.eplb.valid import repair_layer
from placer.problem import PlacementProblem, SolveParams
from placer.regime import Regime
from placer.topology import load_topology
from placer.traces import read_routing


def _placement(rows: list[list[int]], experts: int, gpus: int) -> Placement:
    return Placement(np.array(rows, dtype=np.int64), np.arange(len(rows)), experts, gpus)


def test_repair_by_hand():
    """GPU 0 holds expert 0 twice: one of them swaps with a replica of GPU 1, the
    experts' replica counts unchanged."""
    row = np.array([0, 0, 1, 2], dtype=np.int64)  # 2 GPUs x 2 slots
    assert repair_layer(row, np.array([4.0, 1.0, 1.0]), 2, 2) == 1
    assert sorted(row[:2].tolist()) in ([0, 1], [0, 2]) and 0 in row[2:].tolist()
    assert np.bincount(row, minlength=3).tolist() == [2, 1, 1]


def test_a_layer_where_swaps_corner_themselves_is_dealt_afresh():
    """Found by hypothesis: 4 GPUs x 5 slots whose greedy swaps run out while a layout
    without duplicates exists (experts 0-3 on every GPU): the row is dealt afresh, the
    replica counts kept."""
    row = np.array([0, 0, 0, 0, 1, 1, 1, 3, 2, 2, 2, 2, 3, 3, 3, 1, 4, 4, 4, 5], dtype=np.int64)
    counts = np.bincount(row, minlength=6).tolist()
    assert repair_layer(row, np.arange(1.0, 7.0), 4, 4) is not None
    assert not _placement([row.tolist()], 6, 4).duplicate_gpus.any()
    assert np.bincount(row, minlength=6).tolist() == counts


def test_a_layer_no_swap_can_repair_takes_the_plans_row():
    """3 replicas of expert 0 on 2 GPUs: some GPU must hold it twice; that layer of the
    candidate becomes the plan's, the other layer is repaired."""
    candidate = _placement([[0, 0, 0, 1, 2, 1], [0, 0, 1, 2, 2, 1]], 3, 2)
    plan = _placement([[0, 1, 2, 0, 1, 2], [0, 1, 2, 0, 1, 2]], 3, 2)
    fixed, count = without_duplicates(candidate, plan, np.ones((2, 3)), 2)
    assert count == 2
    assert fixed.physical_to_logical[0].tolist() == plan.physical_to_logical[0].tolist()
    assert not fixed.duplicate_gpus[1].any()
    assert np.bincount(fixed.physical_to_logical[1], minlength=3).tolist() == [2, 2, 2]
    assert candidate.physical_to_logical.tolist() == [[0, 0, 0, 1, 2, 1], [0, 0, 1, 2, 2, 1]]


@st.composite
def _rows(draw: st.DrawFn) -> tuple[np.ndarray, int, int]:
    """A layer whose slots allow distinct experts per GPU: no expert has more replicas
    than there are GPUs, and every expert has at least one."""
    gpus = draw(st.integers(1, 6))
    slots = draw(st.integers(1, 5))
    experts = draw(st.integers(slots, gpus * slots))
    counts = np.ones(experts, dtype=np.int64)
    for _ in range(gpus * slots - experts):
        room = np.flatnonzero(counts < gpus)
        counts[room[draw(st.integers(0, room.size - 1))]] += 1
    row = np.repeat(np.arange(experts), counts)
    order = draw(st.permutations(range(row.size)))
    return row[np.array(order, dtype=np.int64)], gpus, experts


@settings(max_examples=200, deadline=None)
@given(_rows(), st.integers(1, 3))
def test_repair_removes_every_duplicate_the_slots_allow(case, nodes):
    row, gpus, experts = case
    per_node = gpus // nodes if gpus % nodes == 0 else gpus
    counts = np.bincount(row, minlength=experts)
    placement = _placement([row.tolist()], experts, gpus)
    fixed, _ = without_duplicates(placement, placement, np.arange(1.0, experts + 1)[None], per_node)
    assert not fixed.duplicate_gpus.any()
    assert np.bincount(fixed.physical_to_logical[0], minlength=experts).tolist() == counts.tolist()


def _problem(stats, topology: str, slots: int, **kw) -> PlacementProblem:
    topo = load_topology(topology)
    return PlacementProblem(stats=stats, num_gpus=topo.num_gpus, slots_per_gpu=slots,
                            node_of_gpu=topo.node_of_gpu, topology=topo, **kw)


@pytest.mark.parametrize(("topology", "slots", "dispatch"), [
    ("dgx-h100", 8, "vllm"), ("2x-dgx-h100", 4, "sglang"), ("2x-dgx-h100", 6, "trtllm"),
])
def test_no_cpsat_plan_of_synthetic_data_holds_an_expert_twice(topology, slots, dispatch):
    """Heavy skew and many redundant slots: EPLB's reference puts experts twice on a
    GPU, the plan never does, and the summary's EPLB is still the reference."""
    prob = _problem(skewed_stats(), topology, slots, num_groups=4, model=MODEL)
    params = SolveParams(regime=Regime(dispatch, "decode"), time_limit_s=1.0)
    reference = solve(prob, "eplb", params).placement
    assert reference.duplicate_gpus.any()
    result = solve(prob, "cpsat", params)
    assert not result.placement.duplicate_gpus.any()
    assert result.details["duplicate_gpus"] == 0
    assert result.details["repaired_layers"].get("eplb") == 2


@pytest.mark.slow
@pytest.mark.parametrize(("trace", "model"), [
    ("qwen3-30b-a3b.npz", "qwen3-30b-a3b"), ("synthetic-small.jsonl.gz", "gpt-oss-20b"),
    ("synthetic-dsv3-drift.npz", "deepseek-v3"),
])
def test_no_cpsat_plan_of_the_bundled_traces_holds_an_expert_twice(trace, model):
    """Each bundled trace on two nodes with a quarter of the experts redundant, judged
    as SGLang decode (the spread candidates compete too)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stats = read_routing(str(SYNTH.parent / trace)).stats
    gpus = load_topology("2x-dgx-h100").num_gpus
    slots = -(-stats.num_experts * 5 // 4 // gpus)
    prob = _problem(stats, "2x-dgx-h100", slots, model=load_model(model))
    params = SolveParams(regime=Regime("sglang", "decode"), time_limit_s=0.2,
                         total_time_limit_s=5.0)
    result = solve(prob, "cpsat", params)
    assert not result.placement.duplicate_gpus.any(), result.details["repaired_layers"]
