"""What-if comparison: plan and evaluate several scenarios on the same routing data.

A *scenario* is one way to deploy the model: a topology (which GPUs, how many
nodes, which links), a number of redundant experts ``R`` per layer, and a solver.
Each scenario runs ``plan -> evaluate -> row``:

1. ``placer.planning.build_problem`` sizes the slots from the model and the
   topology's memory (an :class:`~placer.errors.InfeasibleError` when the
   experts do not fit),
2. ``placer.problem.solve`` places the experts on the *fitted* windows,
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
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from placer import constants
from placer.errors import InfeasibleError, PlacerError, UsageError
from placer.evaluate import MODES, POLICIES, EvalParams, evaluate
from placer.evaluate.windows import default_split
from placer.parallel import Backend
from placer.placement import Placement
from placer.planning import build_problem
from placer.problem import SolveParams, solve
from placer.stats import ExpertStats, RoutingData
from placer.summary import EQUAL_TOLERANCE, time_figure, verdict
from placer.workload import Workload

#: ``status`` of a row whose scenario planned and evaluated.
STATUS_OK = "ok"


# -- scenarios and settings -------------------------------------------------------------
@dataclass(frozen=True)
class Scenario:
    """One deployment to plan and evaluate.

    Attributes
    ----------
    topology: a topology preset name or a YAML path (``placer.topology.load_topology``).
    redundant: ``R``, redundant experts per layer (slots beyond one per expert).
    solver: a registered solver name (``placer.problem.solver_names()``).
    name: label in tables and pictures; default ``"<topology> R=<R> <solver>"``.
    """

    topology: str
    redundant: int
    solver: str
    name: str = ""

    def __post_init__(self) -> None:
        if self.redundant < 0:
            raise UsageError(
                f"redundant experts must be zero or more, got {self.redundant}",
                where="--redundant",
            )

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        return f"{topology_label(self.topology)} R={self.redundant} {self.solver}"


def topology_label(topology: str) -> str:
    """Short name of a topology argument: a preset name as is, a file by its stem."""
    if topology.endswith((".yaml", ".yml")) or "/" in topology:
        return Path(topology).stem
    return topology


def expand_scenarios(
    topologies: Sequence[str], redundant: Sequence[int], solvers: Sequence[str]
) -> tuple[Scenario, ...]:
    """Every (topology, redundancy, solver) combination, topology-major, in the given orders."""
    if not topologies:
        raise UsageError("no topology to compare", where="--topology",
                         hint="give --topology at least once (a preset name or a YAML file)")
    if not redundant:
        raise UsageError("no redundancy level to compare", where="--redundant")
    if not solvers:
        raise UsageError("no solver to compare", where="--solver")
    return tuple(
        Scenario(topology=t, redundant=int(r), solver=s)
        for t in topologies for r in redundant for s in solvers
    )


@dataclass(frozen=True)
class CompareSettings:
    """What every scenario of a study shares.

    Attributes
    ----------
    model: model preset name or YAML path (``placer.models.load_model``); ``""``
        until the command line or the scenario file names one.
    dtype: expert weight dtype (``bf16``, ``fp8``, ``mxfp4``); None = the model's default.
    policy: dispatch policy the evaluator simulates (``round_robin``, ``sglang``, ``local_first``,
        ``random``; :data:`placer.evaluate.POLICIES`).
    mode: all-to-all mode (``normal`` deduplicates copies per GPU and node; ``low_latency`` not).
    kv_reserve_gb: GB per GPU kept for the KV cache when sizing slots; None = capacity default.
    time_limit_s: solver time limit per layer, seconds; None = ``SolveParams`` default.
    seed: seed of solvers and of the evaluator's sampling.
    batch_tokens: tokens per evaluated batch; None = evaluator default.
    num_batches: batches the evaluator samples when the trace has no per-token
        routing (aggregated loads); None = evaluator default.
    holdout: judge placements on held-out windows (True) or on all the data (False).
    engine, workload, tokens_per_gpu: the :class:`placer.workload.Workload` to plan for and
        judge under (``--engine``, ``--workload``, ``--tokens-per-gpu``); when any is
        given it sets the dispatch policy, the all-to-all mode and the batch
        (``tokens_per_gpu x G`` of each scenario), and the solvers plan for it
        (``SolveParams.workload``); None for all three: ``policy``, ``mode`` and
        ``batch_tokens`` as given, solvers with their default workload.
    """

    model: str
    dtype: str | None = None
    policy: str = "round_robin"
    mode: str = "normal"
    kv_reserve_gb: float | None = None
    time_limit_s: float | None = None
    seed: int = 0
    batch_tokens: int | None = None
    num_batches: int | None = None
    holdout: bool = True
    engine: str | None = None
    workload: str | None = None
    tokens_per_gpu: int | None = None

    @property
    def target(self) -> Workload | None:
        """The workload of ``engine``/``workload``/``tokens_per_gpu``, or None (none given)."""
        if self.engine is None and self.workload is None and self.tokens_per_gpu is None:
            return None
        return Workload(self.engine or "vllm", self.workload or "decode", self.tokens_per_gpu)

    def eval_params(self, num_gpus: int, windows: tuple[int, int] | None = None) -> EvalParams:
        """The evaluator's parameters for a scenario on ``num_gpus`` GPUs."""
        kwargs: dict[str, Any] = {"policy": self.policy, "mode": self.mode, "seed": self.seed,
                                  "dtype": self.dtype, "windows": windows}
        target = self.target
        if target is not None:
            kwargs.update(policy=target.policy, mode=target.mode,
                          batch_tokens=target.batch_tokens(num_gpus))
        elif self.batch_tokens is not None:
            kwargs["batch_tokens"] = self.batch_tokens
        if self.num_batches is not None:
            kwargs["num_batches"] = self.num_batches
        return EvalParams(**kwargs)

    def __post_init__(self) -> None:
        if self.target is not None and (self.policy != "round_robin" or self.mode != "normal"
                                        or self.batch_tokens is not None):
            raise UsageError(
                "--engine/--workload/--tokens-per-gpu set the dispatch policy, the all-to-all"
                " mode and the batch", where="--engine",
                hint="drop --policy, --mode and --batch-tokens (or 'policy', 'mode',"
                " 'batch_tokens' in the scenario file), or drop the workload",
            )
        if self.policy not in POLICIES:
            raise UsageError(f"unknown dispatch policy {self.policy!r}", where="--policy",
                             hint=f"choose one of: {', '.join(POLICIES)}")
        if self.mode not in MODES:
            raise UsageError(f"unknown all-to-all mode {self.mode!r}", where="--mode",
                             hint=f"choose one of: {', '.join(MODES)}")
        if self.dtype is not None and self.dtype not in constants.DTYPES:
            raise UsageError(f"unknown dtype {self.dtype!r}", where="--dtype",
                             hint=f"choose one of: {', '.join(constants.DTYPES)}")
        if self.kv_reserve_gb is not None and not self.kv_reserve_gb >= 0:
            raise UsageError(f"KV reserve must be zero or more GB, got {self.kv_reserve_gb}",
                             where="--kv-reserve-gb")
        if self.time_limit_s is not None and not self.time_limit_s > 0:
            raise UsageError(f"time limit must be positive, got {self.time_limit_s}",
                             where="--time-limit")
        if self.batch_tokens is not None and self.batch_tokens < 1:
            raise UsageError(f"batch tokens must be at least 1, got {self.batch_tokens}",
                             where="--batch-tokens")
        if self.num_batches is not None and self.num_batches < 1:
            raise UsageError(f"number of batches must be at least 1, got {self.num_batches}",
                             where="--num-batches")


