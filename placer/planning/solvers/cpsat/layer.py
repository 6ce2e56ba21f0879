"""One layer's planning data and the exact figures the CP-SAT planner optimizes.

The planner works on one layer at a time with a placement held as a boolean
matrix ``X: [E, G]`` (expert ``e`` has a replica on GPU ``g``); replica counts are
``X.sum(axis=1)``.  The figures also take an integer ``X`` counting replicas per GPU,
for placements that hold an expert twice on one GPU (the reference EPLB's).  This
module holds what a layer needs (:class:`LayerData`) and
computes the three objectives exactly, in floating point, from ``X``:

1. balance -- the hottest GPU's load relative to the mean GPU load, per window:
   in the worst window (``robust="max"``), averaged over the worst ``tail`` windows
   (``robust="cvar"``: the conditional value at risk of the windows' hot shards), or
   of the summed load (``robust="mean"``).  Each window is normalized to the same
   total first, so a long window does not outweigh a short one.  This is the
   evaluator's per-window hot-shard ratio (``placer.evaluate.window_hot_shard``).
2. traffic -- expected cost of the copies a token sends, from pairs of
   co-activated experts: two experts of one token dispatched to the same GPU share
   one copy, to the same node share one inter-node copy (DeepEP normal mode).
3. moves -- expert weights to load onto GPUs that do not hold them in the current
   placement.

The CP-SAT models (``model.py``) use integer versions of the same figures; every
candidate they return is re-scored here before it is accepted.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from placer import constants
from placer.errors import ScalingWarning


@dataclass(frozen=True)
class LayerData:
    """What the planner knows about one layer.

    Attributes
    ----------
    layer_id: absolute layer index.
    shares: ``[windows, E]`` float64, each window's load divided by the window's
        total (rows sum to 1; empty windows are dropped).
    mean_share: ``[E]`` float64, load summed over windows, normalized to sum 1.
    num_gpus, slots_per_gpu: ``G`` and ``S``.
    node_of_gpu: ``[G]`` int64.
    pairs: ``[M, 2]`` int64 co-activated expert pairs ``i < j`` kept by the planner.
    pair_rate: ``[M]`` float64, tokens selecting both experts of the pair, per token
        of the layer (so ``sum(pair_rate)`` <= ``top_k * (top_k - 1) / 2``).
    gpu_cost, node_cost: cost of one copy to another GPU (1.0) and of one copy to
        another node, in the same unit (bandwidth ratio of the two link classes).
    current: ``[E, G]`` bool, the deployed placement, or None.
    replica_range: ``[E, 2]`` int64, the fewest and most replicas an expert may get.
    scale: factor turning shares into CP-SAT integers (:func:`load_scale`).
    identical_gpus: GPUs of one node are interchangeable (uniform links and types).
    tail: objective 1 averages the hot shards of this many worst windows (1: the
        worst window alone).
    noise: ``[windows, E]`` float64 or None: the variance of one expert's load, in
        squared hot-shard units, when it has one replica (``c`` replicas each carry
        ``noise / c**2``): over windows (``robust="std"``, :func:`window_variance`) and
        per batch (``batch_tokens``, :func:`batch_variance`).
    noise_weight: the weight of a GPU's load variance in its ratio (:func:`noise_weight`).
    allowed: ``[E, G]`` bool or None: the GPUs each expert may have a replica on (None:
        any).  Used to keep EPLB's group-to-node packing (:func:`home_nodes`).
    """

    layer_id: int
    shares: np.ndarray
    mean_share: np.ndarray
    num_gpus: int
    slots_per_gpu: int
    node_of_gpu: np.ndarray
    pairs: np.ndarray
    pair_rate: np.ndarray
    gpu_cost: float
    node_cost: float
    current: np.ndarray | None
    replica_range: np.ndarray
    scale: float
    identical_gpus: bool = True
    tail: int = 1
    noise: np.ndarray | None = None
    noise_weight: float = 0.0
    allowed: np.ndarray | None = None

    @property
    def num_experts(self) -> int:
        return int(self.shares.shape[1])

    @property
    def num_windows(self) -> int:
        return int(self.shares.shape[0])

    @property
    def num_nodes(self) -> int:
        return int(self.node_of_gpu.max()) + 1

    @property
    def num_physical(self) -> int:
        return self.num_gpus * self.slots_per_gpu

    # -- balance --------------------------------------------------------------------
    def effective_share(self, counts: np.ndarray | int) -> np.ndarray:
        """``[windows, E]`` share of the window's load one replica carries, with
        ``counts`` replicas per expert, plus the batch-noise term when planning for
        small batches (so that ``G * sum`` over a GPU's replicas is its ratio)."""
        counts = np.maximum(np.asarray(counts, dtype=np.float64), 1.0)
        out = self.shares / counts
        if self.noise is not None and self.noise_weight > 0:
            out = out + self.noise_weight * self.noise / (self.num_gpus * counts**2)
        return np.asarray(out, dtype=np.float64)

    def gpu_ratio(self, x: np.ndarray) -> np.ndarray:
        """``[windows, G]`` float64: each GPU's load over the window's mean GPU load
        (with the variance term, see :func:`noise_weight`)."""
        per_replica = self.effective_share(x.sum(axis=1)[None, :])  # [W, E]
        return (per_replica @ x.astype(np.float64)) * self.num_gpus

    def hot_shard(self, x: np.ndarray) -> float:
        """The plain hot-shard ratio (no batch-noise term), worst window."""
        counts = np.maximum(x.sum(axis=1), 1)[None, :]
        return float(((self.shares / counts) @ x.astype(np.float64)).max() * self.num_gpus)

    def window_hot(self, x: np.ndarray) -> np.ndarray:
        """``[windows]`` float64: each window's hot-shard ratio."""
        return self.gpu_ratio(x).max(axis=1)

    def balance(self, x: np.ndarray) -> float:
        """Objective 1: the hot shard, averaged over the ``tail`` worst windows."""
        return _top_mean(self.window_hot(x), self.tail)

    def balance_key(self, x: np.ndarray) -> tuple[float, float, float]:
        """Objective 1, then the worst window, then the sum of squared per-GPU worst
        ratios (ties: flatter wins)."""
        ratio = self.gpu_ratio(x)
        worst = ratio.max(axis=0)
        return _top_mean(ratio.max(axis=1), self.tail), float(worst.max()), float(
            (worst**2).sum())

    def balance_bound(self) -> float:
        """A lower bound on :meth:`balance` for any placement.

        The mean GPU (1.0), and the hottest expert split over as many replicas as
        it may have: ``G * max share / most replicas``.
        """
        most = np.minimum(self.replica_range[:, 1], self.num_gpus).astype(np.float64)
        item = (self.shares / most[None, :]).max(axis=1) * self.num_gpus  # [W]
        return _top_mean(np.maximum(item, 1.0), self.tail)

    # -- traffic --------------------------------------------------------------------
    def traffic(self, x: np.ndarray) -> float:
        """Objective 2: expected cost of the copies pairs of experts do not share, per token.

        For each kept pair ``(i, j)`` with rate ``r`` (tokens selecting both, per
        token) and round-robin choice among replicas, the chance that both go to
        the same GPU is ``sum_g x[i,g] x[j,g] / (c_i c_j)`` and to the same node
        ``sum_k a[i,k] a[j,k] / (c_i c_j)`` (``a``: replicas per node).  The cost
        is ``sum r * (gpu_cost * (1 - P_gpu) + node_cost * (1 - P_node))``; the
        node term is 0 on one node.
        """
        if self.pairs.size == 0:
            return 0.0
        counts = x.sum(axis=1).astype(np.float64)
        i, j = self.pairs[:, 0], self.pairs[:, 1]
        denom = counts[i] * counts[j]
        same_gpu = (x[i] * x[j]).sum(axis=1) / denom  # x may count replicas (duplicates)
        cost = self.gpu_cost * (1.0 - same_gpu)
        if self.num_nodes > 1:
            per_node = self.node_counts(x).astype(np.float64)
            same_node = (per_node[i] * per_node[j]).sum(axis=1) / denom
            cost = cost + self.node_cost * (1.0 - same_node)
        return float((self.pair_rate * cost).sum())

    def traffic_reference(self) -> float:
        """Traffic when no pair shares a GPU or node: the unit of the traffic term."""
        per_pair = self.gpu_cost + (self.node_cost if self.num_nodes > 1 else 0.0)
        return float(self.pair_rate.sum() * per_pair)

    def node_counts(self, x: np.ndarray) -> np.ndarray:
        """``[E, nodes]`` int64 replicas of each expert per node."""
        out = np.zeros((x.shape[0], self.num_nodes), dtype=np.int64)
        for node in range(self.num_nodes):
            out[:, node] = x[:, self.node_of_gpu == node].sum(axis=1)
        return out

    # -- migration ------------------------------------------------------------------
    def moves(self, x: np.ndarray) -> int:
        """Objective 3: replicas on GPUs that do not hold that expert now (0 without current)."""
        if self.current is None:
            return 0
        return int(((x > 0) & ~self.current).sum())

    def cost(self, x: np.ndarray, traffic_weight: float, migration_weight: float) -> float:
        """Objectives 2 and 3 weighted: ``tw * traffic / reference + mw * moves / P``."""
        out = 0.0
        ref = self.traffic_reference()
        if ref > 0 and traffic_weight > 0:
            out += traffic_weight * self.traffic(x) / ref
        if self.current is not None and migration_weight > 0:
            out += migration_weight * self.moves(x) / self.num_physical
        return out


def home_nodes(node_of_gpu: np.ndarray, *masks: np.ndarray | None) -> np.ndarray:
    """``[E, G]`` bool: GPU g lies in a node where one of ``masks`` (``[E, G]`` bool
    placements) has a replica of expert e -- the nodes an expert may live on when the
    planner keeps a placement's expert-to-node structure."""
    num_nodes = int(node_of_gpu.max()) + 1
    on_node = np.zeros((masks[0].shape[0] if masks[0] is not None else 0, num_nodes), bool)
    for mask in masks:
        if mask is None:
            continue
        for n in range(num_nodes):
            on_node[:, n] |= mask[:, node_of_gpu == n].any(axis=1)
    return on_node[:, node_of_gpu]


def _top_mean(values: np.ndarray, count: int) -> float:
    """Mean of the ``count`` largest of ``values`` (all of them when fewer)."""
    count = max(1, min(int(count), values.size))
    return float(np.sort(values)[-count:].mean())


def tail_windows(num_windows: int, fraction: float) -> int:
    """Windows a ``cvar`` objective averages: ``ceil(fraction * W)``, at least 1."""
    return max(1, min(num_windows, int(np.ceil(fraction * num_windows - 1e-9))))


def batch_variance(shares: np.ndarray, num_gpus: int, top_k: int, batch_tokens: int) -> np.ndarray:
    """``[W, E]`` variance of each expert's per-batch load, one replica, in squared
    hot-shard units, for batches of ``batch_tokens`` tokens.

    A batch of ``B`` tokens selects expert ``e`` about ``Binomial(B, pi_e)`` times,
    ``pi_e = top_k * share_e``; in units of the mean GPU load ``B top_k / G`` an expert
    with ``c`` replicas adds ``G**2 pi_e (1 - pi_e) / (B top_k**2 c**2)`` to the variance
    of each of its GPUs' load.
    """
    pi = np.clip(top_k * shares, 0.0, 1.0)
    out: np.ndarray = num_gpus**2 * pi * (1.0 - pi) / (batch_tokens * top_k**2)
    return out


def window_variance(shares: np.ndarray, num_gpus: int) -> np.ndarray:
    """``[1, E]`` variance over windows of each expert's load share, one replica, in
    squared hot-shard units (``G**2 Var_w(share_e)``): noise and drift as the trace saw
    them, at its window size."""
    out: np.ndarray = num_gpus**2 * shares.var(axis=0, keepdims=True)
    return out


def noise_weight(noise: np.ndarray, hint_counts: np.ndarray, num_gpus: int, z: float) -> float:
    """Weight of a GPU's load variance ``V`` in its ratio: ``z / (2 sqrt(v0))``.

    A GPU's tail load ``mean + z sqrt(V)`` is bounded from above by the tangent of the
    square root at the typical variance ``v0`` (the hint's mean over GPUs and windows):
    ``sqrt(V) <= sqrt(v0) / 2 + V / (2 sqrt(v0))``, which keeps every GPU's ratio linear
    in the placement.  The constant ``z sqrt(v0) / 2`` is the same for every GPU and is
    left out.  0 when there is no variance.
    """
    counts = np.maximum(hint_counts, 1).astype(np.float64)
    typical = float((noise / counts[None, :]).sum(axis=1).mean()) / num_gpus
    if typical <= 0 or z <= 0:
        return 0.0
    return float(z / (2.0 * np.sqrt(typical)))


def load_scale(shares: np.ndarray, num_gpus: int, slots_per_gpu: int, layer_id: int) -> float:
    """Factor turning window shares into CP-SAT integers.

    The largest share (one expert with one replica) becomes
    ``constants.CPSAT_LOAD_SCALE_MAX``.  Rounding each term costs at most 0.5, so a
    GPU's load is off by at most ``S / 2``; a :class:`ScalingWarning` is raised when
    that exceeds ``constants.CPSAT_SCALING_RTOL`` of the mean GPU load.
    """
    top = float(shares.max()) if shares.size else 0.0
    if top <= 0:
        return 1.0
    scale = constants.CPSAT_LOAD_SCALE_MAX / top
    mean_gpu = scale / num_gpus
    error = 0.5 * slots_per_gpu / mean_gpu
    if error > constants.CPSAT_SCALING_RTOL:
        warnings.warn(
            f"layer {layer_id}: integer loads are precise to {error:.1e} of the mean GPU"
            f" load (one expert holds {top:.0%} of the load over {num_gpus} GPUs)",
            ScalingWarning,
            stacklevel=2,
        )
    return scale
