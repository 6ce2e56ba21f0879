"""The CP-SAT planner (registered solver ``"cpsat"``).

Per layer it decides how many replicas each logical expert gets and which GPU holds
each replica: exactly ``S`` slots per GPU, at most one replica of an expert per GPU.
Objectives, lexicographic with a tolerance (see ``docs/planner.md``):

1. the hot shard: the hottest GPU's load over the mean, in the worst window of the
   trace (each window normalized to the same total), never worse than the hint
   (DeepSeek EPLB);
2. traffic: co-activated experts on one GPU, and on one node across nodes, weighted
   by the topology's link costs;
3. migration: few weight moves from ``--current``.

Modules: ``layer`` (a layer's data and the exact objective figures), ``replicas``
(replica-count ranges), ``traffic`` (pairs and link costs), ``model`` (the CP-SAT
model, built in named steps), ``search`` (full model or large-neighbourhood search
per layer), ``options`` (the solver's options), ``solver`` (the solver: hint, parallel
layers, judge, result).
"""

from placer.planning.solvers.cpsat.layer import LayerData
from placer.planning.solvers.cpsat.model import LayerModel
from placer.planning.solvers.cpsat.options import CpsatOptions
from placer.planning.solvers.cpsat.search import LayerOutcome, SearchParams, solve_layer
from placer.planning.solvers.cpsat.solver import layer_data, solve_cpsat

__all__ = [
    "CpsatOptions",
    "LayerData",
    "LayerModel",
    "LayerOutcome",
    "SearchParams",
    "layer_data",
    "solve_cpsat",
    "solve_layer",
]
