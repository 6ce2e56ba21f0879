"""Measured timings: the CSV ``placer calibrate`` fits, read, checked and written.

Format (``docs/calibrate.md``): UTF-8 CSV, one header row naming the columns (any
order), then one row per measurement.  Blank lines and lines starting with ``#`` are
comments.  The ``benchmark`` column says what a row measured:

``all_to_all``
    one dispatch or combine phase of an MoE all-to-all (one row of DeepEP's test output,
    or ``bench/gpu_microbench.py``): ``phase`` (dispatch | combine), ``mode`` (normal |
    low_latency | low_latency_rdma), ``num_gpus``, ``gpus_per_node``,
    ``tokens_per_gpu``, ``hidden``, ``top_k``, ``num_experts``, ``top_groups`` (0 = no
    group limit), ``dtype`` (fp8 | bf16, the dispatch payload), ``measured_us``.  Each
    row is an :class:`~placer.calibrate.cases.AllToAllCase`.
``expert_gemm``
    one GPU running its local experts' FFNs (grouped GEMMs): ``num_experts`` (local
    experts), ``tokens_per_expert``, ``hidden``, ``ffn`` (the expert's intermediate
    size), ``dtype`` (bf16 | fp8 | mxfp4, the weights), ``measured_us``.

``note`` is an optional free-text column.  Cells of columns a row's benchmark does not
use stay empty; a header may leave out the columns no row uses.  A comment line
``# gpu: NAME`` declares the GPU type the rows were measured on (a topology's GPU type
name, e.g. ``h800-sxm``): ``placer calibrate`` warns when the topology's GPUs are others
(:mod:`placer.calibrate.hardware`).
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from placer import constants
from placer.calibrate.cases import AllToAllCase
from placer.errors import DataError, UsageError
from placer.io.fileio import write_text_atomic
from placer.regime import MODES

ALL_TO_ALL = "all_to_all"
EXPERT_GEMM = "expert_gemm"
BENCHMARKS = (ALL_TO_ALL, EXPERT_GEMM)
PHASES = ("dispatch", "combine")
#: Dispatch payloads of all-to-all rows; weight dtypes of GEMM rows.
A2A_DTYPES = ("fp8", "bf16")
GEMM_DTYPES = ("bf16", "fp8", "mxfp4")

#: Columns in the order placer writes them.
COLUMNS = (
    "benchmark", "phase", "mode", "num_gpus", "gpus_per_node", "tokens_per_gpu", "hidden",
    "top_k", "num_experts", "top_groups", "tokens_per_expert", "ffn", "dtype",
    "measured_us", "note",
)
#: Columns each benchmark needs (besides ``benchmark`` and ``measured_us``).
FIELDS = {
    ALL_TO_ALL: ("phase", "mode", "num_gpus", "gpus_per_node", "tokens_per_gpu", "hidden",
                 "top_k", "num_experts", "top_groups", "dtype"),
    EXPERT_GEMM: ("num_experts", "tokens_per_expert", "hidden", "ffn", "dtype"),
}
_ALWAYS = ("benchmark", "measured_us", "note")
#: What each column holds (error hints).
_MEANING = {
    "phase": "dispatch or combine",
    "mode": "the communication mode: normal (DeepEP normal kernels), low_latency (one copy"
            " per selection, NVLink inside a node) or low_latency_rdma (all through the NICs)",
    "num_gpus": "EP ranks taking part",
    "gpus_per_node": "ranks per node (the base topology's first node must have as many GPUs)",
    "tokens_per_gpu": "tokens each rank dispatches",
    "hidden": "the model width, elements",
    "top_k": "experts each token selects",
    "num_experts": "routed experts (all_to_all: all of them; expert_gemm: the GPU's own)",
    "top_groups": "node groups a token may use, 0 for no group limit",
    "tokens_per_expert": "tokens each local expert processes",
    "ffn": "the expert's intermediate size (moe_intermediate_size)",
    "dtype": "fp8 or bf16 dispatch payload (all_to_all); bf16, fp8 or mxfp4 weights"
             " (expert_gemm)",
    "measured_us": "the measured time in microseconds, e.g. 123.4",
}
_SEE_DOCS = "see docs/calibrate.md, 'Timings CSV'"
#: Largest value of each integer column (docs/limits.md): a case is routed in memory.
_LIMITS = {
    "num_gpus": constants.MAX_GPUS, "gpus_per_node": constants.MAX_GPUS,
    "tokens_per_gpu": constants.MAX_CALIBRATE_TOKENS, "hidden": constants.MAX_MODEL_DIM,
    "top_k": constants.MAX_TOP_K, "num_experts": constants.MAX_EXPERTS,
    "top_groups": constants.MAX_EXPERTS, "tokens_per_expert": constants.MAX_CALIBRATE_TOKENS,
    "ffn": constants.MAX_MODEL_DIM,
}


@dataclass(frozen=True)
class AllToAllTiming:
    """One measured all-to-all phase.

    Attributes
    ----------
    case: the configuration (routing as DeepEP's tests draw it).
    phase: ``dispatch`` or ``combine``.
    measured_us: measured time of the phase, microseconds.
    note: free text.  where: ``file:line`` it was read from (empty when built in code).
    """

    case: AllToAllCase
    phase: str
    measured_us: float
    note: str = ""
    where: str = ""

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise UsageError(f"unknown phase {self.phase!r}", hint="dispatch or combine")
        _check_time(self.measured_us)

    @property
    def benchmark(self) -> str:
        return ALL_TO_ALL

    @property
    def label(self) -> str:
        c = self.case
        groups = f" g{c.top_groups}" if c.top_groups else ""
        return (f"{c.mode} EP{c.num_gpus}/{c.gpus_per_node} {self.phase}"
                f" {c.tokens_per_gpu}t {c.dtype}{groups}")

    def record(self) -> dict[str, str]:
        c = self.case
        values: dict[str, object] = {
            "phase": self.phase, "mode": c.mode, "num_gpus": c.num_gpus,
            "gpus_per_node": c.gpus_per_node, "tokens_per_gpu": c.tokens_per_gpu,
            "hidden": c.hidden, "top_k": c.top_k, "num_experts": c.num_experts,
            "top_groups": c.top_groups, "dtype": c.dtype,
        }
        return _record(ALL_TO_ALL, values, self.measured_us, self.note)


@dataclass(frozen=True)
class GemmTiming:
    """One GPU's grouped expert FFN (``num_experts`` local experts), measured.

    Attributes
    ----------
    num_experts: local experts run.  tokens_per_expert: tokens each of them processes.
    hidden: model width.  ffn: expert intermediate size.
    dtype: expert weights, ``bf16``, ``fp8`` or ``mxfp4``.
    measured_us: microseconds for all experts.  note, where: as :class:`AllToAllTiming`.
    """

    num_experts: int
    tokens_per_expert: int
    hidden: int
    ffn: int
    dtype: str
    measured_us: float
    note: str = ""
    where: str = ""

    def __post_init__(self) -> None:
        for name in ("num_experts", "tokens_per_expert", "hidden", "ffn"):
            if getattr(self, name) < 1:
                raise UsageError(f"expected {name} >= 1, got {getattr(self, name)}")
        if self.dtype not in GEMM_DTYPES:
            raise UsageError(f"unknown expert dtype {self.dtype!r}",
                             hint=f"one of: {', '.join(GEMM_DTYPES)}")
        _check_time(self.measured_us)

    @property
    def benchmark(self) -> str:
        return EXPERT_GEMM

    @property
    def label(self) -> str:
        return (f"gemm {self.num_experts}x h{self.hidden} f{self.ffn} {self.tokens_per_expert}t"
                f" {self.dtype}")

    def record(self) -> dict[str, str]:
        values: dict[str, object] = {
            "num_experts": self.num_experts, "tokens_per_expert": self.tokens_per_expert,
            "hidden": self.hidden, "ffn": self.ffn, "dtype": self.dtype,
        }
        return _record(EXPERT_GEMM, values, self.measured_us, self.note)


Timing = AllToAllTiming | GemmTiming


def _check_time(value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"expected a measured time > 0 µs, got {value}")


def format_us(value: float) -> str:
    """A time as the CSV writes it: enough digits to read back the same float."""
    return repr(float(value))


def _record(benchmark: str, values: dict[str, object], measured_us: float,
            note: str) -> dict[str, str]:
    out = {name: "" for name in COLUMNS}
    out.update({k: str(v) for k, v in values.items()})
    out["benchmark"] = benchmark
    out["measured_us"] = format_us(measured_us)
    out["note"] = note
    return out


# -- writing --------------------------------------------------------------------------


def format_timings(rows: Iterable[Timing], comments: Sequence[str] = ()) -> str:
    """The CSV text of ``rows``: ``# comment`` lines, the header, one line per row."""
    buf = io.StringIO()
    for line in comments:
        buf.write(f"# {line}\n" if line else "#\n")
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(row.record())
    return buf.getvalue()


def write_timings(path: str | os.PathLike[str], rows: Iterable[Timing],
                  comments: Sequence[str] = ()) -> None:
    """Write ``rows`` to ``path`` atomically (:func:`format_timings`)."""
    write_text_atomic(path, format_timings(rows, comments))


# -- reading --------------------------------------------------------------------------


def read_timings(path: str | os.PathLike[str]) -> list[Timing]:
    """Read and check a timings CSV (module docstring).

    Raises DataError naming ``file:line:column`` and the column for every problem.
    """
    p = Path(path)
    try:
        with open(p, "rb") as f:
            data = f.read(constants.MAX_DOCUMENT_BYTES + 1)
        text = data.decode("utf-8-sig")
    except FileNotFoundError:
        raise DataError(f"no such file: {p}", hint="give the timings CSV's path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read {p}: {exc}", hint="a timings CSV is UTF-8 text") from None
    if len(data) > constants.MAX_DOCUMENT_BYTES:
        raise DataError(
            f"the file is larger than {constants.MAX_DOCUMENT_BYTES >> 20} MiB, the most placer"
            " reads of a timings CSV", where=str(p),
            hint="a timings CSV holds one row per measurement (limits: docs/limits.md)",
        )
    return parse_timings(text, str(path))


def parse_timings(text: str, source: str = "<text>") -> list[Timing]:
    """Check CSV ``text`` (read from ``source``, named in errors) and return its rows."""
    header: list[str] | None = None
    header_line = 0
    rows: list[Timing] = []
    for number, line in enumerate(text.lstrip("\ufeff").splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            cells = [c.strip() for c in next(csv.reader([line]))]
        except csv.Error as exc:  # a cell past csv's field size limit, a NUL byte
            raise DataError(f"not a CSV row ({exc})", where=f"{source}:{number}",
                            hint=f"one measurement per row; {_SEE_DOCS}") from None
        if header is None:
            header = _header(cells, source, number)
            header_line = number
            continue
        rows.append(_row(header, cells, source, number))
    if header is None or not rows:
        raise DataError(
            "no timing rows" if header is not None else "the file is empty",
            where=f"{source}:{header_line}" if header is not None else source,
            hint=f"one header row, then one row per measurement; {_SEE_DOCS}",
        )
    return rows


def _header(cells: list[str], source: str, line: int) -> list[str]:
    known = set(COLUMNS)
    if cells and cells[0] in BENCHMARKS:
        raise DataError(
            "the first row must be the header", where=f"{source}:{line}:1",
            hint=f"start the file with the column names, e.g. {','.join(COLUMNS)}",
        )
    seen: set[str] = set()
    for col, name in enumerate(cells, start=1):
        where = f"{source}:{line}:{col}"
        if name not in known:
            close = [c for c in COLUMNS if c.replace("_", "") == name.lower().replace("_", "")]
            did = f"did you mean '{close[0]}'? " if close else ""
            raise DataError(
                f"unknown column {name!r}", where=where,
                hint=f"{did}known columns: {', '.join(COLUMNS)}; {_SEE_DOCS}",
            )
        if name in seen:
            raise DataError(f"column {name!r} appears twice", where=where,
                            hint="name each column once")
        seen.add(name)
    for name in ("benchmark", "measured_us"):
        if name not in seen:
            raise DataError(f"the header has no {name!r} column", where=f"{source}:{line}",
                            hint=f"every timings CSV has benchmark and measured_us; {_SEE_DOCS}")
    return cells


class _Cells:
    """One data row's cells by column name, with the checks that name their cell."""

    def __init__(self, header: list[str], cells: list[str], source: str, line: int) -> None:
        self.value = dict(zip(header, cells, strict=True))
        self.column = {name: i + 1 for i, name in enumerate(header)}
        self.at = f"{source}:{line}"

    def where(self, name: str) -> str:
        return f"{self.at}:{self.column[name]}" if name in self.column else self.at

    def integer(self, name: str, low: int = 1) -> int:
        value, where = self.value[name], self.where(name)
        try:
            out = int(value)
        except ValueError:
            out = low - 1
            if value.replace(".", "", 1).isdigit() and float(value).is_integer():
                out = int(float(value))
        if out < low:
            raise DataError(f"{name}: expected an integer >= {low}, got {value!r:.40}",
                            where=where, hint=f"{_MEANING[name]}; {_SEE_DOCS}")
        if out > _LIMITS[name]:
            raise DataError(
                f"{name}: {value:.40} is more than placer handles ({_LIMITS[name]:,})",
                where=where, hint=f"{_MEANING[name]}; limits: docs/limits.md",
            )
        return out

    def choice(self, name: str, options: Sequence[str]) -> str:
        if self.value[name] not in options:
            raise DataError(
                f"{name}: expected one of {', '.join(options)}, got {self.value[name]!r}",
                where=self.where(name), hint=f"{_MEANING[name]}; {_SEE_DOCS}",
            )
        return self.value[name]

    def measured_us(self) -> float:
        try:
            measured = float(self.value["measured_us"])
        except ValueError:
            measured = math.nan
        if not (math.isfinite(measured) and measured > 0):
            raise DataError(f"measured_us: expected a time > 0 in microseconds, got"
                            f" {self.value['measured_us']!r}", where=self.where("measured_us"),
                            hint=f"{_MEANING['measured_us']}; {_SEE_DOCS}")
        return measured


def _check_columns(row: _Cells, header: list[str], benchmark: str) -> None:
    """Each column the benchmark uses is present and filled; no other column is filled."""
    fields = FIELDS[benchmark]
    value = row.value
    for name in header:
        if value[name] and name not in fields and name not in _ALWAYS:
            raise DataError(
                f"{name}: {benchmark} rows do not use this column, got {value[name]!r}",
                where=row.where(name), hint=f"leave it empty; {benchmark} rows use"
                f" {', '.join(fields)}, measured_us and note",
            )
    for name in (*fields, "measured_us"):
        if name not in row.column:
            raise DataError(
                f"{benchmark} rows need a {name!r} column and the header has none",
                where=row.at, hint=f"add {name} to the header; {_SEE_DOCS}",
            )
        if not value[name]:
            raise DataError(f"{name}: empty cell", where=row.where(name),
                            hint=f"{benchmark} rows give {', '.join(fields)} and measured_us")


def _row(header: list[str], cells: list[str], source: str, line: int) -> Timing:
    if len(cells) > len(header):
        raise DataError(
            f"the row has {len(cells)} cells, the header {len(header)}",
            where=f"{source}:{line}:{len(header) + 1}",
            hint="quote cells that contain commas (\"a, b\")",
        )
    row = _Cells(header, cells + [""] * (len(header) - len(cells)), source, line)
    benchmark = row.value["benchmark"]
    if benchmark not in BENCHMARKS:
        raise DataError(f"benchmark: unknown benchmark {benchmark!r}", where=row.where("benchmark"),
                        hint=f"one of: {', '.join(BENCHMARKS)}")
    _check_columns(row, header, benchmark)
    measured = row.measured_us()
    note = row.value.get("note", "")
    integer, choice, at = row.integer, row.choice, row.at
    try:
        if benchmark == EXPERT_GEMM:
            return GemmTiming(
                num_experts=integer("num_experts"),
                tokens_per_expert=integer("tokens_per_expert"),
                hidden=integer("hidden"), ffn=integer("ffn"),
                dtype=choice("dtype", GEMM_DTYPES), measured_us=measured, note=note, where=at,
            )
        if integer("num_gpus") * integer("tokens_per_gpu") > constants.MAX_CALIBRATE_TOKENS:
            raise DataError(
                f"num_gpus x tokens_per_gpu is more than the {constants.MAX_CALIBRATE_TOKENS:,}"
                " tokens placer routes for one case", where=row.where("tokens_per_gpu"),
                hint="measure fewer tokens per GPU (limits: docs/limits.md)",
            )
        case = AllToAllCase(
            num_gpus=integer("num_gpus"), gpus_per_node=integer("gpus_per_node"),
            tokens_per_gpu=integer("tokens_per_gpu"), hidden=integer("hidden"),
            top_k=integer("top_k"), num_experts=integer("num_experts"),
            top_groups=integer("top_groups", 0), mode=choice("mode", MODES),
            dtype=choice("dtype", A2A_DTYPES),
        )
        return AllToAllTiming(case, choice("phase", PHASES), measured, note, where=at)
    except UsageError as exc:  # the configuration's own consistency checks
        raise DataError(exc.message, where=at, hint=exc.hint or _SEE_DOCS) from None


# -- DeepEP's published tables as timings -----------------------------------------------


def deepep_timings() -> list[AllToAllTiming]:
    """Every row of DeepEP's V1 tables (:data:`placer.calibrate.deepep.PUBLISHED`) and of
    its first, pure-RDMA low-latency table (``PUBLISHED_RDMA``) as a timing: low-latency
    latencies as published, normal-kernel bandwidths turned back into the time they were
    measured from (:func:`~placer.calibrate.deepep.published_time_us`), rounded to 0.01 us.
    ``bench/data/deepep_v1.csv`` is :data:`DEEPEP_COMMENTS` and these rows
    (:func:`write_deepep_timings`)."""
    from placer.calibrate.deepep import PUBLISHED, PUBLISHED_RDMA, published_time_us

    ids_of: dict[AllToAllCase, object] = {}
    out = []
    for row in PUBLISHED + PUBLISHED_RDMA:
        ids = ids_of.setdefault(row.case, row.case.topk_ids() if row.unit != "us" else None)
        time_us = round(published_time_us(row, ids), 2)  # type: ignore[arg-type]
        figure = f"{row.figure:g} {row.unit}"
        out.append(AllToAllTiming(row.case, row.phase, time_us, note=f"published {figure}"))
    return out


DEEPEP_COMMENTS = (
    "DeepEP V1 published tables (deepseek-ai/DeepEP, docs/legacy.md): H800, ~160 GB/s NVLink,",
    "one CX7 InfiniBand 400 Gb/s NIC per GPU; hidden 7168, top-8 of 256 experts.",
    "Normal kernels publish GB/s: the time is DeepEP's test byte count on placer's routing",
    "over that bandwidth (placer.calibrate.deepep.published_time_us); low-latency: as published.",
    "Rows with mode low_latency_rdma: DeepEP's first README (February 2025), pure-RDMA kernels.",
    "gpu: h800-sxm",
    "Generated by placer.calibrate.timings.write_deepep_timings(); do not edit by hand.",
)


def write_deepep_timings(path: str | os.PathLike[str]) -> None:
    """Write DeepEP's published tables as a timings CSV (``bench/data/deepep_v1.csv``)."""
    write_timings(path, deepep_timings(), DEEPEP_COMMENTS)
