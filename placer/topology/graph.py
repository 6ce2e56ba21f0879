"""Build the networkx graph of a topology and its pairwise path matrices.

Vertices: GPUs ``"{node}/gpu{i}"``, fabric switches (``"{node}/nvswitch"``,
``"{node}/switch"``, ``"{node}/pcie{j}"`` and ``"{node}/root"``), NICs
``"{node}/nic{i}"``, the network ``"network"``, and the ``switches:`` a file declares.

Paths: a message from GPU a to GPU b takes the lowest-latency path that does not pass
through a third GPU (GPUs do not forward); among equally fast paths the widest.  The
pair's bandwidth is the narrowest link on that path (GB/s per direction) and its latency
the sum of the links' latencies (microseconds).
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import replace

import networkx as nx
import numpy as np

from placer.errors import UsageError
from placer.topology.calibration import DEFAULT_CALIBRATION
from placer.topology.schema import NodeSpec, TopologySpec
from placer.topology.types import LinkClass, Topology

#: Latencies are compared after rounding to this many decimals (sums of halves).
_LATENCY_DECIMALS = 9


def gpu_vertex(node: str, index: int) -> str:
    return f"{node}/gpu{index}"


def _add_node(graph: nx.Graph, node: NodeSpec, node_index: int, first_rank: int) -> None:
    gpus = [gpu_vertex(node.name, i) for i in range(node.num_gpus)]
    for i, vertex in enumerate(gpus):
        graph.add_node(vertex, role="gpu", rank=first_rank + i, node=node_index)
    fabric = node.fabric
    hop = fabric.latency_us / 2
    if fabric.kind in ("nvswitch", "switch"):
        switch = f"{node.name}/{fabric.kind}"
        graph.add_node(switch, role="switch", node=node_index)
        for vertex in gpus:
            graph.add_edge(vertex, switch, gbps=fabric.gbps, latency_us=hop, kind=fabric.kind)
    elif fabric.kind == "mesh":
        for u, v in itertools.combinations(gpus, 2):
            graph.add_edge(u, v, gbps=fabric.gbps, latency_us=fabric.latency_us, kind="mesh")
    elif fabric.kind == "pcie":
        root = f"{node.name}/root"
        graph.add_node(root, role="switch", node=node_index)
        for j in range(math.ceil(node.num_gpus / fabric.gpus_per_switch)):
            switch = f"{node.name}/pcie{j}"
            graph.add_node(switch, role="switch", node=node_index)
            graph.add_edge(switch, root, gbps=fabric.uplink_gbps, latency_us=hop, kind="pcie")
            for vertex in gpus[j * fabric.gpus_per_switch : (j + 1) * fabric.gpus_per_switch]:
                graph.add_edge(vertex, switch, gbps=fabric.gbps, latency_us=hop, kind="pcie")
    if node.nic_gbps is not None:
        for i, vertex in enumerate(gpus):
            nic = f"{node.name}/nic{i}"
            graph.add_node(nic, role="nic", node=node_index)
            graph.add_edge(vertex, nic, gbps=node.nic_gbps, latency_us=0.0, kind="nic")


def build_graph(spec: TopologySpec) -> nx.Graph:
    """The graph of ``spec``: generated vertices and edges, then ``switches:`` and ``links:``.

    Raises
    ------
    TopologyError: a switch name taken twice, a link to an unknown vertex, a link from a
    vertex to itself, or the same pair linked twice.
    """
    doc = spec.doc
    graph = nx.Graph(name=spec.name)
    rank = 0
    for index, node in enumerate(spec.nodes):
        _add_node(graph, node, index, rank)
        rank += node.num_gpus
    if spec.network is not None:
        graph.add_node("network", role="network")
        hop = spec.network.latency_us / 2
        for vertex, attrs in list(graph.nodes(data=True)):
            if attrs["role"] == "nic":
                gbps = min(d["gbps"] for _, _, d in graph.edges(vertex, data=True))
                graph.add_edge(vertex, "network", gbps=gbps, latency_us=hop, kind="network")
    for name, path in spec.switches:
        if name in graph:
            raise doc.fail(
                path,
                f"duplicate vertex name '{name}'",
                hint="switch names must differ from each other and from generated names"
                " (node/gpuN, node/nicN, node/nvswitch, node/pcieN, node/root, network)",
            )
        graph.add_node(name, role="switch", node=None)
    for link in spec.links:
        for end, value in (("a", link.a), ("b", link.b)):
            if value not in graph:
                raise doc.fail(
                    f"{link.path}.{end}",
                    f"unknown vertex '{value}'",
                    hint="use a GPU (node/gpuN), a NIC (node/nicN), a generated switch,"
                    " 'network', or a name listed under switches:",
                )
        if link.a == link.b:
            raise doc.fail(link.path, f"link from '{link.a}' to itself")
        if graph.has_edge(link.a, link.b):
            raise doc.fail(
                link.path,
                f"duplicate link between '{link.a}' and '{link.b}'",
                hint="each pair of vertices may be linked once",
            )
        graph.add_edge(link.a, link.b, gbps=link.gbps, latency_us=link.latency_us, kind=link.kind)
    return graph


def _paths_from(graph: nx.Graph, source: str) -> dict[str, tuple[float, float]]:
    """Lowest-latency, then widest, paths from ``source``: vertex -> (latency, bandwidth).

    Dijkstra on the lexicographic cost (latency up, bandwidth down) is exact because
    extending two paths by the same edge keeps their order; other GPUs are reached but
    never expanded.
    """
    best: dict[str, tuple[float, float]] = {source: (0.0, math.inf)}
    counter = itertools.count()
    heap: list[tuple[float, float, int, str]] = [(0.0, -math.inf, next(counter), source)]
    done: set[str] = set()
    roles = graph.nodes
    while heap:
        latency, neg_bw, _, vertex = heapq.heappop(heap)
        if vertex in done:
            continue
        done.add(vertex)
        if vertex != source and roles[vertex]["role"] == "gpu":
            continue
        for other, edge in graph[vertex].items():
            if other in done:
                continue
            new = (
                round(latency + edge["latency_us"], _LATENCY_DECIMALS),
                min(-neg_bw, edge["gbps"]),
            )
            old = best.get(other)
            if old is None or (new[0], -new[1]) < (old[0], -old[1]):
                best[other] = new
                heapq.heappush(heap, (new[0], -new[1], next(counter), other))
    return best


def path_matrices(graph: nx.Graph, gpus: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(bandwidth_gbps [G, G], latency_us [G, G])``; unreachable pairs are nan."""
    g = len(gpus)
    bandwidth = np.full((g, g), np.nan)
    latency = np.full((g, g), np.nan)
    for i, source in enumerate(gpus):
        best = _paths_from(graph, source)
        for j, target in enumerate(gpus):
            if target in best:
                latency[i, j], bandwidth[i, j] = best[target]
    np.fill_diagonal(bandwidth, np.inf)
    np.fill_diagonal(latency, 0.0)
    return bandwidth, latency


