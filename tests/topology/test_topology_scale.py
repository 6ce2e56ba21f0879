"""Topology path matrices at scale: the structured computation equals a search from every
GPU, and a cluster of thousands of GPUs validates in seconds."""

from __future__ import annotations

import heapq
import itertools
import math
import time

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from placer.cli.main import app
from placer.topology import (
    LinkClass,
    link_rows,
    load_topology,
    preset_names,
    topology_from_dict,
    topology_from_text,
)
from placer.topology.graph import path_matrices

H100 = {"memory_gb": 80, "hbm_gbps": 3350, "bf16_tflops": 989, "fp8_tflops": 1979}


def _search_from(graph: nx.Graph, source: str) -> dict[str, tuple[float, float]]:
    """Dijkstra from one GPU on (latency, then widest), never expanding another GPU."""
    best = {source: (0.0, math.inf)}
    counter = itertools.count()
    heap = [(0.0, -math.inf, next(counter), source)]
    done: set[str] = set()
    while heap:
        latency, neg_bw, _, vertex = heapq.heappop(heap)
        if vertex in done:
            continue
        done.add(vertex)
        if vertex != source and graph.nodes[vertex]["role"] == "gpu":
            continue
        for other, edge in graph[vertex].items():
            if other in done:
                continue
            new = (round(latency + edge["latency_us"], 9), min(-neg_bw, edge["gbps"]))
            old = best.get(other)
            if old is None or (new[0], -new[1]) < (old[0], -old[1]):
                best[other] = new
                heapq.heappush(heap, (new[0], -new[1], next(counter), other))
    return best


def _searched_rows(
    graph: nx.Graph, gpus: list[str], sources: range | list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """``(bandwidth, latency)`` rows of ``sources`` by one search each (nan: no path)."""
    bandwidth = np.full((len(sources), len(gpus)), np.nan)
    latency = np.full((len(sources), len(gpus)), np.nan)
    for row, source in enumerate(sources):
        best = _search_from(graph, gpus[source])
        for j, target in enumerate(gpus):
            if target in best:
                latency[row, j], bandwidth[row, j] = best[target]
        bandwidth[row, source], latency[row, source] = np.inf, 0.0
    return bandwidth, latency


def _unique_link_rows(topology) -> list[dict]:
    """link_rows by np.unique over every unordered pair (fine for small topologies)."""
    upper = np.triu_indices(topology.num_gpus, k=1)
    keys = np.stack([topology.link_class[upper].astype(np.float64),
                     topology.bandwidth_gbps[upper], topology.latency_us[upper]], axis=1)
    unique, counts = np.unique(keys, axis=0, return_counts=True)
    rows = [
        {"link_class": LinkClass(int(c)).name.lower().replace("_", "-"),
         "bandwidth_gbps": float(bw), "latency_us": float(lat), "pairs": int(n)}
        for (c, bw, lat), n in zip(unique, counts, strict=True)
    ]
    rows.sort(key=lambda r: (r["link_class"] != "intra-node", -r["bandwidth_gbps"],
                             r["latency_us"]))
    return rows


@pytest.mark.parametrize("name", preset_names())
def test_presets_equal_a_search_from_every_gpu(name):
    topology = load_topology(name)
    gpus = list(topology.gpu_names)
    bandwidth, latency = _searched_rows(topology.graph, gpus, range(len(gpus)))
    assert np.array_equal(topology.bandwidth_gbps, bandwidth)
    assert np.array_equal(topology.latency_us, latency)
    assert link_rows(topology) == _unique_link_rows(topology)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(2, 7),
    st.lists(
        st.tuples(st.integers(0, 13), st.integers(0, 13), st.sampled_from([4, 8, 16, 32]),
                  st.sampled_from([0.0, 0.5, 1.0, 1.5, 0.1])),
        min_size=1, max_size=30,
    ),
)
def test_random_graphs_equal_a_search_from_every_gpu(num_gpus, edges):
    """Any mix of GPU-GPU edges, switch chains, NIC-like hops, dead ends, ties and
    unreachable pairs: the same figures (nan where no path) as a search per GPU."""
    graph = nx.Graph()
    gpus = [f"n/gpu{i}" for i in range(num_gpus)]
    for rank, vertex in enumerate(gpus):
        graph.add_node(vertex, role="gpu", rank=rank, node=0)
    vertices = gpus + [f"s{i}" for i in range(14 - num_gpus)]
    for vertex in vertices[num_gpus:]:
        graph.add_node(vertex, role="switch", node=None)
    for i, j, gbps, lat in edges:
        if i != j and not graph.has_edge(vertices[i], vertices[j]):
            graph.add_edge(vertices[i], vertices[j], gbps=gbps, latency_us=lat, kind="link")
    bandwidth, latency = path_matrices(graph, gpus)
    expected_bw, expected_lat = _searched_rows(graph, gpus, range(num_gpus))
    assert np.array_equal(bandwidth, expected_bw, equal_nan=True)
    assert np.array_equal(latency, expected_lat, equal_nan=True)


