"""Small models, clusters and traces shared by the evaluator's tests (no files read)."""

from __future__ import annotations

import networkx as nx
import numpy as np

from placer.model import ModelSpec
from placer.placement import Placement
from placer.stats import ExpertStats, RoutingData, RoutingTrace
from placer.topology import GpuType, Topology

GPU = GpuType("toy", memory_gb=80.0, hbm_gbps=1000.0, bf16_tflops=100.0, fp8_tflops=200.0)


def tiny_model(num_experts: int = 4, top_k: int = 2, layers: tuple[int, ...] = (0, 1)) -> ModelSpec:
    """A 4-expert, top-2 model with two MoE layers (ids 0 and 1), hidden 64, ffn 32."""
    return ModelSpec(
        name="tiny", num_hidden_layers=max(layers) + 1, moe_layer_ids=layers,
        num_experts=num_experts, top_k=top_k, num_groups=1, top_groups=1,
        num_shared_experts=0, hidden_size=64, moe_intermediate_size=32,
        non_expert_params=1_000_000, default_dtype="bf16",
    )


def cluster(gpus_per_node: tuple[int, ...], *, intra_gbps: float = 100.0,
            pair_gbps: float | None = None, inter_gbps: float = 10.0,
            intra_latency: float = 1.0, inter_latency: float = 3.0) -> Topology:
    """Nodes of the given sizes: fabric ``intra_gbps`` per GPU port (``pair_gbps`` per GPU
    pair when given: a mesh), NIC ``inter_gbps`` per GPU."""
    node_of_gpu = np.repeat(np.arange(len(gpus_per_node)), gpus_per_node).astype(np.int64)
    g = node_of_gpu.size
    same = node_of_gpu[:, None] == node_of_gpu[None, :]
    link_class = np.where(same, 1, 2).astype(np.int8)
    np.fill_diagonal(link_class, 0)
    bandwidth = np.where(same, pair_gbps or intra_gbps, inter_gbps).astype(np.float64)
    np.fill_diagonal(bandwidth, np.inf)
    latency = np.where(same, intra_latency, inter_latency).astype(np.float64)
    np.fill_diagonal(latency, 0.0)
    injection = np.tile([np.inf, intra_gbps, inter_gbps], (g, 1)).astype(np.float64)
    return Topology(
        name="toy", gpu_names=tuple(f"gpu{i}" for i in range(g)),
        node_names=tuple(f"node{n}" for n in range(len(gpus_per_node))),
        node_of_gpu=node_of_gpu, gpu_type_of_gpu=(GPU,) * g, bandwidth_gbps=bandwidth,
        latency_us=latency, link_class=link_class, injection_gbps=injection, graph=nx.Graph(),
    )


def random_routing(num_tokens: int, *, num_experts: int = 4, top_k: int = 2,
                   layer_ids: tuple[int, ...] = (0, 1), batch: int = 8, seed: int = 0,
                   ranks: int | None = None, holes: bool = True) -> RoutingData:
    """Per-token routing: distinct experts per token, ``batch`` tokens per step, some
    tokens without a row in the last layer (``holes``), source ranks known for half the
    tokens when ``ranks`` is given."""
    rng = np.random.default_rng(seed)
    num_layers = len(layer_ids)
    skew = np.linspace(3.0, 1.0, num_experts)
    keys = np.log(skew) + rng.gumbel(size=(num_tokens, num_layers, num_experts))
    ids = np.argsort(-keys, axis=2)[:, :, :top_k].astype(np.int32)  # Gumbel top-k
    if holes:
        ids[::7, -1] = -1
    step = np.arange(num_tokens, dtype=np.int64) // batch
    rank = np.full(num_tokens, -1, dtype=np.int64)
    if ranks:
        rank[::2] = rng.integers(0, ranks, rank[::2].size)
    return routing_of(ids, np.array(layer_ids), step, rank, num_experts)


def routing_of(ids: np.ndarray, layer_ids: np.ndarray, step: np.ndarray, rank: np.ndarray,
               num_experts: int, windows: int = 1) -> RoutingData:
    """RoutingData of a per-token array, cut into ``windows`` windows of whole steps."""
    num_tokens, num_layers, top_k = ids.shape
    steps = np.unique(step)
    cut = np.array_split(steps, windows)
    starts = np.array([c[0] for c in cut], dtype=np.int64)
    window = np.searchsorted(starts, step, side="right") - 1
    load = np.zeros((windows, num_layers, num_experts), dtype=np.int64)
    coact = np.zeros((num_layers, num_experts, num_experts), dtype=np.int64)
    onehot = np.zeros((num_tokens, num_layers, num_experts), dtype=np.int64)
    t, layer, k = np.nonzero(ids >= 0)
    onehot[t, layer, ids[t, layer, k]] = 1
    for w in range(windows):
        load[w] = onehot[window == w].sum(axis=0)
    coact = np.einsum("tli,tlj->lij", onehot, onehot)
    for layer in range(num_layers):
        np.fill_diagonal(coact[layer], 0)
    stats = ExpertStats(
        load=load, tokens=np.bincount(window, minlength=windows).astype(np.int64),
        layer_ids=np.asarray(layer_ids, dtype=np.int64), top_k=top_k, coact=coact,
        window_starts=starts,
    )
    trace = RoutingTrace(topk_ids=ids, layer_ids=np.asarray(layer_ids, dtype=np.int64),
                         step=step, rank=rank)
    return RoutingData(stats, trace)


def placement(rows: list[list[int]], num_gpus: int, num_experts: int = 4,
              layer_ids: tuple[int, ...] = (0, 1)) -> Placement:
    """A placement from explicit ``physical_to_logical`` rows."""
    return Placement(np.array(rows), np.array(layer_ids), num_experts, num_gpus)
