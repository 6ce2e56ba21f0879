"""Placement JSON, version 1: placer's own placement file (docs/placement.md).

A document::

    {"format": "placer-placement", "version": 1,
     "model": {"name": "deepseek-v3", "num_experts": 256, "top_k": 8},
     "topology": {"name": "4x-dgx-h200", "num_gpus": 32, "num_nodes": 4},
     "num_physical_experts": 288, "slots_per_gpu": 9,
     "layers": [{"layer": 3, "physical_to_logical": [...288 ints...]}, ...],
     "solver": {"name": "eplb", "status": "HEURISTIC", "objective": 1234.0, ...},
     "metrics": {"hot_shard_ratio_median": 1.01, ...},
     "regime": {"engine": "sglang", "workload": "decode", "tokens_per_gpu": 32}}

``regime`` (optional) is what the plan was judged under; commands that read the
placement take it as their default regime.

The JSON Schema ships as ``placer/data/placement.schema.json`` (:func:`schema`).
Reading checks the document against it with a small built-in validator (no
``jsonschema`` needed), then checks what a schema cannot say (lengths agree, every
expert has a replica), naming the file and field::

    plan.json: layers[2].physical_to_logical: expert 7 of layer 5 has no replica

A GPU may hold two replicas of one expert (DeepSeek's EPLB, the ``eplb`` solver, makes
such plans; SGLang, TensorRT-LLM and vLLM load them): :func:`read_placement` accepts
them with a :class:`~placer.errors.PlacerWarning` naming the first one, except those the
document's ``duplicates`` records: placer said them when it wrote the file, and does not
say them again each time it reads it back.

Writing is atomic (:func:`placer.io.fileio.atomic_path`) and validates its own output.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from placer.constants import MAX_DOCUMENT_BYTES, MAX_EXPERTS, MAX_GPUS, MAX_LAYER_ID, MAX_LAYERS
from placer.errors import PlacementError
from placer.io.fileio import write_text_atomic
from placer.io.yaml_schema import load_json, read_document
from placer.placement import Placement
from placer.placement.types import DUPLICATES_KEY, said_pairs

if TYPE_CHECKING:
    from placer.model import ModelSpec
    from placer.topology import Topology

__all__ = [
    "FORMAT",
    "VERSION",
    "placement_from_dict",
    "placement_to_dict",
    "read_placement",
    "schema",
    "schema_errors",
    "write_placement",
]

FORMAT = "placer-placement"
VERSION = 1

_SOLVER_KEYS = ("name", "status", "objective", "bound", "seconds")


def schema() -> dict[str, Any]:
    """The JSON Schema of placement files (draft 2020-12), as a dict."""
    text = resources.files("placer").joinpath("data/placement.schema.json").read_text("utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


# -- writing ------------------------------------------------------------------------


def placement_to_dict(
    placement: Placement,
    *,
    model_name: str | None = None,
    top_k: int | None = None,
    topology: Topology | Mapping[str, Any] | None = None,
    solver: Mapping[str, Any] | None = None,
    metrics: dict[str, Any] | None = None,
    regime: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The placement as a JSON-ready v1 document.

    Parameters
    ----------
    placement: what to write.
    model_name, top_k: the model's name and experts per token; default to
        ``placement.meta["model"]``.
    topology: a ``placer.topology.Topology`` (its ``name``, ``num_gpus``,
        ``num_nodes``), a dict with those keys, or None for
        ``placement.meta["topology"]`` (else only ``num_gpus``).
    solver: the ``solver`` section, a mapping with at least ``name`` and ``status``
        (:meth:`placer.problem.SolveResult.record`), or None for
        ``placement.meta["solver"]`` (else omitted).
    metrics: flat ``{name: number}``; default ``placement.meta["metrics"]``.
    regime: what the placement was judged under (:meth:`placer.regime.Regime.record`);
        default ``placement.meta["regime"]`` (else omitted).
    """
    meta = placement.meta
    model_meta = dict(meta.get("model") or {})
    model = {
        "name": model_name if model_name is not None else model_meta.get("name"),
        "num_experts": placement.num_experts,
        "top_k": top_k if top_k is not None else model_meta.get("top_k"),
    }
    doc: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "model": model,
        "topology": _topology_dict(placement, topology),
        "num_physical_experts": placement.num_physical,
        "slots_per_gpu": placement.slots_per_gpu,
        "layers": [
            {"layer": int(layer), "physical_to_logical": row.tolist()}
            for layer, row in zip(placement.layer_ids, placement.physical_to_logical, strict=True)
        ],
    }
    solver_doc = solver if solver is not None else meta.get("solver")
    if solver_doc is not None:
        doc["solver"] = _plain(dict(solver_doc))
    chosen_metrics = metrics if metrics is not None else meta.get("metrics")
    if chosen_metrics is not None:
        doc["metrics"] = _plain(dict(chosen_metrics))
    chosen_regime = regime if regime is not None else meta.get("regime")
    if chosen_regime is not None:
        doc["regime"] = _plain({k: v for k, v in chosen_regime.items() if v is not None})
    said = sorted(set(placement.duplicate_pairs) & said_pairs(meta))
    if said:  # said when the placement was made or read: not again when it is read back
        doc[DUPLICATES_KEY] = {"pairs": [list(p) for p in said],
                               "why": (meta.get(DUPLICATES_KEY) or {}).get("why")}
    return doc


