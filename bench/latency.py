"""Latency benchmark: the default plan against EPLB on estimated MoE-layer time.

The target table: on every benchmark configuration, for the sglang and
vllm policies (``--engine``, default ``--workload decode``), the default plan's estimated
step p99 on held-out windows must never be above EPLB's; on the multi-node
configurations it must be at least 10% lower (DeepSeek-V3 shape, EP32) and 5% lower
(Qwen3-30B-A3B on 2 nodes).

Every row runs the path ``placer plan`` runs: ``read_routing`` (the model's ``top_k``;
per-token routing kept for the replay when the data has it), ``build_problem`` (model,
topology, slots or redundant experts, ``--fit``), ``solve(problem, "cpsat",
SolveParams(jobs=os.cpu_count(), regime=Regime(engine, "decode")))`` with every other
setting at its default, EPLB (``--solver eplb``: deepseek-ai/EPLB's ``rebalance_experts``
exactly; it reads no workload, so it is solved once per configuration), and
``placer.summary.summarize_plan`` for the side-by-side on the windows ``--fit`` left out.

Configurations (rows whose data is absent are skipped with a line saying so):

- gpt-oss-20b on 4 GPUs x 9 slots and 8 GPUs x 5 slots (H100 nodes as in a DGX H100),
  real aggregated ``load_coact.npz``: one window, so judged on the fitted window with
  batches sampled from the statistics;
- Qwen3-30B-A3B on one DGX H100 (8 GPUs x 18 slots) and on 2 x DGX H100 (16 GPUs x
  9 slots): 16 redundant experts both; real aggregated statistics (one window) converted
  from the JSON by ``traces/convert_qwen3.py`` as ``bench/planning.py`` does;
- Mixtral-8x7B on 4 GPUs x 3 slots and 8 GPUs x 2 slots: the real per-token vLLM logs
  (GSM8K then HumanEval) in windows of 16 tokens, fitted on the first half of the windows
  and replayed on the second;
- DeepSeek-V3 shape on 4 x DGX H100 (EP32, 32 redundant): a synthetic trace with
  group-limited routing (``placer synth --skew S``: 65,536 tokens, 8 groups / top 4,
  8 clusters, drift 0.02, 4,096 tokens per step over 32 ranks, seed 1), fitted on windows
  0:12 and replayed on 12:16;
- Kimi-K2 shape on GB200 NVL72 (72 GPUs x 6 slots = 48 redundant): a synthetic trace made
  likewise (no groups: Kimi-K2 has one), 9,216 tokens per step (the decode batch of 72
  ranks) over 72 ranks, fitted on 0:12, replayed on 12:16.

Each synthetic configuration runs at the three skew presets (``S`` = real, mild, heavy;
:mod:`bench.skews`), same seeds, each under every engine; prefill rows at real skew only.
Every row states its trace's measured skew (median layer's Gini / CV / max÷mean).  The
targets are judged on the real-data and real-skew rows; heavy skew is sensitivity only.

Synthetic traces are written under ``bench/out/`` (git-ignored) and reused when present.
While developing: ``PLACER_BENCH_LATENCY_ONLY=key,key`` runs only the named configurations
(keys: ``CONFIG_KEYS``; a synthetic one at every skew, or at one as ``deepseek-v3-real``);
``PLACER_BENCH_LATENCY_ENGINES=vllm,trtllm`` only those engines (add ``prefill`` for the
prefill rows; unset: every engine and the prefill rows).
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.__main__ import SHARED_DATA
from bench.skews import (
    REPORT_SOURCE,
    SKEW_LABELS,
    SKEWS,
    Measured,
    measure,
    scaling_table,
    skew_order,
)
from placer.cli.summary import judged_text
from placer.metrics import metric

OUT = Path(__file__).resolve().parent / "out"
#: Engines whose dispatch policy each configuration is planned and judged under.
ENGINES = ("sglang", "vllm", "trtllm")
#: Configurations also planned and judged for prefill (vLLM, 4,096 tokens per GPU, normal
#: all-to-all): the target "prefill rows never above EPLB".
PREFILL_KEYS = ("gpt-oss-8x5", "qwen3-2n", "deepseek-v3")
#: Tokens per window of the Mixtral logs (as bench/planning.py reads them).
MIXTRAL_WINDOW_TOKENS = 16
#: Multi-node targets: configuration key -> the least relative reduction of
#: step p99 against EPLB.
TARGETS = {"deepseek-v3": 0.10, "qwen3-2n": 0.05}


def log(message: str) -> None:
    print(f"[bench]   {message}", file=sys.stderr, flush=True)


# -- one configuration ------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """One benchmark configuration.

    Attributes
    ----------
    key: short name (``PLACER_BENCH_LATENCY_ONLY``, :data:`TARGETS`).
    label: the table's configuration cell.
    model: model preset.
    topology: a callable returning the ``Topology``.
    routing: a callable returning the ``RoutingData`` (None: data absent).
    slots_per_gpu, redundant: ``--slots-per-gpu`` or ``--redundant`` (one of them).
    fit: ``--fit START:STOP`` (None: every window).
    note: what the table should say about this configuration.
    skew: the ``placer synth --skew`` preset of a synthetic trace (None: real data).
    """

    key: str
    label: str
    model: str
    topology: Callable[[], Any]
    routing: Callable[[], Any]
    slots_per_gpu: int | None = None
    redundant: int | None = None
    fit: tuple[int, int] | Callable[[Any], tuple[int, int]] | None = None
    note: str = ""
    skew: str | None = None

    @property
    def name(self) -> str:
        """``key``, with the skew of a synthetic configuration: ``deepseek-v3-real``."""
        return self.key if self.skew is None else f"{self.key}-{self.skew}"

    @property
    def row_label(self) -> str:
        """The table's configuration cell: the label, with a synthetic trace's skew."""
        return self.label if self.skew is None else f"{self.label}, {self.skew} skew"


@dataclass
class Row:
    """One (configuration, engine) line of the table."""

    config: str
    engine: str  # "vllm", or "vllm prefill" for a prefill row
    judged: str
    eplb_step_p99: float
    eplb_layer_p99: float
    cpsat_step_p99: float
    cpsat_layer_p99: float
    change: float
    verdict: str
    seconds: float
    status: str = ""
    key: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    skew: str | None = None  # the synth preset; None: real data
    measured: Measured | None = None  # the trace's skew
    base_label: str = ""  # the configuration without its skew

    @property
    def not_above(self) -> bool:
        """cpsat's step p99 is not above EPLB's (the Done-when condition)."""
        return self.cpsat_step_p99 <= self.eplb_step_p99


def _say_warnings(caught: Sequence[warnings.WarningMessage], where: str) -> None:
    """One stderr line per distinct warning (first 160 characters)."""
    seen: set[str] = set()
    for w in caught:
        text = " ".join(str(w.message).split())
        if text in seen:
            continue
        seen.add(text)
        short = text if len(text) <= 160 else text[:157] + "..."
        log(f"{where}: {w.category.__name__}: {short}")


def compare_engines(
    key: str, label: str, routing: Any, model: Any, topology: Any, *,
    slots_per_gpu: int | None = None, redundant: int | None = None,
    fit: tuple[int, int] | None = None, engines: Sequence[str] = ENGINES,
    jobs: int | None = None, time_limit_s: float | None = None, workload: str = "decode",
    options: dict[str, Any] | None = None,
) -> list[Row]:
    """Plan one configuration as ``placer plan`` does, once per engine, and judge each
    plan against EPLB with ``summarize_plan``.

    ``routing`` is what ``read_routing`` returned (every window); ``model`` and
    ``topology`` are specs; ``fit`` the fitted windows.  ``jobs`` defaults to every core
    (as ``placer plan``); ``time_limit_s`` None keeps the default (tests pass less);
    ``options``: cpsat's own options (``--option KEY=VALUE``; None: the defaults).
    """
    from placer.planning.build import ProblemSpec, build_problem
    from placer.planning.solvers import solve
    from placer.problem import SolveParams
    from placer.regime import Regime
    from placer.summary import BASELINE_SOLVER, summarize_plan

    problem = build_problem(routing, ProblemSpec(
        model=model, topology=topology, slots_per_gpu=slots_per_gpu, redundant=redundant,
        fit=fit))
    extra: dict[str, Any] = {} if time_limit_s is None else {"time_limit_s": time_limit_s}
    jobs = jobs or os.cpu_count() or 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        baseline = solve(problem, BASELINE_SOLVER, SolveParams(jobs=jobs, **extra))
    _say_warnings(caught, f"{label} eplb")
    rows = []
    for engine in engines:
        regime = Regime(engine, workload)
        params = SolveParams(jobs=jobs, regime=regime, options=options, **extra)
        started = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = solve(problem, "cpsat", params)
        seconds = time.perf_counter() - started
        _say_warnings(caught, f"{label} {engine} cpsat")
        log(f"{label}, {engine}: cpsat {seconds:.1f} s ({result.status}); judging ...")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            summary = summarize_plan(problem, result, baseline, routing, regime=regime,
                                     fit=fit)
            per_batch = (None if summary.batch_floor is None else
                         (summary.batch_floor[baseline.solver], summary.batch_floor[result.solver]))
        _say_warnings(caught, f"{label} {engine} summary")
        if not summary.times:
            raise RuntimeError(f"{label} {engine}: no estimated times ({summary.times_note})")
        mine, theirs = summary.times[result.solver], summary.times[baseline.solver]
        change = mine["step_p99_us"] / theirs["step_p99_us"] - 1.0
        verdict = summary.verdict
        assert summary.judged is not None
        rows.append(Row(
            config=label, engine=engine if workload == "decode" else f"{engine} {workload}",
            judged=judged_text(summary.judged),
            eplb_step_p99=theirs["step_p99_us"], eplb_layer_p99=theirs["layer_p99_us_median"],
            cpsat_step_p99=mine["step_p99_us"], cpsat_layer_p99=mine["layer_p99_us_median"],
            change=change, verdict=verdict.outcome if verdict is not None else "-",
            seconds=seconds, status=result.status, key=key,
            extra={"layers_faster": summary.layers,
                   "a2a": (theirs["all_to_all_us"], mine["all_to_all_us"]),
                   "compute": (theirs["compute_us"], mine["compute_us"]),
                   "floor": (summary.floor or {}).get("step_mean_us", math.nan),
                   "mean": (theirs["step_mean_us"], mine["step_mean_us"]),
                   "gaps": summary.gaps(), "batch_floor": per_batch,
                   "copies": _copies(summary, (baseline.solver, result.solver))},
        ))
        log(f"{label}, {engine}: step p99 eplb {theirs['step_p99_us']:.1f} µs,"
            f" cpsat {mine['step_p99_us']:.1f} µs ({change:+.2%})")
    return rows


#: The remote-copy figures the floor counts beside the plans' (where the floor is loose).
COPY_KEYS = ("remote_copies_per_token_gpu", "remote_copies_per_token_node")


def _copies(summary: Any, solvers: Sequence[str]) -> dict[str, tuple[float, ...]]:
    """Copies per token to another GPU and to another node: the floor's, then each of
    ``solvers``' (NaN where absent)."""
    floor = summary.floor or {}
    out = {"floor": tuple(floor.get(k, math.nan) for k in COPY_KEYS)}
    for name in solvers:
        ev = summary.evaluations.get(name)
        out[name] = tuple(ev.metrics[k] if ev is not None else math.nan for k in COPY_KEYS)
    return out


