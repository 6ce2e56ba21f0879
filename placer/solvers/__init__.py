"""Solver family: importing this package registers every built-in solver.

Each module registers its solvers with :func:`placer.problem.register_solver`;
add a module here to make its solvers available to ``solve`` and ``--solver``.
``cpsat`` is registered by name and imported on first use: OR-Tools (and the pandas
it pulls in) takes about half a second to import, which every ``placer --help``
would otherwise pay.
"""

from __future__ import annotations

from placer.problem import PlacementProblem, SolveParams, SolveResult, register_solver
from placer.solvers import baselines, eplb


@register_solver("cpsat")
def _cpsat(problem: PlacementProblem, params: SolveParams) -> SolveResult:
    """The CP-SAT planner (``placer.solvers.cpsat``), imported when first called."""
    from placer.solvers.cpsat import solve_cpsat

    return solve_cpsat(problem, params)


__all__ = ["baselines", "eplb"]
