"""``placer report``: one self-contained HTML page about a trace and its placements.

Thin: read the trace, the model, the topology and each placement; evaluate each
placement on the trace (:func:`placer.evaluate.evaluate`); build the report
(:func:`placer.report.sections.placement_report`) and write it atomically.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from placer.cli.command import examples, placer_command
from placer.cli.common import (
    handle_errors,
    judge_sample_for,
    print_json,
    read_trace,
    recorded_by,
    recorded_name,
)
from placer.cli.options import (
    allow_model_mismatch_option,
    dispatch_option,
    dpi_option,
    dtype_option,
    engine_option,
    eval_option,
    format_option,
    json_option,
    layer_option,
    mode_option,
    model_option,
    name_option,
    output_option,
    placement_option,
    png_dir_option,
    quiet_option,
    seed_option,
    tokens_per_gpu_option,
    topology_option,
    workload_option,
)
from placer.cli.regime import judged_as, placements_regime
from placer.cli.summary import judged_doc, judged_line
from placer.errors import UsageError
from placer.stats.windows import default_split, parse_window_range, resolve_window_range

if TYPE_CHECKING:
    from placer.evaluate import PartEvaluation
    from placer.model import ModelSpec
    from placer.topology import Topology

EXAMPLES = examples(
    "placer report traces/qwen3-30b-a3b.npz -p eplb.json -p cpsat.json -m qwen3-30b-a3b"
    " -t 2x-dgx-h100 -o report.html",
    "placer report trace.npz -p plan.json --name deployed -m deepseek-v3 -t 4x-dgx-h100"
    " --engine sglang -o report.html --png-dir pictures/ --json",
    note="What the page shows: docs/compare.md.",
)

def report(
    trace: list[Path] = typer.Argument(
        ..., metavar="TRACE", help="Routing trace or load statistics file(s).", show_default=False
    ),
    placement: list[Path] = placement_option("repeat to put up to 4 side by side"),
    topology: str | None = topology_option(recorded=True),
    model: str | None = model_option(recorded=True),
    output: Path = output_option("HTML file"),
    name: list[str] = name_option(
        "Label of each placement, in order (default: the file's stem).", many=True),
    layer: int | None = layer_option(),
    engine: str | None = engine_option(),
    workload: str | None = workload_option(),
    tokens_per_gpu: int | None = tokens_per_gpu_option(),
    dispatch: str | None = dispatch_option(),
    mode: str | None = mode_option(),
    seed: int = seed_option(),
    dtype: str | None = dtype_option(),
    held_out: str | None = eval_option(),
    trace_format: str | None = format_option(),
    allow_model_mismatch: bool = allow_model_mismatch_option(),
    png_dir: Path | None = png_dir_option(),
    dpi: int = dpi_option(),
    json_out: bool = json_option("what was written and each placement's metrics"),
    quiet: bool = quiet_option(),
) -> None:
    """Write an HTML report: trace statistics, placements side by side, and pictures."""
    labels = _labels(placement, name)
    _check_outputs(output, png_dir, dpi)
    from placer import __version__
    from placer.cli.common import write_pictures, write_text_atomic
    from placer.evaluate import evaluate_many
    from placer.io.fileio import all_or_nothing
    from placer.placement.document import read_placement
    from placer.report.sections import placement_report
    from placer.report.settings import command_line, evaluation_settings_rows
    from placer.report.verdicts import placement_judgements
    from placer.stats.analysis import summarize

    placements = [read_placement(p) for p in placement]
    regime, note = placements_regime(placements, placement, engine, workload, tokens_per_gpu,
                                     dispatch, mode, seed)
    model_spec, topo = _cluster(placements, model, topology)
    routing = read_trace(trace, trace_format, model=model_spec,  # bounded, as plan keeps
                         sample=judge_sample_for(regime.batch_tokens(topo.num_gpus),
                                                 regime.seed),
                         allow_model_mismatch=allow_model_mismatch)
    windows = _judged_windows(routing.stats.num_windows, held_out)
    if not quiet:
        sys.stderr.write(f"evaluating {', '.join(labels)} on windows"
                         f" {windows[0]}:{windows[1]}\n")
    part = evaluate_many(list(zip(labels, placements, strict=True)), routing, topo, model_spec,
                         regime, dtype=dtype, held_out=windows)[0]
    evaluations = [e for _, e in part.evaluations]
    params = evaluations[0].params
    subtitle = (f"{', '.join(str(t) for t in trace)} · model {model_spec.name} · topology"
                f" {topo.name} · {regime.describe()}")
    built = placement_report(routing.stats, summarize(routing.stats), labels, placements,
                             evaluations, node_of_gpu=topo.node_of_gpu, layer=layer,
                             subtitle=subtitle, dpi=dpi,
                             settings=[("trace", ", ".join(str(t) for t in trace)),
                                       ("judged on", _judged_on(part)),
                                       *evaluation_settings_rows(
                                           regime, params, model=model_spec.name,
                                           topology=topo.name,
                                           default_dtype=model_spec.default_dtype)],
                             command=command_line())
    with all_or_nothing():  # the page and its pictures land together, or none of them
        write_text_atomic(output, built.html(footer=f"placer {__version__}"))
        if png_dir is not None:
            write_pictures(built.pictures, png_dir, quiet=True)
    if not quiet:
        sys.stderr.write(f"wrote {output}\n")
        if png_dir is not None:
            sys.stderr.write(f"wrote {len(built.pictures)} PNG file(s) to {png_dir}\n")
    judged = placement_judgements(labels, evaluations)[1:] if len(labels) > 1 else []
    if not json_out:
        sys.stdout.write(judged_as(regime, note) + "\n")
        if judged_line(part):
            sys.stdout.write(judged_line(part) + "\n")
        for j in judged:  # the answer on stdout, one line per placement after the first
            sys.stdout.write(j.line + "\n")
        return
    print_json({
        "output": str(output),
        "pictures": ([str(png_dir / f"{stem}.png") for stem, _ in built.pictures]
                     if png_dir is not None else []),
        "trace": [str(t) for t in trace], "model": model_spec.name, "topology": topo.name,
        "regime": {**regime.to_dict(), "note": note},
        "windows": list(windows), "judged": judged_doc(part),
        "params": {"dtype": dtype or model_spec.default_dtype,
                   "batch_tokens": params.batch_tokens, "num_batches": params.num_batches,
                   "sample": params.sample},
        "placements": [{"name": label, "path": str(path), "metrics": e.metrics}
                       for label, path, e in zip(labels, placement, evaluations,
                                                 strict=True)],
        "verdicts": [{"name": j.name, "baseline": j.baseline, "step_p99_change": j.change,
                      "word": j.word, "line": j.line} for j in judged],
        "command": command_line(),
    })


def _judged_on(part: PartEvaluation) -> str:
    """The settings row: the judged windows, and what of a sampled trace was judged."""
    start, stop = part.windows
    return judged_line(part).removeprefix("judged on ") or f"windows {start}:{stop}"


def _check_outputs(output: Path, png_dir: Path | None, dpi: int) -> None:
    """What the page needs before any work: matplotlib, a valid resolution, the folders."""
    from placer.cli.outputs import check_output, check_output_folder
    from placer.report import require_matplotlib
    from placer.report.files import check_dpi

    require_matplotlib()
    check_dpi(dpi)
    check_output(output, where="--output")
    if png_dir is not None:
        check_output_folder(png_dir, where="--png-dir")


def _labels(placement: list[Path], name: list[str]) -> list[str]:
    """The placements' labels (``--name``, else file stems), checked."""
    if name and len(name) != len(placement):
        raise UsageError(f"{len(name)} --name for {len(placement)} --placement", where="--name",
                         hint="give one --name per --placement, or none")
    if len(placement) > 4:
        raise UsageError(f"at most 4 placements fit side by side, got {len(placement)}",
                         where="--placement", hint="report 1 to 4 placements at a time")
    labels = list(name) or [p.stem for p in placement]
    if len(set(labels)) != len(labels):
        raise UsageError("two placements have the same label", where="--name",
                         hint="give each placement a --name")
    return labels


def _cluster(placements: list[Any], model: str | None,
             topology: str | None) -> tuple[ModelSpec, Topology]:
    """The model and topology: the flags, else the ones the placements record (which also
    outrank configured defaults: :func:`register`)."""
    from placer.model import load_model
    from placer.topology import load_topology

    return (load_model(model or recorded_name(placements, "model", "--model")),
            load_topology(topology or recorded_name(placements, "topology", "--topology")))


def _judged_windows(num_windows: int, held_out: str | None) -> tuple[int, int]:
    """``--eval``'s windows, else the held-out part of the default split (as ``placer
    compare`` judges), else every window."""
    if held_out is not None:
        return resolve_window_range(parse_window_range(held_out, option="--eval"),
                                    num_windows, option="--eval")
    split = default_split(num_windows)
    return split[1] if split is not None else (0, num_windows)


def register(app: typer.Typer) -> None:
    """Add ``placer report`` to ``app``."""
    # the model and topology the placements record outrank configured defaults
    command = placer_command(model=recorded_by("placement", "model"),
                             topology=recorded_by("placement", "topology"))
    app.command("report", cls=command, epilog=EXAMPLES)(handle_errors(report))
