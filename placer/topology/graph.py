"""Build the networkx graph of a topology and its pairwise path matrices.

Vertices: GPUs ``"{node}/gpu{i}"``, fabric switches (``"{node}/nvswitch"``,
``"{node}/switch"``, ``"{node}/pcie{j}"`` and ``"{node}/root"``), NICs
``"{node}/nic{i}"``, the network ``"network"``, and the ``switches:`` a file declares.

Paths: a message from GPU a to GPU b takes the lowest-latency path that does not pass
through a third GPU (GPUs do not forward); among equally fast paths the widest.  The
pair's bandwidth is the narrowest link on that path (GB/s per direction) and its latency
the sum of the links' latencies (microseconds).

The matrices are not found by a search from every GPU (a 10,000-GPU cluster would need
10,000 searches over 30,000 vertices): the switching part of the graph is first reduced
(_Ports), the hub-to-hub part of the paths is searched from a few hubs at once
(_HubPaths), and the ``[G, G]`` matrices are filled with array operations, a hub at a
time (path_matrices).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Any

import networkx as nx
import numpy as np

from placer.errors import TopologyError, UsageError
from placer.limits import check_allocation
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


def _lexmin_into(
    lat: np.ndarray, bw: np.ndarray, new_lat: np.ndarray, new_bw: np.ndarray
) -> None:
    """Replace ``(lat, bw)`` in place where ``(new_lat, new_bw)`` is faster, or as fast
    and wider."""
    better = (new_lat < lat) | ((new_lat == lat) & (new_bw > bw))
    np.copyto(lat, new_lat, where=better)
    np.copyto(bw, new_bw, where=better)


def _joined(first: tuple[float, float], then: tuple[float, float]) -> tuple[float, float]:
    """``(latency, bandwidth)`` of one hop then another."""
    return round(first[0] + then[0], _LATENCY_DECIMALS), min(first[1], then[1])


def _round(latency: np.ndarray) -> np.ndarray:
    return np.round(latency, _LATENCY_DECIMALS)


#: Pair entries updated at once by one array operation (bounds temporary memory).
_BLOCK_ENTRIES = 1 << 18


class _Ports:
    """The GPUs' ways into the switching part of the graph.

    A *hub* is any vertex that is not a GPU (switches, NICs, the network): hubs forward,
    GPUs do not, so a path between two GPUs is either a direct GPU-GPU edge or GPU ->
    hubs -> GPU.  A *port* is a GPU's first step onto a hub, with its latency and
    bandwidth.  The hub graph is then reduced without changing any best path between
    two GPUs (see _fold).
    """

    def __init__(self, graph: nx.Graph, gpus: list[str]) -> None:
        rank = {vertex: i for i, vertex in enumerate(gpus)}
        #: hub -> {gpu rank: (latency, bandwidth)}
        self.ports: dict[str, dict[int, tuple[float, float]]] = {}
        #: hub -> {hub: (latency, bandwidth)}
        self.links: dict[str, dict[str, tuple[float, float]]] = {}
        #: direct GPU-GPU edges (rank, rank, latency, bandwidth)
        self.direct: list[tuple[int, int, float, float]] = []
        for vertex in graph.nodes:
            if vertex not in rank:
                self.ports[vertex] = {}
                self.links[vertex] = {}
        for u, v, edge in graph.edges(data=True):
            cost = (float(edge["latency_us"]), float(edge["gbps"]))
            if u in rank and v in rank:
                self.direct.append((rank[u], rank[v], *cost))
            elif u in rank:
                self.ports[v][rank[u]] = cost
            elif v in rank:
                self.ports[u][rank[v]] = cost
            else:
                self.links[u][v] = cost
                self.links[v][u] = cost
        self._fold()

    def _fold(self) -> None:
        """Shrink the hub graph without changing any best path between two GPUs.

        - A hub that joins one GPU to one other hub (a NIC) becomes the GPU's port on
          that other hub.
        - A hub without GPUs that links two hubs becomes one link between them.
        - A hub with at most one GPU and no link, or without GPUs and with one link,
          leads nowhere and goes.
        """
        pending = list(self.links)
        while pending:
            hub = pending.pop()
            if hub not in self.links:
                continue
            ports, links = self.ports[hub], self.links[hub]
            if len(ports) > 1 or len(links) > 2 or (ports and len(links) == 2):
                continue
            if len(links) == 2:
                (a, to_a), (b, to_b) = links.items()
                self._offer(self.links[a], b, _joined(to_a, to_b))
                self._offer(self.links[b], a, _joined(to_a, to_b))
            for other, hop in links.items():
                for gpu, first in ports.items():
                    self._offer(self.ports[other], gpu, _joined(first, hop))
                del self.links[other][hub]
                pending.append(other)
            del self.ports[hub], self.links[hub]

    @staticmethod
    def _offer(
        costs: dict[Any, tuple[float, float]], key: Any, cost: tuple[float, float]
    ) -> None:
        """Keep ``cost`` for ``key`` if it is faster, or as fast and wider, than the one
        there."""
        old = costs.get(key)
        if old is None or (cost[0], -cost[1]) < (old[0], -old[1]):
            costs[key] = cost


class _HubPaths:
    """Best hub-only paths from each hub GPUs attach to, one row at a time.

    Searches run from few hubs: those that have links and two or more GPUs, and the
    hubs next to a hub with a single GPU (a NIC beside the network and a rail switch).
    A single-GPU hub's row is then the best of its neighbours' rows, one link further;
    a hub without links reaches only itself.  So a 10,000-GPU cluster whose NICs link
    to a network and 8 rails searches from 9 hubs, not 11,250.
    """

    def __init__(self, ports: _Ports, attached: list[str]) -> None:
        self.links = ports.links
        self.hubs = list(ports.links)
        self.index = {hub: i for i, hub in enumerate(self.hubs)}
        self.columns = np.array([self.index[hub] for hub in attached], dtype=np.int64)
        single = {hub for hub in attached if len(ports.ports[hub]) == 1 and ports.links[hub]}
        sources = {hub for hub in attached if ports.links[hub] and hub not in single}
        for hub in single:
            sources.update(ports.links[hub])
        ordered = sorted(sources, key=lambda hub: self.index[hub])
        self.sources = {hub: i for i, hub in enumerate(ordered)}
        self.lat, self.bw = self._search(list(self.sources))

    def _search(self, sources: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(latency, bandwidth)`` ``[len(sources), hubs]``, all sources at once,
        Bellman-Ford style: every round extends every path by one link, until no path
        improves (at most as many rounds as links on the longest best path)."""
        h = len(self.hubs)
        arcs = sorted(  # directed links (tail -> head) grouped by head, for reduceat
            (self.index[other], self.index[hub], hop_lat, hop_bw)
            for hub, links in self.links.items()
            for other, (hop_lat, hop_bw) in links.items()
        )
        heads = np.array([a[0] for a in arcs], dtype=np.int64)
        tails = np.array([a[1] for a in arcs], dtype=np.int64)
        hop_lat = np.array([a[2] for a in arcs])
        hop_bw = np.array([a[3] for a in arcs])
        starts = np.flatnonzero(np.r_[True, heads[1:] != heads[:-1]]) if arcs else heads
        sizes = np.diff(np.r_[starts, len(heads)])
        targets = heads[starts]
        out_lat = np.full((len(sources), h), np.inf)
        out_bw = np.zeros((len(sources), h))
        step = max(1, _BLOCK_ENTRIES // max(1, len(arcs), h))
        for first in range(0, len(sources), step):
            rows = np.arange(min(step, len(sources) - first))
            lat, bw = out_lat[first + rows], out_bw[first + rows]
            own = np.array([self.index[hub] for hub in sources[first : first + len(rows)]])
            lat[rows, own], bw[rows, own] = 0.0, np.inf
            for _ in range(h if arcs else 0):
                via_lat = _round(lat[:, tails] + hop_lat)
                via_bw = np.minimum(bw[:, tails], hop_bw)
                best_lat = np.minimum.reduceat(via_lat, starts, axis=1)
                tied = via_lat == np.repeat(best_lat, sizes, axis=1)
                best_bw = np.maximum.reduceat(np.where(tied, via_bw, -np.inf), starts, axis=1)
                old_lat, old_bw = lat[:, targets], bw[:, targets]
                better = (best_lat < old_lat) | ((best_lat == old_lat) & (best_bw > old_bw))
                if not better.any():
                    break
                _lexmin_into(old_lat, old_bw, best_lat, best_bw)
                lat[:, targets], bw[:, targets] = old_lat, old_bw
            out_lat[first + rows], out_bw[first + rows] = lat, bw
        return out_lat, out_bw

    def row(self, hub: str) -> tuple[np.ndarray, np.ndarray]:
        """``(latency, bandwidth)`` from ``hub`` to each attached hub (inf: no path)."""
        if hub in self.sources:
            i = self.sources[hub]
            return self.lat[i, self.columns], self.bw[i, self.columns]
        lat = np.full(len(self.hubs), np.inf)
        bw = np.zeros(len(self.hubs))
        for other, (hop_lat, hop_bw) in self.links[hub].items():
            i = self.sources[other]  # a single-GPU hub: every neighbour is a source
            _lexmin_into(lat, bw, _round(self.lat[i] + hop_lat), np.minimum(self.bw[i], hop_bw))
        own = self.index[hub]
        lat[own], bw[own] = 0.0, np.inf
        return lat[self.columns], bw[self.columns]


def _as_index(ranks: np.ndarray) -> slice | np.ndarray:
    """A slice when ``ranks`` (ascending) is one contiguous run, else the array."""
    if len(ranks) and int(ranks[-1]) - int(ranks[0]) + 1 == len(ranks):
        return slice(int(ranks[0]), int(ranks[-1]) + 1)
    return ranks


def _update_block(
    latency: np.ndarray, bandwidth: np.ndarray, rows: np.ndarray, cols: np.ndarray,
    row_lat: np.ndarray, row_bw: np.ndarray, col_lat: np.ndarray, col_bw: np.ndarray,
    *, fresh: bool = False,
) -> None:
    """Offer the pairs ``rows x cols`` the paths ``row_lat + col_lat`` (bandwidth the
    narrower of the two); ``fresh``: those pairs have no path yet, take these."""
    col_index = _as_index(cols)
    step = max(1, _BLOCK_ENTRIES // max(1, len(cols)))
    for start in range(0, len(rows), step):
        part = rows[start : start + step]
        new_lat = _round(row_lat[start : start + step, None] + col_lat[None, :])
        new_bw = np.minimum(row_bw[start : start + step, None], col_bw[None, :])
        row_index = _as_index(part)
        if fresh and isinstance(row_index, slice) and isinstance(col_index, slice):
            latency[row_index, col_index] = new_lat
            bandwidth[row_index, col_index] = new_bw
        elif isinstance(row_index, slice) and isinstance(col_index, slice):
            _lexmin_into(latency[row_index, col_index], bandwidth[row_index, col_index],
                         new_lat, new_bw)
        else:
            where = np.ix_(np.arange(latency.shape[0])[row_index],
                           np.arange(latency.shape[1])[col_index])
            old_lat, old_bw = latency[where], bandwidth[where]
            _lexmin_into(old_lat, old_bw, new_lat, new_bw)
            latency[where] = old_lat
            bandwidth[where] = old_bw


def path_matrices(graph: nx.Graph, gpus: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(bandwidth_gbps [G, G], latency_us [G, G])``; unreachable pairs are nan.

    Each pair's path is its direct edge or GPU -> port -> hubs -> port -> GPU
    (see _Ports); the hub-to-hub part comes from _HubPaths, one row per hub with ports,
    and the ``[G, G]`` matrices are filled a hub and a port slot at a time, so the work
    grows with the pairs and the hubs, not with a search from every GPU.
    """
    g = len(gpus)
    latency = np.full((g, g), np.inf)
    bandwidth = np.zeros((g, g))
    ports = _Ports(graph, gpus)
    # the hub with the most ports first: its block lands on pairs with no path yet
    hubs = sorted((hub for hub, attached in ports.ports.items() if attached),
                  key=lambda hub: -len(ports.ports[hub]))
    if hubs:
        paths = _HubPaths(ports, hubs)
        # slot j of GPU r: its j-th port (hub index, latency, bandwidth); -1 when none
        per_gpu: list[list[tuple[int, float, float]]] = [[] for _ in range(g)]
        for h, hub in enumerate(hubs):
            for rank, (lat, bw) in ports.ports[hub].items():
                per_gpu[rank].append((h, lat, bw))
        slots = max(len(p) for p in per_gpu)
        slot_hub = np.full((g, slots), -1, dtype=np.int64)
        slot_lat = np.zeros((g, slots))
        slot_bw = np.zeros((g, slots))
        for rank, entries in enumerate(per_gpu):
            for j, (h, lat, bw) in enumerate(entries):
                slot_hub[rank, j], slot_lat[rank, j], slot_bw[rank, j] = h, lat, bw
        fresh = True
        for hub in hubs:
            hub_lat, hub_bw = paths.row(hub)
            attached = sorted(ports.ports[hub].items())
            rows = np.array([rank for rank, _ in attached], dtype=np.int64)
            row_lat = np.array([cost[0] for _, cost in attached])
            row_bw = np.array([cost[1] for _, cost in attached])
            for j in range(slots):
                targets = slot_hub[:, j]
                far_lat = np.where(targets >= 0, hub_lat[targets], np.inf)
                cols = np.flatnonzero(np.isfinite(far_lat))
                if not len(cols):
                    continue
                # the far side first: this hub -> the hub of the port -> its GPU
                col_lat = _round(far_lat[cols] + slot_lat[cols, j])
                col_bw = np.minimum(hub_bw[targets[cols]], slot_bw[cols, j])
                _update_block(latency, bandwidth, rows, cols, row_lat, row_bw, col_lat, col_bw,
                              fresh=fresh)
                fresh = False
    if ports.direct:
        ends = np.array([(a, b) for a, b, _, _ in ports.direct], dtype=np.int64)
        edge_lat = np.array([cost for _, _, cost, _ in ports.direct])
        edge_bw = np.array([cost for _, _, _, cost in ports.direct])
        for u, v in ((ends[:, 0], ends[:, 1]), (ends[:, 1], ends[:, 0])):
            old_lat, old_bw = latency[u, v], bandwidth[u, v]
            _lexmin_into(old_lat, old_bw, edge_lat, edge_bw)
            latency[u, v], bandwidth[u, v] = old_lat, old_bw
    unreachable = np.isinf(latency)
    if unreachable.any():
        latency[unreachable] = np.nan
        bandwidth[unreachable] = np.nan
    np.fill_diagonal(bandwidth, np.inf)
    np.fill_diagonal(latency, 0.0)
    return bandwidth, latency


def injection(graph: nx.Graph, gpus: list[str], node_of_gpu: np.ndarray) -> np.ndarray:
    """``[G, 3]`` GB/s of each GPU's own links by traffic class (see Topology)."""
    g = len(gpus)
    result = np.full((g, 3), np.inf)
    node_sizes = np.bincount(node_of_gpu)
    for rank, vertex in enumerate(gpus):
        intra = inter = 0.0
        for other, edge in graph[vertex].items():
            if graph.nodes[other]["role"] in ("nic", "network"):
                inter += edge["gbps"]
            else:
                intra += edge["gbps"]
        shares_node = node_sizes[node_of_gpu[rank]] > 1
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
    g = sum(n.num_gpus for n in spec.nodes)
    check_allocation(20 * g * g, f"the {g:,} x {g:,} GPU-pair matrices of the topology",
                     "a topology with fewer GPUs", where=source, error=TopologyError)
    graph = build_graph(spec)
    gpus = [gpu_vertex(n.name, i) for n in spec.nodes for i in range(n.num_gpus)]
    node_of_gpu = np.repeat(
        np.arange(len(spec.nodes), dtype=np.int64), [n.num_gpus for n in spec.nodes]
    )
    bandwidth, latency = path_matrices(graph, gpus)
    unreachable = np.isnan(bandwidth)
    count = int(np.count_nonzero(unreachable))
    if count:
        a, b = divmod(int(np.argmax(unreachable)), len(gpus))
        hint = (
            "give the node a fabric, or add links: between them"
            if node_of_gpu[a] == node_of_gpu[b]
            else "give both nodes nic_gbps and the file a network:"
        )
        raise spec.doc.fail(
            spec.nodes[int(node_of_gpu[b])].path,
            f"GPUs {gpus[a]} and {gpus[b]} cannot reach each other"
            f" ({count} ordered pairs unreachable)",
            hint=hint,
        )
    link_class = np.full((len(gpus), len(gpus)), LinkClass.INTER_NODE, dtype=np.int8)
    first = 0
    for node in spec.nodes:  # a node's GPUs are consecutive ranks
        link_class[first : first + node.num_gpus, first : first + node.num_gpus] = (
            LinkClass.INTRA_NODE
        )
        first += node.num_gpus
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


def with_nodes(topology: Topology, num_nodes: int) -> Topology:
    """``num_nodes`` copies of ``topology``'s first node on its network, same calibration
    (a cluster of the same machines at another size).

    Raises UsageError when the topology was not built from a document, or when several
    nodes need a network this topology does not have.
    """
    spec = topology.spec
    if spec is None:
        raise UsageError(f"topology {topology.name} was built from arrays; it cannot be resized")
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
