"""build_problem: slots per GPU, trace/model agreement, memory budget, fit windows."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from placer.errors import InfeasibleError, TraceError, UsageError
from placer.model import load_model
from placer.placement import Placement
from placer.planning.build import ProblemSpec, build_problem
from placer.stats import ExpertStats, Provenance, RoutingData
from placer.stats.windows import parse_window_range
from placer.topology import load_topology


@pytest.fixture
def eight_expert_trace() -> RoutingData:
    """4 windows x layers 0-3 x 8 experts (Mixtral's shape), read from ``run.npz``."""
    load = np.arange(4 * 4 * 8, dtype=np.int64).reshape(4, 4, 8)
    stats = ExpertStats(
        load=load, tokens=load.sum(axis=(1, 2)) // 8, layer_ids=np.arange(4), top_k=2,
        provenance=Provenance(sources=("run.npz",), format="npz"),
    )
    return RoutingData(stats=stats)


def _usage_error(routing: RoutingData, **spec) -> UsageError:
    with pytest.raises(UsageError) as info:
        build_problem(routing, ProblemSpec(**spec))
    return info.value


def test_default_slots_hold_every_expert_once(eight_expert_trace):
    problem = build_problem(eight_expert_trace, ProblemSpec(num_gpus=4))
    assert (problem.slots_per_gpu, problem.num_redundant) == (2, 0)
    assert problem.node_of_gpu.tolist() == [0, 0, 0, 0]
    # 8 experts on 3 GPUs: 3 slots each, one redundant slot is unavoidable
    assert build_problem(eight_expert_trace, ProblemSpec(num_gpus=3)).num_redundant == 1


def test_redundant_and_slots_per_gpu(eight_expert_trace):
    spec = ProblemSpec(num_gpus=4)
    assert build_problem(eight_expert_trace, replace(spec, redundant=4)).slots_per_gpu == 3
    assert build_problem(eight_expert_trace, replace(spec, slots_per_gpu=4)).num_redundant == 8
    e = _usage_error(routing=eight_expert_trace, num_gpus=4, redundant=3)
    assert (e.where, e.message) == (
        "redundant", "8 experts + 3 redundant = 11 slots do not split evenly over 4 GPUs"
    )
    assert e.hint == "engines need equal slots per GPU: try `redundant` 0 or 4"
    e = _usage_error(routing=eight_expert_trace, num_gpus=4, redundant=4, slots_per_gpu=3)
    assert str(e) == "redundant: `redundant` and `slots_per_gpu` exclude each other"
    e = _usage_error(routing=eight_expert_trace, num_gpus=4, slots_per_gpu=1)
    assert str(e) == "slots_per_gpu: 4 GPUs x 1 slots cannot hold 8 experts"
    e = _usage_error(routing=eight_expert_trace, num_gpus=4, slots_per_gpu=9)
    assert str(e).startswith("slots_per_gpu: 9 slots per GPU exceed the 8 experts")


def test_gpus_come_from_the_topology(eight_expert_trace):
    topology = load_topology("2x-dgx-h100")
    problem = build_problem(eight_expert_trace, ProblemSpec(topology=topology))
    assert (problem.num_gpus, problem.num_nodes, problem.slots_per_gpu) == (16, 2, 1)
    e = _usage_error(routing=eight_expert_trace, topology=topology, num_gpus=8)
    assert str(e) == "num_gpus: `num_gpus` 8 contradicts topology '2x-dgx-h100' with 16 GPUs"
    e = _usage_error(routing=eight_expert_trace)
    assert str(e) == "topology: the number of GPUs is unknown"


def test_fit_selects_windows(eight_expert_trace):
    problem = build_problem(eight_expert_trace, ProblemSpec(num_gpus=4, fit="1:3"))
    assert problem.stats.num_windows == 2
    np.testing.assert_array_equal(problem.stats.load, eight_expert_trace.stats.load[1:3])
    spec = ProblemSpec(num_gpus=4, fit=(2, None))
    assert build_problem(eight_expert_trace, spec).stats.num_windows == 2
    e = _usage_error(routing=eight_expert_trace, num_gpus=4, fit="3:9")
    assert str(e) == "fit: window range 3:9 is outside the trace's 4 windows"


@pytest.mark.parametrize("text,expected", [("2:5", (2, 5)), (":3", (None, 3)), ("4:", (4, None))])
def test_parse_window_range(text, expected):
    assert parse_window_range(text) == expected


@pytest.mark.parametrize("text", ["", ":", "a:b", "3", "-1:2"])
def test_parse_window_range_rejects(text):
    with pytest.raises(UsageError) as info:
        parse_window_range(text)
    assert str(info.value) == f"fit: expected a window range START:STOP, got {text!r}"


def test_model_must_have_the_traces_experts(eight_expert_trace):
    with pytest.raises(TraceError) as info:
        build_problem(eight_expert_trace, ProblemSpec(model=load_model("deepseek-v3"), num_gpus=8))
    assert str(info.value) == "run.npz: the trace has 8 experts per layer but deepseek-v3 has 256"


def test_trace_layers_must_be_moe_layers_of_the_model(eight_expert_trace):
    """A model whose MoE layers are 3-34: the trace's 0-3 look renumbered."""
    model = SimpleNamespace(
        name="shifted", num_experts=8, moe_layer_ids=tuple(range(3, 35)), num_groups=1
    )
    with pytest.raises(TraceError) as info:
        build_problem(eight_expert_trace, ProblemSpec(model=model, num_gpus=4))
    assert str(info.value) == (
        "run.npz: trace layer 0 is not an MoE layer of shifted (trace layers: 0-3)"
    )
    assert info.value.hint.startswith("shifted's MoE layers are 3-34; the trace may number")


def test_model_gives_groups_and_passes_the_memory_check(eight_expert_trace):
    problem = build_problem(
        eight_expert_trace, ProblemSpec(model=load_model("mixtral-8x7b"),
        topology=load_topology("dgx-h100"), slots_per_gpu=2)
    )
    assert (problem.num_groups, problem.num_physical) == (1, 16)


def test_slots_beyond_the_memory_budget_are_infeasible(eight_expert_trace):
    """Mixtral BF16 experts are 11.3 GB per slot over 32 layers; an H100 holds 4 slots."""
    with pytest.raises(InfeasibleError) as info:
        build_problem(
            eight_expert_trace, ProblemSpec(model=load_model("mixtral-8x7b"),
            topology=load_topology("dgx-h100"), redundant=32)
        )
    error = info.value
    assert error.where == "redundant"
    assert error.message.startswith("5 slots per GPU need 56.4 GB of expert weights per GPU")
    assert "the memory budget of dgx-h100 holds 4 (GPU 0: 80 GB - " in error.message
    assert error.hint.startswith("use at most `slots_per_gpu` 4 (`redundant` 24)")


def test_current_placement_must_match(eight_expert_trace):
    current = Placement(np.tile(np.arange(8), (4, 1)), np.arange(4), 8, 2)
    spec = ProblemSpec(num_gpus=2, current=current)
    assert build_problem(eight_expert_trace, spec).current is current
    e = _usage_error(routing=eight_expert_trace, num_gpus=4, current=current)
    assert str(e) == (
        "current: the current placement has 8 experts on 2 GPUs; the problem has 8 on 4"
    )


def test_spec_names_its_fitted_windows_and_takes_a_slot_count(eight_expert_trace):
    assert ProblemSpec().fitted(4) is None
    assert ProblemSpec(fit="1:").fitted(4) == (1, 4)
    assert ProblemSpec(fit=(None, 3)).fitted(4) == (0, 3)
    spec = ProblemSpec(num_gpus=4, redundant=4, fit="1:3")
    sized = spec.with_slots(4)
    assert (sized.slots_per_gpu, sized.redundant, sized.fit) == (4, None, "1:3")
    problem = build_problem(eight_expert_trace, sized)
    assert (problem.slots_per_gpu, problem.num_redundant, problem.stats.num_windows) == (4, 8, 2)
