"""Traffic of one layer: the copies each token's dispatch sends, and over which links.

Communication modes (DeepEP)
----------------------------
``normal`` (prefill / high-throughput kernels)
    a token is sent once per distinct destination GPU: several of its experts on one
    GPU cost one copy.  To another node it travels once per distinct destination node:
    one inter-node copy from the source GPU to the *relay* GPU of that node (the GPU
    with the source's local index, rail-aligned as DeepEP does; local index modulo the
    node's size when nodes differ), then one NVLink copy from the relay to each other
    destination GPU in that node.  Destinations in the source's own node get one
    intra-node copy each.  The source GPU itself costs nothing.
``low_latency`` (decode kernels)
    one copy per (token, expert) selection straight from the source GPU to the GPU
    holding the chosen replica, no deduplication, no relay; selections served by the
    source GPU cost nothing.  Copies inside a node use the node's fabric, as DeepEP's
    low-latency kernels do when NVLink is allowed (its default since mid-2025, and the
    setting of its published low-latency table).
``low_latency_rdma``
    the same copies, every one of them through the NICs, same-node ones included:
    DeepEP's original pure-RDMA low-latency kernels (NVLink not allowed).  Needs a NIC
    on every GPU.

Combine returns exactly the dispatch copies in the opposite direction (relays reduce
before sending on), so one copy matrix describes both phases.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from placer.errors import Param, UsageError

if TYPE_CHECKING:
    from placer.topology import Topology


#: Modes that send one copy per selection (no deduplication, no relay).
PER_SELECTION_MODES = ("low_latency", "low_latency_rdma")


@dataclass(frozen=True)
class Fabric:
    """The arrays of a topology the evaluator uses, with node bookkeeping.

    Attributes
    ----------
    node_of_gpu: ``[G]`` int64 node of each GPU.
    node_start: ``[N]`` int64 lowest rank of each node (ranks are node-major).
    node_size: ``[N]`` int64 GPUs per node.
    local_index: ``[G]`` int64 index of each GPU within its node.
    link_class: ``[G, G]`` int8 LinkClass the pair's copies travel over (in
        ``low_latency_rdma`` mode same-node pairs are INTER_NODE: they use the NIC).
    bandwidth_gbps: ``[G, G]`` float64 achieved path bandwidth (calibration applied),
        GB/s per direction.
    latency_us: ``[G, G]`` float64 path latency, microseconds.
    injection_gbps: ``[G, 3]`` float64 achieved bandwidth of each GPU's links per class.
    phase_us: ``[G, 3]`` float64 fixed cost of one phase on each GPU's links per class.
    gpu_of_node_index: ``[N, max GPUs per node]`` int64, the i-th GPU of each node (-1 pad).
    """

    node_of_gpu: np.ndarray
    node_start: np.ndarray
    node_size: np.ndarray
    local_index: np.ndarray
    link_class: np.ndarray
    bandwidth_gbps: np.ndarray
    latency_us: np.ndarray
    injection_gbps: np.ndarray
    gpu_of_node_index: np.ndarray
    phase_us: np.ndarray | None = None

    @property
    def num_gpus(self) -> int:
        return int(self.node_of_gpu.size)

    @property
    def num_nodes(self) -> int:
        return int(self.node_start.size)

    @classmethod
    def from_topology(cls, topology: Topology, mode: str = "normal") -> Fabric:
        """The evaluator's view of ``topology`` at achieved speeds, for ``mode``.

        Raises UsageError for ``low_latency_rdma`` on a GPU without a NIC.
        """
        node_of_gpu = np.asarray(topology.node_of_gpu, dtype=np.int64)
        num_nodes = int(node_of_gpu.max()) + 1
        node_size = np.bincount(node_of_gpu, minlength=num_nodes).astype(np.int64)
        node_start = np.zeros(num_nodes, dtype=np.int64)
        local_index = np.zeros(node_of_gpu.size, dtype=np.int64)
        gpu_of_node_index = np.full((num_nodes, max(1, int(node_size.max()))), -1, np.int64)
        for n in range(num_nodes):
            members = np.flatnonzero(node_of_gpu == n)
            local_index[members] = np.arange(members.size)
            gpu_of_node_index[n, : members.size] = members
            node_start[n] = members[0] if members.size else 0
        link_class = np.asarray(topology.link_class, dtype=np.int64)
        bandwidth = np.asarray(topology.achieved_bandwidth_gbps, dtype=np.float64)
        latency = np.asarray(topology.latency_us, dtype=np.float64)
        injection = np.asarray(topology.achieved_injection_gbps, dtype=np.float64)
        if mode == "low_latency_rdma":
            link_class, bandwidth, latency = _through_nics(topology, link_class, injection)
        return cls(
            node_of_gpu=node_of_gpu,
            node_start=node_start,
            node_size=node_size,
            local_index=local_index,
            link_class=link_class,
            bandwidth_gbps=bandwidth,
            latency_us=latency,
            injection_gbps=injection,
            gpu_of_node_index=gpu_of_node_index,
            phase_us=np.asarray(topology.phase_us, dtype=np.float64),
        )

    def relay(self, source: np.ndarray, node: np.ndarray) -> np.ndarray:
        """GPU of ``node`` that receives a token from ``source``: the one with the source's
        local index (rail-aligned), modulo the node's size."""
        return self.gpu_of_node_index[node, self.local_index[source] % self.node_size[node]]

    @cached_property
    def node_major_order(self) -> np.ndarray:
        """``[G]`` int64 GPUs sorted by node (stable): the identity for node-major ranks."""
        return np.argsort(self.node_of_gpu, kind="stable").astype(np.int64)

    @cached_property
    def node_major_index(self) -> np.ndarray:
        """``[G]`` int64 position of each GPU in :attr:`node_major_order`."""
        index = np.empty(self.num_gpus, dtype=np.int64)
        index[self.node_major_order] = np.arange(self.num_gpus)
        return index

    @cached_property
    def relay_table(self) -> np.ndarray:
        """``[G, N]`` int64 relay GPU of node n for tokens from GPU g."""
        g = np.arange(self.num_gpus)[:, None]
        n = np.arange(self.num_nodes)[None, :]
        return self.relay(np.broadcast_to(g, (self.num_gpus, self.num_nodes)),
                          np.broadcast_to(n, (self.num_gpus, self.num_nodes)))

    @cached_property
    def relay_of_dest(self) -> np.ndarray:
        """``[G, G]`` int64 relay GPU a token from g passes through to reach h."""
        return self.relay_table[:, self.node_of_gpu]

    @cached_property
    def same_node(self) -> np.ndarray:
        """``[G, G]`` bool: h is another GPU of g's node."""
        same = self.node_of_gpu[:, None] == self.node_of_gpu[None, :]
        np.fill_diagonal(same, False)
        return same

    @cached_property
    def off_node(self) -> np.ndarray:
        """``[G, G]`` bool: h is in another node than g."""
        return self.node_of_gpu[:, None] != self.node_of_gpu[None, :]

    @cached_property
    def forwarded(self) -> np.ndarray:
        """``[G, G]`` bool: a token from g reaches h through a relay other than h."""
        return self.off_node & (self.relay_of_dest != np.arange(self.num_gpus)[None, :])