# -- rows -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CompareRow:
    """One scenario's figures (None where the scenario did not get that far).

    Attributes
    ----------
    scenario: the scenario's label.
    topology, redundant, solver: the scenario.
    status: ``"ok"``, ``"does not fit: <reason>"`` or ``"error: <message>"``.
    num_gpus, num_nodes: the topology's GPUs (EP ranks) and nodes.
    slots_per_gpu: ``S = (E + R) / G``.
    kv_left_gb: memory per GPU left for the KV cache (smallest GPU), GB.
    hot_shard_ratio: per layer, max / mean GPU load over the judged batches (dispatch
        policy applied); median over layers.
    hot_shard_ratio_worst: worst layer's max / mean GPU load.
    batch_hot_shard_p99: p99 over (batch, layer) of the per-batch max / mean GPU load.
    remote_copies_per_token_gpu: token copies sent to another GPU, per token and layer.
    remote_copies_per_token_node: token copies sent to another node, per token and layer.
    bytes_per_token_intra: bytes per token and layer over intra-node links (dispatch + combine).
    bytes_per_token_inter: bytes per token and layer over inter-node links.
    all_to_all_us: estimated dispatch + combine time of one MoE layer, µs (mean over batches).
    moe_layer_p50_us, moe_layer_p99_us: estimated MoE-layer time, µs, median and p99.
    solver_status: the solver's status (``OPTIMAL``, ``FEASIBLE``, ``FALLBACK``, ``HEURISTIC``).
    solve_seconds: solver wall time, s.
    step_p99_us: estimated step time (one batch through every MoE layer), µs, p99 over batches.
    versus_baseline: ``step_p99_us / baseline's - 1`` against the baseline scenario (the
        first that ran on the same topology; negative: faster); None for the baseline and
        rows without figures (:func:`with_verdicts`).
    verdict: the same in words (:func:`placer.summary.verdict`), e.g. ``verdict: 2x-dgx-h100
        R=16 cpsat is 4.1% faster than 2x-dgx-h100 R=0 eplb on held-out step p99``;
        ``"baseline"`` for a baseline.
    """

    scenario: str
    topology: str
    redundant: int
    solver: str
    status: str
    num_gpus: int | None = None
    num_nodes: int | None = None
    slots_per_gpu: int | None = None
    kv_left_gb: float | None = None
    hot_shard_ratio: float | None = None
    hot_shard_ratio_worst: float | None = None
    batch_hot_shard_p99: float | None = None
    remote_copies_per_token_gpu: float | None = None
    remote_copies_per_token_node: float | None = None
    bytes_per_token_intra: float | None = None
    bytes_per_token_inter: float | None = None
    all_to_all_us: float | None = None
    moe_layer_p50_us: float | None = None
    moe_layer_p99_us: float | None = None
    solver_status: str | None = None
    solve_seconds: float | None = None
    step_p99_us: float | None = None
    versus_baseline: float | None = None
    verdict: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Row fields filled from the evaluator's metric keys (docs/ARCHITECTURE.md).
