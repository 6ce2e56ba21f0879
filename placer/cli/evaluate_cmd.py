"""``placer evaluate``: judge placements on a routing trace, side by side.

Thin: read the trace (keeping per-token routing as ``placer plan`` does: the whole trace
while it is small, else a sample of whole batches per window,
:func:`placer.cli.common.judge_sample_for`), the model, the topology and each
placement; judge them all on the fitted and held-out parts
(:func:`placer.evaluate.evaluate_many`); print one table per part with a column per
placement (or JSON).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from placer.cli.command import examples, placer_command
from placer.cli.common import (
    err,
    handle_errors,
    judge_sample_for,
    out,
    print_json,
    read_trace,
    recorded_by,
    recorded_name,
)
from placer.cli.options import (
    allow_model_mismatch_option,
    dispatch_option,
    dtype_option,
    engine_option,
    eval_option,
    fit_option,
    format_option,
    json_option,
    keep_warmup_option,
    mode_option,
    model_option,
    placement_option,
    quiet_option,
    seed_option,
    tokens_per_gpu_option,
    topology_option,
    window_tokens_option,
    workload_option,
)
from placer.cli.regime import judged_as, placements_regime
from placer.cli.summary import judged_doc, judged_line
from placer.errors import PlacerError
from placer.evaluate import Evaluation, PartEvaluation, evaluate_many
from placer.metrics import METRICS
from placer.regime import Regime
from placer.stats.windows import parse_window_range

EXAMPLES = examples(
    "placer evaluate traces/synthetic-small.jsonl.gz -p eplb.json -p cpsat.json --fit 0:6"
    " --eval 6:8",
    "placer evaluate trace.npz -p plan.json -m deepseek-v3 -t 4x-dgx-h100 --engine sglang"
    " --workload decode --json",
    note="The metrics and how batches are replayed: docs/evaluate.md.",
)

def column_names(paths: list[Path]) -> list[str]:
    """File stems, made unique with the parent folder or an index when they repeat."""
    names = [p.stem for p in paths]
    for i, name in enumerate(names):
        if names.count(name) > 1:
            names[i] = f"{paths[i].parent.name}/{paths[i].stem}" if paths[i].parent.name else name
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in seen:
            seen[name] += 1
            names[i] = f"{name}#{seen[name]}"
        else:
            seen[name] = 1
    return names


def evaluation_report(
    parts: list[dict[str, Any]], *, trace: list[str], model: str, topology: str,
    regime: Regime, note: str, judged: list[PartEvaluation], dtype: str,
) -> dict[str, Any]:
    """The JSON document of ``placer evaluate --json``: the regime, and each part's
    parameters (batches replayed or sampled) and figures."""
    for part, done in zip(parts, judged, strict=True):
        params = done.evaluations[0][1].params if done.evaluations else None
        if params is not None:
            part["params"] = {"batch_tokens": params.batch_tokens,
                              "num_batches": params.num_batches, "sample": params.sample}
        part["judged"] = judged_doc(done)
    return {
        "trace": trace,
        "model": model,
        "topology": topology,
        "dtype": dtype,
        "regime": {**regime.to_dict(), "note": note},
        "parts": parts,
    }


def render_part(part: dict[str, Any]) -> Table:
    """One table: metric rows, a column per placement, then what each metric is."""
    start, stop = part["windows"]
    table = Table(
        title=f"{part['name']}: windows {start}:{stop} ({part['source']}"
              + (f"; {part['ranks']}" if part.get("ranks") else "") + ")",
        box=box.SIMPLE_HEAD, title_justify="left",
    )
    table.add_column("metric", no_wrap=True)
    table.add_column("unit", no_wrap=True)
    for column in part["placements"]:
        table.add_column(column["name"], justify="right", no_wrap=True)
    table.add_column("what", no_wrap=True)
    for entry in METRICS:
        table.add_row(entry.key, entry.unit, *(entry.cell(c["metrics"].get(entry.key))
                                               for c in part["placements"]), entry.what)
    return table


def evaluate_cmd(
    trace: list[Path] = typer.Argument(
        ..., metavar="TRACE", help="Routing trace file(s) (per-token or aggregated statistics)."
    ),
    placement: list[Path] = placement_option("repeat for one column each"),
    topology: str | None = topology_option(recorded=True),
    model: str | None = model_option(recorded=True),
    engine: str | None = engine_option(),
    workload: str | None = workload_option(),
    tokens_per_gpu: int | None = tokens_per_gpu_option(),
    dispatch: str | None = dispatch_option(),
    mode: str | None = mode_option(),
    fit: str | None = fit_option("the placements were fitted on"),
    held_out: str | None = eval_option(),
    dtype: str | None = dtype_option(),
    seed: int = seed_option(),
    window_tokens: int | None = window_tokens_option(),
    trace_format: str | None = format_option(),
    json_out: bool = json_option("the results"),
    keep_warmup: bool = keep_warmup_option(),
    allow_model_mismatch: bool = allow_model_mismatch_option(),
    quiet: bool = quiet_option(),
) -> None:
    """Evaluate placements on a routing trace: hot shard, traffic and time, side by side."""
    fit_range = parse_window_range(fit, option="--fit") if fit is not None else None
    eval_range = parse_window_range(held_out, option="--eval") if held_out is not None else None

    from placer.model import load_model
    from placer.placement.document import read_placement
    from placer.topology import load_topology
    placements = []
    for path in placement:
        try:
            placements.append(read_placement(path))
        except PlacerError as e:
            e.where = e.where or str(path)
            raise
    regime, note = placements_regime(placements, placement, engine, workload, tokens_per_gpu,
                                     dispatch, mode, seed)
    model_name = model or recorded_name(placements, "model", "--model")
    topology_name = topology or recorded_name(placements, "topology", "--topology")
    model_spec = load_model(model_name)
    topo = load_topology(topology_name)
    # per-token routing within bounds: whole batches of the judged size, as plan keeps
    routing = read_trace(trace, trace_format, model=model_spec, window_tokens=window_tokens,
                         sample=judge_sample_for(regime.batch_tokens(topo.num_gpus),
                                                 regime.seed),
                         keep_warmup=keep_warmup, allow_model_mismatch=allow_model_mismatch)
    names = column_names(placement)
    path_of = dict(zip(names, placement, strict=True))

    def starting(label: str, part: str, windows: tuple[int, int]) -> None:
        if not quiet:
            err.print(f"evaluating {path_of[label]} on {part} windows"
                      f" {windows[0]}:{windows[1]}")

    try:
        judged = evaluate_many(list(zip(names, placements, strict=True)), routing, topo,
                               model_spec, regime, dtype=dtype, fit=fit_range,
                               held_out=eval_range, on_start=starting)
    except PlacerError as e:  # name the placement's file, not its column
        if e.where in path_of:
            e.where = str(path_of[e.where])
        raise
    report_parts = [{
        "name": part.name, "windows": list(part.windows), "source": part.source,
        "ranks": _dealt(part, topo.num_gpus),
        "placements": [_column(label, path_of[label], evaluation)
                       for label, evaluation in part.evaluations],
    } for part in judged]
    report = evaluation_report(
        report_parts, trace=[str(p) for p in trace], model=model_spec.name,
        topology=topo.name, regime=regime, note=note, judged=judged,
        dtype=dtype or model_spec.default_dtype,
    )
    if json_out:
        print_json(report)
        return
    sys.stdout.write(judged_as(regime, note) + "\n\n")
    for i, (part, done) in enumerate(zip(report_parts, judged, strict=True)):
        if i:
            sys.stdout.write("\n")
        if judged_line(done):
            sys.stdout.write(judged_line(done) + "\n")
        table = render_part(part)
        # wide enough for every cell: a console not attached to a terminal is 80 wide
        wide = Console(highlight=False, soft_wrap=True,
                       width=max(out.width, _table_width(part)))
        wide.print(table)


def _dealt(part: Any, num_gpus: int) -> str:
    """The trace's source ranks dealt over every GPU, in words, when they were (else "")."""
    from placer.evaluate.batches import dealt_note

    recorded = max((e.dealt_ranks for _, e in part.evaluations), default=0)
    return dealt_note(recorded, num_gpus) if recorded else ""


def _table_width(part: dict[str, Any]) -> int:
    """Characters :func:`render_part`'s table needs so that no cell is cut."""
    widths = [max(len(m.key) for m in METRICS), max(len(m.unit) for m in METRICS),
              max(len(m.what) for m in METRICS)]
    for column in part["placements"]:
        cells = [m.cell(column["metrics"].get(m.key)) for m in METRICS]
        widths.append(max(len(column["name"]), *(len(c) for c in cells)))
    return sum(widths) + 3 * len(widths) + 4


def _column(name: str, path: Path, evaluation: Evaluation) -> dict[str, Any]:
    return {
        "name": name,
        "path": str(path),
        "source": evaluation.source,
        "metrics": evaluation.metrics,
        "per_layer": {key: values for key, values in evaluation.per_layer.items()},
    }


def register(app: typer.Typer) -> None:
    """Add ``placer evaluate`` to ``app``."""
    # the model and topology the placements record outrank configured defaults
    command = placer_command(model=recorded_by("placement", "model"),
                             topology=recorded_by("placement", "topology"))
    app.command("evaluate", cls=command, epilog=EXAMPLES)(handle_errors(evaluate_cmd))
