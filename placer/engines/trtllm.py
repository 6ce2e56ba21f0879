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
"""

from __future__ import annotations

import warnings
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
    register_engine,
)
from placer.errors import EngineFormatError, PlacerWarning
from placer.placement import Placement

ENGINE = "TensorRT-LLM"
KEYS = ("num_slots", "initial_global_assignments", "layer_updates_per_iter")
_KEY_RULE = (
    "TensorRT-LLM's MoeLoadBalancerConfig takes exactly num_slots,"
    " initial_global_assignments and layer_updates_per_iter"
)


def to_document(placement: Placement) -> dict[str, Any]:
    """The YAML document; ``placement`` rows are the model's MoE layers."""
    return {
        "num_slots": placement.num_physical,
        "initial_global_assignments": {
            int(layer): placement.physical_to_logical[row].tolist()
            for row, layer in enumerate(placement.layer_ids)
        },
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
    extra = sorted(set(assignments) - set(moe))
    if extra:
        raise EngineFormatError(
            f"layer {extra[0]} is not a MoE layer of {model.name}; TensorRT-LLM keys are"
            f" absolute MoE layer ids ({moe[0]}..{moe[-1]})",
            where=f"{path}: initial_global_assignments",
        )
    missing = [i for i in moe if i not in assignments]
    if missing:
        raise EngineFormatError(
            f"MoE layer {missing[0]} has no assignment ({len(missing)} layers missing);"
            " TensorRT-LLM needs one for every MoE layer",
            where=f"{path}: initial_global_assignments",
        )
    rows = []
    for layer in moe:
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
    return build_placement(np.asarray(rows, dtype=np.int64), model, gpus, path, ENGINE)


def write(placement: Placement, path: Path, model: EngineModel) -> list[str]:
    path.write_text(dump_yaml(to_document(placement)))
    return [
        "# extra_llm_api_options.yaml (trtllm-serve / trtllm-bench --extra_llm_api_options)",
        "moe_config:",
        "  backend: WIDEEP",
        "  load_balancer: {path}",
        f"# serve with --ep_size {placement.num_gpus}"
        f" (num_slots {placement.num_physical} = {placement.slots_per_gpu} per rank)",
    ]


def read(path: Path, model: EngineModel, num_gpus: int | None) -> Placement:
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise EngineFormatError(f"invalid YAML: {getattr(e, 'problem', e)}", where=where) from None
    return from_document(doc, path, model, num_gpus)


def sniff(path: Path) -> bool:
    return path.suffix in (".yaml", ".yml") and "initial_global_assignments" in read_head(path)


FORMAT = register_engine(
    EngineFormat(
        name="trtllm", engine=ENGINE, suffix=".yaml", write=write, read=read, sniff=sniff
    )
)
