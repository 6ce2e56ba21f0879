"""``placer topology``, ``placer model`` and ``placer capacity``: the hardware side.

Thin: options are parsed here, figures come from ``placer.topology``, ``placer.model``
and ``placer.model.capacity``; tables go to stdout (``--json`` for machines).
"""

from __future__ import annotations

import typer

from placer.cli.command import PlacerCommand, examples, new_typer
from placer.cli.common import cell, handle_errors, print_json, table
from placer.cli.options import (
    dtype_option,
    json_option,
    kv_reserve_gb_option,
    model_option,
    topology_option,
)
from placer.constants import DEFAULT_KV_RESERVE_FRACTION, RUNTIME_OVERHEAD_GB
from placer.errors import TopologyError
from placer.model import load_model, model_names, model_to_dict
from placer.model.capacity import plan_capacity
from placer.model.describe import (
    DTYPE_HEADERS,
    PRESET_HEADERS,
    capacity_note,
    capacity_rows,
    dtype_rows,
    preset_row,
    spec_rows,
)
from placer.topology import (
    Topology,
    calibration_rows,
    link_rows,
    load_topology,
    node_rows,
    preset_names,
    topology_to_dict,
)

topology_app = new_typer(
    help="List, show and validate cluster topologies (GPUs, nodes, links).",
    epilog=examples("placer topology list", "placer topology show 4x-dgx-h100",
                    "placer topology validate my-cluster.yaml",
                    note="Presets and the YAML format: docs/hardware.md."),
)
model_app = new_typer(
    help="List and show MoE model presets (layers, experts, sizes).",
    epilog=examples("placer model list", "placer model show deepseek-v3",
                    note="Presets, aliases and Hugging Face configs: docs/models.md."),
)


# -- rendering ------------------------------------------------------------------------


def _echo(text: str = "") -> None:
    typer.echo(text)


# -- topology -------------------------------------------------------------------------


def _inter_gbps(topology: Topology) -> float | None:
    inter = [r for r in link_rows(topology) if r["link_class"] == "inter-node"]
    return min(r["bandwidth_gbps"] for r in inter) if inter else None


def _intra_gbps(topology: Topology) -> str:
    intra = [r["bandwidth_gbps"] for r in link_rows(topology) if r["link_class"] == "intra-node"]
    if not intra:
        return "-"
    low, high = min(intra), max(intra)
    return f"{low:g}" if low == high else f"{low:g}-{high:g}"


@topology_app.command("list", cls=PlacerCommand,
                      epilog=examples("placer topology list", "placer topology list --json"))
@handle_errors
def topology_list(
    json_out: bool = json_option("the presets"),
) -> None:
    """List the built-in topology presets."""
    topologies = [load_topology(name) for name in preset_names()]
    if json_out:
        print_json([topology_to_dict(t, matrices=False) for t in topologies])
        return
    rows = [
        (
            t.name,
            t.num_gpus,
            t.num_nodes,
            ",".join(gt.name for gt in t.gpu_types),
            _intra_gbps(t),
            _inter_gbps(t),
            t.description,
        )
        for t in topologies
    ]
    headers = ("name", "GPUs", "nodes", "GPU type", "intra GB/s", "inter GB/s", "description")
    _echo(table(headers, rows))


@topology_app.command("show", cls=PlacerCommand, epilog=examples(
    "placer topology show 2x-dgx-h100", "placer topology show my-cluster.yaml --matrix",
    "placer topology show gb200-nvl72 --json"))
