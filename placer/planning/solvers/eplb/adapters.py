"""The ``eplb`` and ``eplb-valid`` solvers: the reference EPLB and its valid variant run on
a :class:`~placer.problem.PlacementProblem` (the fitted load summed over windows, the
hierarchical policy where the cluster's nodes are equal blocks of ranks)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from placer.placement import Placement
from placer.planning.solvers.baselines import heuristic_result
from placer.planning.solvers.eplb.reference import rebalance_experts
from placer.planning.solvers.eplb.valid import eplb_valid_placement
from placer.problem import PlacementProblem, SolveParams, SolveResult

__all__ = ["eplb_placement", "solve_eplb", "solve_eplb_valid"]


def eplb_placement(
    weight: np.ndarray,
    layer_ids: np.ndarray,
    num_gpus: int,
    slots_per_gpu: int,
    num_groups: int = 1,
    num_nodes: int = 1,
) -> tuple[Placement, dict[str, object]]:
    """The reference EPLB's placement (:func:`rebalance_experts`) and a report.

    Parameters
    ----------
    weight: ``[layers, E]`` load (tokens).
    layer_ids: ``[layers]`` absolute layer ids.
    num_gpus, slots_per_gpu: ``G`` and ``S``.
    num_groups, num_nodes: as :func:`rebalance_experts`; nodes are GPU blocks of
        ``G / num_nodes`` consecutive ranks.

    Returns
    -------
    The placement (a GPU may hold an expert twice), and ``{"policy": "hierarchical" |
    "global", "duplicate_gpus": int}``: (layer, GPU) pairs holding an expert twice
    (hierarchical with one node and one group is reported as global: they are the same).
    """
    phy2log, _, _ = rebalance_experts(
        weight, num_gpus * slots_per_gpu, num_groups, num_nodes, num_gpus
    )
    placement = Placement(
        physical_to_logical=phy2log, layer_ids=layer_ids, num_experts=np.shape(weight)[1],
        num_gpus=num_gpus,
    )
    hierarchical = num_groups % num_nodes == 0 and (num_groups, num_nodes) != (1, 1)
    return placement, {
        "policy": "hierarchical" if hierarchical else "global",
        "duplicate_gpus": int(placement.duplicate_gpus.sum()),
    }


def solve_eplb(problem: PlacementProblem, params: SolveParams) -> SolveResult:
    """DeepSeek EPLB, exactly as published, on the fitted statistics' load summed over windows.

    Reads no parameter of ``params`` (deterministic, no time limit).  The objective is
    the hottest GPU's load (tokens, summed over the fitted windows) in the worst layer,
    as :func:`placer.placement.gpu_loads` computes it; status ``HEURISTIC``.  Details
    add ``policy`` and ``duplicate_gpus`` (see :func:`eplb_placement`).
    """
    return _solve(problem, params, "eplb", eplb_placement)


def solve_eplb_valid(problem: PlacementProblem, params: SolveParams) -> SolveResult:
    """EPLB keeping two replicas of one expert off one GPU (:func:`eplb_valid_placement`).

    As ``eplb`` otherwise; details add ``policy`` and ``repaired_slots``.
    """
    return _solve(problem, params, "eplb-valid", eplb_valid_placement)


def _solve(problem: PlacementProblem, params: SolveParams, name: str, method: Any) -> SolveResult:
    del params
    started = time.perf_counter()
    stats = problem.stats
    placement, report = method(
        stats.mean_load,
        stats.layer_ids,
        problem.num_gpus,
        problem.slots_per_gpu,
        num_groups=problem.num_groups,
        num_nodes=_uniform_nodes(problem),
    )
    return heuristic_result(problem, name, placement, started, report)


def _uniform_nodes(problem: PlacementProblem) -> int:
    """Nodes for the hierarchical policy: only when GPUs form equal consecutive blocks."""
    nodes = problem.num_nodes
    if nodes <= 1 or problem.num_gpus % nodes:
        return 1
    expected = np.repeat(np.arange(nodes), problem.num_gpus // nodes)
    return nodes if np.array_equal(problem.node_of_gpu, expected) else 1
