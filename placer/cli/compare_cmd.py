"""``placer compare``: plan and evaluate what-if scenarios side by side.

Thin: read the trace, build the scenarios from flags or a scenario file
(:func:`placer.compare.read_study`), run :func:`placer.compare.compare` with a
progress display on stderr, and print one table (or ``--json`` / ``--csv``) on
stdout; ``--report`` and ``--png-dir`` write the pictures.
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path
from typing import Any

import typer

from placer.cli.command import examples, given, placer_command
from placer.cli.common import (
    err,
    handle_errors,
    judge_sample_for,
    print_json,
    read_trace,
    said_warnings,
    to_jsonable,
    write_pictures,
)
from placer.cli.options import (
    allow_model_mismatch_option,
    dispatch_option,
    dpi_option,
    dtype_option,
    engine_option,
    format_option,
    jobs_option,
    json_option,
    keep_warmup_option,
    kv_reserve_gb_option,
    layer_time_limit_option,
    mode_option,
    model_option,
    png_dir_option,
    quiet_option,
    ray_option,
    redundant_option,
    report_option,
    seed_option,
    slots_per_gpu_option,
    solver_option,
    time_limit_option,
    tokens_per_gpu_option,
    topology_option,
    workload_option,
)
from placer.cli.outputs import check_output, check_output_folder
from placer.cli.regime import judged_as
from placer.compare import (
    DEFAULT_P99_SLACK_PCT,
    CompareSettings,
    Grid,
    Recommendation,
    ScenarioOutcome,
    Study,
    check_names,
    format_table,
    parse_sweep,
    read_study,
    recommend,
    resolve_study,
    row_fields,
    split_routing,
)
from placer.errors import UsageError

EXAMPLES = examples(
    "placer compare traces/qwen3-30b-a3b.npz -m qwen3-30b-a3b -t dgx-h100 -t 2x-dgx-h100"
    " -r 0,16,32 -s eplb,cpsat",
    "placer compare traces/qwen3-30b-a3b.npz -m qwen3-30b-a3b -t 2x8-mi300x-roce"
    " -t gb200-nvl72 -r auto --engine sglang --p99-target-us 7000",
    "placer compare trace.npz -m deepseek-v3 -t 4x-dgx-h100 --slots-per-gpu 8..10 --engine sglang"
    " --csv > rows.csv",
    "placer compare --scenarios study.yaml --report compare.html --png-dir pictures/",
    note="Scenario files, columns and the report: docs/compare.md.",
)

#: Version of the ``--json`` document.
COMPARE_FORMAT, COMPARE_VERSION = "placer-compare", 1


def parse_name_list(texts: list[str]) -> list[str]:
    """Repeated and comma-separated names (``--solver eplb,cpsat --solver linear``), in order."""
    out: list[str] = []
    for text in texts:
        out.extend(p.strip() for p in text.split(",") if p.strip())
    return out


def build_study(
    scenario_file: Path | None,
    trace: list[Path],
    topologies: list[str],
    redundant: str | None,
    solvers: list[str],
    overrides: dict[str, Any],
    slots_per_gpu: str | None = None,
) -> Study:
    """The study from a scenario file or flags; settings flags override the file's values.

    The topologies x redundancies x solvers product stays a :class:`placer.compare.Grid`
    until :func:`placer.compare.resolve_study` gives each topology its valid values.
    """
    from dataclasses import replace

    if scenario_file is not None:
        if topologies or redundant is not None or slots_per_gpu is not None or solvers:
            raise UsageError(
                "scenarios come either from --scenarios or from --topology/--redundant/"
                "--slots-per-gpu/--solver",
                where="--scenarios", hint="put every scenario in the file, or drop --scenarios",
            )
        study = read_study(scenario_file)
        settings = replace(study.settings, **{k: v for k, v in overrides.items() if v is not None})
        traces = tuple(str(t) for t in trace) or study.trace
        return replace(study, settings=settings, trace=traces)
    if not topologies:
        raise UsageError("no topology to compare", where="--topology",
                         hint="give --topology at least once (a preset name or a YAML file)")
    grid = Grid(tuple(topologies), parse_sweep(redundant, slots_per_gpu),
                tuple(parse_name_list(solvers) or ["eplb"]))
    kwargs = {k: v for k, v in overrides.items() if v is not None}
    kwargs.setdefault("model", "")
    return Study((), CompareSettings(**kwargs), tuple(str(t) for t in trace), grid=grid)


def compare_json(study: Study, outcomes: list[ScenarioOutcome], description: str,
                 recommendation: Recommendation | None = None) -> dict[str, Any]:
    """The ``--json`` document: inputs, how the data was split, what the sweep skipped,
    one object per row and the recommendation."""
    s = study.settings
    return {
        "format": COMPARE_FORMAT,
        "version": COMPARE_VERSION,
        "trace": list(study.trace),
        "model": s.model,
        "evaluated_on": description,
        "regime": s.regime.to_dict(),
        "settings": {"dtype": s.dtype, "kv_reserve_gb": s.kv_reserve_gb,
                     "time_limit_s": s.time_limit_s,
                     "layer_time_limit_s": s.layer_time_limit_s, "holdout": s.holdout,
                     "p99_target_us": s.p99_target_us, "p99_slack_pct": s.p99_slack_pct},
        "notes": list(study.notes),
        "rows": [o.row.as_dict() for o in outcomes],
        "judged": [{"scenario": o.row.scenario, **o.judged} for o in outcomes if o.judged],
        "recommendation": None if recommendation is None else recommendation.to_dict(),
    }


def judged_lines(outcomes: list[ScenarioOutcome]) -> list[str]:
    """What the scenarios were judged on when the trace was read as a sample, in plan's
    words: one line when every scenario was judged alike, else one per scenario; none
    when the trace was kept whole."""
    judged = [(o.row.scenario, o.judged) for o in outcomes if o.judged]

    def said(doc: dict[str, Any]) -> str:
        of = f" of {doc['of_tokens']}" if doc["of_tokens"] > doc["num_tokens"] else ""
        return f"judged on {doc['num_tokens']}{of} tokens ({doc['why']})"

    if len({said(doc) for _, doc in judged}) == 1:
        return [said(judged[0][1])]
    return [f"{label}: {said(doc)}" for label, doc in judged]


def _judge_sample(study: Study) -> Any:
    """Per-token routing kept as plan keeps it (:func:`judge_sample_for`), in whole
    batches of the size most scenarios judge with (their GPUs x tokens per GPU); a
    scenario of another size samples batches from the statistics, and says so."""
    from collections import Counter

    from placer.topology import load_topology

    names = Counter(s.topology for s in study.scenarios)
    gpus = Counter({load_topology(name).num_gpus: 0 for name in names})
    for name, count in names.items():
        gpus[load_topology(name).num_gpus] += count
    num_gpus = gpus.most_common(1)[0][0] if gpus else 1
    regime = study.settings.regime
    return judge_sample_for(regime.batch_tokens(num_gpus), regime.seed)


def compare_csv(outcomes: list[ScenarioOutcome]) -> str:
    """One CSV line per row, every :class:`CompareRow` field (empty = no figure)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    names = row_fields()
    writer.writerow(names)
    for o in outcomes:
        values = to_jsonable(o.row.as_dict())
        writer.writerow(["" if values[n] is None else values[n] for n in names])
    return buf.getvalue()


