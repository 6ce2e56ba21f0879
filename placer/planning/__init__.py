"""Planning: from routing statistics to a placement, and what ``placer plan`` runs.

- :mod:`placer.planning.build`: the :class:`~placer.problem.PlacementProblem` of a trace,
  a model and a cluster (slots from memory, the fitted windows, the current placement);
- :mod:`placer.planning.solvers`: the table of solvers (the reference EPLB, its valid
  variant, the baselines, CP-SAT), each ``(problem, params) -> SolveResult``;
- :mod:`placer.planning.redundancy`: ``redundant = auto``, the redundancy chosen by
  estimated step time;
- :mod:`placer.planning.run`: the whole pipeline of ``placer plan`` (build, solve, the
  reference EPLB beside it, the summary).
"""
