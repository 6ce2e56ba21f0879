"""The solvers: EPLB (the reference), the engines' default layouts, and CP-SAT.

``solve(problem, name, params)`` runs the solver named ``name``; the names and where
each solver lives are a table in :mod:`placer.planning.solvers.registry`, imported on first use
(OR-Tools takes about half a second to import, which ``placer --help`` should not pay).
Adding a solver: docs/planner.md, "Adding a solver".
"""

from __future__ import annotations

from placer.planning.solvers.registry import get_solver, register_solver, solve, solver_names

__all__ = ["get_solver", "register_solver", "solve", "solver_names"]
