"""``placer report``: one self-contained HTML page about a trace and its placements.

Thin: read the trace, the model, the topology and each placement; evaluate each
placement on the trace (:func:`placer.evaluate.evaluate`); build the report
(:func:`placer.report.sections.placement_report`) and write it atomically.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import typer

from placer import constants
from placer.cli.command import PlacerCommand, examples
from placer.cli.common import (
    complete_model,
    complete_topology,
    handle_errors,
    print_json,
    read_trace,
)
from placer.errors import UsageError

EXAMPLES = examples(
    "placer report traces/qwen3-30b-a3b.npz -p eplb.json -p cpsat.json -m qwen3-30b-a3b"
    " -t 2x-dgx-h100 -o report.html",
    "placer report trace.npz -p plan.json --name deployed -m deepseek-v3 -t 4x-dgx-h100"
    " --policy sglang -o report.html --png-dir pictures/ --json",
    note="What the page shows: docs/compare.md.",
)

def report(
    trace: list[Path] = typer.Argument(
        ..., metavar="TRACE", help="Routing trace or load statistics file(s).", show_default=False
    ),
    placement: list[Path] = typer.Option(
        ..., "--placement", "-p", metavar="FILE",
        help="Placement JSON (placer plan's output); repeat to put"
        " up to 4 side by side.", show_default=False,
    ),
    topology: str = typer.Option(
        ..., "--topology", "-t", metavar="NAME|FILE",
        autocompletion=complete_topology, help="Topology preset name or YAML file.",
        show_default=False,
    ),
    model: str = typer.Option(
        ..., "--model", "-m", metavar="NAME|FILE",
        autocompletion=complete_model, help="Model preset name or YAML file.",
        show_default=False,
    ),
    output: Path = typer.Option(
        ..., "--output", "-o", metavar="FILE", help="HTML file to write (atomically).",
        show_default=False,
    ),
    name: list[str] = typer.Option(
        [], "--name", metavar="LABEL",
        help="Label of each placement, in order (default: the file's stem).",
        show_default=False,
    ),
    layer: int | None = typer.Option(
        None, "--layer", metavar="ID",
        help="Absolute layer id drawn in the maps (default: the hottest).",
        show_default=False,
    ),
    policy: str = typer.Option(
        "round_robin", "--policy", metavar="POLICY",
        help="Dispatch policy: round_robin (vLLM, TensorRT-LLM), sglang (SGLang static),"
        " local_first (SGLang's earlier static), random.",
    ),
    mode: str = typer.Option(
        "normal", "--mode", metavar="MODE",
        help="All-to-all mode: normal, low_latency or low_latency_rdma (all copies via NICs).",
    ),
    dtype: str | None = typer.Option(
        None, "--dtype", metavar="DTYPE",
        help="Expert weight dtype (default: the model's).", show_default=False
    ),
    batch_tokens: int | None = typer.Option(
        None, "--batch-tokens", metavar="TOKENS",
        help="Tokens per evaluated batch (default: the trace's steps).",
        show_default=False,
    ),
    num_batches: int | None = typer.Option(
        None, "--num-batches", help="Batches sampled when the trace has only aggregated loads"
        " (default 32).", show_default=False,
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the evaluation's sampling."),
    trace_format: str | None = typer.Option(
        None, "--format", "-f", metavar="FORMAT", help="Trace format (default: detected)."
    ),
    png_dir: Path | None = typer.Option(
        None, "--png-dir", metavar="DIR", help="Also write each picture as PNG in this folder.",
        show_default=False,
    ),
    dpi: int = typer.Option(
        constants.REPORT_DPI, "--dpi", help="Resolution of the pictures, dots per inch."
    ),
    json_out: bool = typer.Option(
        False, "--json", help="Print what was written and each placement's metrics as JSON."
    ),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="No progress on stderr (warnings and errors stay)."
    ),
) -> None:
    """Write an HTML report: trace statistics, placements side by side, and pictures."""
    from placer.report import require_matplotlib

    require_matplotlib()
    from placer.report.files import check_dpi

    check_dpi(dpi)
    if name and len(name) != len(placement):
        raise UsageError(f"{len(name)} --name for {len(placement)} --placement", where="--name",
                         hint="give one --name per --placement, or none")
    if len(placement) > 4:
        raise UsageError(f"at most 4 placements fit side by side, got {len(placement)}",
                         where="--placement")
    labels = list(name) or [p.stem for p in placement]
    if len(set(labels)) != len(labels):
        raise UsageError("two placements have the same label", where="--name",
                         hint="give each placement a --name")

    from placer import __version__
    from placer.cli.common import write_pictures, write_text_atomic
    from placer.evaluate import EvalParams, evaluate
    from placer.model import load_model
    from placer.placement.document import read_placement
    from placer.report.sections import placement_report
    from placer.report.settings import command_line, evaluation_settings_rows
    from placer.report.verdicts import placement_judgements
    from placer.stats.analysis import summarize
    from placer.topology import load_topology

    params = EvalParams(policy=policy, mode=mode, dtype=dtype, batch_tokens=batch_tokens,
                        seed=seed)
    if num_batches is not None:
        params = replace(params, num_batches=num_batches)
    model_spec = load_model(model)
    topo = load_topology(topology)
    placements = [read_placement(p) for p in placement]
    routing = read_trace(trace, trace_format, model=model_spec, keep_tokens=True)
    evaluations = []
    for label, p in zip(labels, placements, strict=True):
        if not quiet:
            sys.stderr.write(f"evaluating {label} ...\n")
        evaluations.append(evaluate(p, routing, topo, model_spec, params))
    subtitle = (f"{', '.join(str(t) for t in trace)} · model {model_spec.name} · topology"
                f" {topo.name} · {policy} dispatch, {mode} mode")
    built = placement_report(routing.stats, summarize(routing.stats), labels, placements,
                             evaluations, node_of_gpu=topo.node_of_gpu, layer=layer,
                             subtitle=subtitle, dpi=dpi,
                             settings=[("trace", ", ".join(str(t) for t in trace)),
                                       *evaluation_settings_rows(
                                           params, model=model_spec.name, topology=topo.name,
                                           default_dtype=model_spec.default_dtype)],
                             command=command_line())
    write_text_atomic(output, built.html(footer=f"placer {__version__}"))
    if not quiet:
        sys.stderr.write(f"wrote {output}\n")
    if png_dir is not None:
        write_pictures(built.pictures, png_dir, quiet)
    judged = placement_judgements(labels, evaluations)[1:] if len(labels) > 1 else []
    if not json_out:
        for j in judged:  # the answer on stdout, one line per placement after the first
            sys.stdout.write(j.line + "\n")
        return
    print_json({
        "output": str(output),
        "pictures": ([str(png_dir / f"{stem}.png") for stem, _ in built.pictures]
                     if png_dir is not None else []),
        "trace": [str(t) for t in trace], "model": model_spec.name, "topology": topo.name,
        "params": {"policy": policy, "mode": mode, "dtype": dtype or model_spec.default_dtype,
                   "batch_tokens": batch_tokens, "num_batches": params.num_batches,
                   "seed": seed},
        "placements": [{"name": label, "path": str(path), "metrics": e.metrics}
                       for label, path, e in zip(labels, placement, evaluations,
                                                 strict=True)],
        "verdicts": [{"name": j.name, "baseline": j.baseline, "step_p99_change": j.change,
                      "word": j.word, "line": j.line} for j in judged],
        "command": command_line(),
    })


def register(app: typer.Typer) -> None:
    """Add ``placer report`` to ``app``."""
    app.command("report", cls=PlacerCommand, epilog=EXAMPLES)(handle_errors(report))
