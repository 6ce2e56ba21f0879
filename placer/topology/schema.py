"""The topology YAML schema: read a document into a checked :class:`TopologySpec`.

Schema (units: GB/s per direction, microseconds, GB = 1e9 bytes)::

    name: 2x-dgx-h100                  # required
    description: ...                   # optional
    gpu_types:                         # required; every type a node names
      h100-sxm: {memory_gb: 80, hbm_gbps: 3350, bf16_tflops: 989, fp8_tflops: 1979}
                                       # optional mxfp4_tflops (else the fp8 figure)
    nodes:                             # required, rank order (node-major)
      - name: node                     # with count: N, nodes node0 .. node{N-1}
        count: 2                       # optional, default 1
        gpus: 8
        gpu_type: h100-sxm
        fabric: {kind: nvswitch, gbps: 450, latency_us: 1.0}   # optional link: nvlink
        nic_gbps: 50                   # per GPU (one NIC per GPU); optional on one node
    network: {kind: infiniband, latency_us: 2.0}   # required with several nodes
    calibration:                       # optional; over placer's defaults, per key
      links: {nvlink: {efficiency: 0.833, phase_us: 21.2}}
      compute: {hbm_efficiency: 1.0, flops_efficiency: 1.0}
      rebalance: {host_ms: 50, layer_ms: 14, async_share: 1.0}   # online weight moves
      source: "where the figures come from"
    switches: [box/plx0]               # optional extra vertices for links:
    links:                             # optional explicit edges
      - {a: node0/gpu0, b: box/plx0, gbps: 32, latency_us: 0.5, kind: pcie}

Fabric kinds: ``nvswitch`` / ``switch`` (each GPU has one port of ``gbps`` to a switch),
``mesh`` (every pair of the node's GPUs has a direct link of ``gbps``), ``pcie`` (GPUs in
groups of ``gpus_per_switch`` behind PCIe switches of ``uplink_gbps`` to one root
complex), ``none`` (only ``links:``).  ``latency_us`` is GPU-to-GPU through the fabric's
nearest point (one switch, or the direct link); each switch hop costs half of it.
A fabric's ``link`` is its link technology, the key of its calibration (default
``nvlink``, or ``pcie`` for a ``pcie`` fabric; ``xgmi`` for AMD Infinity Fabric meshes).

An *overlay* is a file with ``extends: BASE`` (a preset name, or a path relative to the
overlay) and only ``name``, ``description`` and ``calibration``: the base topology with
that calibration laid over its own (what ``placer calibrate`` writes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from placer.constants import DEFAULT_FABRIC_LATENCY_US, DEFAULT_NETWORK_LATENCY_US, MAX_GPUS
from placer.errors import UsageError
from placer.io.yaml_schema import Section, YamlDoc
from placer.topology.calibration import (
    Calibration,
    ComputeCalibration,
    LinkCalibration,
    RebalanceCalibration,
)
from placer.topology.gpus import GpuType

FABRIC_KINDS = ("nvswitch", "switch", "mesh", "pcie", "none")
NETWORK_KINDS = ("infiniband", "roce", "ethernet")
FABRIC_LINKS = ("nvlink", "xgmi", "pcie")

#: Link technology of each fabric kind when ``link:`` is not given.
_DEFAULT_FABRIC_LINK = {"nvswitch": "nvlink", "switch": "nvlink", "mesh": "nvlink",
                        "pcie": "pcie", "none": ""}

_T = TypeVar("_T")

_ZERO_HINT = "a link without bandwidth carries nothing; remove it or give its GB/s"


@dataclass(frozen=True)
class FabricSpec:
    """A node's GPU-to-GPU fabric; ``gbps`` per GPU port (switch) or per link (mesh)."""

    kind: str
    gbps: float
    latency_us: float
    gpus_per_switch: int
    uplink_gbps: float
    link: str = ""


@dataclass(frozen=True)
class NodeSpec:
    """One node after ``count`` expansion; ``path`` is its YAML path for messages."""

    name: str
    num_gpus: int
    gpu_type: GpuType
    fabric: FabricSpec
    nic_gbps: float | None
    path: str


@dataclass(frozen=True)
class NetworkSpec:
    """The network between nodes, modelled as one non-blocking switch."""

    kind: str
    latency_us: float


@dataclass(frozen=True)
class LinkSpec:
    """An explicit edge between two vertices of the graph."""

    a: str
    b: str
    gbps: float
    latency_us: float
    kind: str
    path: str


