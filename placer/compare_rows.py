"""What-if comparison: rows and how they are shown.

:class:`CompareRow` (one scenario's figures), the text table's columns and cells,
verdicts against the baseline, status notes and the CSV header; the comparison itself
is :mod:`placer.compare`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from placer.summary import EQUAL_TOLERANCE, time_figure, verdict

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