METRIC_FIELDS = {
    "kv_left_gb": "kv_left_gb",
    "hot_shard_ratio": "hot_shard_ratio_median",
    "hot_shard_ratio_worst": "hot_shard_ratio_worst",
    "batch_hot_shard_p99": "batch_hot_shard_p99",
    "remote_copies_per_token_gpu": "remote_copies_per_token_gpu",
    "remote_copies_per_token_node": "remote_copies_per_token_node",
    "bytes_per_token_intra": "bytes_per_token_intra",
    "bytes_per_token_inter": "bytes_per_token_inter",
    "all_to_all_us": "all_to_all_us",
    "moe_layer_p50_us": "moe_layer_p50_us",
    "moe_layer_p99_us": "moe_layer_p99_us",
    "step_p99_us": "step_p99_us",
}


@dataclass(frozen=True)
class Column:
    """How a row field is shown in the text table (JSON and CSV carry raw values)."""

    field: str
    header: str
    fmt: str = "{}"

    def cell(self, row: CompareRow) -> str:
        value = getattr(row, self.field)
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            return "-"
        return self.fmt.format(value)


#: Columns of the text table, in order (units in the headers).
TABLE_COLUMNS = (
    Column("scenario", "scenario"),
    Column("num_gpus", "GPUs"),
    Column("num_nodes", "nodes"),
    Column("slots_per_gpu", "slots/GPU"),
    Column("kv_left_gb", "KV left GB", "{:.1f}"),
    Column("hot_shard_ratio", "hot shard", "{:.3f}"),
    Column("batch_hot_shard_p99", "batch hot p99", "{:.2f}"),
    Column("remote_copies_per_token_gpu", "remote/tok GPU", "{:.2f}"),
    Column("remote_copies_per_token_node", "remote/tok node", "{:.2f}"),
    Column("bytes_per_token_intra", "KB/tok intra", "{:.1f}"),
    Column("bytes_per_token_inter", "KB/tok inter", "{:.1f}"),
    *(Column(f.key, f.header, f.fmt) for f in map(
        time_figure, ("all_to_all_us", "moe_layer_p50_us", "moe_layer_p99_us", "step_p99_us"))),
    Column("versus_baseline", "vs base", "{:+.1%}"),
    Column("solver_status", "solver"),
    Column("solve_seconds", "solve s", "{:.2f}"),
    Column("status", "status"),
)