def _through_nics(
    topology: Topology, link_class: np.ndarray, injection: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pair class, bandwidth and latency when every copy goes through the NICs.

    A same-node pair becomes INTER_NODE: NIC to NIC (loopback through the switch the
    NICs share), at the narrower NIC's achieved rate and the latency of the nearest
    other-node path of the sender (or, on a single node, its fabric latency).
    """
    nic = injection[:, 2]
    if not np.isfinite(nic).all():
        missing = int(np.flatnonzero(~np.isfinite(nic))[0])
        raise UsageError(
            f"mode low_latency_rdma sends every copy through a NIC, and GPU"
            f" {topology.gpu_names[missing]} has none",
            where=Param("mode"),
            hint="give every node nic_gbps in the topology, or use `mode` low_latency",
        )
    same = link_class == 1
    bandwidth = np.where(same, np.minimum(nic[:, None], nic[None, :]),
                         topology.achieved_bandwidth_gbps)
    off = link_class == 2
    nearest = np.where(off, topology.latency_us, np.inf).min(axis=1)
    nearest = np.where(np.isfinite(nearest), nearest, topology.latency_us.max(axis=1))
    latency = np.where(same, nearest[:, None], topology.latency_us)
    classes = np.where(same, 2, link_class)
    return classes, bandwidth, latency


@dataclass(frozen=True)
class Segments:
    """Runs of tokens with the same (batch, source rank); tokens are sorted by both.

    Attributes
    ----------
    of_token: ``[tokens]`` int64 run of each token.
    batch: ``[segments]`` int64 batch of each run (relative to the block).
    source: ``[segments]`` int64 source rank of each run.
    num_batches: batches in the block.
    """

    of_token: np.ndarray
    batch: np.ndarray
    source: np.ndarray
    num_batches: int

    @classmethod
    def of(cls, batch: np.ndarray, source: np.ndarray, num_batches: int) -> Segments:
        """Runs of ``batch`` / ``source`` arrays already sorted by (batch, source)."""
        if batch.size == 0:
            empty = np.zeros(0, dtype=np.int64)
            return cls(empty, empty, empty, num_batches)
        change = np.r_[True, (batch[1:] != batch[:-1]) | (source[1:] != source[:-1])]
        starts = np.flatnonzero(change)
        of_token = np.cumsum(change) - 1
        return cls(of_token.astype(np.int64), batch[starts], source[starts], num_batches)

    @property
    def num_segments(self) -> int:
        return int(self.batch.size)


@dataclass(frozen=True)
class LayerTraffic:
    """Loads and copies of one layer for a block of batches.

    Attributes
    ----------
    gpu_load: ``[batches, G]`` int64 selections served by each GPU (tokens processed).
    copies: ``[batches, G, G]`` int64 dispatch copies over links from GPU g to GPU h
        (relay forwards included); diagonal zero.  Combine sends the transpose.
    local: ``[batches]`` int64 copies that stay on the source GPU.
    remote_gpu: ``[batches]`` int64 deliveries to a GPU other than the source: distinct
        (token, GPU) pairs in normal mode, (token, expert) selections in low-latency mode.
    remote_node: ``[batches]`` int64 the same counted by node: distinct (token, node)
        pairs off the source's node, or selections served off the source's node.
    """

    gpu_load: np.ndarray
    copies: np.ndarray
    local: np.ndarray
    remote_gpu: np.ndarray
    remote_node: np.ndarray


def layer_traffic(
    token: np.ndarray,
    position: np.ndarray,
    gpu: np.ndarray,
    num_tokens: int,
    width: int,
    segments: Segments,
    fabric: Fabric,
    mode: str,
) -> LayerTraffic:
    """Loads and copies of one layer's dispatch.

    Parameters
    ----------
    token: ``[selections]`` int64 token (index in the block) of each selection.
    position: ``[selections]`` int64 k position of each selection (``< width``).
    gpu: ``[selections]`` int64 GPU serving each selection.
    num_tokens: tokens in the block.  width: ``top_k``.
    segments: the (batch, source) runs of the block's tokens.
    mode: one of :data:`MODES` (see the module docstring).
    """
    served = _per_segment(segments, segments.of_token[token], gpu, fabric.num_gpus)  # [S, G]
    gpu_load = np.zeros((segments.num_batches, fabric.num_gpus), dtype=np.int64)
    np.add.at(gpu_load, segments.batch, served)
    if mode in PER_SELECTION_MODES:
        return per_selection_traffic(served, gpu_load, segments, fabric)
    if mode != "normal":
        raise ValueError(f"unknown mode {mode!r}")
    return _normal_traffic(token, position, gpu, num_tokens, width, gpu_load, segments,
                           fabric)


def _per_segment(segments: Segments, seg: np.ndarray, col: np.ndarray,
                 width: int) -> np.ndarray:
    """``[segments, width]`` int64 count of the (segment, column) pairs ``(seg, col)``."""
    num_seg = segments.num_segments
    out = np.bincount(seg * width + col, minlength=num_seg * width)
    return out.reshape(num_seg, width)


def _per_batch(segments: Segments, per_seg: np.ndarray) -> np.ndarray:
    """``[batches]`` int64 sums of ``[segments]`` values over each batch's segments."""
    return np.bincount(segments.batch, weights=per_seg,
                       minlength=segments.num_batches).astype(np.int64)


def per_selection_traffic(served: np.ndarray, gpu_load: np.ndarray, segments: Segments,
                           fabric: Fabric) -> LayerTraffic:
    """Low-latency modes: one copy per selection served off its source GPU.

    ``served``: ``[segments, G]`` selections each GPU serves for each segment.
    """
    sb, ss = segments.batch, segments.source
    seg_rows = np.arange(segments.num_segments)
    copies = np.zeros((segments.num_batches, fabric.num_gpus, fabric.num_gpus),
                      dtype=served.dtype)  # expected counts are floats
    local = served[seg_rows, ss].copy()
    remote = served.copy()
    remote[seg_rows, ss] = 0
    copies[sb, ss] += remote
    return LayerTraffic(
        gpu_load, copies, _per_batch(segments, local),
        _per_batch(segments, remote.sum(axis=1)),
        _per_batch(segments, (remote * fabric.off_node[ss]).sum(axis=1)),
    )


def _distinct_destinations(
    token: np.ndarray, position: np.ndarray, gpu: np.ndarray, num_tokens: int, width: int,
    fabric: Fabric,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(token, gpu, new_node)`` of each distinct (token, GPU) pair, in token then
    node-major GPU order; ``new_node`` marks the first pair of each (token, node)."""
    # sort each token's GPUs in node-major order, keep the first of each run
    sentinel = fabric.num_gpus
    key = np.full((num_tokens, width), sentinel, dtype=np.int64)
    key.reshape(-1)[token * width + position] = fabric.node_major_index[gpu]
    key.sort(axis=1)
    first = np.ones(key.shape, dtype=bool)
    first[:, 1:] = key[:, 1:] != key[:, :-1]
    first &= key < sentinel
    pair_token = np.nonzero(first)[0]
    pair_gpu = fabric.node_major_order[key[first]]
    pair_node = fabric.node_of_gpu[pair_gpu]
    new_node = np.ones(pair_token.size, dtype=bool)
    new_node[1:] = (pair_token[1:] != pair_token[:-1]) | (pair_node[1:] != pair_node[:-1])
    return pair_token, pair_gpu, new_node


def _normal_traffic(
    token: np.ndarray, position: np.ndarray, gpu: np.ndarray, num_tokens: int, width: int,
    gpu_load: np.ndarray, segments: Segments, fabric: Fabric,
) -> LayerTraffic:
    """Normal mode: one copy per distinct destination GPU, relayed once per node."""
    num_gpus = fabric.num_gpus
    sb, ss = segments.batch, segments.source
    seg_rows = np.arange(segments.num_segments)
    pair_token, pair_gpu, new_node = _distinct_destinations(
        token, position, gpu, num_tokens, width, fabric)
    pair_node = fabric.node_of_gpu[pair_gpu]
    pair_seg = segments.of_token[pair_token]
    dest = _per_segment(segments, pair_seg, pair_gpu, num_gpus)  # tokens [S, G]
    dest_node = _per_segment(segments, pair_seg[new_node], pair_node[new_node],
                             fabric.num_nodes)  # [S, N]
    local = dest[seg_rows, ss].copy()
    dest[seg_rows, ss] = 0
    dest_node[seg_rows, fabric.node_of_gpu[ss]] = 0

    copies = np.zeros((segments.num_batches, num_gpus, num_gpus), dtype=np.int64)
    # intra-node: source -> each destination GPU of its own node
    copies[sb, ss] += dest * fabric.same_node[ss]
    # inter-node: source -> the relay of each destination node
    np.add.at(copies, (sb[:, None], ss[:, None], fabric.relay_table[ss]), dest_node)
    # forwards: relay -> each other destination GPU of that node
    forward = dest * fabric.forwarded[ss]
    np.add.at(
        copies, (sb[:, None], fabric.relay_of_dest[ss], np.arange(num_gpus)[None, :]), forward
    )
    return LayerTraffic(
        gpu_load, copies, _per_batch(segments, local),
        _per_batch(segments, dest.sum(axis=1)), _per_batch(segments, dest_node.sum(axis=1)),
    )