@dataclass(frozen=True)
class TopologySpec:
    """A checked topology document, before the graph is built."""

    name: str
    description: str
    nodes: tuple[NodeSpec, ...]
    network: NetworkSpec | None
    switches: tuple[tuple[str, str], ...]  # (name, YAML path)
    links: tuple[LinkSpec, ...]
    doc: YamlDoc
    calibration: Calibration | None = None  # the file's own section (None: defaults)


def _gpu_type(section: Section, name: str) -> GpuType:
    gpu = GpuType(
        name=name,
        memory_gb=section.number("memory_gb"),
        hbm_gbps=section.number("hbm_gbps", zero_hint=_ZERO_HINT),
        bf16_tflops=section.number("bf16_tflops"),
        fp8_tflops=section.number("fp8_tflops"),
        mxfp4_tflops=section.number("mxfp4_tflops", None),
    )
    section.done()
    return gpu


def _fabric(node: Section, num_gpus: int) -> FabricSpec:
    section = node.section("fabric", None)
    if section is None:
        return FabricSpec("none", 0.0, 0.0, num_gpus, 0.0)
    kind = section.string("kind", choices=FABRIC_KINDS)
    if kind == "none":
        latency = section.number("latency_us", 0.0, strict=False)
        section.done()
        return FabricSpec("none", 0.0, latency, num_gpus, 0.0)
    gbps = section.number("gbps", zero_hint=_ZERO_HINT)
    latency = section.number("latency_us", DEFAULT_FABRIC_LATENCY_US[kind], strict=False)
    link = section.string("link", _DEFAULT_FABRIC_LINK[kind], choices=FABRIC_LINKS)
    per_switch = num_gpus
    uplink = gbps
    if kind == "pcie":
        per_switch = section.integer("gpus_per_switch", num_gpus, maximum=MAX_GPUS)
        uplink = section.number("uplink_gbps", gbps, zero_hint=_ZERO_HINT)
    section.done()
    return FabricSpec(kind, gbps, latency, per_switch, uplink, link)


def read_calibration(section: Section) -> Calibration:
    """The ``calibration:`` section: ``links``, ``compute``, ``rebalance`` and ``source``,
    all optional."""
    links: dict[str, LinkCalibration] = {}
    links_section = section.section("links", None)
    if links_section is not None:
        for kind in list(links_section.value):
            entry = links_section.mapping(str(kind))
            links[str(kind)] = _checked(entry, lambda e: LinkCalibration(
                efficiency=e.number("efficiency", 1.0),
                phase_us=e.number("phase_us", 0.0, strict=False),
            ))
        links_section.done()
    compute = ComputeCalibration()
    compute_section = section.section("compute", None)
    if compute_section is not None:
        compute = _checked(compute_section, lambda e: ComputeCalibration(
            hbm_efficiency=e.number("hbm_efficiency", 1.0),
            flops_efficiency=e.number("flops_efficiency", 1.0),
        ))
    rebalance = None
    rebalance_section = section.section("rebalance", None)
    if rebalance_section is not None:
        rebalance = _checked(rebalance_section, lambda e: RebalanceCalibration(
            host_ms=e.number("host_ms", 50.0, strict=False),
            layer_ms=e.number("layer_ms", 14.0, strict=False),
            async_share=e.number("async_share", 1.0, strict=False),
        ))
    source = section.string("source", "")
    section.done()
    return Calibration(links, compute, source, rebalance)


def _checked(section: Section, build: Callable[[Section], _T]) -> _T:
    """``build(section)``, with the dataclass's range errors pointed at the file."""
    try:
        value = build(section)
    except UsageError as exc:
        raise section.fail(None, exc.message, exc.hint) from None
    section.done()
    return value


def _gpu_types(doc: YamlDoc, root: Section) -> dict[str, GpuType]:
    """Read `gpu_types`: name -> GpuType, at least one."""
    gpu_types: dict[str, GpuType] = {}
    types_section = root.mapping("gpu_types")
    for type_name, value in types_section.value.items():
        types_section.raw(str(type_name))
        gpu_types[str(type_name)] = _gpu_type(
            Section(doc, value, types_section.sub(str(type_name))), str(type_name)
        )
    if not gpu_types:
        raise types_section.fail(None, "gpu_types is empty", "define at least one GPU type")
    return gpu_types