def render_traffic(rows: Sequence[Row]) -> list[str]:
    """Where the floor is loose in prefill: the remote copies per token its traffic term
    counts beside EPLB's and cpsat's (the evaluator's figures on the judged tokens)."""
    prefill = [r for r in rows if r.engine.endswith("prefill") and r.extra.get("copies")]
    if not prefill:
        return []
    lines = ["Prefill: copies per token the floor counts (at least) and the plans send:", "",
             "| configuration | to another GPU: floor / EPLB / cpsat |"
             " to another node: floor / EPLB / cpsat | EPLB above floor |",
             "|---|---|---|---|"]
    for r in prefill:
        copies = list(r.extra["copies"].values())
        cells = [" / ".join(f"{c[i]:.2f}" for c in copies) for i in range(2)]
        gap = r.extra.get("gaps", {}).get("eplb", math.nan)
        lines.append(f"| {r.config} | {cells[0]} | {cells[1]} | {gap:.1%} |")
    return lines


# -- rendering --------------------------------------------------------------------------------


def _us(key: str, value: float) -> str:
    """``value`` as every placer table shows metric ``key`` (:mod:`placer.metrics`)."""
    return metric(key).cell(value)


def _header(who: str, key: str) -> str:
    return f"{who} {metric(key).header}"


