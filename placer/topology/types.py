"""The cluster as placer sees it: GPU types, and a :class:`Topology` of GPUs and links."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import IntEnum
from functools import cached_property
from typing import TYPE_CHECKING

import networkx as nx
import numpy as np

from placer.topology.calibration import DEFAULT_CALIBRATION, Calibration
from placer.topology.gpus import GpuType

if TYPE_CHECKING:
    from placer.topology.schema import TopologySpec


class LinkClass(IntEnum):
    """How two GPUs exchange data: the same GPU, the node's fabric, or the network."""

    SAME_GPU = 0
    INTRA_NODE = 1
    INTER_NODE = 2


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class Topology:
    """GPUs in rank order and what links them.

    Rank ``g`` is the g-th GPU of the file, node-major (all GPUs of the first node, then
    the second...), as engines number EP ranks.  Pair figures come from the path a
    message takes in :attr:`graph`: the lowest-latency path that does not pass through
    another GPU (ties: the widest); its bandwidth is the narrowest link on it, its
    latency the sum of its links' latencies.

    Attributes
    ----------
    name: topology name (file's ``name:``).
    gpu_names: ``[G]`` GPU vertex names in rank order (``"node0/gpu3"``).
    node_names: ``[N]`` node names in file order.
    node_of_gpu: ``[G]`` int64, node index of each GPU.
    gpu_type_of_gpu: ``[G]`` GpuType of each GPU.
    bandwidth_gbps: ``[G, G]`` float64, bottleneck bandwidth of the path, GB/s per
        direction; diagonal inf.
    latency_us: ``[G, G]`` float64, latency of the path, microseconds; diagonal 0.
    link_class: ``[G, G]`` int8 :class:`LinkClass` values.
    injection_gbps: ``[G, 3]`` float64, GB/s per direction of GPU g's own links by the
        class of traffic they carry: column 0 inf (same GPU); column 1 its intra-node
        links (the NVSwitch port, the sum of its mesh links, its PCIe x16 link); column
        2 its NIC.  A GPU without such links has inf (it never sends that traffic).
    graph: vertices are GPUs (``role="gpu"``, ``rank``, ``node``), switches
        (``role="switch"``), NICs (``role="nic"``) and the network (``role="network"``);
        edges carry ``gbps``, ``latency_us`` and ``kind`` (``nvlink``, ``xgmi``, ``pcie``,
        ``nic``, ``network``, or the kind given in ``links:``).
    source: where it was read from (file path or ``"preset NAME"``).
    description: the file's ``description:``.
    link_kind: ``[G, 3]`` str, the link technology (calibration key) GPU g uses for
        each class of traffic: column 0 ``""``; column 1 its fabric's ``link`` (or its
        NIC's technology when the node has no fabric); column 2 the network's kind
        (``""`` without a NIC).
    calibration: achieved-speed figures (placer's defaults with the file's own
        ``calibration:`` laid over them); nominal arrays above stay nominal, the
        ``achieved_*`` properties apply it.
    spec: the checked document it was built from (None when built from arrays).
    """

    name: str
    gpu_names: tuple[str, ...]
    node_names: tuple[str, ...]
    node_of_gpu: np.ndarray
    gpu_type_of_gpu: tuple[GpuType, ...]
    bandwidth_gbps: np.ndarray
    latency_us: np.ndarray
    link_class: np.ndarray
    injection_gbps: np.ndarray
    graph: nx.Graph = field(repr=False)
    source: str = ""
    description: str = ""
    link_kind: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), dtype="<U32"))
    calibration: Calibration = DEFAULT_CALIBRATION
    spec: TopologySpec | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        g = len(self.gpu_names)
        if self.link_kind.size == 0 and g:
            kinds = np.full((g, 3), "", dtype="<U32")
            object.__setattr__(self, "link_kind", kinds)
        for name, arr, shape in (
            ("node_of_gpu", self.node_of_gpu, (g,)),
            ("bandwidth_gbps", self.bandwidth_gbps, (g, g)),
            ("latency_us", self.latency_us, (g, g)),
            ("link_class", self.link_class, (g, g)),
            ("injection_gbps", self.injection_gbps, (g, 3)),
            ("link_kind", self.link_kind, (g, 3)),
        ):
            if arr.shape != shape:
                raise ValueError(f"{name} must have shape {shape}, got {arr.shape}")
            _frozen(arr)
        if len(self.gpu_type_of_gpu) != g:
            raise ValueError(f"gpu_type_of_gpu must have {g} entries")

    @property
    def num_gpus(self) -> int:
        return len(self.gpu_names)

    # -- achieved speeds (calibration applied) ------------------------------------------
    def _per_link(self, figure: str, same_gpu: float) -> np.ndarray:
        """``[G, 3]`` float64 the calibration's ``figure`` for each GPU's link technology
        of each class (``same_gpu`` in column 0)."""
        kinds = np.unique(self.link_kind).tolist()
        table = {k: float(getattr(self.calibration.link(k), figure)) for k in kinds}
        out = np.vectorize(table.__getitem__, otypes=[np.float64])(self.link_kind)
        out[:, LinkClass.SAME_GPU] = same_gpu
        return _frozen(out)

    @cached_property
    def link_efficiency(self) -> np.ndarray:
        """``[G, 3]`` float64 achieved / nominal bandwidth of GPU g's links per class."""
        return self._per_link("efficiency", 1.0)

    @cached_property
    def phase_us(self) -> np.ndarray:
        """``[G, 3]`` float64 fixed cost of one all-to-all phase on GPU g's links of each
        class, microseconds (paid once per phase for each class the GPU uses)."""
        return self._per_link("phase_us", 0.0)

    @cached_property
    def achieved_injection_gbps(self) -> np.ndarray:
        """``[G, 3]`` float64 :attr:`injection_gbps` times :attr:`link_efficiency`."""
        return _frozen(self.injection_gbps * self.link_efficiency)

    @cached_property
    def achieved_bandwidth_gbps(self) -> np.ndarray:
        """``[G, G]`` float64 path bandwidth at the sender's efficiency for the pair's
        class, GB/s per direction (diagonal inf)."""
        rows = np.arange(self.num_gpus)[:, None]
        efficiency = self.link_efficiency[rows, self.link_class.astype(np.int64)]
        return _frozen(self.bandwidth_gbps * efficiency)

    @property
    def hbm_efficiency(self) -> float:
        """Achieved / nominal HBM bandwidth of expert weight reads."""
        return self.calibration.compute.hbm_efficiency

    @property
    def flops_efficiency(self) -> float:
        """Achieved / peak FLOPS of expert GEMMs."""
        return self.calibration.compute.flops_efficiency

    def with_calibration(self, calibration: Calibration) -> Topology:
        """The same cluster with ``calibration`` laid over this one's."""
        return replace(self, calibration=self.calibration.merged(calibration))

    @property
    def num_nodes(self) -> int:
        return len(self.node_names)

    @property
    def memory_gb(self) -> np.ndarray:
        """``[G]`` float64, HBM capacity of each GPU, GB."""
        return np.array([t.memory_gb for t in self.gpu_type_of_gpu], dtype=np.float64)

    @property
    def hbm_gbps(self) -> np.ndarray:
        """``[G]`` float64, HBM bandwidth of each GPU, GB/s."""
        return np.array([t.hbm_gbps for t in self.gpu_type_of_gpu], dtype=np.float64)

    def tflops(self, dtype: str) -> np.ndarray:
        """``[G]`` float64, dense throughput of each GPU for ``dtype`` experts, TFLOPS."""
        return np.array([t.tflops(dtype) for t in self.gpu_type_of_gpu], dtype=np.float64)

    @property
    def gpus_per_node(self) -> np.ndarray:
        """``[N]`` int64, GPUs in each node."""
        return np.bincount(self.node_of_gpu, minlength=self.num_nodes).astype(np.int64)

    @property
    def gpu_types(self) -> tuple[GpuType, ...]:
        """Distinct GPU types, in rank order of first appearance."""
        seen: dict[str, GpuType] = {}
        for t in self.gpu_type_of_gpu:
            seen.setdefault(t.name, t)
        return tuple(seen.values())

    def gpus_of_node(self, node: int) -> np.ndarray:
        """``[gpus in node]`` int64, ranks of node ``node``'s GPUs."""
        return np.flatnonzero(self.node_of_gpu == node).astype(np.int64)
