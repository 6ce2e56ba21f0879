"""SGLang: ``--init-expert-location FILE.json`` with ``physical_to_logical_map``.

SGLang loads the JSON and passes its keys as keyword arguments to
``ExpertLocationMetadata.init_by_mapping`` (python/sglang/srt/eplb/expert_location.py),
so the document must hold ``physical_to_logical_map`` and nothing else::

    {"physical_to_logical_map": [[...P ids...], ...]}   # [num_hidden_layers][P]

Rows are indexed by the model's absolute layer id over *all* hidden layers
(``num_layers = config.num_hidden_layers``), dense layers included.  SGLang's own
trivial mapping fills every row with ``arange(P) % E``; placer writes dense rows the
same way.  ``P = E + R`` where ``R`` is ``--ep-num-redundant-experts``, and
``P % --ep-size == 0``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from placer.engines.registry import (
    EngineFormat,
    EngineModel,
    build_placement,
    check_exact_keys,
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

ENGINE = SERVING_ENGINES["sglang"].title
LOADS_BY = SERVING_ENGINES["sglang"].loads_by
KEY = "physical_to_logical_map"
_KEY_RULE = f"SGLang passes the file as keyword arguments, so {KEY} must be its only key"


def to_document(placement: Placement, model: EngineModel) -> dict[str, list[list[int]]]:
    """The JSON document: one row per hidden layer, dense rows trivial.

    ``placement`` rows must be the model's MoE layers (see ``fit_to_model``).
    """
    num_slots = placement.num_physical
    trivial = (np.arange(num_slots) % model.num_experts).tolist()
    rows = [trivial] * model.num_hidden_layers
    for row, layer in enumerate(placement.layer_ids):
        rows[int(layer)] = placement.physical_to_logical[row].tolist()
    return {KEY: rows}


def from_document(
    doc: object, path: Path, model: EngineModel, num_gpus: int | None
) -> Placement:
    """Parse and check a document; keep the MoE-layer rows."""
    doc = check_exact_keys(doc, [KEY], str(path), _KEY_RULE)
    rows = doc[KEY]
    if not isinstance(rows, list) or not rows:
        raise EngineFormatError(f"{KEY} must be a non-empty list of rows", where=str(path))
    if len(rows) != model.num_hidden_layers:
        raise EngineFormatError(
            f"{KEY} has {len(rows)} rows but SGLang needs one per hidden layer"
            f" ({model.num_hidden_layers} for {model.name}, dense layers included)",
            where=str(path),
        )
    first = int_list(rows[0], f"{path}: {KEY}[0]", "a row")
    num_slots = len(first)
    if num_slots < model.num_experts:
        raise EngineFormatError(
            f"rows have {num_slots} slots, fewer than the {model.num_experts} experts"
            " (SGLang needs num_experts + --ep-num-redundant-experts slots)",
            where=f"{path}: {KEY}[0]",
        )
    moe = set(model.moe_layer_ids)
    for layer, row in enumerate(rows):
        where = f"{path}: {KEY}[{layer}]"
        row = int_list(row, where, "a row")
        if layer in moe:
            check_slot_row(row, num_slots, model.num_experts, where, ENGINE)
        elif len(row) != num_slots or not all(0 <= e < model.num_experts for e in row):
            raise EngineFormatError(
                f"dense layer row must hold {num_slots} expert ids in [0, {model.num_experts})",
                where=where,
            )
    gpus = check_num_gpus(num_slots, num_gpus, path, ENGINE)
    p2l = np.asarray([rows[i] for i in model.moe_layer_ids], dtype=np.int64)
    return build_placement(p2l, model, gpus, path, ENGINE)


def write(placement: Placement, path: Path, model: EngineModel) -> list[str]:
    write_json(path, to_document(placement, model))
    gpus = placement.num_gpus
    return [
        f"--tp-size {gpus} --ep-size {gpus} --moe-a2a-backend deepep"
        f" --init-expert-location {{path}} --ep-num-redundant-experts {placement.num_redundant}",
        f"# EP spans the whole world: tensor-parallel size = EP size = {gpus} GPUs (with"
        " --nnodes / --node-rank on several nodes); an EP all-to-all backend such as DeepEP",
        "# SGLang then dispatches statically (--ep-dispatch-algorithm static is implied)",
    ]


def read(path: Path, model: EngineModel, num_gpus: int | None) -> Placement:
    return from_document(read_json(path), path, model, num_gpus)


def sniff(path: Path) -> bool:
    if path.suffix != ".json":
        return False
    head = read_head(path, 200)
    return f'"{KEY}"' in head


FORMAT = register_engine(
    EngineFormat(
        name="sglang", engine=ENGINE, suffix=".json", write=write, read=read, sniff=sniff,
        suffixes=(".json",),
        suffix_rule=f"{ENGINE} reads {LOADS_BY} by its suffix (.json: a JSON file,"
        " .pt: a torch file) and parses any other value as inline JSON",
    )
)