@handle_errors
def topology_show(
    name_or_file: str = typer.Argument(
        ..., metavar="NAME|FILE", help="A preset name or a topology YAML file."
    ),
    json_out: bool = json_option("the topology (with matrices)"),
    matrix: bool = typer.Option(
        False, "--matrix", help="Also print the GPU-to-GPU bandwidth matrix (GB/s)."
    ),

) -> None:
    """Show a topology: GPU types, GPUs per node, link classes and bandwidths."""
    topology = load_topology(name_or_file)
    if json_out:
        print_json(topology_to_dict(topology))
        return
    _echo(
        f"{topology.name}: {topology.num_gpus} GPUs in {topology.num_nodes} node"
        f"{'s' if topology.num_nodes != 1 else ''} ({topology.source})"
    )
    if topology.description:
        _echo(topology.description)
    _echo()
    _echo(
        table(
            ("GPU type", "memory GB", "HBM GB/s", "BF16 TFLOPS", "FP8 TFLOPS", "FP4 TFLOPS"),
            [
                (t.name, t.memory_gb, t.hbm_gbps, t.bf16_tflops, t.fp8_tflops, t.mxfp4_tflops)
                for t in topology.gpu_types
            ],
        )
    )
    _echo()
    _echo(
        table(
            ("node", "GPUs", "ranks", "GPU type", "fabric", "fabric GB/s/GPU", "NIC GB/s/GPU"),
            [
                (
                    r["node"],
                    r["num_gpus"],
                    f"{r['first_rank']}-{r['last_rank']}",
                    r["gpu_type"],
                    r["fabric"],
                    r["fabric_gbps_per_gpu"],
                    r["nic_gbps_per_gpu"],
                )
                for r in node_rows(topology)
            ],
        )
    )
    _echo()
    _echo(
        table(
            ("link class", "GB/s", "latency µs", "GPU pairs"),
            [
                (r["link_class"], r["bandwidth_gbps"], r["latency_us"], r["pairs"])
                for r in link_rows(topology)
            ],
        )
    )
    _echo()
    _echo(_calibration_table(topology))
    _echo(
        f"calibration: {topology.calibration.source or 'nominal'}; expert compute at"
        f" {topology.hbm_efficiency:g} of HBM, {topology.flops_efficiency:g} of peak FLOPS"
    )
    if matrix:
        _echo()
        _echo(_bandwidth_matrix(topology))


def _calibration_table(topology: Topology) -> str:
    """The achieved bandwidth per traffic class (calibrated or nominal)."""
    return table(
        ("traffic", "link", "nominal GB/s/GPU", "efficiency", "achieved GB/s/GPU", "phase µs"),
        [
            (r["link_class"], r["technology"] + ("" if r["calibrated"] else " (nominal)"),
             r["nominal_gbps_per_gpu"], r["efficiency"], r["achieved_gbps_per_gpu"],
             r["phase_us"])
            for r in calibration_rows(topology)
        ],
    )


def _bandwidth_matrix(topology: Topology) -> str:
    """``--matrix``: the GPU-to-GPU bandwidth (GB/s), ``-`` on the diagonal."""
    g = topology.num_gpus
    rows = [
        [rank, *(("-" if i == rank else topology.bandwidth_gbps[rank, i]) for i in range(g))]
        for rank in range(g)
    ]
    rows = [[r[0], *(float(v) if not isinstance(v, str) else v for v in r[1:])] for r in rows]
    return table(("GB/s", *(str(i) for i in range(g))), rows)


@topology_app.command("validate", cls=PlacerCommand, epilog=examples(
    "placer topology validate my-cluster.yaml",
    "placer topology validate my-cluster.yaml --json",
    note="The YAML format: docs/hardware.md."))
@handle_errors
def topology_validate(
    file: str = typer.Argument(..., metavar="FILE", help="A topology YAML file."),
    json_out: bool = json_option("the checked topology (no matrices)"),
) -> None:
    """Check a topology file; print a one-line summary or the first error (exit 1)."""
    if not file.endswith((".yaml", ".yml")) and file in preset_names():
        raise TopologyError(
            f"'{file}' is a preset name, not a file",
            where=file,
            hint=f"placer topology show {file}",
        )
    topology = load_topology(file)
    if json_out:
        print_json({"ok": True, "file": file, **topology_to_dict(topology, matrices=False)})
        return
    _echo(
        f"ok: {file}: '{topology.name}', {topology.num_gpus} GPUs in {topology.num_nodes}"
        f" node{'s' if topology.num_nodes != 1 else ''}, intra-node {_intra_gbps(topology)}"
        f" GB/s, inter-node {cell(_inter_gbps(topology))} GB/s"
    )