def injection(graph: nx.Graph, gpus: list[str], node_of_gpu: np.ndarray) -> np.ndarray:
    """``[G, 3]`` GB/s of each GPU's own links by traffic class (see Topology)."""
    g = len(gpus)
    result = np.full((g, 3), np.inf)
    for rank, vertex in enumerate(gpus):
        intra = inter = 0.0
        for other, edge in graph[vertex].items():
            if graph.nodes[other]["role"] in ("nic", "network"):
                inter += edge["gbps"]
            else:
                intra += edge["gbps"]
        shares_node = np.count_nonzero(node_of_gpu == node_of_gpu[rank]) > 1
        if intra > 0:
            result[rank, LinkClass.INTRA_NODE] = intra
        elif shares_node and inter > 0:
            # No fabric: the node's GPUs talk through their NICs.
            result[rank, LinkClass.INTRA_NODE] = inter
        if inter > 0:
            result[rank, LinkClass.INTER_NODE] = inter
    return result


def link_kinds(
    spec: TopologySpec, graph: nx.Graph, gpus: list[str], injection_gbps: np.ndarray
) -> np.ndarray:
    """``[G, 3]`` str link technology (calibration key) of each GPU's traffic classes.

    Intra-node: the fabric's ``link``; with no fabric, the kind of the GPU's first
    explicit link (``links:``), or the network's kind when its node's GPUs talk through
    their NICs.  Inter-node: the network's kind for GPUs with a NIC.
    """
    network = spec.network.kind if spec.network is not None else ""
    kinds = np.full((len(gpus), 3), "", dtype="<U32")
    nodes = [node for node in spec.nodes for _ in range(node.num_gpus)]
    for rank, (vertex, node) in enumerate(zip(gpus, nodes, strict=True)):
        if np.isfinite(injection_gbps[rank, LinkClass.INTER_NODE]):
            kinds[rank, LinkClass.INTER_NODE] = network
        if not np.isfinite(injection_gbps[rank, LinkClass.INTRA_NODE]):
            continue
        kind = node.fabric.link
        if not kind:
            own = sorted(
                str(edge["kind"]) for other, edge in graph[vertex].items()
                if graph.nodes[other]["role"] not in ("nic", "network")
            )
            kind = own[0] if own else network
        kinds[rank, LinkClass.INTRA_NODE] = kind
    return kinds


