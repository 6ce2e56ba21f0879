"""vLLM-Ascend: the static expert map JSON (``expert_map_path``).

vLLM-Ascend's ExpertLoadBalancer (vllm_ascend/ops/expert_load_balancer.py) reads::

    {"moe_layer_count": N,
     "layer_list": [{"layer_id": i, "device_count": G,
                     "device_list": [{"device_id": g, "device_expert": [S logical ids]}, ...]},
                    ...]}

It stacks ``device_expert`` into an ``[N, G, S]`` tensor: layers by position in
``layer_list`` (MoE-layer position, 0-based, not the absolute layer id), devices
by position in ``device_list``, so every device holds the same number of experts
and position ``s`` of device ``g`` is physical slot ``g*S + s``.

A device cannot hold an expert twice: ``generate_expert_placement_map`` keeps one local
index per (device, expert) (``map[layer, device, device_expert] = arange(S)``), so a
second copy would overwrite the first and the device would count ``S - 1`` experts.
Writing refuses such placements; reading one warns, as for every engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from placer.engines.registry import (
    EngineFormat,
    EngineModel,
    build_placement,
    check_exact_keys,
    check_slot_row,
    int_list,
    read_head,
    read_json,
    register_engine,
    write_json,
)
from placer.errors import EngineFormatError, PlacementError
from placer.placement import Placement
from placer.regime import SERVING_ENGINES

ENGINE = SERVING_ENGINES["vllm-ascend"].title
LOADS_BY = SERVING_ENGINES["vllm-ascend"].loads_by
TOP_KEYS = ("moe_layer_count", "layer_list")
LAYER_KEYS = ("layer_id", "device_count", "device_list")
DEVICE_KEYS = ("device_id", "device_expert")
_RULE = "vLLM-Ascend's expert map has exactly these keys"


def to_document(placement: Placement) -> dict[str, Any]:
    """The expert-map document; ``layer_id`` is the MoE-layer position."""
    layers = []
    for row in range(placement.num_layers):
        layers.append(
            {
                "layer_id": row,
                "device_count": placement.num_gpus,
                "device_list": [
                    {"device_id": gpu, "device_expert": placement.experts_on_gpu(row, gpu).tolist()}
                    for gpu in range(placement.num_gpus)
                ],
            }
        )
    return {"moe_layer_count": placement.num_layers, "layer_list": layers}


def from_document(
    doc: Any, path: Path, model: EngineModel, num_gpus: int | None
) -> Placement:
    """Parse and check a document against the model and vLLM-Ascend's layout."""
    doc = check_exact_keys(doc, TOP_KEYS, str(path), _RULE)
    count = doc["moe_layer_count"]
    layers = doc["layer_list"]
    if not isinstance(layers, list):
        raise EngineFormatError("layer_list must be a list", where=f"{path}: layer_list")
    if count != len(layers):
        raise EngineFormatError(
            f"moe_layer_count is {count} but layer_list has {len(layers)} layers",
            where=f"{path}: moe_layer_count",
        )
    if len(layers) != model.num_moe_layers:
        raise EngineFormatError(
            f"{len(layers)} layers but {model.name} has {model.num_moe_layers} MoE layers"
            " (vLLM-Ascend's map has one entry per MoE layer)",
            where=f"{path}: layer_list",
        )
    rows: list[list[int]] = []
    gpus: int | None = None
    slots_per_gpu: int | None = None
    for pos, layer in enumerate(layers):
        lwhere = f"{path}: layer_list[{pos}]"
        layer = check_exact_keys(layer, LAYER_KEYS, lwhere, _RULE)
        if layer["layer_id"] != pos:
            raise EngineFormatError(
                f"layer_id is {layer['layer_id']!r} but vLLM-Ascend indexes layers by"
                f" position: expected {pos}",
                where=lwhere,
            )
        devices = layer["device_list"]
        if not isinstance(devices, list) or layer["device_count"] != len(devices):
            raise EngineFormatError(
                f"device_count is {layer['device_count']!r} but device_list has"
                f" {len(devices) if isinstance(devices, list) else 'no'} devices",
                where=lwhere,
            )
        if gpus is None:
            gpus = len(devices)
        elif len(devices) != gpus:
            raise EngineFormatError(
                f"{len(devices)} devices where layer 0 has {gpus}", where=lwhere
            )
        row: list[int] = []
        for g, device in enumerate(devices):
            dwhere = f"{lwhere}.device_list[{g}]"
            device = check_exact_keys(device, DEVICE_KEYS, dwhere, _RULE)
            if device["device_id"] != g:
                raise EngineFormatError(
                    f"device_id is {device['device_id']!r}, expected {g} (devices are in rank"
                    " order)",
                    where=dwhere,
                )
            experts = int_list(device["device_expert"], dwhere, "device_expert")
            if slots_per_gpu is None:
                slots_per_gpu = len(experts)
            elif len(experts) != slots_per_gpu:
                raise EngineFormatError(
                    f"{len(experts)} experts where device 0 of layer 0 has {slots_per_gpu}"
                    " (vLLM-Ascend needs the same number on every device)",
                    where=dwhere,
                )
            row.extend(experts)
        check_slot_row(row, len(row), model.num_experts, lwhere, ENGINE)
        rows.append(row)
    if gpus is None:
        raise EngineFormatError("layer_list is empty", where=f"{path}: layer_list")
    if num_gpus is not None and num_gpus != gpus:
        raise EngineFormatError(
            f"the map has {gpus} devices but `ep_size` is {num_gpus}", where=str(path)
        )
    return build_placement(np.asarray(rows, dtype=np.int64), model, gpus, path, ENGINE)


def check_no_duplicates(placement: Placement) -> None:
    """EngineFormatError when a device would hold an expert twice (see the module)."""
    try:
        placement.check_distinct(
            "vLLM-Ascend's expert map keeps one slot per expert on a device", unit="device",
            hint="plan with `export` vllm-ascend:FILE (the planner then keeps two replicas of"
            " an expert off one GPU) or with `solver` eplb-valid, or export for an engine that"
            " loads such placements (sglang, trtllm, vllm)")
    except PlacementError as e:
        raise EngineFormatError(e.message, hint=e.hint) from None


def write(placement: Placement, path: Path, model: EngineModel) -> list[str]:
    check_no_duplicates(placement)
    write_json(path, to_document(placement))
    return [
        "--enable-expert-parallel"
        ' --additional-config \'{"eplb_config": {"expert_map_path": "{path}"}}\'',
        "# older vLLM-Ascend releases: --additional-config '{\"expert_map_path\": \"{path}\"}'",
        f"# EP size must be {placement.num_gpus}"
        f" ({placement.slots_per_gpu} experts per device, {placement.num_redundant} redundant)",
        "# vLLM-Ascend loads a static map only when the model's quantization method declares"
        " supports_eplb: check yours before serving",
    ]


def read(path: Path, model: EngineModel, num_gpus: int | None) -> Placement:
    return from_document(read_json(path), path, model, num_gpus)


def sniff(path: Path) -> bool:
    return path.suffix == ".json" and '"moe_layer_count"' in read_head(path, 200)


FORMAT = register_engine(
    EngineFormat(
        name="vllm-ascend",
        engine=ENGINE,
        suffix=".json",
        write=write,
        read=read,
        sniff=sniff,
        suffixes=(".json",),
        suffix_rule=f"{ENGINE} loads {LOADS_BY} as a JSON file",
        duplicates=False,
    )
)