# -- model ----------------------------------------------------------------------------


@model_app.command("list", cls=PlacerCommand,
                   epilog=examples("placer model list", "placer model list --json"))
@handle_errors
def model_list(
    json_out: bool = json_option("the presets"),
) -> None:
    """List the model presets."""
    models = [load_model(name) for name in model_names()]
    if json_out:
        print_json([model_to_dict(m) for m in models])
        return
    _echo(table(PRESET_HEADERS, [preset_row(m) for m in models]))


@model_app.command("show", cls=PlacerCommand, epilog=examples(
    "placer model show deepseek-v3", "placer model show Qwen/Qwen3-30B-A3B --json",
    "placer model show path/to/config.json"))
@handle_errors
def model_show(
    name_or_file: str = typer.Argument(
        ..., metavar="NAME|FILE",
        help="A preset name, alias or Hugging Face id, a model YAML file, or a Hugging Face"
        " config.json (or its folder).",
    ),
    json_out: bool = json_option("the model"),
) -> None:
    """Show a model: MoE layers, experts, shapes, and bytes per dtype."""
    m = load_model(name_or_file)
    if json_out:
        print_json(model_to_dict(m))
        return
    _echo(f"{m.name}: {m.description} ({m.source})")
    _echo(table(("field", "value"), spec_rows(m)))
    _echo()
    _echo(table(DTYPE_HEADERS, dtype_rows(m)))


# -- capacity -------------------------------------------------------------------------

CAPACITY_EXAMPLES = examples(
    "placer capacity --model deepseek-v3 --topology 4x-dgx-h100 --dtype fp8",
    "placer capacity -m qwen3-30b-a3b -t gb200-nvl72 --kv-reserve-fraction 0.5 --json",
    note="The memory model: docs/hardware.md.",
)


@handle_errors
def capacity(
    model: str = model_option(required=True),
    topology: str = topology_option(required=True),
    dtype: str | None = dtype_option(),
    kv_reserve_gb: float | None = kv_reserve_gb_option(),
    kv_reserve_fraction: float | None = typer.Option(
        None,
        "--kv-reserve-fraction",
        min=0,
        max=1,
        metavar="SHARE",
        help="Part of each GPU's memory kept for the KV cache"
        f" (default {DEFAULT_KV_RESERVE_FRACTION:g}).",
    ),
    overhead_gb: float = typer.Option(
        RUNTIME_OVERHEAD_GB, "--overhead-gb", metavar="GB",
        help="Runtime memory per GPU besides weights, GB."
    ),
    tp: int = typer.Option(1, "--tp", help="GPUs sharding each non-expert weight (1: replicated)."),
    json_out: bool = json_option("the capacity"),
) -> None:
    """Expert slots per GPU, the most redundant experts, and memory left for the KV cache."""
    spec = load_model(model)
    topo = load_topology(topology)
    c = plan_capacity(
        spec,
        topo,
        dtype,
        kv_reserve_gb=kv_reserve_gb,
        kv_reserve_fraction=kv_reserve_fraction,
        overhead_gb=overhead_gb,
        tp=tp,
    )
    if json_out:
        print_json(c.to_dict())
        return
    _echo(
        f"{spec.name} ({c.dtype}) on {topo.name}: {topo.num_gpus} GPUs,"
        f" {spec.num_experts} experts x {spec.num_moe_layers} MoE layers"
    )
    _echo(table(("figure", "value"), capacity_rows(c, spec, topo)))
    note = capacity_note(c, spec, topo)
    if note is not None:
        _echo(note)


def register(app: typer.Typer) -> None:
    """Add ``topology``, ``model`` and ``capacity`` to the ``placer`` app."""
    app.add_typer(topology_app, name="topology")
    app.add_typer(model_app, name="model")
    app.command("capacity", cls=PlacerCommand, epilog=CAPACITY_EXAMPLES)(capacity)
