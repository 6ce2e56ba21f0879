"""TensorRT-LLM: the MoE load-balancer YAML (``moe_config.load_balancer``).

``MoeLoadBalancerConfig`` (tensorrt_llm/llmapi/llm_args.py) is a strict model with
three fields, so the file holds exactly::

    num_slots: 288                      # P, slots per MoE layer over all EP ranks
    initial_global_assignments:         # absolute MoE layer id -> P logical ids
      3: [138, 81, 60, ...]
      ...
    layer_updates_per_iter: 0           # 0 = static placement, no online moves

TensorRT-LLM checks ``num_slots % ep_size == 0`` and that every MoE layer has a
list of ``num_slots`` ids; rank ``r`` holds slots ``r*S .. r*S+S-1``.  Keys are the
model's absolute layer ids (DeepSeek-V3: 3..60), as its own
examples/ep_load_balancer/generate_eplb_config.py writes them.

Multi-token prediction: served with MTP, DeepSeek-V3 / R1 build one more MoE layer,
``DeepseekV3MTP(num_hidden_layers + i)`` (tensorrt_llm/_torch/models/modeling_deepseekv3.py),
and ``MoeLoadBalancerConfig.get_layer_initial_global_assignments`` raises KeyError for a
layer the file lacks.  The file therefore also holds the model's MTP layers (layer 61): the
placement's row when it planned them (statistics recorded with MTP on hold them), else
TensorRT-LLM's own default layout (:func:`default_assignments`).  The key is ignored when
MTP is off.

TensorRT-LLM creates the load balancer only for the architectures in
:data:`LOAD_BALANCER_ARCHITECTURES` (``moe_model_arch_list`` in
tensorrt_llm/_torch/modules/fused_moe/moe_load_balancer.py); for any other (gpt-oss) it
ignores ``moe_config.load_balancer``, and exporting warns.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from placer.engines.registry import (
    EngineFormat,
    EngineModel,
    build_placement,
    check_exact_keys,
    check_num_gpus,
    check_slot_row,
    int_list,
    read_head,
    read_yaml_data,
    register_engine,
)
from placer.errors import EngineFormatError, PlacerWarning
from placer.placement import Placement
from placer.regime import SERVING_ENGINES
from placer.stats import format_ranges

ENGINE = SERVING_ENGINES["trtllm"].title
#: Hugging Face architectures for which TensorRT-LLM builds its MoE load balancer.
LOAD_BALANCER_ARCHITECTURES = (
    "DeepseekV3ForCausalLM",
    "MixtralForCausalLM",
    "Llama4ForConditionalGeneration",
    "Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM",
)
KEYS = ("num_slots", "initial_global_assignments", "layer_updates_per_iter")
_KEY_RULE = (
    "TensorRT-LLM's MoeLoadBalancerConfig takes exactly num_slots,"
    " initial_global_assignments and layer_updates_per_iter"
)


def default_assignments(num_experts: int, num_gpus: int, slots_per_gpu: int) -> list[int]:
    """TensorRT-LLM's layout for a layer the load-balancer file leaves out: ``[P]``.

    Rank ``r``'s local slot ``i`` holds expert ``(r * E // G + i) % E``: each rank starts
    at its even share of the experts and fills its ``S`` slots with the ones that follow
    (the fused MoE modules' ``initial_global_assignments`` when none is loaded).
    """
    return [
        (rank * num_experts // num_gpus + i) % num_experts
        for rank in range(num_gpus)
        for i in range(slots_per_gpu)
    ]


def to_document(placement: Placement, mtp_layer_ids: tuple[int, ...] = ()) -> dict[str, Any]:
    """The YAML document; ``placement`` rows are the model's MoE layers (and any MTP layers
    it planned); the other ``mtp_layer_ids`` get :func:`default_assignments`."""
    rows = {
        int(layer): placement.physical_to_logical[row].tolist()
        for row, layer in enumerate(placement.layer_ids)
    }
    default = default_assignments(
        placement.num_experts, placement.num_gpus, placement.slots_per_gpu
    )
    for layer in mtp_layer_ids:
        rows.setdefault(int(layer), default)
    return {
        "num_slots": placement.num_physical,
        "initial_global_assignments": dict(sorted(rows.items())),
        "layer_updates_per_iter": 0,
    }


def dump_yaml(doc: dict[str, Any]) -> str:
    """YAML with each slot list on one line (flow style), keys in engine order."""
    return yaml.dump(doc, Dumper=_InlineListDumper, sort_keys=False, width=1 << 30)


class _InlineListDumper(yaml.SafeDumper):
    """SafeDumper that writes lists in flow style and mappings in block style."""


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True)


_InlineListDumper.add_representer(list, _represent_list)


def from_document(
    doc: Any, path: Path, model: EngineModel, num_gpus: int | None
) -> Placement:
    """Parse and check a document against the model and TensorRT-LLM's rules."""
    doc = check_exact_keys(doc, KEYS, str(path), _KEY_RULE)
    num_slots = doc["num_slots"]
    if not isinstance(num_slots, int) or isinstance(num_slots, bool) or num_slots <= 0:
        raise EngineFormatError("num_slots must be a positive integer", where=f"{path}: num_slots")
    if num_slots < model.num_experts:
        raise EngineFormatError(
            f"num_slots {num_slots} is below the {model.num_experts} experts of {model.name}",
            where=f"{path}: num_slots",
        )
    updates = doc["layer_updates_per_iter"]
    if not isinstance(updates, int) or isinstance(updates, bool) or updates < 0:
        raise EngineFormatError(
            "layer_updates_per_iter must be a non-negative integer",
            where=f"{path}: layer_updates_per_iter",
        )
    if updates:
        warnings.warn(
            f"{path}: layer_updates_per_iter is {updates}: TensorRT-LLM moves experts online;"
            " this file is only the initial placement",
            PlacerWarning,
            stacklevel=2,
        )
    assignments = doc["initial_global_assignments"]
    if not isinstance(assignments, dict):
        raise EngineFormatError(
            "initial_global_assignments must map layer ids to slot lists",
            where=f"{path}: initial_global_assignments",
        )
    bad_keys = [k for k in assignments if not isinstance(k, int) or isinstance(k, bool)]
    if bad_keys:
        raise EngineFormatError(
            f"key {bad_keys[0]!r} is not an integer layer id",
            where=f"{path}: initial_global_assignments",
        )
    moe = list(model.moe_layer_ids)
    mtp = [int(i) for i in model.mtp_layer_ids]
    extra = sorted(set(assignments) - set(moe) - set(mtp))
    if extra:
        with_mtp = f", MTP {format_ranges(mtp)}" if mtp else ""
        hint = "is `model` the model TensorRT-LLM serves with this file?"
        if extra[0] == model.num_hidden_layers:
            hint = (
                f"layer {extra[0]} follows {model.name}'s {model.num_hidden_layers} hidden"
                " layers, as a multi-token-prediction (MTP) layer does: give a model with"
                " num_nextn_predict_layers (its config.json or a model YAML)"
            )
        raise EngineFormatError(
            f"layer {extra[0]} is not a MoE layer of {model.name}; TensorRT-LLM keys are"
            f" absolute MoE layer ids ({moe[0]}..{moe[-1]}{with_mtp})",
            where=f"{path}: initial_global_assignments",
            hint=hint,
        )
    missing = [i for i in moe if i not in assignments]
    if missing:
        raise EngineFormatError(
            f"MoE layer {missing[0]} has no assignment ({len(missing)} layers missing);"
            " TensorRT-LLM needs one for every MoE layer",
            where=f"{path}: initial_global_assignments",
        )
    # MTP layers are optional: TensorRT-LLM looks them up only when serving with MTP
    layers = moe + [i for i in mtp if i in assignments]
    rows = []
    for layer in layers:
        where = f"{path}: initial_global_assignments[{layer}]"
        row = int_list(assignments[layer], where, "an assignment")
        check_slot_row(row, num_slots, model.num_experts, where, f"{ENGINE} (num_slots)")
        rows.append(row)
    if num_gpus is not None and num_slots % num_gpus:
        raise EngineFormatError(
            f"num_slots {num_slots} is not divisible by ep_size {num_gpus}"
            " (TensorRT-LLM requires num_slots % ep_size == 0)",
            where=f"{path}: num_slots",
        )
    gpus = check_num_gpus(num_slots, num_gpus, path, ENGINE)
    on_layers = _Layers(model.name, model.num_hidden_layers, tuple(layers), model.num_experts)
    return build_placement(np.asarray(rows, dtype=np.int64), on_layers, gpus, path, ENGINE)


