"""Plain summaries of a topology (for ``placer topology show`` and ``--json``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from placer.topology.types import LinkClass, Topology


def _fabric_kinds(topology: Topology, rank: int) -> list[str]:
    graph = topology.graph
    vertex = topology.gpu_names[rank]
    kinds = {
        edge["kind"]
        for other, edge in graph[vertex].items()
        if graph.nodes[other]["role"] not in ("nic", "network")
    }
    return sorted(kinds)


def node_rows(topology: Topology) -> list[dict[str, Any]]:
    """One row per node: GPUs, ranks, GPU type, fabric kind and per-GPU bandwidths."""
    rows = []
    for index, name in enumerate(topology.node_names):
        ranks = topology.gpus_of_node(index)
        first = int(ranks[0])
        intra = topology.injection_gbps[ranks, LinkClass.INTRA_NODE]
        nic = topology.injection_gbps[ranks, LinkClass.INTER_NODE]
        rows.append(
            {
                "node": name,
                "num_gpus": len(ranks),
                "first_rank": first,
                "last_rank": int(ranks[-1]),
                "gpu_type": topology.gpu_type_of_gpu[first].name,
                "fabric": "+".join(_fabric_kinds(topology, first)) or "none",
                "fabric_gbps_per_gpu": float(intra.min()) if np.isfinite(intra).all() else None,
                "nic_gbps_per_gpu": float(nic.min()) if np.isfinite(nic).all() else None,
            }
        )
    return rows


def link_rows(topology: Topology) -> list[dict[str, Any]]:
    """Unordered GPU pairs grouped by (link class, bandwidth, latency), fastest first."""
    g = topology.num_gpus
    upper = np.triu_indices(g, k=1)
    keys = np.stack(
        [
            topology.link_class[upper].astype(np.float64),
            topology.bandwidth_gbps[upper],
            topology.latency_us[upper],
        ],
        axis=1,
    )
    if keys.size == 0:
        return []
    unique, counts = np.unique(keys, axis=0, return_counts=True)
    rows: list[dict[str, Any]] = [
        {
            "link_class": LinkClass(int(c)).name.lower().replace("_", "-"),
            "bandwidth_gbps": float(bw),
            "latency_us": float(lat),
            "pairs": int(n),
        }
        for (c, bw, lat), n in zip(unique, counts, strict=True)
    ]
    rows.sort(
        key=lambda r: (r["link_class"] != "intra-node", -r["bandwidth_gbps"], r["latency_us"])
    )
    return rows


def calibration_rows(topology: Topology) -> list[dict[str, Any]]:
    """One row per (traffic class, link technology) the GPUs use: nominal and achieved
    GB/s per GPU (slowest GPU), efficiency and fixed cost per all-to-all phase."""
    rows: list[dict[str, Any]] = []
    for link_class in (LinkClass.INTRA_NODE, LinkClass.INTER_NODE):
        kinds = topology.link_kind[:, link_class]
        for kind in sorted(set(kinds.tolist()) - {""}):
            gpus = kinds == kind
            nominal = topology.injection_gbps[gpus, link_class]
            cal = topology.calibration.link(kind)
            rows.append({
                "link_class": link_class.name.lower().replace("_", "-"),
                "technology": kind,
                "nominal_gbps_per_gpu": float(nominal.min()),
                "efficiency": cal.efficiency,
                "achieved_gbps_per_gpu": float(nominal.min() * cal.efficiency),
                "phase_us": cal.phase_us,
                "calibrated": kind in topology.calibration.links,
            })
    return rows


def topology_to_dict(topology: Topology, *, matrices: bool = True) -> dict[str, Any]:
    """Everything about a topology as plain values (inf becomes None in JSON)."""
    result: dict[str, Any] = {
        "name": topology.name,
        "description": topology.description,
        "source": topology.source,
        "num_gpus": topology.num_gpus,
        "num_nodes": topology.num_nodes,
        "gpu_types": [
            {
                "name": t.name,
                "memory_gb": t.memory_gb,
                "hbm_gbps": t.hbm_gbps,
                "bf16_tflops": t.bf16_tflops,
                "fp8_tflops": t.fp8_tflops,
                "mxfp4_tflops": t.mxfp4_tflops,
            }
            for t in topology.gpu_types
        ],
        "nodes": node_rows(topology),
        "links": link_rows(topology),
        "calibration": {
            "source": topology.calibration.source,
            "links": calibration_rows(topology),
            "compute": {
                "hbm_efficiency": topology.hbm_efficiency,
                "flops_efficiency": topology.flops_efficiency,
            },
        },
        "gpus": [
            {
                "rank": rank,
                "name": name,
                "node": topology.node_names[int(topology.node_of_gpu[rank])],
                "gpu_type": topology.gpu_type_of_gpu[rank].name,
            }
            for rank, name in enumerate(topology.gpu_names)
        ],
    }
    if matrices:
        result["bandwidth_gbps"] = topology.bandwidth_gbps
        result["latency_us"] = topology.latency_us
        result["link_class"] = topology.link_class
        result["injection_gbps"] = topology.injection_gbps
    return result