def write_placement(
    path: str | os.PathLike[str],
    placement: Placement,
    *,
    model_name: str | None = None,
    top_k: int | None = None,
    topology: Topology | Mapping[str, Any] | None = None,
    solver: Mapping[str, Any] | None = None,
    metrics: dict[str, Any] | None = None,
    regime: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``placement`` as placement JSON v1, atomically; return the path.

    Arguments after ``placement`` are those of :func:`placement_to_dict`.  One layer
    per line keeps large placements readable and diffable.
    """
    doc = placement_to_dict(
        placement, model_name=model_name, top_k=top_k, topology=topology, solver=solver,
        metrics=metrics, regime=regime,
    )
    problems = schema_errors(doc)
    if problems:  # a bug in this module, not the user's input
        raise RuntimeError(f"placement document breaks its schema: {problems[0]}")
    write_text_atomic(path, _dumps(doc))
    return Path(path)


def _dumps(doc: dict[str, Any]) -> str:
    lines = ["{"]
    items = list(doc.items())
    for i, (key, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if key == "layers":
            lines.append('  "layers": [')
            rows = [json.dumps(layer, separators=(", ", ": ")) for layer in value]
            lines.append(",\n".join(f"    {row}" for row in rows))
            lines.append(f"  ]{comma}")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _topology_dict(
    placement: Placement, topology: Topology | Mapping[str, Any] | None
) -> dict[str, Any]:
    if topology is None:
        topology = placement.meta.get("topology")
    if topology is None:
        return {"name": None, "num_gpus": placement.num_gpus, "num_nodes": None}
    if isinstance(topology, Mapping):
        name, num_gpus, num_nodes = (
            topology.get("name"), topology.get("num_gpus"), topology.get("num_nodes"),
        )
    else:
        name, num_gpus, num_nodes = topology.name, topology.num_gpus, topology.num_nodes
    if num_gpus is not None and int(num_gpus) != placement.num_gpus:
        raise PlacementError(
            f"the placement spans {placement.num_gpus} GPUs but topology {name!r} has {num_gpus}",
            hint="plan for the topology you write the placement for",
        )
    return {
        "name": None if name is None else str(name),
        "num_gpus": placement.num_gpus,
        "num_nodes": None if num_nodes is None else int(num_nodes),
    }


def _plain(obj: Any) -> Any:
    """numpy and tuples to plain JSON values; non-finite floats to None."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | np.ndarray):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.bool_ | bool):
        return bool(obj)
    if isinstance(obj, np.integer | int):
        return int(obj)
    if isinstance(obj, np.floating | float):
        return float(obj) if math.isfinite(float(obj)) else None
    return obj


# -- reading ------------------------------------------------------------------------


def read_placement(
    path: str | os.PathLike[str], *, model: ModelSpec | None = None,
    warn_duplicates: bool = True
) -> Placement:
    """Read a placement JSON v1 file.

    Parameters
    ----------
    path: the file.
    model: a ``placer.model.ModelSpec`` to check against (expert count, and that
        every layer is one of its MoE layers), or None.
    warn_duplicates: issue a :class:`~placer.errors.PlacerWarning` when a GPU holds
        two replicas of one expert (:meth:`Placement.duplicate_warning`) that the
        document's ``duplicates`` does not record as said.

    Returns
    -------
    The placement; ``meta`` holds ``model``, ``topology``, ``solver``, ``metrics``,
    ``regime`` (as in the file) and ``source`` (the path).

    Raises
    ------
    PlacementError: unreadable file, bad JSON (with line and column), a field that
        breaks the schema, or a placement engines would reject.
    """
    source = str(path)
    doc = load_json(
        _read_bytes(Path(path)), source, PlacementError, unique_keys=True,
        hint="placement files are JSON documents written by `placer plan` or `placer import`",
    )
    placement = placement_from_dict(doc, source=source)
    if model is not None:
        placement.check_model(model, where=source)
    if warn_duplicates:
        placement.warn_duplicates(source)
    return placement


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, within placer's limits (:func:`placer.io.yaml_schema.read_document`).

    A named pipe is opened without waiting for a writer, so a pipe nothing writes to is
    an error instead of a wait without end (``-p <(...)`` still works).
    """
    try:
        is_pipe = stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        is_pipe = False  # read_document names the problem
    if not is_pipe:
        return read_document(path, PlacementError, what="placement file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_DOCUMENT_BYTES + 1)
    except OSError as e:
        raise PlacementError(f"cannot read the pipe ({e.strerror or e})", where=str(path),
                             hint="give the placement file itself") from None
    if not data:
        raise PlacementError(
            "a named pipe that nothing writes to", where=str(path),
            hint="start the program that writes the placement into it first, or give the"
            " placement file itself",
        )
    if len(data) > MAX_DOCUMENT_BYTES:
        raise PlacementError(
            f"more than {MAX_DOCUMENT_BYTES >> 20} MiB came through the pipe, the most placer"
            " reads of a placement file", where=str(path),
            hint="is this the right file? (limits: docs/limits.md)",
        )
    return data


def _schema_hint(field: str) -> str:
    """What to do about a field that breaks the schema."""
    if "physical_to_logical" in field:
        return ("physical_to_logical lists the expert id (0 .. model.num_experts - 1, an"
                " integer) each slot holds, num_physical_experts of them, GPU by GPU")
    if field.startswith("layers"):
        return 'layers is a list of {"layer": id, "physical_to_logical": [...]}, one per layer'
    return ("placement files are written by `placer plan` and `placer import`; fix the field"
            " or write the file again (format: docs/placement.md)")


def _check_limits(doc: dict[str, Any], source: str) -> None:
    """Refuse counts past placer's limits before anything is sized by them."""
    too_many = "is more than placer handles"
    hint = "is this the right file? (limits: docs/limits.md)"
    num_experts = doc["model"]["num_experts"]
    if num_experts > MAX_EXPERTS:
        raise PlacementError(f"{num_experts:,} experts per layer {too_many} ({MAX_EXPERTS:,})",
                             where=f"{source}: model.num_experts", hint=hint)
    num_gpus = doc["topology"]["num_gpus"]
    if num_gpus > MAX_GPUS:
        raise PlacementError(f"{num_gpus:,} GPUs {too_many} ({MAX_GPUS:,})",
                             where=f"{source}: topology.num_gpus", hint=hint)
    if len(doc["layers"]) > MAX_LAYERS:
        raise PlacementError(f"{len(doc['layers']):,} layers {too_many} ({MAX_LAYERS:,})",
                             where=f"{source}: layers", hint=hint)
    for i, layer in enumerate(doc["layers"]):
        if layer["layer"] > MAX_LAYER_ID:
            raise PlacementError(f"layer id {layer['layer']:,} {too_many} ({MAX_LAYER_ID:,})",
                                 where=f"{source}: layers[{i}].layer", hint=hint)


def placement_from_dict(doc: Any, *, source: str = "<placement>") -> Placement:
    """Build a :class:`Placement` from a v1 document; errors name ``source`` and the field."""
    if isinstance(doc, dict):
        if doc.get("format") != FORMAT and "format" in doc:
            raise PlacementError(
                f"unknown format {doc['format']!r}, expected {FORMAT!r}", where=f"{source}: format",
                hint="is this an engine's file? `placer import` reads those",
            )
        if "version" in doc and doc.get("version") != VERSION and isinstance(doc["version"], int):
            raise PlacementError(
                f"unsupported version {doc['version']}; this placer reads version {VERSION}",
                where=f"{source}: version", hint="upgrade placer to read newer placement files",
            )
    problems = schema_errors(doc)
    if problems:
        field, message = problems[0]
        raise PlacementError(message, where=f"{source}: {field}" if field else source,
                             hint=_schema_hint(field))
    _check_limits(doc, source)

    num_physical = doc["num_physical_experts"]
    slots_per_gpu = doc["slots_per_gpu"]
    num_gpus = doc["topology"]["num_gpus"]
    num_experts = doc["model"]["num_experts"]
    if num_gpus * slots_per_gpu != num_physical:
        raise PlacementError(
            f"{num_gpus} GPUs x {slots_per_gpu} slots per GPU = {num_gpus * slots_per_gpu},"
            f" not num_physical_experts = {num_physical}",
            where=f"{source}: num_physical_experts",
            hint="num_physical_experts is topology.num_gpus x slots_per_gpu",
        )
    if num_physical < num_experts:
        raise PlacementError(
            f"{num_physical} physical experts cannot hold {num_experts} experts",
            where=f"{source}: num_physical_experts",
            hint="every expert needs a slot: num_physical_experts >= model.num_experts",
        )
    rows = []
    first_row_of: dict[int, int] = {}
    for i, layer in enumerate(doc["layers"]):
        where = f"{source}: layers[{i}]"
        layer_id = layer["layer"]
        if layer_id in first_row_of:
            raise PlacementError(
                f"layer {layer_id} repeats layers[{first_row_of[layer_id]}]",
                where=f"{where}.layer", hint="give each layer once",
            )
        first_row_of[layer_id] = i
        row = layer["physical_to_logical"]
        if len(row) != num_physical:
            raise PlacementError(
                f"{len(row)} slots, expected num_physical_experts = {num_physical}",
                where=f"{where}.physical_to_logical", hint=_schema_hint("physical_to_logical"),
            )
        try:
            Placement(np.array([row]), np.array([layer_id]), num_experts, num_gpus)
        except PlacementError as e:
            raise PlacementError(
                e.message, where=f"{where}.physical_to_logical",
                hint=e.hint or _schema_hint("physical_to_logical"),
            ) from None
        rows.append(row)
    meta = {
        "model": doc["model"],
        "topology": doc["topology"],
        "solver": doc.get("solver"),
        "metrics": doc.get("metrics"),
        "regime": doc.get("regime"),
        "source": source,
    }
    if DUPLICATES_KEY in doc:
        meta[DUPLICATES_KEY] = doc[DUPLICATES_KEY]
    return Placement(
        physical_to_logical=np.array(rows, dtype=np.int64),
        layer_ids=np.array(list(first_row_of), dtype=np.int64),
        num_experts=num_experts,
        num_gpus=num_gpus,
        meta=meta,
    )


# -- a small JSON Schema validator ----------------------------------------------------

_JSON_TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
}


