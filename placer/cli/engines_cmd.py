"""``placer export`` and ``placer import``: placements to and from serving-engine files.

Thin: read the placement (or engine file), resolve the model, call
:func:`placer.engines.export_engine` / :func:`placer.engines.read_engine`, print.
:mod:`placer.cli.exports` parses ``placer plan --export``; both write with
:func:`placer.engines.export_engine`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from placer.cli.command import examples, given, placer_command
from placer.cli.common import (
    handle_errors,
    print_json,
    recorded_by,
)
from placer.cli.options import (
    format_option,
    json_option,
    model_option,
    num_gpus_option,
    output_option,
    topology_option,
)
from placer.cli.outputs import check_output
from placer.engines import (
    export_engine,
    get_engine,
    read_engine,
    sniff_engine,
)
from placer.errors import UsageError
from placer.io.fileio import check_not_inputs
from placer.placement import Placement

if TYPE_CHECKING:
    from placer.model import ModelSpec

EXPORT_EXAMPLES = examples(
    "placer export plan.json --format sglang -o plan.sglang.json",
    "placer export plan.json --format trtllm -o plan.trtllm.yaml --model deepseek-v3",
    "placer export plan.json --format vllm -o plan.vllm.json --json",
    note="Each engine's file and how it loads it: docs/engines.md.",
)
IMPORT_EXAMPLES = examples(
    "placer import deployed.sglang.json --model deepseek-v3 --topology 4x-dgx-h100"
    " -o deployed.json",
    "placer import plan.vllm.json --format vllm --model qwen3-30b-a3b --ep-size 16"
    " -o current.json",
    note="Then re-plan from it: placer plan NEW_TRACE ... --current deployed.json"
    " (docs/engines.md).",
)

def resolve_model(name: str | None, placement: Placement | None = None) -> ModelSpec:
    """``--model`` if given, else the model named in the placement file."""
    from placer.model import load_model

    if name is None and placement is not None:
        declared = placement.meta.get("model")
        name = declared.get("name") if isinstance(declared, dict) else None
    if name is None:
        raise UsageError(
            "the model is needed to lay out engine files (hidden and MoE layers)",
            where="--model",
            hint="pass --model with a preset name or a model YAML",
        )
    return load_model(name)


def export(
    placement_file: Path = typer.Argument(
        ..., metavar="PLACEMENT", show_default=False,
        help="Placement JSON written by `placer plan` or `placer import`.",
    ),
    fmt: str = format_option("engine"),
    output: Path = output_option("Engine file"),
    model: str | None = model_option(recorded=True),
    json_out: bool = json_option("the result"),
) -> None:
    """Write a placement in a serving engine's format and print how to load it."""
    from placer.placement.document import read_placement

    get_engine(fmt).check_output(output, where="--output")
    check_output(output, where="--output")
    check_not_inputs([("--output", output)], [placement_file])
    placement = read_placement(placement_file)
    spec = resolve_model(model, placement)
    result = export_engine(placement, fmt, output, model=spec)
    if json_out:
        print_json(result.to_dict())
    else:
        sys.stdout.write("\n".join(result.lines()) + "\n")
    sys.stderr.write(f"wrote {output}\n")


def import_(
    engine_file: Path = typer.Argument(
        ..., metavar="FILE", help="An engine placement file.", show_default=False
    ),
    output: Path = output_option("Placement JSON"),
    model: str = model_option("the model the engine serves", required=True),
    fmt: str | None = format_option("engine-read"),
    num_gpus: int | None = num_gpus_option(ep_size=True),
    topology: str | None = topology_option(
        "the cluster the engine serves on (its GPU count is the EP size)"),
    json_out: bool = json_option("the summary"),
) -> None:
    """Read a serving engine's placement file into placement JSON (for evaluate, --current)."""
    from placer.placement.document import write_placement

    spec = resolve_model(model)
    check_output(output, where="--output")
    check_not_inputs([("--output", output)], [engine_file])
    if topology is not None:
        from placer.topology import load_topology

        gpus = load_topology(topology).num_gpus
        if num_gpus is not None and num_gpus != gpus:
            raise UsageError(
                f"--ep-size {num_gpus} disagrees with --topology {topology} ({gpus} GPUs)",
                where="--ep-size", hint="give one of them, or make them agree",
            )
        num_gpus = gpus
    name = fmt or sniff_engine(engine_file)
    placement = read_engine(engine_file, name, model=spec, num_gpus=num_gpus)
    write_placement(output, placement, model_name=spec.name, top_k=spec.top_k)
    summary = {
        "output": str(output),
        "format": name,
        "source": str(engine_file),
        "model": spec.name,
        "num_layers": placement.num_layers,
        "num_gpus": placement.num_gpus,
        "slots_per_gpu": placement.slots_per_gpu,
        "num_physical_experts": placement.num_physical,
        "num_redundant": placement.num_redundant,
    }
    if json_out:
        print_json(summary)
    else:
        sys.stdout.write(
            f"placement    {output}\n"
            f"from         {get_engine(name).engine} file {engine_file}: {spec.name},"
            f" {placement.num_layers} MoE layers\n"
            f"cluster      {placement.num_gpus} GPUs x {placement.slots_per_gpu} slots"
            f" ({placement.num_physical} physical, {placement.num_redundant} redundant)\n"
        )
    sys.stderr.write(f"wrote {output}\n")


def register(app: typer.Typer) -> None:
    """Add ``placer export`` and ``placer import`` to ``app``."""
    # the placement's own model outranks a configured one; --ep-size a configured topology
    exported = placer_command(model=recorded_by("placement_file", "model"))
    app.command("export", cls=exported, epilog=EXPORT_EXAMPLES)(handle_errors(export))
    imported = placer_command(topology=given("num_gpus"))
    app.command("import", cls=imported, epilog=IMPORT_EXAMPLES)(handle_errors(import_))
