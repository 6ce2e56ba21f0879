"""All-to-all benchmark cases as placer evaluates them: DeepEP-test-style routing on a
cluster of identical nodes, experts placed linearly, one MoE layer.

A :class:`AllToAllCase` is one row of an all-to-all benchmark (DeepEP's published
tables, ``bench/gpu_microbench.py``, a user's own measurements): how many GPUs, how many
per node, tokens per GPU, the model's width, top-k and experts, group-limited routing,
and the communication mode.  :meth:`AllToAllCase.evaluate` runs it through
:func:`placer.evaluate.evaluate`, the path every placer command takes, and returns the
predicted dispatch and combine times.

Routing follows DeepEP's tests (``tests/test_internode.py``, ``tests/test_low_latency.py``):
each token draws scores ``|N(0, 1)| + 1`` for every expert; with ``top_groups`` the
experts are split into one group per node, the token keeps its ``top_groups`` groups
with the highest best score, and picks its ``top_k`` best experts among them; without,
it picks its ``top_k`` best experts of all.  GPU ``g`` holds experts
``g * E / G .. (g + 1) * E / G - 1`` and every GPU sources ``tokens_per_gpu`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from placer.errors import UsageError
from placer.evaluate import EvalParams, evaluate
from placer.model import ModelSpec
from placer.placement import Placement
from placer.regime import MODES
from placer.stats import ExpertStats, RoutingData, RoutingTrace
from placer.topology import Topology, with_nodes

#: The one MoE layer id a case's model and placement use.
_LAYER = 0
#: Random draws per chunk of tokens when generating routing (memory bound).
_CHUNK_TOKENS = 16384


@dataclass(frozen=True)
class AllToAllCase:
    """One all-to-all configuration (one row of a benchmark table).

    Attributes
    ----------
    num_gpus: EP ranks.
    gpus_per_node: ranks per node (the topology's first node is replicated).
    tokens_per_gpu: tokens each rank dispatches.
    hidden: model width, elements.
    top_k: experts per token.
    num_experts: routed experts (a multiple of ``num_gpus``).
    top_groups: node groups a token may use (DeepEP's ``num_topk_groups``); 0 = no
        group limit.
    mode: communication mode (``normal``, ``low_latency``, ``low_latency_rdma``).
    dtype: dispatch payload, ``fp8`` (hidden + hidden/32 bytes) or ``bf16``.
    seed: routing seed.
    """

    num_gpus: int
    gpus_per_node: int
    tokens_per_gpu: int
    hidden: int = 7168
    top_k: int = 8
    num_experts: int = 256
    top_groups: int = 0
    mode: str = "normal"
    dtype: str = "fp8"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise UsageError(f"unknown mode {self.mode!r}", hint=f"one of: {', '.join(MODES)}")
        if self.dtype not in ("fp8", "bf16"):
            raise UsageError(f"unknown dispatch dtype {self.dtype!r}", hint="fp8 or bf16")
        for name in ("num_gpus", "gpus_per_node", "tokens_per_gpu", "hidden", "top_k",
                     "num_experts"):
            if getattr(self, name) < 1:
                raise UsageError(f"expected {name} >= 1, got {getattr(self, name)}")
        if self.num_gpus % self.gpus_per_node:
            raise UsageError(
                f"{self.num_gpus} GPUs do not fill nodes of {self.gpus_per_node}",
                hint="num_gpus must be a multiple of gpus_per_node",
            )
        if self.num_experts % self.num_gpus:
            raise UsageError(
                f"{self.num_experts} experts do not split evenly over {self.num_gpus} GPUs",
                hint="use a number of experts that is a multiple of the GPU count",
            )
        if self.top_k > self.num_experts:
            raise UsageError(f"top_k {self.top_k} exceeds {self.num_experts} experts")
        if not 0 <= self.top_groups <= self.num_nodes:
            raise UsageError(
                f"top_groups {self.top_groups} must be in 0..{self.num_nodes} (one group per"
                " node)"
            )
        if self.top_groups and self.top_groups * self.num_experts // self.num_nodes < self.top_k:
            raise UsageError(f"{self.top_groups} groups hold fewer than top_k experts")

    @property
    def num_nodes(self) -> int:
        return self.num_gpus // self.gpus_per_node

    @property
    def num_tokens(self) -> int:
        return self.num_gpus * self.tokens_per_gpu

    def model(self) -> ModelSpec:
        """A one-layer model of this width, top-k and expert count (FFN width unused)."""
        return ModelSpec(
            name=f"a2a-h{self.hidden}-k{self.top_k}-e{self.num_experts}",
            num_hidden_layers=1, moe_layer_ids=(_LAYER,), num_experts=self.num_experts,
            top_k=self.top_k, num_groups=1, top_groups=1, num_shared_experts=0,
            hidden_size=self.hidden, moe_intermediate_size=self.hidden,
            non_expert_params=0, default_dtype=self.dtype,
        )

    def placement(self) -> Placement:
        """Experts in order, ``E / G`` per GPU, no replicas (DeepEP's tests' layout)."""
        return Placement(
            physical_to_logical=np.arange(self.num_experts, dtype=np.int64)[None, :],
            layer_ids=np.array([_LAYER], dtype=np.int64),
            num_experts=self.num_experts, num_gpus=self.num_gpus,
        )

    def topk_ids(self) -> np.ndarray:
        """``[tokens, k]`` int32 experts of every token, rank-major (rank r sources
        tokens ``r * tokens_per_gpu ..``), drawn as DeepEP's tests draw them."""
        rng = np.random.default_rng((self.seed, self.num_gpus, self.tokens_per_gpu))
        out = np.empty((self.num_tokens, self.top_k), dtype=np.int32)
        per_group = self.num_experts // self.num_nodes
        for lo in range(0, self.num_tokens, _CHUNK_TOKENS):
            n = min(_CHUNK_TOKENS, self.num_tokens - lo)
            scores = np.abs(rng.standard_normal((n, self.num_experts))) + 1.0
            if self.top_groups and self.top_groups < self.num_nodes:
                group_best = scores.reshape(n, self.num_nodes, per_group).max(axis=2)
                keep = np.argpartition(-group_best, self.top_groups - 1, axis=1)
                masked = np.zeros((n, self.num_nodes), dtype=bool)
                np.put_along_axis(masked, keep[:, : self.top_groups], True, axis=1)
                scores = np.where(np.repeat(masked, per_group, axis=1), scores, 0.0)
            top = np.argpartition(-scores, self.top_k - 1, axis=1)[:, : self.top_k]
            out[lo : lo + n] = top
        return out

    def routing(self) -> RoutingData:
        """The case's routing as a one-window, one-step per-token trace."""
        ids = self.topk_ids()
        load = np.bincount(ids.ravel(), minlength=self.num_experts).astype(np.int64)
        stats = ExpertStats(
            load=load[None, None, :], tokens=np.array([self.num_tokens], dtype=np.int64),
            layer_ids=np.array([_LAYER], dtype=np.int64), top_k=self.top_k,
        )
        rank = np.repeat(np.arange(self.num_gpus, dtype=np.int64), self.tokens_per_gpu)
        trace = RoutingTrace(
            topk_ids=ids[:, None, :], layer_ids=np.array([_LAYER], dtype=np.int64),
            step=np.zeros(self.num_tokens, dtype=np.int64), rank=rank,
        )
        return RoutingData(stats, trace)

    def cluster(self, topology: Topology) -> Topology:
        """``topology``'s first node, replicated to this case's node count."""
        if (topology.num_gpus == self.num_gpus
                and int(topology.gpus_per_node.min()) == self.gpus_per_node
                and int(topology.gpus_per_node.max()) == self.gpus_per_node):
            return topology
        if int(topology.gpus_per_node[0]) != self.gpus_per_node:
            raise UsageError(
                f"the case has {self.gpus_per_node} GPUs per node, topology {topology.name}'s"
                f" first node has {int(topology.gpus_per_node[0])}",
                hint="give a topology whose nodes have as many GPUs as the measured ones",
            )
        return with_nodes(topology, self.num_nodes)

    def evaluate(self, topology: Topology) -> tuple[float, float]:
        """``(dispatch_us, combine_us)`` placer predicts for this case on ``topology``'s
        machines (through :func:`placer.evaluate.evaluate`)."""
        cluster = self.cluster(topology)
        params = EvalParams(policy="round_robin", mode=self.mode, batch_tokens=self.num_tokens,
                            dtype=self.dtype)
        result = evaluate(self.placement(), self.routing(), cluster, self.model(), params)
        return (float(result.per_layer["dispatch_us"][0]),
                float(result.per_layer["combine_us"][0]))