class _Progress:
    """A progress bar on a terminal; one line per finished scenario otherwise."""

    def __init__(self, labels: list[str], quiet: bool):
        self.labels = labels
        self.done = 0
        self.quiet = quiet
        self.bar: Any = None
        self.task: Any = None

    def __enter__(self) -> _Progress:
        if not self.quiet and err.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            self.bar = Progress("scenarios", BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=err, transient=True)
            self.bar.__enter__()
            self.task = self.bar.add_task("scenarios", total=len(self.labels))
        return self

    def __call__(self, index: int, outcome: ScenarioOutcome) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.advance(self.task)
        elif not self.quiet:
            sys.stderr.write(f"[{self.done}/{len(self.labels)}] {self.labels[index]}:"
                             f" {outcome.row.status}\n")
            sys.stderr.flush()

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)


def compare(
    trace: list[Path] = typer.Argument(
        None, metavar="TRACE",
        help="Routing trace or load statistics file(s); optional with --scenarios"
        " when the file names the trace.", show_default=False,
    ),
    model: str | None = model_option(),
    topology: list[str] = topology_option(many=True),
    redundant: str | None = redundant_option("sweep"),
    slots_per_gpu: str | None = slots_per_gpu_option(sweep=True),
    solver: list[str] = solver_option(many=True),
    scenarios: Path | None = typer.Option(
        None, "--scenarios", metavar="FILE",
        help="Scenario file (YAML) instead of --topology/--redundant/"
        "--solver; see docs/compare.md.", show_default=False,
    ),
    dtype: str | None = dtype_option(),
    kv_reserve_gb: float | None = kv_reserve_gb_option(),
    time_limit: float | None = time_limit_option(),
    layer_time_limit: float | None = layer_time_limit_option(),
    seed: int | None = seed_option(default=None),
    holdout: bool | None = typer.Option(
        None, "--holdout/--no-holdout", help="Judge on held-out windows (default) or on all.",
        show_default=False,
    ),
    engine: str | None = engine_option(),
    workload: str | None = workload_option(),
    tokens_per_gpu: int | None = tokens_per_gpu_option(),
    dispatch: str | None = dispatch_option(),
    mode: str | None = mode_option(),
    p99_target_us: float | None = typer.Option(
        None, "--p99-target-us", min=0, metavar="US",
        help="Recommend the fewest GPUs whose estimated step p99 is at most this (µs)."
        " Default: no target, see --p99-slack.", show_default=False,
    ),
    p99_slack: float | None = typer.Option(
        None, "--p99-slack", min=0, metavar="PCT",
        help="Without a target, recommend the most tokens/s per GPU among the scenarios"
        f" within PCT% of the lowest step p99 (default {DEFAULT_P99_SLACK_PCT:g}).",
        show_default=False,
    ),
    trace_format: str | None = format_option(),
    keep_warmup: bool = keep_warmup_option(),
    allow_model_mismatch: bool = allow_model_mismatch_option(),
    jobs: int = jobs_option("Scenarios run"),
    ray: str | None = ray_option("Run the scenarios"),
    json_out: bool = json_option("the rows"),
    csv_out: bool = typer.Option(False, "--csv", help="Print the rows as CSV."),
    wide: bool = typer.Option(
        False, "--wide", help="Show every column of the table (hot shard, traffic, MoE-layer"
        " times, KV cache, solver); default: scenario, GPUs, step p99 and mean, tok/s/GPU,"
        " changes and verdict, in 120 columns."),
    quiet: bool = quiet_option(),
    report: Path | None = report_option(),
    png_dir: Path | None = png_dir_option(),
    dpi: int = dpi_option(),
) -> None:
    """Compare what-if scenarios (topology x redundant experts x solver) on one trace and
    recommend one."""
    if json_out and csv_out:
        raise UsageError("--json and --csv are two answers to one question", where="--csv",
                         hint="choose one")
    overrides = {"model": model, "dtype": dtype, "policy": dispatch, "mode": mode,
                 "kv_reserve_gb": kv_reserve_gb, "time_limit_s": time_limit,
                 "layer_time_limit_s": layer_time_limit, "seed": seed, "holdout": holdout,
                 "engine": engine, "workload": workload, "tokens_per_gpu": tokens_per_gpu,
                 "p99_target_us": p99_target_us, "p99_slack_pct": p99_slack}
    study = build_study(scenarios, list(trace or []), topology, redundant, solver, overrides,
                        slots_per_gpu)
    if not study.trace:
        raise UsageError("no trace to compare on", where="TRACE",
                         hint="give the trace file, or 'trace:' in the scenario file")
    study = resolve_study(study)
    for note in study.notes:  # why rows are missing: shown even with --quiet
        sys.stderr.write(f"note: {note}\n")
    check_names(study.scenarios, study.settings)
    _check_pictures(dpi, report is not None or png_dir is not None)
    if report is not None:
        check_output(report, where="--report")
    if png_dir is not None:
        check_output_folder(png_dir, where="--png-dir")
    from placer import compare as compare_lib
    from placer.model import load_model

    routing = read_trace(list(study.trace), trace_format, model=load_model(study.settings.model),
                         sample=_judge_sample(study), keep_warmup=keep_warmup,
                         allow_model_mismatch=allow_model_mismatch)
    description = split_routing(routing, study.settings.holdout).description
    if not quiet:
        sys.stderr.write(f"{len(study.scenarios)} scenario(s), {description}\n")
        sys.stderr.write(judged_as(study.settings.regime) + "\n")
    labels = [s.label for s in study.scenarios]
    with _Progress(labels, quiet=quiet) as progress:
        outcomes = compare_lib.compare(routing, study.scenarios, study.settings, jobs=jobs,
                                       ray=ray, on_done=progress,
                                       keep_details=report is not None or png_dir is not None)
    rows = [o.row for o in outcomes]
    choice = recommend(rows, p99_target_us=study.settings.p99_target_us,
                       p99_slack_pct=study.settings.p99_slack_pct)
    if json_out:
        print_json(compare_json(study, outcomes, description, choice))
    elif csv_out:
        sys.stdout.write(compare_csv(outcomes))
        sys.stderr.write("".join(f"{line}\n" for line in (*judged_lines(outcomes), choice.line)))
    else:
        sys.stdout.write(format_table(rows, wide=wide))
        sys.stdout.write("\n" + "".join(f"{line}\n" for line in
                                         (*judged_lines(outcomes), choice.line)))
    if report is not None or png_dir is not None:
        _write_report(study, outcomes, routing, description, report, png_dir, dpi, quiet,
                      said=(choice.line, *said_warnings()))