def build_topology(spec: TopologySpec, source: str) -> Topology:
    """Build the graph and every per-pair matrix of ``spec``.

    Raises
    ------
    TopologyError: two GPUs cannot reach each other (names the first such pair).
    """
    graph = build_graph(spec)
    gpus = [gpu_vertex(n.name, i) for n in spec.nodes for i in range(n.num_gpus)]
    node_of_gpu = np.repeat(
        np.arange(len(spec.nodes), dtype=np.int64), [n.num_gpus for n in spec.nodes]
    )
    bandwidth, latency = path_matrices(graph, gpus)
    unreachable = np.argwhere(np.isnan(bandwidth))
    if unreachable.size:
        a, b = (int(x) for x in unreachable[0])
        hint = (
            "give the node a fabric, or add links: between them"
            if node_of_gpu[a] == node_of_gpu[b]
            else "give both nodes nic_gbps and the file a network:"
        )
        raise spec.doc.fail(
            spec.nodes[int(node_of_gpu[b])].path,
            f"GPUs {gpus[a]} and {gpus[b]} cannot reach each other"
            f" ({len(unreachable)} ordered pairs unreachable)",
            hint=hint,
        )
    link_class = np.where(
        node_of_gpu[:, None] == node_of_gpu[None, :], LinkClass.INTRA_NODE, LinkClass.INTER_NODE
    ).astype(np.int8)
    np.fill_diagonal(link_class, LinkClass.SAME_GPU)
    injection_gbps = injection(graph, gpus, node_of_gpu)
    calibration = DEFAULT_CALIBRATION
    if spec.calibration is not None:
        calibration = calibration.merged(spec.calibration)
    return Topology(
        name=spec.name,
        gpu_names=tuple(gpus),
        node_names=tuple(n.name for n in spec.nodes),
        node_of_gpu=node_of_gpu,
        gpu_type_of_gpu=tuple(n.gpu_type for n in spec.nodes for _ in range(n.num_gpus)),
        bandwidth_gbps=bandwidth,
        latency_us=latency,
        link_class=link_class,
        injection_gbps=injection_gbps,
        graph=graph,
        source=source,
        description=spec.description,
        link_kind=link_kinds(spec, graph, gpus, injection_gbps),
        calibration=calibration,
        spec=spec,
    )


def replicate_first_node(topology: Topology, num_nodes: int) -> Topology:
    """``num_nodes`` copies of ``topology``'s first node (see Topology.with_nodes)."""
    spec = topology.spec
    assert spec is not None
    if num_nodes < 1:
        raise UsageError(f"expected at least 1 node, got {num_nodes}")
    if num_nodes > 1 and (spec.network is None or spec.nodes[0].nic_gbps is None):
        raise UsageError(
            f"topology {topology.name} has no network or NICs, so it cannot span"
            f" {num_nodes} nodes",
            hint="use a topology whose nodes have nic_gbps and a network:",
        )
    if spec.links or spec.switches:
        raise UsageError(
            f"topology {topology.name} has explicit links:, which cannot be replicated",
            hint="describe the node with a fabric: instead",
        )
    first = spec.nodes[0]
    nodes = tuple(replace(first, name=f"node{i}") for i in range(num_nodes))
    resized = build_topology(replace(spec, nodes=nodes), topology.source)
    return replace(
        resized,
        name=(topology.name if num_nodes == len(spec.nodes)
              else f"{topology.name} ({num_nodes} nodes)"),
        calibration=topology.calibration,
    )
