"""``placer topology``, ``placer model`` and ``placer capacity``: the hardware side.

Thin: options are parsed here, figures come from ``placer.topology``, ``placer.models``
and ``placer.capacity``; tables go to stdout (``--json`` for machines).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import typer

from placer.capacity import plan_capacity
from placer.cli.command import PlacerCommand, examples, new_typer
from placer.cli.common import (
    complete_model,
    complete_topology,
    handle_errors,
    print_json,
)
from placer.constants import DEFAULT_KV_RESERVE_FRACTION, GB, RUNTIME_OVERHEAD_GB
from placer.errors import TopologyError
from placer.models import ModelSpec, load_model, model_names, model_to_dict
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


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table: columns two spaces apart, numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    numeric = [
        all(isinstance(row[i], int | float) and not isinstance(row[i], bool) for row in rows)
        for i in range(len(headers))
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = [
            r[i].rjust(widths[i]) if numeric[i] else r[i].ljust(widths[i])
            for i in range(len(headers))
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf"
        return f"{value:g}"
    return str(value)


def _echo(text: str = "") -> None:
    typer.echo(text)


def _gb(value: float) -> str:
    return f"{value:.2f}"


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
    json_out: bool = typer.Option(False, "--json", help="Print JSON on stdout."),
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
    json_out: bool = typer.Option(False, "--json", help="Print JSON (with matrices) on stdout."),
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
            ("link class", "GB/s", "latency us", "GPU pairs"),
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
        ("traffic", "link", "nominal GB/s/GPU", "efficiency", "achieved GB/s/GPU", "phase us"),
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
    json_out: bool = typer.Option(
        False, "--json", help="Print the checked topology as JSON (no matrices) on stdout."
    ),
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
        f" GB/s, inter-node {_cell(_inter_gbps(topology))} GB/s"
    )


# -- model ----------------------------------------------------------------------------


def _layer_ranges(ids: Sequence[int]) -> str:
    """``3..60`` for a contiguous run, ``1..47 step 2`` for a stride, else the list."""
    if len(ids) == 1:
        return str(ids[0])
    step = ids[1] - ids[0]
    if all(b - a == step for a, b in itertools.pairwise(ids)):
        return f"{ids[0]}..{ids[-1]}" + (f" step {step}" if step != 1 else "")
    return ",".join(str(i) for i in ids)


def _mtp_row(m: ModelSpec) -> str:
    """``1 (id 61, when served with MTP)`` or ``-``."""
    if not m.num_nextn_predict_layers:
        return "-"
    ids = _layer_ranges(m.mtp_layer_ids)
    word = "id" if m.num_nextn_predict_layers == 1 else "ids"
    return f"{m.num_nextn_predict_layers} ({word} {ids}, when served with MTP)"


@model_app.command("list", cls=PlacerCommand,
                   epilog=examples("placer model list", "placer model list --json"))
@handle_errors
def model_list(
    json_out: bool = typer.Option(False, "--json", help="Print JSON on stdout."),
) -> None:
    """List the model presets."""
    models = [load_model(name) for name in model_names()]
    if json_out:
        print_json([model_to_dict(m) for m in models])
        return
    rows = []
    for m in models:
        rows.append(
            (
                m.name,
                f"{m.num_moe_layers}/{m.num_hidden_layers}",
                m.num_experts,
                m.top_k,
                m.num_shared_experts,
                f"{m.hidden_size}/{m.moe_intermediate_size}",
                f"{m.expert_bytes('bf16') / 1e6:.1f}",
                f"{m.expert_bytes(m.default_dtype) / 1e6:.1f}",
                m.default_dtype,
                f"{m.total_params / 1e9:.1f}",
            )
        )
    headers = (
        "name",
        "MoE/layers",
        "experts",
        "top-k",
        "shared",
        "hidden/ffn",
        "expert MB bf16",
        "expert MB default",
        "default",
        "params B",
    )
    _echo(table(headers, rows))


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
    json_out: bool = typer.Option(False, "--json", help="Print JSON on stdout."),
) -> None:
    """Show a model: MoE layers, experts, shapes, and bytes per dtype."""
    m = load_model(name_or_file)
    if json_out:
        print_json(model_to_dict(m))
        return
    _echo(f"{m.name}: {m.description} ({m.source})")
    groups = f"{m.num_groups} groups, top {m.top_groups}" if m.num_groups > 1 else "ungrouped"
    rows: list[tuple[str, Any]] = [
        ("aliases", ", ".join(m.aliases) or "-"),
        ("hidden layers", m.num_hidden_layers),
        ("MoE layers", f"{m.num_moe_layers} (ids {_layer_ranges(m.moe_layer_ids)})"),
        ("MTP layers", _mtp_row(m)),
        ("experts / top-k", f"{m.num_experts} / {m.top_k} ({groups})"),
        ("shared experts", m.num_shared_experts),
        ("hidden / expert FFN", f"{m.hidden_size} / {m.moe_intermediate_size}"),
        ("params per expert", f"{m.expert_params:,}" + (" (with biases)" if m.expert_bias else "")),
        ("non-expert params", f"{m.non_expert_params:,}"),
        ("total / active params", f"{m.total_params / 1e9:.2f} B / {m.active_params / 1e9:.2f} B"),
        ("default dtype", m.default_dtype),
        ("architecture", m.architecture or "-"),
        ("hub ids", ", ".join(m.hub_ids) or "-"),
    ]
    _echo(table(("field", "value"), rows))
    _echo()
    dtype_rows = []
    for dtype, figures in model_to_dict(m)["bytes"].items():
        dtype_rows.append(
            (
                dtype,
                f"{figures['expert'] / 1e6:.2f}",
                f"{figures['expert_scales'] / 1e6:.3f}",
                f"{figures['slot'] / GB:.3f}",
                f"{figures['all_experts'] / GB:.1f}",
                f"{figures['non_expert'] / GB:.2f}",
                figures["activation"],
            )
        )
    _echo(
        table(
            (
                "dtype",
                "expert MB",
                "of which scales MB",
                "slot GB (all MoE layers)",
                "all experts GB",
                "non-expert GB",
                "dispatch B/token",
            ),
            dtype_rows,
        )
    )


# -- capacity -------------------------------------------------------------------------

CAPACITY_EXAMPLES = examples(
    "placer capacity --model deepseek-v3 --topology 4x-dgx-h100 --dtype fp8",
    "placer capacity -m qwen3-30b-a3b -t gb200-nvl72 --kv-reserve-fraction 0.5 --json",
    note="The memory model: docs/hardware.md.",
)


@handle_errors
def capacity(
    model: str = typer.Option(
        ..., "--model", "-m", metavar="NAME|FILE",
        autocompletion=complete_model, help="Model preset name or YAML file."
    ),
    topology: str = typer.Option(
        ..., "--topology", "-t", metavar="NAME|FILE",
        autocompletion=complete_topology, help="Topology preset or YAML file."
    ),
    dtype: str | None = typer.Option(
        None, "--dtype", metavar="DTYPE",
        help="Expert dtype: bf16, fp8, mxfp4 (default: the model's).",
    ),
    kv_reserve_gb: float | None = typer.Option(
        None, "--kv-reserve-gb", metavar="GB", help="GB per GPU kept for the KV cache."
    ),
    kv_reserve_fraction: float | None = typer.Option(
        None,
        "--kv-reserve-fraction",
        metavar="SHARE",
        help="Part of each GPU's memory kept for the KV cache"
        f" (default {DEFAULT_KV_RESERVE_FRACTION:g}).",
    ),
    overhead_gb: float = typer.Option(
        RUNTIME_OVERHEAD_GB, "--overhead-gb", metavar="GB",
        help="Runtime memory per GPU besides weights, GB."
    ),
    tp: int = typer.Option(1, "--tp", help="GPUs sharding each non-expert weight (1: replicated)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON on stdout."),
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
    figures = c.to_dict()
    if json_out:
        print_json(figures)
        return
    g = c.limiting_gpu
    _echo(
        f"{spec.name} ({c.dtype}) on {topo.name}: {topo.num_gpus} GPUs,"
        f" {spec.num_experts} experts x {spec.num_moe_layers} MoE layers"
    )
    usable = c.usable_slots_per_gpu
    rows: list[tuple[str, Any]] = [
        ("expert bytes (one layer)", f"{spec.expert_bytes(c.dtype) / 1e6:.2f} MB"),
        ("slot bytes (all MoE layers)", f"{_gb(c.expert_gb_at(1))} GB"),
        ("GPU memory (smallest)", f"{_gb(float(c.memory_gb[g]))} GB ({topo.gpu_names[g]})"),
        (f"non-expert weights (tp {c.tp})", f"{_gb(c.non_expert_gb)} GB"),
        ("runtime overhead", f"{_gb(c.overhead_gb)} GB"),
        ("KV-cache reserve", f"{_gb(float(c.kv_reserve_gb[g]))} GB"),
        ("left for experts", f"{_gb(float(c.available_gb[g]))} GB"),
        ("slots per GPU (memory bound)", c.slots_per_gpu),
        ("slots per GPU (usable, <= experts)", usable),
        ("slots per GPU (no redundancy)", c.min_slots_per_gpu),
        ("max redundant experts per layer", c.usable_max_redundant),
        ("expert weights per GPU at usable", f"{_gb(c.expert_gb_at(usable))} GB"),
        ("KV cache left per GPU at usable", f"{_gb(c.kv_left_gb_at(usable))} GB"),
        ("KV cache left per GPU, no redundancy", f"{_gb(c.kv_left_gb_at(c.min_slots_per_gpu))} GB"),
    ]
    _echo(table(("figure", "value"), rows))
    if usable < c.slots_per_gpu:
        _echo(
            f"max redundant experts per layer: {c.usable_max_redundant:,} = {topo.num_gpus}"
            f" GPUs x {usable} slots - {spec.num_experts} experts, not the"
            f" {c.max_redundant:,} the memory holds: with {usable} slots every GPU holds"
            " every expert, and a second replica on one GPU takes memory but adds no"
            " dispatch bandwidth"
        )


def register(app: typer.Typer) -> None:
    """Add ``topology``, ``model`` and ``capacity`` to the ``placer`` app."""
    app.add_typer(topology_app, name="topology")
    app.add_typer(model_app, name="model")
    app.command("capacity", cls=PlacerCommand, epilog=CAPACITY_EXAMPLES)(capacity)
