"""Load-blind baselines: the layouts engines use when they know nothing of the load.

``linear`` (vLLM's default ``expert_placement_strategy``): expert ``e`` on GPU
``e // (E / G)``.  With redundant slots it is the map vLLM's EPLB starts from
before it has measured any load (vllm ``distributed/eplb/eplb_state.py``,
``EplbState.build_initial_global_physical_to_logical_map``): the experts in order,
then the redundant slots holding experts ``0, 1, 2, ...`` again
(``physical_to_logical = [0..E-1] + [i % E for i in range(R)]``), slot ``p`` on
GPU ``p // S``.  Copies of one expert are ``E >= S`` slots apart, so they never
share a GPU.

``round_robin`` (vLLM's ``expert_placement_strategy="round_robin"``): expert ``e``
on GPU ``e % G``, GPU ``g`` holding ``g, g + G, g + 2G, ...`` in that order.  vLLM
refuses redundant experts with this strategy (``determine_expert_placement_strategy``
falls back to linear), so with redundant slots placer uses its documented rule:
replicate experts in index order (``i % E`` for the ``i``-th redundant slot), each
replica going to the next GPU in round-robin order that has room and lacks that
expert.

Both ignore the statistics; their objective is still reported on them (the
hottest GPU's load in the worst layer, as for EPLB) so they compare directly.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from placer.placement import Placement, gpu_loads, hot_shard_ratio
from placer.problem import PlacementProblem, SolveParams, SolveResult

__all__ = ["heuristic_result", "linear_layout", "round_robin_layout"]


def linear_layout(num_experts: int, num_gpus: int, slots_per_gpu: int) -> np.ndarray:
    """``[P]`` int64 physical_to_logical of vLLM's linear layout (one layer).

    >>> linear_layout(4, 2, 3).tolist()   # GPU 0 {0, 1, 2}, GPU 1 {3, 0, 1}
    [0, 1, 2, 3, 0, 1]
    """
    num_physical = num_gpus * slots_per_gpu
    return np.arange(num_physical, dtype=np.int64) % num_experts


def round_robin_layout(num_experts: int, num_gpus: int, slots_per_gpu: int) -> np.ndarray:
    """``[P]`` int64 physical_to_logical of the round-robin layout (one layer).

    >>> round_robin_layout(4, 2, 2).tolist()  # GPU 0 {0, 2}, GPU 1 {1, 3}
    [0, 2, 1, 3]
    >>> round_robin_layout(4, 2, 3).tolist()  # redundant replicas of 0, 1
    [0, 2, 1, 1, 3, 0]
    """
    num_physical = num_gpus * slots_per_gpu
    held: list[list[int]] = [[] for _ in range(num_gpus)]
    for expert in range(num_experts):
        held[expert % num_gpus].append(expert)
    cursor = num_experts % num_gpus
    for i in range(num_physical - num_experts):
        expert = i % num_experts
        for step in range(num_gpus):
            gpu = (cursor + step) % num_gpus
            if len(held[gpu]) < slots_per_gpu and expert not in held[gpu]:
                held[gpu].append(expert)
                cursor = gpu + 1
                break
        else:  # not reached for slots_per_gpu <= num_experts (checked exhaustively to E=96, G=32)
            raise RuntimeError(
                f"round_robin found no GPU for a replica of expert {expert}; please report"
                f" E={num_experts} G={num_gpus} S={slots_per_gpu}"
            )
    return np.array([e for gpu in held for e in gpu], dtype=np.int64)


#: What the greedy solvers' objective measures.
OBJECTIVE_UNIT = "tokens on the busiest GPU of the worst layer (fitted load summed over windows)"


def heuristic_result(
    problem: PlacementProblem,
    name: str,
    placement: Placement,
    started: float,
    details: dict[str, Any] | None = None,
) -> SolveResult:
    """A ``HEURISTIC`` SolveResult scored on the problem's load summed over windows.

    objective: the hottest GPU's load in the worst layer (tokens), as
    :func:`placer.placement.gpu_loads` computes it; ``details`` gains
    ``hottest_gpu_load`` ``[layers]`` and ``hot_shard_ratio`` ``[layers]``.
    """
    loads = gpu_loads(placement, problem.stats.mean_load)  # [L, G]
    hottest = loads.max(axis=1)
    return SolveResult(
        placement=placement,
        solver=name,
        status="HEURISTIC",
        objective=float(hottest.max()) if hottest.size else 0.0,
        objective_unit=OBJECTIVE_UNIT,
        seconds=time.perf_counter() - started,
        details={
            **(details or {}),
            "hottest_gpu_load": hottest,
            "hot_shard_ratio": hot_shard_ratio(loads),
        },
    )


def _baseline(problem: PlacementProblem, name: str, layout: np.ndarray) -> SolveResult:
    started = time.perf_counter()
    stats = problem.stats
    placement = Placement(
        physical_to_logical=np.tile(layout, (stats.num_layers, 1)),
        layer_ids=stats.layer_ids,
        num_experts=stats.num_experts,
        num_gpus=problem.num_gpus,
    )
    return heuristic_result(problem, name, placement, started)


def solve_linear(problem: PlacementProblem, params: SolveParams) -> SolveResult:
    """vLLM's default layout (see the module docstring); reads no parameter."""
    del params
    layout = linear_layout(problem.stats.num_experts, problem.num_gpus, problem.slots_per_gpu)
    return _baseline(problem, "linear", layout)


def solve_round_robin(problem: PlacementProblem, params: SolveParams) -> SolveResult:
    """Expert ``e`` on GPU ``e % G`` (see the module docstring); reads no parameter."""
    del params
    layout = round_robin_layout(
        problem.stats.num_experts, problem.num_gpus, problem.slots_per_gpu
    )
    return _baseline(problem, "round_robin", layout)
