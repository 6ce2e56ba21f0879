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


def replan_rows(doc: dict[str, Any] | None, frontier: bool = False) -> list[str]:
    """Text lines of :func:`replan_doc`; the frontier table too when ``frontier``."""
    if doc is None:
        return []
    lines = [f"re-plan      {doc['describe']}"]
    if "current_cost" in doc:
        before, after, best = doc["current_cost"], doc["cost_after"], doc["best_cost"]
        change = after / before - 1.0 if before else 0.0
        why = (f"budget {doc['budget']:,} moves" if doc.get("budget") is not None else
               f"the fewest moves within {doc['tolerance']:.1%} of the best re-plan")
        lines.append(
            f"             {why}; the best re-plan needs {doc['best_moves']:,} moves"
            f" ({best:,.1f})")
        lines.append(
            f"             {doc['cost']} on the fitted windows: current {before:,.1f},"
            f" re-planned {after:,.1f} ({change:+.2%})")
    if frontier and doc.get("frontier"):
        lines += ["", f"{'move budget':>12}{'moves':>10}{'estimate':>14}{'vs current':>12}"]
        before = doc["current_cost"]
        for row in doc["frontier"]:
            change = row["cost"] / before - 1.0 if before else 0.0
            lines.append(f"{row['budget']:>12,}{row['moves']:>10,}{row['cost']:>14,.1f}"
                         f"{change:>+12.2%}")
        lines.append(f"(estimate: {doc['cost']}, fitted windows; whole layers re-planned or kept,"
                     " the most gain per budget)")
    return lines
