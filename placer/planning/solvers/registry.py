"""The solver table: one name per solver, and where its function lives.

A solver is a function ``(PlacementProblem, SolveParams) -> SolveResult`` (see
:mod:`placer.problem` for the contract).  The built-in ones are a literal table of
``name -> "module:function"``, imported on first use: nothing here imports a solver
module at import time, so the solvers may import this module (``cpsat`` plans from its
hint with :func:`solve`) without an import cycle, and ``placer --help`` does not pay for
OR-Tools.  Code outside placer adds its own with :func:`register_solver`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from placer.errors import Param, UsageError
from placer.placement import gpu_loads, hot_shard_ratio
from placer.problem import PlacementProblem, SolveParams, SolveResult

SolverFn = Callable[[PlacementProblem, SolveParams], SolveResult]

#: Built-in solvers: name -> ``"module:function"``.
BUILTIN: dict[str, str] = {
    "eplb": "placer.planning.solvers.eplb.adapters:solve_eplb",
    "eplb-valid": "placer.planning.solvers.eplb.adapters:solve_eplb_valid",
    "linear": "placer.planning.solvers.baselines:solve_linear",
    "round_robin": "placer.planning.solvers.baselines:solve_round_robin",
    "cpsat": "placer.planning.solvers.cpsat.solver:solve_cpsat",
}

#: Solvers with options of their own: name -> ``"module:OptionsClass"``
#: (``SolveParams.options``); the others take none.
OPTIONS: dict[str, str] = {
    "cpsat": "placer.planning.solvers.cpsat.options:CpsatOptions",
}

_ADDED: dict[str, SolverFn] = {}


def register_solver(name: str, fn: SolverFn) -> None:
    """Make ``fn`` available as ``solve(problem, name)`` and ``--solver name``.

    For solvers that live outside placer; a built-in name cannot be replaced.
    """
    if name in BUILTIN:
        raise UsageError(f"solver name {name!r} is a built-in solver's",
                         hint="choose another name")
    _ADDED[name] = fn


def solver_names() -> list[str]:
    """Every solver's name, sorted."""
    return sorted({*BUILTIN, *_ADDED})


def get_solver(name: str) -> SolverFn:
    """The function of solver ``name``."""
    if name in _ADDED:
        return _ADDED[name]
    if name not in BUILTIN:
        raise UsageError(f"unknown solver {name!r}", where=Param("solver"),
                         hint=f"choose one of: {', '.join(solver_names())}")
    module, function = BUILTIN[name].split(":")
    fn: SolverFn = getattr(importlib.import_module(module), function)
    return fn


def options_class(name: str) -> type | None:
    """The options dataclass of built-in solver ``name``, or None when it has none."""
    if name not in OPTIONS:
        return None
    module, cls = OPTIONS[name].split(":")
    found: type = getattr(importlib.import_module(module), cls)
    return found


def solve(
    problem: PlacementProblem, solver: str = "eplb", params: SolveParams | None = None
) -> SolveResult:
    """Plan a placement with the named solver; the result's ``hot_shard`` is filled in.

    Raises UsageError for an unknown solver, or options given to a built-in solver that
    has none.
    """
    fn = get_solver(solver)
    params = params or SolveParams()
    if params.options and solver in BUILTIN and options_class(solver) is None:
        given = ", ".join(sorted(params.options)) if isinstance(params.options, dict) else (
            type(params.options).__name__)
        raise UsageError(f"solver {solver} has no options (given: {given})", where=Param("options"),
                         hint=f"options are for: {', '.join(sorted(OPTIONS))}")
    result = fn(problem, params)
    return replace(result, hot_shard=mean_hot_shard(problem, result))


def mean_hot_shard(problem: PlacementProblem, result: SolveResult) -> float:
    """:attr:`SolveResult.hot_shard` of ``result`` on ``problem``'s fitted load."""
    loads = gpu_loads(result.placement, problem.stats.mean_load)  # [L, G]
    ratios = hot_shard_ratio(loads)
    return float(np.mean(ratios)) if ratios.size else 1.0
