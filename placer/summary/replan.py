"""The re-plan block of the plan summary: moves, their cost, and the move frontier."""

from __future__ import annotations

from typing import Any

from placer.placement.migration import move_cost
from placer.problem import PlacementProblem, SolveResult


def replan_doc(problem: PlacementProblem, result: SolveResult,
               dtype: str | None = None) -> dict[str, Any] | None:
    """What re-planning from ``problem.current`` costs and gains (None without one).

    Keys: ``moves``, ``slots``, ``gb``, ``copy_s`` (:func:`placer.placement.migration.move_cost`),
    and from the solver's ``replan`` report when it has one (``cpsat``): ``budget``,
    ``tolerance``, ``best_moves``, ``cost`` (what the figures are), ``current_cost``,
    ``cost_after``, ``best_cost`` and the ``frontier`` rows.
    """
    current = problem.current
    if current is None:
        return None
    cost = move_cost(result.placement, current, problem.model, problem.topology, dtype)
    doc: dict[str, Any] = {
        "moves": cost.moves,
        "slots": int(result.placement.num_physical * result.placement.num_layers),
        "gb": cost.gb,
        "copy_s": cost.copy_s,
        "describe": cost.describe(int(result.placement.num_physical
                                      * result.placement.num_layers)),
    }
    doc.update(result.replan or {})
    return doc
