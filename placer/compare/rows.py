"""The rows of a comparison and how they are shown.

:class:`CompareRow` (one scenario's figures), the text table's columns and cells,
verdicts against the baseline, status notes and the CSV header; the comparison itself
is :mod:`placer.compare`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from placer.metrics import Metric, metric
from placer.summary import EQUAL_TOLERANCE, verdict

#: ``status`` of a row whose scenario planned and evaluated.
STATUS_OK = "ok"

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
    step_p50_us, step_mean_us: the same, median and mean over batches.
    tokens_per_step: tokens of one judged batch (mean over batches): with ``--tokens-per-gpu``
        ``tokens x G``, else the trace's steps or ``--batch-tokens``.
    tokens_per_s_per_gpu: ``tokens_per_step / step_mean_us / num_gpus`` (in tokens per
        second): what each GPU serves at the estimated mean step.  The step counts the MoE
        layers only (dispatch, expert compute, combine), so this is a figure to compare
        scenarios by, an upper bound rather than a serving rate.
    baseline: the scenario this row is judged against (:func:`with_verdicts`), None for a
        baseline and rows without figures.
    versus_baseline: ``step_p99_us / baseline's - 1`` (negative: faster).
    versus_baseline_mean: ``step_mean_us / baseline's - 1``.
    verdict: the p99 change in words (:func:`placer.summary.verdict`), e.g. ``verdict:
        2x-dgx-h100 R=16 cpsat is 4.1% faster than 2x-dgx-h100 R=16 eplb on held-out step
        p99``; ``"baseline"`` for a baseline.
    outcome: the verdict in one word: ``baseline``, ``faster``, ``slower`` or ``equal``
        (within ``placer.summary.EQUAL_TOLERANCE``).
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
    step_p50_us: float | None = None
    step_mean_us: float | None = None
    tokens_per_step: float | None = None
    tokens_per_s_per_gpu: float | None = None
    baseline: str | None = None
    versus_baseline: float | None = None
    versus_baseline_mean: float | None = None
    verdict: str | None = None
    outcome: str | None = None

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
    "step_p50_us": "step_p50_us",
    "step_mean_us": "step_mean_us",
}


@dataclass(frozen=True)
class Column:
    """How a row field is shown in the text table (JSON and CSV carry raw values).

    A figure's column (``metric`` set) takes its header and number format from the metric
    table (:mod:`placer.metrics`); the others (the scenario, changes, solver, status)
    declare their own.
    """

    field: str
    header: str
    fmt: str = "{}"
    metric: Metric | None = None

    @classmethod
    def of(cls, field: str, key: str | None = None) -> Column:
        """The column of row field ``field``, shown as metric ``key`` (default: the
        evaluator key :data:`METRIC_FIELDS` maps it to, else ``field`` itself)."""
        entry = metric(key or METRIC_FIELDS.get(field, field))
        return cls(field, entry.header, entry.fmt, entry)

    def cell(self, row: CompareRow) -> str:
        value = getattr(row, self.field)
        if self.metric is not None:
            return self.metric.cell(value)
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            return "-"
        return self.fmt.format(value)


#: Columns of the text table, in order (units in the headers).
TABLE_COLUMNS = (
    Column("scenario", "scenario"),
    Column("num_gpus", "GPUs"),
    Column("num_nodes", "nodes"),
    Column("slots_per_gpu", "slots/GPU"),
    *map(Column.of, (
        "kv_left_gb", "hot_shard_ratio", "batch_hot_shard_p99", "remote_copies_per_token_gpu",
        "remote_copies_per_token_node", "bytes_per_token_intra", "bytes_per_token_inter",
        "all_to_all_us", "moe_layer_p50_us", "moe_layer_p99_us", "step_p99_us",
        "step_mean_us", "tokens_per_s_per_gpu")),
    Column("versus_baseline", "Δ p99", "{:+.1%}"),
    Column("versus_baseline_mean", "Δ mean", "{:+.1%}"),
    Column("outcome", "verdict"),
    Column("solver_status", "solver"),
    Column("solve_seconds", "solve s", "{:.2f}"),
    Column("status", "status"),
)


#: Columns of the compact table (the default): what a scenario costs and how it compares,
#: in at most :data:`COMPACT_WIDTH` characters for scenario labels of up to 30.  JSON, CSV
#: and the wide table (:data:`TABLE_COLUMNS`) carry the rest.
COMPACT_COLUMNS = tuple(c for c in TABLE_COLUMNS if c.field in (
    "scenario", "num_gpus", "step_p99_us", "step_mean_us", "tokens_per_s_per_gpu",
    "versus_baseline", "versus_baseline_mean", "outcome", "status"))
#: The widest a compact table is meant to be (a terminal of 120 columns).
COMPACT_WIDTH = 120

#: Columns whose cells are text (left-aligned); the others are numbers (right-aligned).
_TEXT_FIELDS = ("scenario", "outcome", "solver_status", "status")

#: Change columns: ``=`` within ``placer.summary.EQUAL_TOLERANCE``, ``base`` for a baseline.
_CHANGE_FIELDS = ("versus_baseline", "versus_baseline_mean")


def table_cells(row: CompareRow, columns: Sequence[Column] = TABLE_COLUMNS) -> list[str]:
    """The text-table cells of ``row``, one per entry of ``columns`` (``Δ p99`` and
    ``Δ mean``: ``base`` for a baseline, ``=`` within ``placer.summary.EQUAL_TOLERANCE``;
    ``verdict``: ``base`` for a baseline)."""
    cells = []
    is_base = row.outcome == BASELINE_NOTE
    for col in columns:
        value = getattr(row, col.field)
        if col.field in _CHANGE_FIELDS and value is not None and (
                abs(value) < EQUAL_TOLERANCE):
            cells.append("=")
        elif is_base and ((col.field in _CHANGE_FIELDS and value is None)
                          or col.field == "outcome"):
            cells.append("base")
        else:
            cells.append(col.cell(row))
    return cells


#: ``verdict`` and ``outcome`` of a baseline row.
BASELINE_NOTE = "baseline"

#: The solver whose rows are the baselines: EPLB, the placement every engine ships.
BASELINE_SOLVER = "eplb"

#: The baseline rule in one line (under the table, and in docs/compare.md).
BASELINE_RULE = ("Δ p99, Δ mean: step p99 and mean against the row's baseline (base): EPLB"
                 " at the same redundancy on the same topology; EPLB rows, and rows without an"
                 " EPLB twin, against the topology's first EPLB row (its first row when no EPLB"
                 " ran); negative is faster")


def baselines(rows: Sequence[CompareRow]) -> list[int | None]:
    """Index of each row's baseline in ``rows`` (None: the row is a baseline, or has no
    step p99).

    A row's baseline is the :data:`BASELINE_SOLVER` row at the same redundancy on the same
    topology (what the row would replace); that row itself, and rows without such a twin,
    are judged against the topology's *anchor*: its first EPLB row, or its first row when
    no EPLB row ran.  Only rows that ran with a step p99 take part.  Per topology, because
    a step's batch may depend on the GPUs (``--tokens-per-gpu`` makes it ``tokens x G``):
    the same topology always judges the same batches.
    """
    anchor: dict[str, int] = {}
    first: dict[str, int] = {}
    twin: dict[tuple[str, int], int] = {}
    for i, row in enumerate(rows):
        if not _judged(row):
            continue
        first.setdefault(row.topology, i)
        if row.solver == BASELINE_SOLVER:
            anchor.setdefault(row.topology, i)
            twin.setdefault((row.topology, row.redundant), i)
    out: list[int | None] = []
    for i, row in enumerate(rows):
        if not _judged(row):
            out.append(None)
            continue
        base = twin.get((row.topology, row.redundant))
        if base is None or base == i:
            base = anchor.get(row.topology, first[row.topology])
        out.append(None if base == i else base)
    return out


def with_verdicts(rows: Sequence[CompareRow], on: str = "step p99") -> list[CompareRow]:
    """``rows`` with ``baseline``, ``versus_baseline`` (step p99), ``versus_baseline_mean``,
    ``verdict`` and ``outcome`` against their baseline (:func:`baselines`); a baseline row
    gets ``verdict`` and ``outcome`` ``"baseline"``.  ``on`` names the judged figure in the
    verdict (e.g. ``"held-out step p99"``)."""
    out = []
    for row, index in zip(rows, baselines(rows), strict=True):
        if index is None:
            judged = _judged(row)
            out.append(replace(row, baseline=None, versus_baseline=None,
                               versus_baseline_mean=None,
                               verdict=BASELINE_NOTE if judged else None,
                               outcome=BASELINE_NOTE if judged else None))
            continue
        base = rows[index]
        assert row.step_p99_us is not None and base.step_p99_us is not None
        said = verdict(row.scenario, base.scenario, row.step_p99_us, base.step_p99_us, on=on)
        mean = None
        if row.step_mean_us is not None and base.step_mean_us:
            mean = row.step_mean_us / base.step_mean_us - 1.0
        out.append(replace(
            row, baseline=base.scenario, versus_baseline=None if said is None else said.change,
            versus_baseline_mean=mean, verdict=None if said is None else said.text,
            outcome=None if said is None else said.outcome))
    return out


def _judged(row: CompareRow) -> bool:
    return row.ok and row.step_p99_us is not None and math.isfinite(row.step_p99_us)


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


def format_table(rows: Sequence[CompareRow], *, wide: bool = False) -> str:
    """The comparison as an aligned plain-text table (text left, numbers right):
    :data:`COMPACT_COLUMNS`, or every column of :data:`TABLE_COLUMNS` when ``wide``.

    A row that did not run shows ``does not fit [n]`` or ``error [n]`` in its status
    cell; the reasons follow the table as numbered notes (identical reasons share a
    number), so the table stays as wide as its figures.
    """
    columns = TABLE_COLUMNS if wide else COMPACT_COLUMNS
    header = [c.header for c in columns]
    status_at = [c.field for c in columns].index("status")
    short, notes = status_notes(rows)
    body = []
    for row, status in zip(rows, short, strict=True):
        cells = table_cells(row, columns)
        cells[status_at] = status
        body.append(cells)
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h)
              for i, h in enumerate(header)]
    left = {i for i, c in enumerate(columns) if c.field in _TEXT_FIELDS}

    def line(cells: list[str]) -> str:
        parts = [c.ljust(w) if i in left else c.rjust(w)
                 for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "  ".join(parts).rstrip()

    sep = "  ".join("-" * w for w in widths)
    lines = [line(header), sep, *(line(b) for b in body)]
    if any(r.outcome == BASELINE_NOTE for r in rows):
        lines += ["", BASELINE_RULE]
    if notes:
        lines.append("")
        lines.extend(f"[{i}] {reason}" for i, reason in enumerate(notes, 1))
    return "\n".join(lines) + "\n"


def row_fields() -> list[str]:
    """Names of every :class:`CompareRow` field, in order (the CSV header)."""
    return [f.name for f in fields(CompareRow)]
