"""What ``placer model list``, ``placer model show`` and ``placer capacity`` show.

Rows of text cells, computed from a :class:`~placer.model.ModelSpec` and a
:class:`~placer.model.capacity.Capacity`, so the commands only lay them out (the topology's
counterpart is :mod:`placer.topology.describe`).  Sizes: MB = 1e6 bytes, GB = 1e9 bytes
(``placer.constants.GB``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from placer.constants import GB
from placer.model import ModelSpec, model_to_dict

if TYPE_CHECKING:
    from placer.model.capacity import Capacity
    from placer.topology import Topology

MB = 1e6

#: Headings of :func:`preset_row` (``placer model list``).
PRESET_HEADERS = ("name", "MoE/layers", "experts", "top-k", "shared", "hidden/ffn",
                  "expert MB bf16", "expert MB default", "default", "params B")

#: Headings of :func:`dtype_rows` (``placer model show``).
DTYPE_HEADERS = ("dtype", "expert MB", "of which scales MB", "slot GB (all MoE layers)",
                 "all experts GB", "non-expert GB", "dispatch B/token")


def layer_ranges(ids: Sequence[int]) -> str:
    """``3..60`` for a contiguous run, ``1..47 step 2`` for a stride, else the list."""
    if len(ids) == 1:
        return str(ids[0])
    step = ids[1] - ids[0]
    if all(b - a == step for a, b in itertools.pairwise(ids)):
        return f"{ids[0]}..{ids[-1]}" + (f" step {step}" if step != 1 else "")
    return ",".join(str(i) for i in ids)


def preset_row(m: ModelSpec) -> tuple[Any, ...]:
    """One line of the preset list: shape, expert sizes and total parameters."""
    return (
        m.name, f"{m.num_moe_layers}/{m.num_hidden_layers}", m.num_experts, m.top_k,
        m.num_shared_experts, f"{m.hidden_size}/{m.moe_intermediate_size}",
        f"{m.expert_bytes('bf16') / MB:.1f}", f"{m.expert_bytes(m.default_dtype) / MB:.1f}",
        m.default_dtype, f"{m.total_params / 1e9:.1f}",
    )


def _mtp_row(m: ModelSpec) -> str:
    """``1 (id 61, when served with MTP)`` or ``-``."""
    if not m.num_nextn_predict_layers:
        return "-"
    ids = layer_ranges(m.mtp_layer_ids)
    word = "id" if m.num_nextn_predict_layers == 1 else "ids"
    return f"{m.num_nextn_predict_layers} ({word} {ids}, when served with MTP)"


def spec_rows(m: ModelSpec) -> list[tuple[str, Any]]:
    """``(field, value)`` rows of one model."""
    groups = f"{m.num_groups} groups, top {m.top_groups}" if m.num_groups > 1 else "ungrouped"
    return [
        ("aliases", ", ".join(m.aliases) or "-"),
        ("hidden layers", m.num_hidden_layers),
        ("MoE layers", f"{m.num_moe_layers} (ids {layer_ranges(m.moe_layer_ids)})"),
        ("MTP layers", _mtp_row(m)),
        ("experts / top-k", f"{m.num_experts} / {m.top_k} ({groups})"),
        ("shared experts", m.num_shared_experts),
        ("hidden / expert FFN", f"{m.hidden_size} / {m.moe_intermediate_size}"),
        ("params per expert", f"{m.expert_params:,}" + (" (with biases)" if m.expert_bias else "")),
        ("non-expert params", f"{m.non_expert_params:,}"),
        ("total / active params", f"{m.total_params / 1e9:.2f} B / {m.active_params / 1e9:.2f} B"),
        ("default dtype", m.default_dtype),
        ("architecture", m.architecture or "-"),
        ("hub ids", ", ".join(m.hub_ids) or "-"),
    ]


def dtype_rows(m: ModelSpec) -> list[tuple[Any, ...]]:
    """One row per dtype: expert, scale, slot, all-expert and non-expert sizes, and the
    bytes one token's activation takes in dispatch."""
    return [
        (dtype, f"{b['expert'] / MB:.2f}", f"{b['expert_scales'] / MB:.3f}",
         f"{b['slot'] / GB:.3f}", f"{b['all_experts'] / GB:.1f}", f"{b['non_expert'] / GB:.2f}",
         b["activation"])
        for dtype, b in model_to_dict(m)["bytes"].items()
    ]


def _gb(value: float) -> str:
    return f"{value:.2f} GB"


def capacity_rows(c: Capacity, spec: ModelSpec, topology: Topology) -> list[tuple[str, Any]]:
    """``(figure, value)`` rows of a capacity plan, on its most constrained GPU."""
    g, usable = c.limiting_gpu, c.usable_slots_per_gpu
    return [
        ("expert bytes (one layer)", f"{spec.expert_bytes(c.dtype) / MB:.2f} MB"),
        ("slot bytes (all MoE layers)", _gb(c.expert_gb_at(1))),
        ("GPU memory (smallest)", f"{_gb(float(c.memory_gb[g]))} ({topology.gpu_names[g]})"),
        (f"non-expert weights (tp {c.tp})", _gb(c.non_expert_gb)),
        ("runtime overhead", _gb(c.overhead_gb)),
        ("KV-cache reserve", _gb(float(c.kv_reserve_gb[g]))),
        ("left for experts", _gb(float(c.available_gb[g]))),
        ("slots per GPU (memory bound)", c.slots_per_gpu),
        ("slots per GPU (usable, <= experts)", usable),
        ("slots per GPU (no redundancy)", c.min_slots_per_gpu),
        ("max redundant experts per layer", c.usable_max_redundant),
        ("expert weights per GPU at usable", _gb(c.expert_gb_at(usable))),
        ("KV cache left per GPU at usable", _gb(c.kv_left_gb_at(usable))),
        ("KV cache left per GPU, no redundancy", _gb(c.kv_left_gb_at(c.min_slots_per_gpu))),
    ]


def capacity_note(c: Capacity, spec: ModelSpec, topology: Topology) -> str | None:
    """Why engines can use fewer redundant experts than memory holds, or None."""
    usable = c.usable_slots_per_gpu
    if usable >= c.slots_per_gpu:
        return None
    return (
        f"max redundant experts per layer: {c.usable_max_redundant:,} = {topology.num_gpus}"
        f" GPUs x {usable} slots - {spec.num_experts} experts, not the"
        f" {c.max_redundant:,} the memory holds: with {usable} slots every GPU holds"
        " every expert, and a second replica on one GPU takes memory but adds no"
        " dispatch bandwidth"
    )