def _nodes(doc: YamlDoc, root: Section, gpu_types: dict[str, GpuType]) -> list[NodeSpec]:
    """Read `nodes`, expanding `count`; names unique, at most MAX_GPUS GPUs in all."""
    nodes: list[NodeSpec] = []
    node_paths: dict[str, str] = {}
    total_gpus = 0
    for path, value in root.items("nodes"):
        node = Section(doc, value, path)
        base = node.string("name")
        count = node.integer("count", None, maximum=MAX_GPUS)
        num_gpus = node.integer("gpus", maximum=MAX_GPUS)
        # checked before the nodes are made: `count: 100000000` must not build them
        total_gpus += num_gpus * (1 if count is None else count)
        if total_gpus > MAX_GPUS:
            raise node.fail(
                "count" if count is not None else "gpus",
                f"the topology has more than {MAX_GPUS:,} GPUs, the most placer handles",
                hint="check count and gpus (limits: docs/limits.md)",
            )
        type_name = node.string("gpu_type")
        if type_name not in gpu_types:
            raise node.fail(
                "gpu_type",
                f"unknown GPU type '{type_name}'",
                hint=f"gpu_types defines: {', '.join(sorted(gpu_types))}",
            )
        fabric = _fabric(node, num_gpus)
        nic = node.number("nic_gbps", None, zero_hint=_ZERO_HINT)
        node.done()
        names = [base] if count is None else [f"{base}{i}" for i in range(count)]
        for node_name in names:
            if "/" in node_name:
                raise node.fail(
                    "name", f"node name '{node_name}' must not contain '/'",
                    hint="'/' separates a node from its GPU in vertex names (node0/gpu3)",
                )
            if node_name in node_paths:
                raise node.fail(
                    "name",
                    f"duplicate node name '{node_name}' (also {node_paths[node_name]})",
                    hint="give every node a different name",
                )
            node_paths[node_name] = path
            nodes.append(NodeSpec(node_name, num_gpus, gpu_types[type_name], fabric, nic, path))
    if not nodes:
        raise root.fail("nodes", "nodes is empty", "list at least one node")
    return nodes


def _network(root: Section, num_nodes: int) -> NetworkSpec | None:
    """Read `network`, required when there is more than one node."""
    net = root.section("network", None)
    if net is None:
        if num_nodes > 1:
            raise root.fail(
                None,
                f"missing key 'network': {num_nodes} nodes need a network between them",
                hint="add e.g. network: {kind: infiniband, latency_us: 2.0}",
            )
        return None
    network = NetworkSpec(
        kind=net.string("kind", choices=NETWORK_KINDS),
        latency_us=net.number("latency_us", DEFAULT_NETWORK_LATENCY_US, strict=False),
    )
    net.done()
    return network


def _switches(doc: YamlDoc, root: Section) -> list[tuple[str, str]]:
    """Read `switches`: (name, YAML path) pairs."""
    switches: list[tuple[str, str]] = []
    for path, value in root.items("switches", None):
        if not isinstance(value, str) or not value.strip():
            raise doc.fail(
                path, f"a switch must be a name, got {value!r:.60}",
                hint="name switches like box/plx0",
            )
        switches.append((value, path))
    return switches


def _links(doc: YamlDoc, root: Section) -> list[LinkSpec]:
    """Read `links`: explicit links between GPUs, switches or NICs."""
    links: list[LinkSpec] = []
    for path, value in root.items("links", None):
        link = Section(doc, value, path)
        links.append(
            LinkSpec(
                a=link.string("a"),
                b=link.string("b"),
                gbps=link.number("gbps", zero_hint=_ZERO_HINT),
                latency_us=link.number("latency_us", 0.0, strict=False),
                kind=link.string("kind", "link"),
                path=path,
            )
        )
        link.done()
    return links


def read_spec(doc: YamlDoc) -> TopologySpec:
    """Check a topology document against the schema and return its spec.

    Raises
    ------
    TopologyError (the document's error class), naming the YAML path: unknown or
    missing keys, wrong types, non-positive figures, unknown GPU types, duplicate names.
    """
    root = doc.root()
    name = root.string("name")
    description = root.string("description", "")
    gpu_types = _gpu_types(doc, root)
    nodes = _nodes(doc, root, gpu_types)
    network = _network(root, len(nodes))
    switches = _switches(doc, root)
    links = _links(doc, root)
    calibration = None
    calibration_section = root.section("calibration", None)
    if calibration_section is not None:
        calibration = read_calibration(calibration_section)
    root.done()
    return TopologySpec(
        name=name,
        description=description,
        nodes=tuple(nodes),
        network=network,
        switches=tuple(switches),
        links=tuple(links),
        doc=doc,
        calibration=calibration,
    )
