"""Memory budget: how many expert slots each GPU can hold.

Serving assumption: attention data-parallel + expert parallel, so every GPU holds the
full non-expert weights (``tp`` > 1 shards them over ``tp`` GPUs), a runtime overhead,
a KV-cache reserve, and ``S`` expert slots, each slot being one expert's weights in every
MoE layer::

    slot_bytes    = num_moe_layers x expert_bytes(dtype)
    available_gb  = memory_gb - non_expert_gb - overhead_gb - kv_reserve_gb
    slots_per_gpu = floor(available_gb x 1e9 / slot_bytes)        (min over GPUs)
    max_redundant = num_gpus x slots_per_gpu - num_experts

Engines need the same ``S`` on every GPU, so a mixed cluster is bounded by its smallest
GPU.  ``slots_per_gpu`` is the memory bound; planners use ``min(slots_per_gpu, E)``: at
``E`` slots every GPU holds every expert, and a second replica on one GPU takes memory but
adds no dispatch bandwidth, so ``usable_max_redundant = num_gpus x min(S, E) - E`` is the
most redundant experts a placement can use (``max_redundant`` may exceed it many times:
Qwen3-30B-A3B on GB200 NVL72 holds 292 slots, 20,896 redundant experts, of which 9,088 can
be used).

Example, DeepSeek-V3 FP8 on 4 x DGX H100 (32 GPUs of 80 GB, default reserve 25%)::

    slot_bytes = 58 x 44,050,944 B = 2.555 GB
    available  = 80 - 19.078 (non-expert, FP8) - 4.0 (overhead) - 20.0 (KV) = 36.92 GB
    S = floor(36.92 / 2.555) = 14;  max_redundant = 32 x 14 - 256 = 192
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from placer.constants import DEFAULT_KV_RESERVE_FRACTION, DTYPES, GB, RUNTIME_OVERHEAD_GB
from placer.errors import InfeasibleError, Param, UsageError
from placer.model import ModelSpec, check_dtype
from placer.model.slots import fewest_slots_per_gpu
from placer.topology import Topology

__all__ = ["Capacity", "plan_capacity"]


@dataclass(frozen=True, eq=False)
class Capacity:
    """The memory budget of one model on one cluster.

    Attributes
    ----------
    model, topology: what was sized.
    dtype: expert dtype (``bf16``, ``fp8``, ``mxfp4``).
    slots_per_gpu: ``S``, the most slots every GPU can hold (memory bound; may exceed E).
    max_redundant: ``G x S - E``, the redundant experts per layer memory holds (may exceed
        :attr:`usable_max_redundant`, what a placement can use).
    slot_bytes: bytes of one slot across all MoE layers.
    expert_gb_per_gpu: GB of expert weights per GPU at ``slots_per_gpu``.
    kv_left_gb: GB left for the KV cache on the tightest GPU at ``slots_per_gpu``.
    min_slots_per_gpu: ``ceil(E / G)``, the fewest slots that hold every expert once.
    memory_gb: ``[G]`` float64, each GPU's memory, GB.
    non_expert_gb: GB of non-expert weights per GPU (after ``tp`` sharding).
    overhead_gb: runtime overhead per GPU, GB.
    kv_reserve_gb: ``[G]`` float64, KV-cache reserve of each GPU, GB.
    tp: GPUs each non-expert weight is sharded over (1 = replicated).
    limiting_gpu: rank of the GPU that bounds ``slots_per_gpu``.
    """

    model: ModelSpec
    topology: Topology
    dtype: str
    slots_per_gpu: int
    max_redundant: int
    slot_bytes: int
    expert_gb_per_gpu: float
    kv_left_gb: float
    min_slots_per_gpu: int
    memory_gb: np.ndarray
    non_expert_gb: float
    overhead_gb: float
    kv_reserve_gb: np.ndarray
    tp: int
    limiting_gpu: int

    @property
    def num_gpus(self) -> int:
        return self.topology.num_gpus

    @property
    def usable_slots_per_gpu(self) -> int:
        """``min(slots_per_gpu, E)``: a GPU never holds two replicas of one expert."""
        return min(self.slots_per_gpu, self.model.num_experts)

    @property
    def usable_max_redundant(self) -> int:
        """``G x min(S, E) - E``: the most redundant experts per layer a placement can
        use; beyond ``E`` slots per GPU every GPU already holds every expert."""
        return self.num_gpus * self.usable_slots_per_gpu - self.model.num_experts

    @property
    def available_gb(self) -> np.ndarray:
        """``[G]`` GB each GPU has for expert slots after weights, overhead and reserve."""
        return self.memory_gb - self.non_expert_gb - self.overhead_gb - self.kv_reserve_gb

    def expert_gb_at(self, slots_per_gpu: int) -> float:
        """GB of expert weights per GPU when each GPU holds ``slots_per_gpu`` slots."""
        return slots_per_gpu * self.slot_bytes / GB

    def kv_left_gb_at(self, slots_per_gpu: int) -> float:
        """GB left for the KV cache on the tightest GPU when each GPU holds ``slots_per_gpu``."""
        expert_gb = self.expert_gb_at(slots_per_gpu)
        return float(np.min(self.memory_gb - self.non_expert_gb - self.overhead_gb - expert_gb))

    def to_dict(self) -> dict[str, object]:
        """Figures for ``--json`` and reports (GB, bytes, counts)."""
        return {
            "model": self.model.name,
            "topology": self.topology.name,
            "dtype": self.dtype,
            "num_gpus": self.num_gpus,
            "num_experts": self.model.num_experts,
            "num_moe_layers": self.model.num_moe_layers,
            "expert_bytes": self.model.expert_bytes(self.dtype),
            "slot_bytes": self.slot_bytes,
            "slots_per_gpu": self.slots_per_gpu,
            "usable_slots_per_gpu": self.usable_slots_per_gpu,
            "min_slots_per_gpu": self.min_slots_per_gpu,
            "max_redundant": self.max_redundant,
            "usable_max_redundant": self.usable_max_redundant,
            "memory_gb": float(self.memory_gb[self.limiting_gpu]),
            "non_expert_gb": self.non_expert_gb,
            "overhead_gb": self.overhead_gb,
            "kv_reserve_gb": float(self.kv_reserve_gb[self.limiting_gpu]),
            "expert_gb_per_gpu": self.expert_gb_per_gpu,
            "kv_left_gb": self.kv_left_gb,
            "kv_left_gb_min_slots": self.kv_left_gb_at(self.min_slots_per_gpu),
            "tp": self.tp,
            "limiting_gpu": self.topology.gpu_names[self.limiting_gpu],
        }


def _reserve(
    memory_gb: np.ndarray, kv_reserve_gb: float | None, kv_reserve_fraction: float | None
) -> np.ndarray:
    if kv_reserve_gb is not None and kv_reserve_fraction is not None:
        raise UsageError(
            "give the KV-cache reserve once",
            where=Param("kv_reserve_gb"),
            hint="use either `kv_reserve_gb` or `kv_reserve_fraction`",
        )
    if kv_reserve_gb is not None:
        if not math.isfinite(kv_reserve_gb) or kv_reserve_gb < 0:
            raise UsageError(
                f"KV-cache reserve must be zero or more GB, got {kv_reserve_gb:g}",
                where=Param("kv_reserve_gb"), hint="give a value >= 0; the nearest valid one is 0",
            )
        return np.full_like(memory_gb, float(kv_reserve_gb))
    fraction = DEFAULT_KV_RESERVE_FRACTION if kv_reserve_fraction is None else kv_reserve_fraction
    if not 0 <= fraction < 1:
        raise UsageError(
            f"expected a KV-cache reserve fraction in [0, 1), got {fraction:g}",
            where=Param("kv_reserve_fraction"),
            hint="give a share from 0 up to, not including, 1 (0.9 keeps 90% for the KV cache)",
        )
    return memory_gb * fraction


def plan_capacity(
    model: ModelSpec,
    topology: Topology,
    dtype: str | None = None,
    *,
    kv_reserve_gb: float | None = None,
    kv_reserve_fraction: float | None = None,
    overhead_gb: float = RUNTIME_OVERHEAD_GB,
    tp: int = 1,
) -> Capacity:
    """Size the expert slots of ``model`` on ``topology``.

    Parameters
    ----------
    model, topology: what to size.
    dtype: expert dtype; the model's ``default_dtype`` when None.
    kv_reserve_gb: GB per GPU kept for the KV cache (exclusive with the fraction).
    kv_reserve_fraction: part of each GPU's memory kept for the KV cache; default
        ``constants.DEFAULT_KV_RESERVE_FRACTION`` when neither is given.
    overhead_gb: runtime memory per GPU besides weights and KV cache, GB.
    tp: GPUs that shard each non-expert weight (1: replicated on every GPU).

    Raises
    ------
    UsageError: inconsistent options (names the option).
    InfeasibleError: the ``ceil(E / G)`` slots needed to hold every expert once do not
        fit; the message gives needed vs available GB per GPU and the hint what would fit.
    """
    dtype = model.default_dtype if dtype is None else check_dtype(dtype)
    if not math.isfinite(overhead_gb) or overhead_gb < 0:
        raise UsageError(
            f"overhead must be zero or more GB, got {overhead_gb:g}", where=Param("overhead_gb"),
            hint="give a value >= 0; the nearest valid one is 0",
        )
    if tp < 1:
        raise UsageError(f"tp must be at least 1, got {tp}", where=Param("tp"),
                         hint="give a value >= 1; the nearest valid one is 1")
    memory = topology.memory_gb
    reserve = _reserve(memory, kv_reserve_gb, kv_reserve_fraction)
    num_gpus = topology.num_gpus
    slot_bytes = model.num_moe_layers * model.expert_bytes(dtype)
    non_expert_gb = model.non_expert_bytes(dtype) / tp / GB
    available = memory - non_expert_gb - overhead_gb - reserve
    # A hair of tolerance so an exact fit is not lost to float rounding.
    slots = np.floor(np.maximum(available, 0.0) * GB / slot_bytes + 1e-9).astype(np.int64)
    limiting = int(np.argmin(slots))
    slots_per_gpu = int(slots[limiting])
    min_slots = fewest_slots_per_gpu(model.num_experts, num_gpus)
    capacity = Capacity(
        model=model,
        topology=topology,
        dtype=dtype,
        slots_per_gpu=slots_per_gpu,
        max_redundant=num_gpus * slots_per_gpu - model.num_experts,
        slot_bytes=slot_bytes,
        expert_gb_per_gpu=slots_per_gpu * slot_bytes / GB,
        kv_left_gb=float(
            np.min(memory - non_expert_gb - overhead_gb - slots_per_gpu * slot_bytes / GB)
        ),
        min_slots_per_gpu=min_slots,
        memory_gb=memory,
        non_expert_gb=non_expert_gb,
        overhead_gb=float(overhead_gb),
        kv_reserve_gb=reserve,
        tp=tp,
        limiting_gpu=limiting,
    )
    if slots_per_gpu < min_slots:
        raise _does_not_fit(capacity)
    return capacity


def _does_not_fit(c: Capacity) -> InfeasibleError:
    """The error for a model that does not fit, with the figures and what would fit."""
    g = c.limiting_gpu
    model, topo = c.model, c.topology
    slot_gb = c.slot_bytes / GB
    memory = float(c.memory_gb[g])
    reserve = float(c.kv_reserve_gb[g])
    need = c.non_expert_gb + c.overhead_gb + reserve + c.min_slots_per_gpu * slot_gb
    message = (
        f"{model.name} ({c.dtype}) does not fit on {topo.name}: each of {topo.num_gpus} GPUs"
        f" needs {need:.1f} GB ({c.min_slots_per_gpu} slots x {slot_gb:.2f} GB + "
        f"{c.non_expert_gb:.1f} GB non-expert weights + {c.overhead_gb:.1f} GB overhead + "
        f"{reserve:.1f} GB KV reserve) but {topo.gpu_names[g]} has {memory:.1f} GB"
    )
    options: list[str] = []
    fit = math.floor(max(float(c.available_gb[g]), 0.0) / slot_gb + 1e-9)
    if fit >= 1:
        gpus = -(-model.num_experts // fit)
        per_node = int(topo.gpus_per_node.max())
        nodes = -(-gpus // per_node)
        options.append(
            f"at least {gpus} GPUs like {topo.gpu_names[g]} ({fit} slots each;"
            f" {nodes} nodes of {per_node})"
        )
    max_reserve = memory - c.non_expert_gb - c.overhead_gb - c.min_slots_per_gpu * slot_gb
    if max_reserve > 0:
        options.append(f"`kv_reserve_gb` {math.floor(max_reserve * 10) / 10:.1f} or less")
    expert_bytes = model.expert_bytes(c.dtype)
    for other in DTYPES:
        if other == c.dtype or model.expert_bytes(other) >= expert_bytes:
            continue
        try:
            smaller = plan_capacity(
                model,
                topo,
                other,
                kv_reserve_gb=reserve,
                overhead_gb=c.overhead_gb,
                tp=c.tp,
            )
        except InfeasibleError:
            continue
        options.append(f"`dtype` {other} ({smaller.slots_per_gpu} slots per GPU)")
    hint = (
        "would fit: " + "; ".join(options)
        if options
        else ("the non-expert weights alone do not fit: shard them with `tp` or use larger GPUs")
    )
    return InfeasibleError(message, hint=hint)
