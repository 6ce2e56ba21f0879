"""``placer calibrate``: fit link and compute efficiencies to measured timings, write an
overlay topology every ``--topology`` accepts.

Thin: read the timings CSV (:mod:`placer.calibrate.timings`), fit
(:func:`placer.calibrate.fit.fit_calibration`), print a table per row and the fitted
figures (or JSON), write ``{extends: BASE, calibration: ...}`` atomically.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer
import yaml

from placer.cli.command import PlacerCommand, examples
from placer.cli.common import handle_errors, print_json, table, write_text_atomic
from placer.cli.options import (
    json_option,
    name_option,
    output_option,
    topology_option,
)
from placer.cli.outputs import check_output
from placer.errors import UsageError

if TYPE_CHECKING:
    from placer.calibrate.fit import FitResult

_EPILOG = examples(
    "placer calibrate bench/data/deepep_v1.csv --topology dgx-h800 -o h800-cal.yaml",
    "placer topology show h800-cal.yaml",
    "placer evaluate trace.jsonl -p plan.json --topology h800-cal.yaml",
    note="Timings CSV format, the model and the fit: docs/calibrate.md. bench/gpu_microbench.py"
    " measures such a CSV on a machine with GPUs.",
)


def register(app: typer.Typer) -> None:
    """Add ``placer calibrate`` to ``app``."""
    app.command("calibrate", cls=PlacerCommand, no_args_is_help=True,
                epilog=_EPILOG)(calibrate)


def _is_path(value: str) -> bool:
    """Whether load_topology reads ``value`` as a file (not a preset name)."""
    path = Path(value)
    return path.suffix in (".yaml", ".yml") or path.is_file()


def extends_value(base: str, overlay: Path) -> str:
    """``extends:`` for an overlay written to ``overlay``: a preset name as given; a file
    relative to the overlay's folder (absolute when no relative path exists)."""
    if not _is_path(base):
        return base
    target = Path(base).resolve()
    try:
        return Path(os.path.relpath(target, overlay.resolve().parent)).as_posix()
    except ValueError:  # another drive
        return str(target)


def overlay_document(result: FitResult, base_name: str, extends: str, name: str,
                     timings: str) -> str:
    """The overlay YAML: a comment, ``extends``, ``name``, ``description``, ``calibration``."""
    doc = {
        "extends": extends,
        "name": name,
        "description": f"{base_name} with link and compute efficiencies fitted by placer"
                       f" calibrate to {timings}",
        "calibration": result.calibration.to_dict(),
    }
    head = (f"# Written by placer calibrate: {len(result.rows)} rows of {timings} on"
            f" {base_name}; rms |log(predicted/measured)| {result.rms_log_before:.3f} before,"
            f" {result.rms_log_after:.3f} after.\n"
            "# Use it as --topology in any placer command (docs/calibrate.md).\n")
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=1 << 20)
    return head + body


def _line(where: str) -> str:
    return where.rsplit(":", 1)[-1] if where else "-"


def _us(value: float) -> str:
    return f"{value:.2f}"


def _figure(value: float, is_phase: bool) -> str:
    return f"{value:.2f}" if is_phase else f"{value:.4f}"


def render(result: FitResult, timings: str, base_name: str) -> str:
    """The text report: one row per timing, then the fitted parameters."""
    gemm = sum(r.row.benchmark == "expert_gemm" for r in result.rows)
    lines = [
        f"{len(result.rows)} rows of {timings} on {base_name}"
        f" ({len(result.rows) - gemm} all-to-all, {gemm} expert GEMM)",
        "",
        table(
            ("line", "row", "measured µs", "before µs", "after µs", "before/meas",
             "after/meas"),
            [(_line(r.row.where), r.label, _us(r.measured_us), _us(r.before_us),
              _us(r.after_us), f"{r.ratio_before:.3f}", f"{r.ratio_after:.3f}")
             for r in result.rows],
            right=(2, 3, 4, 5, 6),
        ),
        "",
        f"rms |log(predicted/measured)|: {result.rms_log_before:.3f} before,"
        f" {result.rms_log_after:.3f} after",
        "",
    ]
    rows = []
    for p in result.parameters:
        phase = p.name.endswith("phase_us")
        stderr = "-" if p.stderr is None else _figure(p.stderr, phase)
        rows.append((p.name, _figure(p.base, phase), _figure(p.value, phase),
                     stderr, p.note))
    lines.append(table(("parameter", "base", "fitted", "± stderr", "note"), rows,
                       right=(1, 2, 3)))
    return "\n".join(lines)


@handle_errors
def calibrate(
    timings: Path = typer.Argument(
        ..., metavar="TIMINGS",
        help="Timings CSV: measured all-to-all phases and expert GEMMs (docs/calibrate.md)."
    ),
    topology: str = topology_option(
        "the base, the machines the timings were measured on (all-to-all rows grow its first"
        " node to their node count)", required=True),
    output: Path | None = output_option(
        "Overlay topology YAML ({extends: BASE, calibration: ...})", required=False),
    name: str | None = name_option("The overlay's name (default: BASE's name +"
                                   " '-calibrated')."),
    json_out: bool = json_option("the fit"),
) -> None:
    """Fit link efficiencies, fixed phase costs and expert compute efficiencies to
    measured timings, and write them as a topology overlay every --topology accepts."""
    from placer.calibrate.fit import fit_calibration
    from placer.calibrate.hardware import declared_gpu, warn_hardware
    from placer.calibrate.timings import read_timings
    from placer.topology import load_topology

    if output is not None:
        if output.suffix not in (".yaml", ".yml"):
            raise UsageError(f"the overlay must be a .yaml file, got {output}", where="--output",
                             hint="e.g. -o h800-calibrated.yaml (--topology reads .yaml paths)")
        if output.exists() and timings.exists() and output.resolve() == timings.resolve():
            raise UsageError("the overlay would overwrite the timings CSV", where="--output",
                             hint="write the overlay to another file")
        check_output(output, where="--output")
    base = load_topology(topology)
    rows = read_timings(timings)
    source = f"placer calibrate on {timings} ({len(rows)} rows)"
    result = fit_calibration(rows, base, source=source)
    # timings of other hardware fit figures that describe no machine: say so
    warn_hardware(result, base, declared_gpu(timings.read_text(encoding="utf-8-sig",
                                                               errors="replace")),
                  source=str(timings))
    overlay_name = name or f"{base.name}-calibrated"
    text = None
    if output is not None:
        text = overlay_document(result, base.name, extends_value(topology, output),
                                overlay_name, str(timings))
        write_text_atomic(output, text)
    if json_out:
        print_json({
            "timings": str(timings), "topology": base.name,
            "overlay": None if output is None else str(output), "name": overlay_name,
            **result.to_dict(),
        })
        return
    typer.echo(render(result, str(timings), base.name))
    typer.echo("")
    if output is None:
        typer.echo("no overlay written: add -o OVERLAY.yaml to write one")
    else:
        typer.echo(f"wrote {output} (extends {extends_value(topology, output)}): use it as"
                   f" --topology {output}")
