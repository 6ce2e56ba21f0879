"""Solver family: importing this package registers every built-in solver.

Each module registers its solvers with :func:`placer.problem.register_solver`;
add a module here to make its solvers available to ``solve`` and ``--solver``.
"""

from placer.solvers import baselines, cpsat, eplb

__all__ = ["baselines", "cpsat", "eplb"]
