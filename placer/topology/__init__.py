"""The cluster: GPU types, nodes and links, as a graph with per-pair path figures.

``load_topology("dgx-h100")`` or ``load_topology("my-cluster.yaml")`` returns a frozen
:class:`Topology`: GPUs in rank order (node-major, as engines number EP ranks), the node
of each GPU, pairwise bottleneck bandwidth (GB/s per direction) and latency
(microseconds) matrices, the :class:`LinkClass` of each pair, and each GPU's memory and
speed.  The YAML schema is documented in :mod:`placer.topology.schema` and
``docs/hardware.md``.
"""

from placer.topology.calibration import (
    DEFAULT_CALIBRATION,
    Calibration,
    ComputeCalibration,
    LinkCalibration,
)
from placer.topology.describe import calibration_rows, link_rows, node_rows, topology_to_dict
from placer.topology.gpus import GpuType
from placer.topology.graph import with_nodes
from placer.topology.presets import (
    load_topology,
    preset_names,
    preset_text,
    topology_from_dict,
    topology_from_text,
)
from placer.topology.schema import FABRIC_KINDS, NETWORK_KINDS
from placer.topology.types import LinkClass, Topology

__all__ = [
    "DEFAULT_CALIBRATION",
    "FABRIC_KINDS",
    "NETWORK_KINDS",
    "Calibration",
    "ComputeCalibration",
    "GpuType",
    "LinkCalibration",
    "LinkClass",
    "Topology",
    "calibration_rows",
    "link_rows",
    "load_topology",
    "node_rows",
    "preset_names",
    "preset_text",
    "topology_from_dict",
    "topology_from_text",
    "topology_to_dict",
    "with_nodes",
]