def _check_pictures(dpi: int, wanted: bool) -> None:
    """The resolution, and matplotlib when pictures are wanted: before the long part."""
    from placer.report.files import check_dpi

    check_dpi(dpi)
    if wanted:
        from placer.report import require_matplotlib

        require_matplotlib()


def _write_report(
    study: Study,
    outcomes: list[ScenarioOutcome],
    routing: Any,
    description: str,
    report: Path | None,
    png_dir: Path | None,
    dpi: int,
    quiet: bool = False,
    said: tuple[str, ...] = (),
) -> None:
    """The HTML page and pictures; ``said``: the recommendation line, then the warnings,
    as the terminal says them."""
    from placer import __version__
    from placer.cli.common import write_text_atomic
    from placer.report.sections import compare_report
    from placer.report.settings import command_line
    from placer.stats.analysis import summarize
    from placer.topology import load_topology

    split = split_routing(routing, study.settings.holdout)
    nodes = {}
    for s in study.scenarios:
        if s.topology not in nodes:
            nodes[s.topology] = load_topology(s.topology).node_of_gpu
    subtitle = f"{', '.join(study.trace)} · model {study.settings.model}"
    # what a sampled trace was judged on, as the terminal says it, beside the windows
    description = "; ".join(part for part in (description, *judged_lines(outcomes)) if part)
    built = compare_report(outcomes, split.judge_stats, summarize(routing.stats),
                           description=description, node_of_gpu=nodes, subtitle=subtitle,
                           dpi=dpi, settings=study.settings, scenarios=study.scenarios,
                           command=command_line(), recommendation=said[:1],
                           warnings=said[1:])
    if report is not None:
        write_text_atomic(report, built.html(footer=f"placer {__version__}"))
        if not quiet:
            sys.stderr.write(f"wrote {report}\n")
    if png_dir is not None:
        write_pictures(built.pictures, png_dir, quiet)


#: The options whose configured defaults a scenario file's settings outrank.
SCENARIO_SETTINGS = ("engine", "workload", "tokens_per_gpu", "topology", "solver", "model",
                     "dtype", "kv_reserve_gb", "seed")


def register(app: typer.Typer) -> None:
    """Add ``placer compare`` to ``app``."""
    # configured defaults yield to a scenario file's own settings
    scenario_file = given("scenarios")
    command = placer_command(**{name: scenario_file for name in SCENARIO_SETTINGS})
    app.command("compare", cls=command, epilog=EXAMPLES)(handle_errors(compare))
