"""--redundant auto: candidates the memory allows, timed by the evaluator, fewest slots
among the equally fast."""

from __future__ import annotations

import pytest
from planner_fixtures import MODEL, skewed_stats

from placer.errors import UsageError
from placer.planning.build import ProblemSpec, build_problem
from placer.planning.redundancy import (
    MAX_CANDIDATES,
    RedundancyOption,
    auto_problems,
    auto_redundancy,
    choose_redundancy,
    slot_candidates,
)
from placer.problem import PlacementProblem
from placer.regime import Regime


def test_slot_candidates_span_the_memory_bound():
    assert slot_candidates(32, 16, 4) == [2, 3, 4]
    assert slot_candidates(256, 32, 30) == [8, 9, 10, 12, 16, 24]
    assert len(slot_candidates(4096, 8, 4096)) == MAX_CANDIDATES
    assert slot_candidates(32, 16, 1) == [2]  # the bound below ceil(E / G): the minimum
    assert slot_candidates(8, 2, 50) == [4, 5, 6, 8]  # never more slots than experts


def problems(max_slots: int = 5) -> dict[int, PlacementProblem]:
    from placer.topology import load_topology

    topo = load_topology("2x-dgx-h100")
    return auto_problems(skewed_stats(), ProblemSpec(model=MODEL, topology=topo), max_slots)


@pytest.mark.parametrize("workload", [Regime("vllm", "decode"), Regime("sglang", "prefill")])
def test_choice_is_the_fewest_slots_within_tolerance_of_the_fastest(workload):
    probs = problems()
    choice = choose_redundancy(probs, workload, tolerance=0.01)
    assert [o.slots_per_gpu for o in choice.options] == sorted(probs)
    fastest = min(o.step_us for o in choice.options)
    assert choice.chosen.step_us <= fastest * 1.01
    fewer = [o for o in choice.options if o.slots_per_gpu < choice.chosen.slots_per_gpu]
    assert all(o.step_us > fastest * 1.01 for o in fewer)
    assert str(choice.chosen.redundant) in choice.reason
    assert choice.to_dict()["redundant"] == choice.chosen.redundant


def test_reason_by_hand():
    """Three options; the middle one is fastest, the last within tolerance but larger."""
    from placer.planning.redundancy import RedundancyChoice

    opts = (RedundancyOption(0, 2, 100.0, 60.0), RedundancyOption(16, 3, 80.0, 58.0),
            RedundancyOption(32, 4, 79.9, 56.0))
    choice = RedundancyChoice(opts[1], opts, 0.005, Regime())
    assert "16 redundant experts (3 slots per GPU)" in choice.reason
    assert "within 0.5% of the fastest (32: 79.9 µs)" in choice.reason
    assert "20.0% faster than 0 redundant" in choice.reason


def test_auto_needs_model_and_topology():
    stats = skewed_stats()
    bare = {2: build_problem(stats, ProblemSpec(num_gpus=16, slots_per_gpu=2))}
    with pytest.raises(UsageError, match="needs the model and the topology"):
        choose_redundancy(bare, Regime())


def test_auto_redundancy_times_what_the_memory_allows():
    from placer.model.capacity import plan_capacity
    from placer.topology import load_topology

    topo = load_topology("2x-dgx-h100")
    workload = Regime("vllm", "decode")
    # the spec's own slot count is the one auto replaces
    choice = auto_redundancy(skewed_stats(), ProblemSpec(model=MODEL, topology=topo,
                                                         slots_per_gpu=7), workload)
    bound = plan_capacity(MODEL, topo, None).slots_per_gpu
    assert [o.slots_per_gpu for o in choice.options] == slot_candidates(32, 16, bound)
    by_hand = choose_redundancy(problems(bound), workload)
    assert choice.chosen.slots_per_gpu == by_hand.chosen.slots_per_gpu
    assert all(o.kv_left_gb is not None for o in choice.options)


def test_auto_redundancy_needs_the_model_and_the_topology():
    with pytest.raises(UsageError, match="needs the model and the topology") as info:
        auto_redundancy(skewed_stats(), ProblemSpec(num_gpus=16), Regime())
    assert info.value.where == "redundant"
