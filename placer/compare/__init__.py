"""What-if comparison: plan and evaluate several scenarios on the same routing data.

A *scenario* is one way to deploy the model: a topology (which GPUs, how many
nodes, which links), a number of redundant experts ``R`` per layer, and a solver.
Each scenario runs ``plan -> evaluate -> row``:

1. ``placer.planning.build.build_problem`` sizes the slots from the model and the
   topology's memory (an :class:`~placer.errors.InfeasibleError` when the
   experts do not fit),
2. ``placer.planning.solvers.solve`` places the experts on the *fitted* windows,
3. ``placer.evaluate.evaluate`` judges the placement on the *held-out* windows
   (the last ``constants.HOLDOUT_FRACTION`` of them, as ``placer evaluate``
   does; a one-window trace is judged on the data it was fitted on),
4. the figures become a :class:`CompareRow`.

A scenario that does not fit, or fails, is a row whose ``status`` says so
(``"does not fit: ..."``, ``"error: ..."``), never an exception. Rows come back
in scenario order whatever the number of parallel jobs.

Example (two topologies x two redundancy levels x one solver = 4 rows)::

    scenarios = expand_scenarios(["2x-dgx-h100", "1x-h200"], [0, 16], ["eplb"])
    outcomes = compare(routing, scenarios, CompareSettings(model="deepseek-v3"), jobs=2)
    rows = [o.row for o in outcomes]
    print(recommend(rows).line)

:func:`sweep_scenarios` gives each topology the redundancies it can run instead (a
:class:`Sweep` of ``R`` values, slots per GPU, or ``auto``), and :func:`recommend` picks
the scenario to deploy by a stated rule.
"""

from __future__ import annotations

from placer.compare.recommend import (
    Recommendation,
    recommend,
)
from placer.compare.rows import (
    BASELINE_NOTE,
    BASELINE_RULE,
    BASELINE_SOLVER,
    METRIC_FIELDS,
    STATUS_OK,
    TABLE_COLUMNS,
    Column,
    CompareRow,
    baselines,
    format_table,
    row_fields,
    status_notes,
    table_cells,
    with_verdicts,
)
from placer.compare.run import (
    RoutingSplit,
    ScenarioOutcome,
    check_names,
    compare,
    prepare,
    run_scenario,
    split_routing,
    throughput,
)
from placer.compare.scenarios import (
    DEFAULT_P99_SLACK_PCT,
    CompareSettings,
    Scenario,
    expand_scenarios,
    topology_label,
)
from placer.compare.study import (
    STUDY_KEYS,
    Grid,
    Study,
    read_study,
    resolve_study,
    study_from_yaml,
)
from placer.compare.sweep import (
    SWEEP_KINDS,
    Sweep,
    TopologySweep,
    parse_counts,
    parse_sweep,
    sweep_scenarios,
    topology_sweep,
)

__all__ = [
    "BASELINE_NOTE",
    "BASELINE_RULE",
    "BASELINE_SOLVER",
    "DEFAULT_P99_SLACK_PCT",
    "METRIC_FIELDS",
    "STATUS_OK",
    "STUDY_KEYS",
    "SWEEP_KINDS",
    "TABLE_COLUMNS",
    "Column",
    "CompareRow",
    "CompareSettings",
    "Grid",
    "Recommendation",
    "RoutingSplit",
    "Scenario",
    "ScenarioOutcome",
    "Study",
    "Sweep",
    "TopologySweep",
    "baselines",
    "check_names",
    "compare",
    "expand_scenarios",
    "format_table",
    "parse_counts",
    "parse_sweep",
    "prepare",
    "read_study",
    "recommend",
    "resolve_study",
    "row_fields",
    "run_scenario",
    "split_routing",
    "status_notes",
    "study_from_yaml",
    "sweep_scenarios",
    "table_cells",
    "throughput",
    "topology_label",
    "topology_sweep",
    "with_verdicts",
]
