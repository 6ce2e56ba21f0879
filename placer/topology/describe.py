"""Plain summaries of a topology (for ``placer topology show`` and ``--json``)."""

from __future__ import annotations

import weakref
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


#: Pair entries looked at by one array operation in link_rows.
_CHUNK_ENTRIES = 1 << 18

_link_rows_cache: weakref.WeakKeyDictionary[Topology, list[dict[str, Any]]] = (
    weakref.WeakKeyDictionary()
)


def _factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(distinct sorted values, index of each value in them)``.

    Pair figures take few distinct values, so they are found in a sample and every value
    is looked up among them; values the sample missed are added and looked up again.
    """
    distinct = np.unique(values[:: max(1, values.size // 4096)])
    codes = np.minimum(np.searchsorted(distinct, values), len(distinct) - 1)
    missed = distinct[codes] != values
    if missed.any():
        distinct = np.union1d(distinct, values[missed])
        codes = np.searchsorted(distinct, values)
    return distinct, codes


def _pair_counts(topology: Topology) -> dict[tuple[int, float, float], int]:
    """Unordered GPU pairs by (link class, bandwidth, latency), a block of rows at a time
    (a 10,000-GPU topology has 50 million pairs)."""
    g = topology.num_gpus
    counts: dict[tuple[int, float, float], int] = {}
    step = max(1, _CHUNK_ENTRIES // max(1, g))
    columns = np.arange(g)
    for first in range(0, g, step):
        rows = slice(first, min(g, first + step))
        upper = columns[None, :] > columns[rows, None]
        link_class = topology.link_class[rows][upper].astype(np.int64)
        if not link_class.size:
            continue
        bandwidths, bw_codes = _factorize(topology.bandwidth_gbps[rows][upper])
        latencies, lat_codes = _factorize(topology.latency_us[rows][upper])
        keys = (link_class * len(bandwidths) + bw_codes) * len(latencies) + lat_codes
        if len(bandwidths) * len(latencies) * (len(LinkClass) + 1) <= keys.size:
            found = np.bincount(keys)
            present = np.flatnonzero(found)
            numbers = found[present]
        else:
            present, numbers = np.unique(keys, return_counts=True)
        bw_index, lat_index = np.divmod(present % (len(bandwidths) * len(latencies)),
                                        len(latencies))
        for key, c, bw, lat in zip(
            (present // (len(bandwidths) * len(latencies))).tolist(),
            numbers.tolist(),
            bandwidths[bw_index].tolist(),
            latencies[lat_index].tolist(),
            strict=True,
        ):
            counts[(key, bw, lat)] = counts.get((key, bw, lat), 0) + c
    return counts


def link_rows(topology: Topology) -> list[dict[str, Any]]:
    """Unordered GPU pairs grouped by (link class, bandwidth, latency), fastest first."""
    if topology not in _link_rows_cache:
        rows: list[dict[str, Any]] = [
            {
                "link_class": LinkClass(c).name.lower().replace("_", "-"),
                "bandwidth_gbps": float(bw),
                "latency_us": float(lat),
                "pairs": int(n),
            }
            for (c, bw, lat), n in _pair_counts(topology).items()
        ]
        rows.sort(
            key=lambda r: (r["link_class"] != "intra-node", -r["bandwidth_gbps"], r["latency_us"])
        )
        _link_rows_cache[topology] = rows
    return [dict(row) for row in _link_rows_cache[topology]]


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