def test_mixed_small_cluster_equals_a_search_and_unique_rows():
    """Mesh, PCIe and switch nodes, NICs on a network, an extra switch with links to
    NICs and GPUs: matrices and link rows as the plain computations give them."""
    data = {
        "name": "mixed",
        "gpu_types": {"h100": dict(H100)},
        "nodes": [
            {"name": "m", "gpus": 4, "gpu_type": "h100",
             "fabric": {"kind": "mesh", "gbps": 64, "latency_us": 0.7}, "nic_gbps": 25},
            {"name": "p", "gpus": 6, "gpu_type": "h100",
             "fabric": {"kind": "pcie", "gbps": 32, "gpus_per_switch": 4, "uplink_gbps": 48},
             "nic_gbps": 12.5},
            {"name": "s", "count": 2, "gpus": 3, "gpu_type": "h100",
             "fabric": {"kind": "nvswitch", "gbps": 450}, "nic_gbps": 50},
        ],
        "network": {"kind": "roce", "latency_us": 3.0},
        "switches": ["x"],
        "links": [
            {"a": "m/nic0", "b": "x", "gbps": 100, "latency_us": 0.25},
            {"a": "x", "b": "s1/gpu2", "gbps": 40, "latency_us": 0.5},
            {"a": "p/gpu5", "b": "s0/gpu0", "gbps": 8, "latency_us": 0.1},
        ],
    }
    topology = topology_from_dict(data)
    gpus = list(topology.gpu_names)
    bandwidth, latency = _searched_rows(topology.graph, gpus, range(len(gpus)))
    assert np.array_equal(topology.bandwidth_gbps, bandwidth)
    assert np.array_equal(topology.latency_us, latency)
    assert link_rows(topology) == _unique_link_rows(topology)


def _nodes_yaml(nodes: int, gpus: int) -> str:
    return f"""\
name: big
gpu_types:
  h100: {{memory_gb: 80, hbm_gbps: 3350, bf16_tflops: 989, fp8_tflops: 1979}}
nodes:
  - {{name: node, count: {nodes}, gpus: {gpus}, gpu_type: h100,
     fabric: {{kind: nvswitch, gbps: 450, latency_us: 1.0}}, nic_gbps: 50}}
network: {{kind: infiniband, latency_us: 2.0}}
"""


def test_2048_gpus_validate_in_seconds(tmp_path):
    """256 nodes x 8 GPUs (a search from every GPU took over 20 s): the CLI's summary,
    pair counts by class, and rows equal to a search from a few GPUs."""
    path = tmp_path / "big.yaml"
    path.write_text(_nodes_yaml(256, 8))
    start = time.process_time()
    result = CliRunner().invoke(app, ["topology", "validate", str(path)])
    assert result.exit_code == 0, result.output
    assert time.process_time() - start < 20
    assert result.output == (
        f"ok: {path}: 'big', 2048 GPUs in 256 nodes, intra-node 450 GB/s,"
        " inter-node 50 GB/s\n"
    )
    topology = topology_from_text(path.read_text(), str(path))
    pairs = 2048 * 2047 // 2
    assert [(r["link_class"], r["bandwidth_gbps"], r["latency_us"], r["pairs"])
            for r in link_rows(topology)] == [
        ("intra-node", 450.0, 1.0, 256 * 28),
        ("inter-node", 50.0, 2.0, pairs - 256 * 28),
    ]
    sources = [0, 7, 1000, 2047]
    bandwidth, latency = _searched_rows(topology.graph, list(topology.gpu_names), sources)
    assert np.array_equal(topology.bandwidth_gbps[sources], bandwidth)
    assert np.array_equal(topology.latency_us[sources], latency)


def test_leaf_spine_links_at_scale():
    """1,024 GPUs on 128 leaf switches and 8 spines, all by explicit links: rows equal a
    search, and the two pair groups are counted exactly."""
    leaves, spines, per_leaf = 128, 8, 8
    gpus = leaves * per_leaf
    links = [
        {"a": f"box/gpu{g}", "b": f"leaf{g // per_leaf}", "gbps": 50, "latency_us": 0.5}
        for g in range(gpus)
    ] + [
        {"a": f"leaf{i}", "b": f"spine{j}", "gbps": 400 - j, "latency_us": 0.5}
        for i in range(leaves) for j in range(spines)
    ]
    data = {
        "name": "leaf-spine",
        "gpu_types": {"h100": dict(H100)},
        "nodes": [{"name": "box", "gpus": gpus, "gpu_type": "h100"}],
        "switches": [f"leaf{i}" for i in range(leaves)] + [f"spine{j}" for j in range(spines)],
        "links": links,
    }
    topology = topology_from_dict(data)
    sources = [0, 9, 1023]
    bandwidth, latency = _searched_rows(topology.graph, list(topology.gpu_names), sources)
    assert np.array_equal(topology.bandwidth_gbps[sources], bandwidth)
    assert np.array_equal(topology.latency_us[sources], latency)
    same_leaf = leaves * per_leaf * (per_leaf - 1) // 2
    assert [(r["bandwidth_gbps"], r["latency_us"], r["pairs"]) for r in link_rows(topology)] == [
        (50.0, 1.0, same_leaf),
        (50.0, 2.0, gpus * (gpus - 1) // 2 - same_leaf),
    ]