def render_table(rows: Sequence[Row]) -> list[str]:
    """The Markdown table of ``rows``; metric headings and number formats are the metric
    table's (:mod:`placer.metrics`), as in ``placer plan`` and ``placer evaluate``."""
    step, layer, mean = "step_p99_us", "layer_p99_us_median", "step_mean_us"
    a2a_key, compute_key = "all_to_all_us", "compute_us"
    lines = [
        f"| configuration | engine | skew: Gini / CV / max÷mean (class) |"
        f" {_header('EPLB', step)} | {_header('EPLB', layer)} |"
        f" {_header('cpsat', step)} | {_header('cpsat', layer)} | cpsat / EPLB - 1 | verdict |"
        f" cpsat <= EPLB | {metric(a2a_key).header} EPLB / cpsat |"
        f" {metric(compute_key).header} EPLB / cpsat |"
        f" {metric(mean).header} EPLB / cpsat / floor | above floor EPLB / cpsat |"
        f" per-batch floor {metric(step).header} EPLB / cpsat counts |"
        " above per-batch floor EPLB / cpsat | cpsat s (status) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        a2a = r.extra.get("a2a", (math.nan, math.nan))
        compute = r.extra.get("compute", (math.nan, math.nan))
        means = r.extra.get("mean", (math.nan, math.nan))
        gaps = r.extra.get("gaps", {})
        above = " / ".join(f"{gaps[n]:.1%}" if n in gaps else "-" for n in ("eplb", "cpsat"))
        per_batch = r.extra.get("batch_floor")
        if per_batch is None:
            floors = above_batch = "-"
        else:
            floors = f"{_us(step, per_batch[0])} / {_us(step, per_batch[1])}"
            above_batch = (f"{1 - per_batch[0] / r.eplb_step_p99:.1%} /"
                           f" {1 - per_batch[1] / r.cpsat_step_p99:.1%}")
        lines.append(
            f"| {r.config} | {r.engine} | {_skew_cell(r)} | {_us(step, r.eplb_step_p99)} |"
            f" {_us(layer, r.eplb_layer_p99)} | {_us(step, r.cpsat_step_p99)} |"
            f" {_us(layer, r.cpsat_layer_p99)} | {r.change:+.2%} |"
            f" {r.verdict} | {'pass' if r.not_above else '**FAIL**'} |"
            f" {_us(a2a_key, a2a[0])} / {_us(a2a_key, a2a[1])} |"
            f" {_us(compute_key, compute[0])} / {_us(compute_key, compute[1])} |"
            f" {_us(mean, means[0])} / {_us(mean, means[1])} /"
            f" {_us(mean, r.extra.get('floor', math.nan))} |"
            f" {above} | {floors} | {above_batch} | {r.seconds:.1f} ({r.status or '-'}) |"
        )
    return lines


def _skew_cell(row: Row) -> str:
    """The row's skew: measured figures and class; a synthetic preset's name when it
    differs from the class; heavy marked as sensitivity."""
    cell = "-" if row.measured is None else row.measured.cell()
    if row.skew is not None and (row.measured is None or row.measured.cls != row.skew):
        cell += f", preset {row.skew}"
    return cell + (" sensitivity" if row.skew == "heavy" else "")


def headline(rows: Sequence[Row]) -> list[Row]:
    """The rows the targets are judged on: real data and real skew."""
    return [r for r in rows if r.skew in (None, "real")]


def _lower(change: float) -> str:
    """``-0.088`` -> ``8.8% lower``; ``0.012`` -> ``1.2% higher``."""
    return f"{abs(change):.1%} {'lower' if change <= 0 else 'higher'}"


def closing_line(rows: Sequence[Row], targets: dict[str, float] = TARGETS) -> str:
    """How many rows have cpsat's step p99 <= EPLB's, and each multi-node target (on the
    real-data and real-skew rows)."""
    good = sum(r.not_above for r in rows)
    parts = [f"cpsat's held-out step p99 <= EPLB's on {good} of {len(rows)} rows"]
    for key, need in targets.items():
        mine = [r for r in headline(rows) if r.key == key]
        if not mine:
            parts.append(f"{key} >= {need:.0%} lower: not run")
            continue
        figures = ", ".join(f"{r.engine} {_lower(r.change)}" for r in mine)
        met = all(-r.change >= need for r in mine)
        parts.append(f"{mine[0].config} >= {need:.0%} lower on every engine:"
                     f" {'met' if met else 'not met'} ({figures})")
    return "; ".join(parts) + "."


def round_robin_targets_line(rows: Sequence[Row]) -> str:
    """The round-robin targets: round-robin rows of the DeepSeek-V3 shape and Qwen3 on 2
    nodes >= 3% below EPLB or EPLB within 3% of its per-batch floor; SGLang DeepSeek-V3
    >= 10% below (real-data and real-skew rows); prefill rows never above EPLB."""
    parts = []
    for r in headline(rows):
        if r.key not in ("deepseek-v3", "qwen3-2n") or r.engine not in ("vllm", "trtllm"):
            continue
        floors = r.extra.get("batch_floor") or (math.nan, math.nan)
        within = 1 - floors[0] / r.eplb_step_p99
        mine = 1 - floors[1] / r.cpsat_step_p99
        met = -r.change >= 0.03 or within <= 0.03
        parts.append(f"{r.config} {r.engine}: {_lower(r.change)}, EPLB {within:.1%} above its"
                     f" per-batch floor, cpsat {mine:.1%} above its own"
                     f" ({'met' if met else 'not met'})")
    for r in headline(rows):
        if r.key == "deepseek-v3" and r.engine == "sglang":
            parts.append(f"{r.config} sglang: {_lower(r.change)}"
                         f" ({'met' if -r.change >= 0.10 else 'not met'})")
    prefill = [r for r in rows if r.engine.endswith("prefill")]
    if prefill:
        good = sum(r.not_above for r in prefill)
        parts.append(f"prefill rows not above EPLB: {good} of {len(prefill)}")
    return ("Round-robin targets: " + "; ".join(parts) + "." if parts
            else "Round-robin targets: no rows.")


# -- data -------------------------------------------------------------------------------------


def h100_node(num_gpus: int) -> Any:
    """One node of ``num_gpus`` H100 SXM GPUs, otherwise the ``dgx-h100`` preset."""
    import yaml

    from placer.topology import load_topology, preset_text, topology_from_dict

    if num_gpus == 8:
        return load_topology("dgx-h100")
    doc = yaml.safe_load(preset_text("dgx-h100"))
    doc["name"] = f"{num_gpus}x-h100"
    doc["description"] = f"{num_gpus} x H100 SXM 80 GB on NVSwitch (a DGX H100 cut to size)"
    doc["nodes"][0]["gpus"] = num_gpus
    return topology_from_dict(doc)


def synth_trace(path: Path, model: str, skew: str | None = None, **overrides: Any) -> Path:
    """A ``placer synth`` trace of ``model``'s shape at ``path``, written when absent.

    ``skew``: a ``placer synth --skew`` preset (:data:`bench.skews.SKEWS`), as the command
    applies it (:func:`placer.traces.synth.skew.with_skew`); None keeps ``zipf``.
    ``overrides`` are :class:`placer.traces.synth.SynthParams` fields (``num_tokens``, ``zipf``,
    ``clusters``, ``drift``, ``tokens_per_step``, ``num_ranks``, ``seed``, ...).
    """
    from placer.model import load_model
    from placer.traces.synth import params_for_model, write_synth
    from placer.traces.synth.skew import with_skew

    if path.exists():
        log(f"reusing {path}")
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    params = params_for_model(load_model(model), **overrides)
    if skew is not None:
        params = with_skew(params, skew)
    partial = path.with_name(path.name + ".partial.npz")
    info = write_synth(partial, params, format="npz")
    partial.replace(path)
    log(f"wrote {path}: {info['tokens']:,} tokens x {info['layers']} layers in"
        f" {info['seconds']:.1f} s")
    return path


def read(source: Path | list[Path], model: str, **kwargs: Any) -> Any:
    """``read_routing`` with the model's ``top_k``; warnings to stderr."""
    from placer.model import load_model
    from placer.traces import read_routing

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        paths = [str(p) for p in source] if isinstance(source, list) else str(source)
        data = read_routing(paths, top_k=load_model(model).top_k, **kwargs)
    _say_warnings(caught, f"read {model}")
    return data


def _real(folder: Path) -> list[Config]:
    from bench import planning
    from placer.topology import load_topology

    def gpt_oss() -> Any:
        path = planning.REAL / "gpt-oss-20b" / "load_coact.npz"
        return read(path, "gpt-oss-20b") if path.exists() else None

    cache: dict[str, Any] = {}

    def qwen3() -> Any:
        if "qwen3" not in cache:
            cache["qwen3"] = planning.qwen3(folder)
        return cache["qwen3"]

    def mixtral() -> Any:
        if "mixtral" not in cache:
            files = planning.mixtral_files("gsm8k", "humaneval")
            cache["mixtral"] = None if files is None else read(
                files, "mixtral-8x7b", window_tokens=MIXTRAL_WINDOW_TOKENS, keep_tokens=True)
        return cache["mixtral"]

    def first_half(routing: Any) -> tuple[int, int]:
        return (0, routing.stats.num_windows // 2)

    one_window = "real aggregated statistics"
    mixtral_note = (f"real per-token logs (GSM8K then HumanEval) in {MIXTRAL_WINDOW_TOKENS}-token"
                    " windows, fitted on the first half; the held-out half is fewer tokens than"
                    " one decode batch (128 per GPU), so its p99 is that one batch")
    return [
        Config("gpt-oss-4x9", "gpt-oss-20b 4x9", "gpt-oss-20b", lambda: h100_node(4), gpt_oss,
               slots_per_gpu=9, note=one_window),
        Config("gpt-oss-8x5", "gpt-oss-20b 8x5", "gpt-oss-20b", lambda: h100_node(8), gpt_oss,
               slots_per_gpu=5, note=one_window),
        Config("qwen3-1n", "Qwen3-30B-A3B dgx-h100 8x18", "qwen3-30b-a3b",
               lambda: load_topology("dgx-h100"), qwen3, redundant=16, note=one_window),
        Config("qwen3-2n", "Qwen3-30B-A3B 2x-dgx-h100 16x9", "qwen3-30b-a3b",
               lambda: load_topology("2x-dgx-h100"), qwen3, redundant=16, note=one_window),
        Config("mixtral-4x3", "Mixtral-8x7B 4x3", "mixtral-8x7b", lambda: h100_node(4), mixtral,
               slots_per_gpu=3, fit=first_half, note=mixtral_note),
        Config("mixtral-8x2", "Mixtral-8x7B 8x2", "mixtral-8x7b", lambda: h100_node(8), mixtral,
               slots_per_gpu=2, fit=first_half, note=mixtral_note),
    ]


#: Synthetic traces: key -> (file under OUT, model, SynthParams overrides).  The latency
#: rows take every override but ``zipf`` and apply a ``placer synth --skew`` preset instead
#: (:func:`skew_overrides`, :func:`synth_path`), the same seed at every skew; the file and
#: ``zipf`` 1.0 are the Zipf-1.0 trace ``bench replan`` still reads.
SYNTH = {
    "deepseek-v3": ("synth-deepseek-v3.npz", "deepseek-v3", {
        "num_tokens": 65_536, "num_groups": 8, "top_groups": 4, "zipf": 1.0, "clusters": 8,
        "drift": 0.02, "tokens_per_step": 4096, "num_ranks": 32, "seed": 1}),
    "kimi-k2": ("synth-kimi-k2.npz", "kimi-k2", {
        "num_tokens": 16 * 9216, "zipf": 1.0, "clusters": 8, "drift": 0.02,
        "tokens_per_step": 9216, "num_ranks": 72, "seed": 1}),
}


def skew_overrides(key: str) -> dict[str, Any]:
    """The overrides of synthetic configuration ``key`` without its Zipf exponent (a skew
    preset sets one per layer)."""
    return {k: v for k, v in SYNTH[key][2].items() if k != "zipf"}


def synth_path(key: str, skew: str) -> Path:
    """Where the trace of synthetic configuration ``key`` at ``skew`` is kept."""
    return OUT / f"{Path(SYNTH[key][0]).stem}-{skew}.npz"


def _synthetic(skews: Sequence[str] = SKEWS) -> list[Config]:
    """Every synthetic configuration at each of ``skews``, skew by skew (real first)."""
    from placer.topology import load_topology

    def trace(key: str, skew: str) -> Callable[[], Any]:
        model = SYNTH[key][1]
        return lambda: read(synth_trace(synth_path(key, skew), model, skew=skew,
                                        **skew_overrides(key)), model, keep_tokens=True)

    out = []
    for skew in skews:
        made = f"synthetic (`placer synth --skew {skew}`)"
        out += [
            Config("deepseek-v3", "DeepSeek-V3 shape 4x-dgx-h100 EP32 (+32)", "deepseek-v3",
                   lambda: load_topology("4x-dgx-h100"), trace("deepseek-v3", skew),
                   redundant=32, fit=(0, 12), skew=skew,
                   note=f"{made}, group-limited routing (top 4 of 8 groups), 65,536 tokens in"
                   " 16 steps of 4,096"),
            Config("kimi-k2", "Kimi-K2 shape gb200-nvl72 72x6 (+48)", "kimi-k2",
                   lambda: load_topology("gb200-nvl72"), trace("kimi-k2", skew), redundant=48,
                   fit=(0, 12), skew=skew,
                   note=f"{made}, no expert groups, 147,456 tokens in 16 steps of 9,216"),
        ]
    return out


CONFIG_KEYS = ("gpt-oss-4x9", "gpt-oss-8x5", "qwen3-1n", "qwen3-2n", "mixtral-4x3",
               "mixtral-8x2", "deepseek-v3", "kimi-k2")


# -- the section ------------------------------------------------------------------------------


def run() -> str:
    with tempfile.TemporaryDirectory(prefix="placer-bench-") as folder:
        return _run(Path(folder))


INTRO = (
    "Each row runs `placer plan`'s path: `read_routing`, `build_problem`, cpsat with"
    " default settings (`jobs` = {cores} cores, `--engine` as shown,"
    " `--workload decode`, 128 tokens per GPU), EPLB = `--solver eplb`, and"
    " `summarize_plan` side by side on held-out windows (per-token replay when the"
    " data is per-token). Step = one batch through every MoE layer; layer p99 ="
    " each layer's p99 over batches, median layer. Verdict: `summarize_plan`'s, on"
    " step p99 (equal within 0.1%); pass: cpsat's step p99 not above EPLB's at all"
    " (the target: \"never above\"). Skew: the trace's median layer's Gini / CV /"
    " max÷mean (`placer.stats.skew`) and its class against measured routing; synthetic"
    " configurations run at the three `placer synth --skew` presets with the same seeds"
    " (real first; heavy is heavier than any measured routing: sensitivity only); the"
    " targets are judged on the real-data and real-skew rows. a2a / compute: the slowest"
    " GPU's all-to-all and"
    " expert GEMM time, mean over (batch, layer). Status FALLBACK: cpsat kept its"
    " EPLB hint. cpsat's search is time-limited (the default budgets), so on a"
    " loaded machine a row can differ from run to run. Floor: `placer.evaluate.time_bound`,"
    " the mean step no placement with these slots per GPU can beat on the judged"
    " tokens under the evaluator's model (docs/planner.md, the floor); above floor:"
    " how far each plan's mean step is above it, as a share of its own. Per-batch"
    " floor (round-robin engines: vLLM's hash, TensorRT-LLM's blocks):"
    " the plan summary's `batch_floor` (`placer.evaluate.hot_floor.counts_floor`), each"
    " batch's hottest GPU under every placement with EPLB's / cpsat's replica counts,"
    " summed over layers, p99 over batches; above it: share of the plan's own step"
    " p99. Rows `vllm prefill`:"
    " `--workload prefill` (4,096 tokens per GPU, normal all-to-all), at real skew only.")


def selected(configs: Sequence[Config], only: set[str]) -> list[Config]:
    """``configs`` named in ``only`` by key (every skew) or name (``deepseek-v3-real``);
    all of them when ``only`` is empty."""
    return [c for c in configs if not only or c.key in only or c.name in only]


def chosen_engines() -> tuple[tuple[str, ...], bool]:
    """``PLACER_BENCH_LATENCY_ENGINES``: the decode engines to run, and whether to run the
    prefill rows (every engine and prefill when unset)."""
    named = [e.strip() for e in os.environ.get("PLACER_BENCH_LATENCY_ENGINES", "").split(",")
             if e.strip()]
    if not named:
        return ENGINES, True
    return tuple(e for e in ENGINES if e in named), "prefill" in named


def _run(folder: Path) -> str:
    only = {k.strip() for k in os.environ.get("PLACER_BENCH_LATENCY_ONLY", "").split(",")
            if k.strip()}
    engines, prefill = chosen_engines()
    out = ["## latency: estimated MoE-layer time, cpsat vs EPLB", "",
           INTRO.format(cores=os.cpu_count()), "", f"Sources: {REPORT_SOURCE}.", ""]
    configs: list[Config] = []
    notes: list[str] = []
    if SHARED_DATA.exists():
        configs += _real(folder)
    else:
        notes.append(f"- real-data rows skipped: {SHARED_DATA} is absent")
    configs += _synthetic()
    if only or engines != ENGINES or not prefill:
        configs = selected(configs, only)
        out += [f"(subset: {', '.join(sorted(only)) or 'every configuration'};"
                f" engines {', '.join(engines)}{', prefill' if prefill else ''})", ""]
    rows: list[Row] = []
    for config in configs:
        got, note = run_config(config, engines, prefill)
        rows += got
        notes.append(note)
    rows.sort(key=lambda r: skew_order(r.skew))  # stable: configuration order within
    out += render_table(rows)
    out += ["", *notes, "", *scaling_table(rows), "", *render_traffic(rows), "",
            closing_line(rows), "", round_robin_targets_line(rows)]
    return "\n".join(out) + "\n"


def run_config(config: Config, engines: Sequence[str] = ENGINES,
               prefill: bool = True) -> tuple[list[Row], str]:
    """The rows of one configuration (each engine; prefill where :data:`PREFILL_KEYS` and
    the skew is real or real data) with its measured skew, and its note line."""
    from placer.model import load_model

    started = time.perf_counter()
    label = config.row_label
    log(f"{label} ...")
    routing = config.routing()
    if routing is None:
        log(f"{label}: data absent, skipped")
        return [], f"- {label}: skipped, data absent"
    measured = measure(routing.stats.load, routing.stats.layer_ids)
    fit = config.fit(routing) if callable(config.fit) else config.fit
    shape = {"slots_per_gpu": config.slots_per_gpu, "redundant": config.redundant, "fit": fit}
    got = compare_engines(config.key, label, routing, load_model(config.model),
                          config.topology(), engines=engines, **shape) if engines else []
    if prefill and config.key in PREFILL_KEYS and config.skew in (None, "real"):
        got += compare_engines(config.key, label, routing, load_model(config.model),
                               config.topology(), engines=("vllm",), workload="prefill",
                               **shape)
    for r in got:
        r.skew, r.measured, r.base_label = config.skew, measured, config.label
    judged = got[0].judged if got else "(no engine run)"
    log(f"{label} done in {time.perf_counter() - started:.1f} s")
    return got, (f"- {label}: {config.note}; skew {SKEW_LABELS[config.skew]}, measured"
                 f" {measured.cell()}; judged on {judged}")


if __name__ == "__main__":
    print(run())