def schema_errors(doc: Any, schema_: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """``(field, message)`` for each way ``doc`` breaks the placement schema.

    Understands the keywords the shipped schema uses: ``type``, ``const``, ``enum``,
    ``required``, ``properties``, ``additionalProperties``, ``items``, ``minimum``,
    ``minItems``.  Fields are written ``layers[2].physical_to_logical[5]``; the
    document itself is ``""``.  Stops descending into a value at its first problem.
    """
    out: list[tuple[str, str]] = []
    _check(doc, schema_ if schema_ is not None else _schema_cached(), "", out)
    return out


_SCHEMA_CACHE: dict[str, Any] = {}


def _schema_cached() -> dict[str, Any]:
    if not _SCHEMA_CACHE:
        _SCHEMA_CACHE.update(schema())
    return _SCHEMA_CACHE


def _type_ok(value: Any, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, _JSON_TYPES[name])


def _describe(value: Any) -> str:
    kind = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )
    if isinstance(value, str | int | float | bool) and not isinstance(value, dict | list):
        text = json.dumps(value)
        return f"{kind} {text if len(text) <= 40 else text[:37] + '...'}"
    return kind


def _child(field: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{field}[{key}]"
    return f"{field}.{key}" if field else key


def _check(value: Any, rule: dict[str, Any], field: str, out: list[tuple[str, str]]) -> None:
    if "const" in rule and value != rule["const"]:
        out.append((field, f"expected {json.dumps(rule['const'])}, got {_describe(value)}"))
        return
    if "enum" in rule and value not in rule["enum"]:
        choices = ", ".join(json.dumps(v) for v in rule["enum"])
        out.append((field, f"expected one of {choices}, got {_describe(value)}"))
        return
    if "type" in rule:
        names = rule["type"] if isinstance(rule["type"], list) else [rule["type"]]
        if not any(_type_ok(value, name) for name in names):
            wanted = " or ".join(names)
            out.append((field, f"expected {wanted}, got {_describe(value)}"))
            return
    if "minimum" in rule and _type_ok(value, "number") and value < rule["minimum"]:
        out.append((field, f"expected a value >= {rule['minimum']}, got {value}"))
        return
    if isinstance(value, dict):
        for key in rule.get("required", []):
            if key not in value:
                out.append((_child(field, key), "required field is missing"))
        properties = rule.get("properties", {})
        extra = rule.get("additionalProperties", True)
        for key, item in value.items():
            if key in properties:
                _check(item, properties[key], _child(field, key), out)
            elif extra is False:
                out.append((_child(field, key), "unknown field"))
            elif isinstance(extra, dict):
                _check(item, extra, _child(field, key), out)
    if isinstance(value, list):
        if "minItems" in rule and len(value) < rule["minItems"]:
            out.append((field, f"expected at least {rule['minItems']} items, got {len(value)}"))
        if "items" in rule:
            for i, item in enumerate(value):
                before = len(out)
                _check(item, rule["items"], _child(field, i), out)
                if len(out) > before:
                    return  # one bad element of an array is enough to report