#: Fields shown in KB (1e3 bytes) in the text table; JSON and CSV keep bytes.
_KB_FIELDS = ("bytes_per_token_intra", "bytes_per_token_inter")


def table_cells(row: CompareRow) -> list[str]:
    """The text-table cells of ``row``, one per :data:`TABLE_COLUMNS` entry (``vs base``:
    ``base`` for the baseline, ``=`` within ``placer.summary.EQUAL_TOLERANCE``)."""
    cells = []
    for col in TABLE_COLUMNS:
        value = getattr(row, col.field)
        if col.field in _KB_FIELDS and value is not None:
            cells.append(col.fmt.format(value / 1e3))
        elif col.field == "versus_baseline" and value is not None and (
                abs(value) < EQUAL_TOLERANCE):
            cells.append("=")
        elif col.field == "versus_baseline" and value is None and row.verdict == BASELINE_NOTE:
            cells.append("base")
        else:
            cells.append(col.cell(row))
    return cells


#: ``verdict`` of the baseline row.
BASELINE_NOTE = "baseline"


def with_verdicts(rows: Sequence[CompareRow], on: str = "step p99") -> list[CompareRow]:
    """``rows`` with ``versus_baseline`` and ``verdict`` against their baseline: the first
    row that ran on the same topology with a step p99 (``verdict`` ``"baseline"``).

    Per topology, because a step's batch may depend on the GPUs (``--tokens-per-gpu``
    makes it ``tokens x G``): the same topology always judges the same batches.  ``on``
    names the judged figure in the verdict (e.g. ``"held-out step p99"``).
    """
    bases: dict[str, CompareRow] = {}
    for row in rows:
        if row.ok and row.step_p99_us is not None and row.topology not in bases:
            bases[row.topology] = row
    out = []
    for row in rows:
        base = bases.get(row.topology)
        if base is None:
            out.append(row)
            continue
        if row is base:
            out.append(replace(row, versus_baseline=None, verdict=BASELINE_NOTE))
            continue
        assert base.step_p99_us is not None
        said = None if row.step_p99_us is None else verdict(
            row.scenario, base.scenario, row.step_p99_us, base.step_p99_us, on=on)
        if said is None:
            out.append(row)
        else:
            out.append(replace(row, versus_baseline=said.change, verdict=said.text))
    return out


def status_notes(rows: Sequence[CompareRow]) -> tuple[list[str], list[str]]:
    """Short statuses (``ok``, ``does not fit [1]``, ``error [2]``) and the numbered reasons.

    Identical reasons share one number; ``notes[n - 1]`` is the reason of ``[n]``.
    """
    short: list[str] = []
    notes: list[str] = []
    for row in rows:
        if row.ok:
            short.append(row.status)
            continue
        kind, _, reason = row.status.partition(": ")
        if reason not in notes:
            notes.append(reason)
        short.append(f"{kind} [{notes.index(reason) + 1}]")
    return short, notes


