"""vLLM (experimental): a JSON list of physical-to-logical ids per MoE layer.

vLLM's mainline has no file input for an initial placement.  The open proposal
(vllm-project/vllm pull request 49572, ``eplb_config.initial_expert_map_path``)
reads either one list shared by every MoE layer or one list per MoE layer::

    [[0, 1, 2, 3, 0, 1], [3, 2, 1, 0, 3, 2], ...]     # [num_moe_layers][P]

placer writes the per-layer form, rows in MoE-layer order (row ``i`` is the
model's ``i``-th MoE layer), and reads both forms.  ``P = E + num_redundant_experts``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from placer.engines.registry import (
    EngineFormat,
    EngineModel,
    build_placement,
    check_num_gpus,
    check_slot_row,
    int_list,
    read_head,
    read_json,
    register_engine,
    write_json,
)
from placer.errors import EngineFormatError
from placer.placement import Placement
from placer.regime import SERVING_ENGINES

ENGINE = SERVING_ENGINES["vllm"].title
LOADS_BY = SERVING_ENGINES["vllm"].loads_by
EXPERIMENTAL_NOTE = (
    "experimental: vLLM has no mainline file input yet; this follows the open"
    " initial_expert_map_path proposal (vllm-project/vllm PR 49572)"
)


def to_document(placement: Placement) -> list[list[int]]:
    """One list of ``P`` logical ids per MoE layer, in MoE-layer order."""
    return [row.tolist() for row in placement.physical_to_logical]


def from_document(
    doc: Any, path: Path, model: EngineModel, num_gpus: int | None
) -> Placement:
    """Parse either form of the proposal's map."""
    if not isinstance(doc, list) or not doc:
        raise EngineFormatError(
            "expected a list of expert ids, or one such list per MoE layer", where=str(path)
        )
    if all(isinstance(v, int) and not isinstance(v, bool) for v in doc):
        rows = [doc] * model.num_moe_layers  # one map shared by every MoE layer
    else:
        rows = [int_list(r, f"{path}: [{i}]", "a layer map") for i, r in enumerate(doc)]
        if len(rows) != model.num_moe_layers:
            raise EngineFormatError(
                f"{len(rows)} layer maps but {model.name} has {model.num_moe_layers} MoE layers"
                " (vLLM's map has one row per MoE layer)",
                where=str(path),
            )
    num_slots = len(rows[0])
    for i, row in enumerate(rows):
        check_slot_row(row, num_slots, model.num_experts, f"{path}: [{i}]", ENGINE)
    gpus = check_num_gpus(num_slots, num_gpus, path, ENGINE)
    return build_placement(np.asarray(rows, dtype=np.int64), model, gpus, path, ENGINE)


def write(placement: Placement, path: Path, model: EngineModel) -> list[str]:
    write_json(path, to_document(placement))
    return [
        f"# {EXPERIMENTAL_NOTE}",
        "# released vLLM rejects this flag (its EPLBConfig forbids unknown keys): it needs a"
        " build with that pull request",
        "--enable-expert-parallel --enable-eplb"
        f" --eplb-config '{{\"num_redundant_experts\": {placement.num_redundant},"
        ' "initial_expert_map_path": "{path}"}\'',
        f"# EP size (data-parallel x tensor-parallel) must be {placement.num_gpus}",
        "# with --enable-eplb vLLM re-balances on its own every eplb_config.step_interval"
        " steps (default 3000), replacing this placement: raise step_interval to keep it",
    ]


def read(path: Path, model: EngineModel, num_gpus: int | None) -> Placement:
    return from_document(read_json(path), path, model, num_gpus)


def sniff(path: Path) -> bool:
    return path.suffix == ".json" and read_head(path, 64).lstrip()[:1] == "["


FORMAT = register_engine(
    EngineFormat(
        name="vllm",
        engine=ENGINE,
        suffix=".json",
        write=write,
        read=read,
        sniff=sniff,
        experimental=True,
        suffixes=(".json",),
        suffix_rule=f"the {LOADS_BY} proposal reads a JSON file",
    )
)