@dataclass(frozen=True)
class _Layers:
    """A model seen through the layers a file holds (its MoE layers, then MTP layers)."""

    name: str
    num_hidden_layers: int
    moe_layer_ids: tuple[int, ...]
    num_experts: int
    mtp_layer_ids: tuple[int, ...] = ()  # the file's MTP rows are among moe_layer_ids

    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layer_ids)


def _check_architecture(model: EngineModel) -> None:
    """Warn when TensorRT-LLM would ignore the load balancer for this model."""
    architecture = getattr(model, "architecture", "")
    if architecture and architecture not in LOAD_BALANCER_ARCHITECTURES:
        warnings.warn(
            f"{model.name} is {architecture}, for which TensorRT-LLM does not create its MoE"
            " load balancer (only for " + ", ".join(LOAD_BALANCER_ARCHITECTURES) + "): it"
            " ignores moe_config.load_balancer and keeps its experts in their default layout,"
            " unreplicated",
            PlacerWarning,
            stacklevel=2,
        )


def write(placement: Placement, path: Path, model: EngineModel) -> list[str]:
    _check_architecture(model)
    mtp = tuple(int(i) for i in model.mtp_layer_ids)
    path.write_text(dump_yaml(to_document(placement, mtp)))
    hints = [
        "# extra_llm_api_options.yaml (trtllm-serve / trtllm-bench --extra_llm_api_options)",
        "moe_config:",
        "  backend: WIDEEP",
        "  load_balancer: {path}",
        f"# serve with --ep_size {placement.num_gpus}"
        f" (num_slots {placement.num_physical} = {placement.slots_per_gpu} per rank)",
    ]
    if mtp:
        planned = set(int(i) for i in placement.layer_ids)
        how = ("planned from its statistics" if all(i in planned for i in mtp)
               else "TensorRT-LLM's default layout (no statistics for it)")
        hints.append(f"# MTP layer {format_ranges(mtp)} (used when serving with MTP): {how}")
    return hints


def read(path: Path, model: EngineModel, num_gpus: int | None) -> Placement:
    return from_document(read_yaml_data(path), path, model, num_gpus)


def sniff(path: Path) -> bool:
    return path.suffix in (".yaml", ".yml") and "initial_global_assignments" in read_head(path)


FORMAT = register_engine(
    EngineFormat(
        name="trtllm", engine=ENGINE, suffix=".yaml", write=write, read=read, sniff=sniff,
        mtp_layers=True,
    )
)