def format_table(rows: Sequence[CompareRow]) -> str:
    """The comparison as an aligned plain-text table (text left, numbers right).

    A row that did not run shows ``does not fit [n]`` or ``error [n]`` in its status
    cell; the reasons follow the table as numbered notes (identical reasons share a
    number), so the table stays as wide as its figures.
    """
    header = [c.header for c in TABLE_COLUMNS]
    short, notes = status_notes(rows)
    body = []
    for row, status in zip(rows, short, strict=True):
        cells = table_cells(row)
        cells[-1] = status
        body.append(cells)
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h)
              for i, h in enumerate(header)]
    left = {0, len(header) - 1, len(header) - 3}  # scenario, status, solver status

    def line(cells: list[str]) -> str:
        parts = [c.ljust(w) if i in left else c.rjust(w)
                 for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "  ".join(parts).rstrip()

    sep = "  ".join("-" * w for w in widths)
    lines = [line(header), sep, *(line(b) for b in body)]
    if any(r.verdict == BASELINE_NOTE for r in rows):
        lines += ["", "vs base: step p99 against the first scenario that ran on the same"
                      " topology (base); negative is faster"]
    if notes:
        lines.append("")
        lines.extend(f"[{i}] {reason}" for i, reason in enumerate(notes, 1))
    return "\n".join(lines) + "\n"


def row_fields() -> list[str]:
    """Names of every :class:`CompareRow` field, in order (the CSV header)."""
    return [f.name for f in fields(CompareRow)]


# -- outcomes -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScenarioOutcome:
    """A row and, when the scenario ran, its placement and evaluation (for pictures).

    Attributes
    ----------
    row: the figures.
    placement: the planned placement, or None.
    evaluation: ``placer.evaluate.Evaluation`` on the judged windows, or None.
    """

    row: CompareRow
    placement: Placement | None = None
    evaluation: Any = None


@dataclass(frozen=True)
class RoutingSplit:
    """Which windows of the routing data placements are fitted on and judged on.

    Attributes
    ----------
    routing: the whole routing data.
    fit: ``(start, stop)`` windows the solvers see.
    judge: ``(start, stop)`` windows the evaluator replays (held out, or the same).
    description: in words, e.g. ``"fitted on windows 0:6, judged on held-out windows 6:8"``.
    """

    routing: RoutingData
    fit: tuple[int, int]
    judge: tuple[int, int]
    description: str

    @property
    def judge_stats(self) -> ExpertStats:
        """The statistics of the judged windows (what the report's pictures show)."""
        stats = self.routing.stats
        if self.judge == (0, stats.num_windows):
            return stats
        return stats.select_windows(*self.judge)


def split_routing(routing: RoutingData, holdout: bool = True) -> RoutingSplit:
    """Fitted and held-out windows by ``placer evaluate``'s default split.

    With ``holdout=False`` or a single window, both parts are every window.
    """
    num_windows = routing.stats.num_windows
    split = default_split(num_windows) if holdout else None
    if split is None:
        why = "the trace has one window" if holdout else "no hold-out asked"
        every = (0, num_windows)
        return RoutingSplit(routing, every, every,
                            f"fitted and judged on all {num_windows} window(s): {why}")
    fit, judge = split
    return RoutingSplit(
        routing, fit, judge,
        f"fitted on windows {fit[0]}:{fit[1]}, judged on held-out windows {judge[0]}:{judge[1]}",
    )


# -- running --------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Context:
    """What every scenario shares; sent once to each worker process."""

    split: RoutingSplit
    model: Any
    topologies: dict[str, Any]
    settings: CompareSettings
    keep_details: bool = True


def run_scenario(
    scenario: Scenario,
    split: RoutingSplit,
    model: Any,
    topology: Any,
    settings: CompareSettings,
    *,
    keep_details: bool = True,
) -> ScenarioOutcome:
    """Plan and evaluate one scenario; every PlacerError becomes the row's status.

    Parameters
    ----------
    scenario: what to run.
    split: the fitted and judged routing data.
    model: ``placer.models.ModelSpec``.
    topology: ``placer.topology.Topology`` of ``scenario.topology``.
    settings: what the study shares.
    keep_details: return the placement and evaluation with the row (for pictures).
    """
    base: dict[str, Any] = {
        "scenario": scenario.label,
        "topology": scenario.topology,
        "redundant": scenario.redundant,
        "solver": scenario.solver,
        "num_gpus": int(topology.num_gpus),
        "num_nodes": int(topology.num_nodes),
    }
    try:
        problem = build_problem(
            split.routing, fit=split.fit, model=model, topology=topology,
            redundant=scenario.redundant, dtype=settings.dtype,
            kv_reserve_gb=settings.kv_reserve_gb,
        )
        base["slots_per_gpu"] = int(problem.slots_per_gpu)
        solve_kwargs: dict[str, Any] = {"seed": settings.seed}
        if settings.time_limit_s is not None:
            solve_kwargs["time_limit_s"] = settings.time_limit_s
        if settings.target is not None:
            solve_kwargs["workload"] = settings.target
        started = time.perf_counter()
        result = solve(problem, scenario.solver, SolveParams(**solve_kwargs))
        seconds = result.seconds or (time.perf_counter() - started)
        evaluation = evaluate(result.placement, split.routing, topology, model,
                              settings.eval_params(int(topology.num_gpus), split.judge))
    except InfeasibleError as e:
        return ScenarioOutcome(CompareRow(status=f"does not fit: {_reason(e)}", **base))
    except PlacerError as e:
        return ScenarioOutcome(CompareRow(status=f"error: {_reason(e)}", **base))
    metrics = evaluation.metrics
    figures: dict[str, Any] = {k: _number(metrics.get(m)) for k, m in METRIC_FIELDS.items()}
    row = CompareRow(status=STATUS_OK, solver_status=str(result.status),
                     solve_seconds=float(seconds), **base, **figures)
    if not keep_details:
        return ScenarioOutcome(row)
    return ScenarioOutcome(row, result.placement, evaluation)


def compare(
    routing: RoutingData,
    scenarios: Sequence[Scenario],
    settings: CompareSettings,
    *,
    jobs: int = 1,
    ray: str | None = None,
    on_done: Callable[[int, ScenarioOutcome], None] | None = None,
    keep_details: bool = True,
) -> list[ScenarioOutcome]:
    """Run every scenario on the same routing data; outcomes in scenario order.

    Parameters
    ----------
    routing: the trace (statistics, and per-token routing when kept).
    scenarios: what to compare (:func:`expand_scenarios`).
    settings: what the scenarios share.
    jobs: scenarios run at once in separate processes (1 = in this process).
    ray: run the scenarios on Ray instead (:class:`placer.parallel.Backend`: ``"local"``
        or a cluster's address); the table is the same as a local run's.
    on_done: called as ``on_done(index, outcome)`` when a scenario finishes (in
        completion order), e.g. to advance a progress bar.
    keep_details: keep placements and evaluations (for pictures).

    Raises
    ------
    UsageError: unknown model, topology or solver names, or ``jobs < 1``; these
        stop the study before anything runs. Problems of one scenario become rows.
    """
    backend = Backend(jobs=jobs, ray=ray)
    context = prepare(routing, scenarios, settings, keep_details=keep_details)
    outcomes: list[ScenarioOutcome | None] = backend.run(
        _run_safely, scenarios, shared=context, on_done=on_done)
    done = [o for o in outcomes if o is not None]
    judged = context.split
    on = "held-out step p99" if judged.judge != judged.fit else "step p99"
    rows = with_verdicts([o.row for o in done], on)
    return [replace(o, row=row) for o, row in zip(done, rows, strict=True)]


def prepare(
    routing: RoutingData,
    scenarios: Sequence[Scenario],
    settings: CompareSettings,
    *,
    keep_details: bool = True,
) -> _Context:
    """Load the model and every topology once and split the data; name errors stop here."""
    from placer.models import load_model
    from placer.topology import load_topology

    check_names(scenarios, settings)
    model = load_model(settings.model)
    topologies = {}
    for s in scenarios:
        if s.topology not in topologies:
            topologies[s.topology] = load_topology(s.topology)
    split = split_routing(routing, settings.holdout)
    return _Context(split, model, topologies, settings, keep_details)


def check_names(scenarios: Sequence[Scenario], settings: CompareSettings) -> None:
    """Raise UsageError for an unknown solver or a missing model (cheap; before reading data)."""
    from placer.problem import solver_names

    known = solver_names()
    for s in scenarios:
        if s.solver not in known:
            raise UsageError(f"unknown solver {s.solver!r}", where="--solver",
                             hint=f"choose one of: {', '.join(known)}")
    if not settings.model:
        raise UsageError("no model to plan for", where="--model",
                         hint="give --model NAME (see `placer model list`) or 'model:' in the"
                              " scenario file")


def _run_safely(context: _Context, scenario: Scenario) -> ScenarioOutcome:
    """:func:`run_scenario`, where even an unexpected exception becomes an ``error:`` row."""
    topology = context.topologies[scenario.topology]
    try:
        return run_scenario(scenario, context.split, context.model, topology, context.settings,
                            keep_details=context.keep_details)
    except Exception as e:  # a bug in one scenario must not lose the others' rows
        row = CompareRow(scenario=scenario.label, topology=scenario.topology,
                         redundant=scenario.redundant, solver=scenario.solver,
                         status=f"error: {type(e).__name__}: {e}",
                         num_gpus=int(topology.num_gpus), num_nodes=int(topology.num_nodes))
        return ScenarioOutcome(row)


def _reason(error: PlacerError) -> str:
    text = error.message
    return f"{text} ({error.hint})" if error.hint and len(error.hint) < 80 else text


def _number(value: Any) -> float | None:
    if value is None:
        return None
    value = float(np.asarray(value))
    return value if math.isfinite(value) else None


# -- in words -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Study:
    """A repeatable comparison: what to read, what to compare, and how.

    Attributes
    ----------
    scenarios: in order.
    settings: shared settings.
    trace: the routing trace path(s), when the study names them.
    extras: free-form values kept for the report (source file name).
    """

    scenarios: tuple[Scenario, ...]
    settings: CompareSettings
    trace: tuple[str, ...] = ()
    extras: dict[str, Any] = field(default_factory=dict)


#: Keys of a scenario file, in the order docs/compare.md documents them.
STUDY_KEYS = ("trace", "model", "dtype", "topologies", "redundant", "solvers", "scenarios",
              "policy", "mode", "kv_reserve_gb", "time_limit_s", "seed", "batch_tokens",
              "num_batches", "holdout", "engine", "workload", "tokens_per_gpu")


_PATH_SUFFIXES = (".yaml", ".yml", ".json", ".jsonl", ".gz", ".npz", ".csv", ".npy")


def study_from_yaml(text: str, source: str = "<scenarios>", base_dir: Path | None = None) -> Study:
    """Parse a scenario file (YAML) into a :class:`Study`.

    The schema (every key optional but at least one scenario; ``model`` and
    ``trace`` may come from the command line instead)::

        trace: traces/run.jsonl          # or a list; relative to the file's folder
        model: deepseek-v3               # preset name or YAML path
        dtype: fp8
        topologies: [2x-dgx-h100, 1x-dgx-h200]   # x redundant x solvers
        redundant: [0, 16, 32]           # default [0]
        solvers: [eplb, cpsat]           # default [eplb]
        scenarios:                       # extra scenarios, after the product
          - {name: NVL72, topology: gb200-nvl72, redundant: 32, solver: cpsat}
        policy: round_robin              # round_robin | sglang | local_first | random
        mode: normal                     # normal | low_latency | low_latency_rdma
        kv_reserve_gb: 20
        time_limit_s: 5
        seed: 0
        batch_tokens: 4096
        num_batches: 32                  # sampled batches (aggregated traces only)
        holdout: true
        engine: sglang                   # or workload / tokens_per_gpu, instead of
        workload: decode                 #   policy, mode and batch_tokens
        tokens_per_gpu: 128

    Unknown keys, wrong types and unknown choices raise UsageError with
    ``where="<file>:<line>: <yaml path>"``. Paths (``trace``, topology and model
    files) are resolved against ``base_dir`` when they exist there.
    """
    from placer.yaml_schema import parse_yaml

    doc = parse_yaml(text, source, UsageError)
    root = doc.root()
    base = base_dir or Path(".")

    def resolve(value: str) -> str:
        candidate = base / value
        is_path = "/" in value or value.endswith(_PATH_SUFFIXES)
        return str(candidate) if is_path and candidate.exists() else value

    trace: tuple[str, ...] = ()
    raw_trace = root.raw("trace", None)
    if isinstance(raw_trace, list):
        trace = tuple(resolve(_yaml_string(root, p, v, "trace")) for p, v in root.items("trace"))
    elif raw_trace is not None:
        trace = (resolve(root.string("trace")),)

    model = root.string("model", None)
    settings_kwargs: dict[str, Any] = {"model": resolve(model) if model else ""}
    dtype = root.string("dtype", None)
    if dtype is not None:
        settings_kwargs["dtype"] = dtype
    settings_kwargs["policy"] = root.string("policy", "round_robin", choices=POLICIES)
    settings_kwargs["mode"] = root.string("mode", "normal", choices=MODES)
    kv = root.number("kv_reserve_gb", None, strict=False)
    if kv is not None:
        settings_kwargs["kv_reserve_gb"] = kv
    limit = root.number("time_limit_s", None)
    if limit is not None:
        settings_kwargs["time_limit_s"] = limit
    settings_kwargs["seed"] = root.integer("seed", 0, minimum=0)
    for key in ("batch_tokens", "num_batches"):
        count = root.integer(key, None)
        if count is not None:
            settings_kwargs[key] = count
    settings_kwargs["holdout"] = root.boolean("holdout", True)
    from placer.workload import ENGINES, PHASES

    engine = root.string("engine", None, choices=ENGINES)
    if engine is not None:
        settings_kwargs["engine"] = engine
    phase = root.string("workload", None, choices=PHASES)
    if phase is not None:
        settings_kwargs["workload"] = phase
    tokens = root.integer("tokens_per_gpu", None, minimum=1)
    if tokens is not None:
        settings_kwargs["tokens_per_gpu"] = tokens

    topologies = [resolve(_yaml_string(root, p, v, "topology"))
                  for p, v in root.items("topologies", [])]
    redundant = [_yaml_int(root, p, v) for p, v in root.items("redundant", [])] or [0]
    solvers = [_yaml_string(root, p, v, "solver") for p, v in root.items("solvers", [])]
    scenarios = list(expand_scenarios(topologies, redundant, solvers or ["eplb"])
                     if topologies else ())
    for path, value in root.items("scenarios", []):
        from placer.yaml_schema import Section

        item = Section(doc, value, path)
        scenarios.append(Scenario(
            topology=resolve(item.string("topology")),
            redundant=item.integer("redundant", 0, minimum=0),
            solver=item.string("solver", "eplb"),
            name=item.string("name", ""),
        ))
        item.done()
    root.done()
    if not scenarios:
        raise doc.fail("", "the scenario file names no scenario",
                       hint="give 'topologies' (with 'redundant' and 'solvers') or 'scenarios'")
    return Study(tuple(scenarios), CompareSettings(**settings_kwargs), trace,
                 {"source": source})


def read_study(path: str | Path) -> Study:
    """Read a scenario file; paths inside it are relative to its folder."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError("scenario file not found", where=str(path)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read scenario file: {e}", where=str(path)) from None
    return study_from_yaml(text, str(path), path.parent)


def _yaml_string(section: Any, path: str, value: Any, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float) or not str(value):
        raise section.doc.fail(path, f"expected a {what} name, got {value!r}")
    return str(value)


def _yaml_int(section: Any, path: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise section.doc.fail(path, f"expected a number of redundant experts >= 0, got {value!r}")
    return int(value)
