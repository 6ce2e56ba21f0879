"""Engine-format registry: one module per serving engine, each registering itself.

An engine format knows how to turn a :class:`~placer.placement.Placement` into
the document an engine loads (``to_document``), how to write that document to a
file, and how to read such a file back into a placement.  The layer axis differs
per engine (SGLang: every hidden layer; TensorRT-LLM: absolute MoE layer ids;
vLLM, vLLM-Ascend, EPLB: MoE-layer position), so every format takes the model.

Public entry points: :func:`write_engine`, :func:`read_engine`,
:func:`engine_names`, :func:`sniff_engine`.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from placer.errors import EngineFormatError, Param, PlacementError, UsageError
from placer.io.fileio import reading
from placer.io.yaml_schema import decode_text, load_json, parse_yaml, read_document
from placer.placement import ModelLayers, Placement
from placer.regime import SERVING_ENGINES
from placer.stats import format_ranges


class EngineModel(ModelLayers, Protocol):
    """What the engine formats need from a model (``placer.model.ModelSpec`` has it)."""

    @property
    def num_hidden_layers(self) -> int: ...
    @property
    def num_moe_layers(self) -> int: ...


#: ``write(placement, path, model) -> hints``: write the engine file at ``path``
#: (a temporary file the registry renames); return lines telling how to load it,
#: with ``{path}`` where the final file name goes.
WriteFn = Callable[[Placement, Path, EngineModel], list[str]]
#: ``read(path, model, num_gpus) -> Placement``; ``num_gpus`` is None when the user
#: gave none (formats that do not record the GPU count then raise).
ReadFn = Callable[[Path, EngineModel, "int | None"], Placement]


@dataclass(frozen=True)
class EngineFormat:
    """One serving engine's placement file.

    Attributes
    ----------
    name: registry name, the CLI's ``--format`` value (a key of
        :data:`placer.regime.SERVING_ENGINES`).
    engine: the engine's name as users know it (``"SGLang"``: the entry's title).
    suffix: usual file suffix (``".json"``).
    write: see :data:`WriteFn`.
    read: see :data:`ReadFn`.
    sniff: ``sniff(path) -> bool``, whether a file looks like this format.
    experimental: the engine has no released loader for it yet.
    suffixes: the only suffixes the engine loads the file by (empty: any), and
    suffix_rule: why, in words (the engine's own rule), for the error.
    mtp_layers: the file holds the model's multi-token-prediction layers too
        (TensorRT-LLM); other formats get the main MoE layers only.
    duplicates: the engine loads two replicas of one expert on one GPU (False:
        vLLM-Ascend, whose map holds one slot per expert on a device).
    """

    name: str
    engine: str
    suffix: str
    write: WriteFn
    read: ReadFn
    sniff: Callable[[Path], bool]
    experimental: bool = False
    suffixes: tuple[str, ...] = ()
    suffix_rule: str = ""
    mtp_layers: bool = False
    duplicates: bool = True

    def check_output(self, path: str | Path, where: str | None = None) -> None:
        """UsageError when the engine would not load a file named ``path``."""
        path = Path(path)
        if not self.suffixes or path.suffix.lower() in self.suffixes:
            return
        stem = path.name if path.suffix else f"{path.name}"
        raise UsageError(
            f"{self.engine} would not load {path.name}: {self.suffix_rule}",
            where=where or str(path),
            hint=f"name the file with {' or '.join(self.suffixes)}, e.g. {stem}{self.suffixes[0]}",
        )


_FORMATS: dict[str, EngineFormat] = {}


def register_engine(fmt: EngineFormat) -> EngineFormat:
    """Make ``fmt`` available to :func:`write_engine`, :func:`read_engine` and the CLI.

    Its name must have an entry in :data:`placer.regime.SERVING_ENGINES` (the engine's
    title, dispatch and the engine its file implies), and its ``engine`` be that title."""
    entry = SERVING_ENGINES.get(fmt.name)
    if entry is None or entry.title != fmt.engine:
        raise ValueError(f"engine format {fmt.name!r} ({fmt.engine}) has no matching entry"
                         " in placer.regime.SERVING_ENGINES")
    _FORMATS[fmt.name] = fmt
    return fmt


def engine_names() -> list[str]:
    """Names of the registered engine formats, sorted."""
    return sorted(_FORMATS)


def get_engine(name: str) -> EngineFormat:
    """The format called ``name``; UsageError naming the choices otherwise."""
    if name not in _FORMATS:
        raise UsageError(
            f"unknown engine format {name!r}",
            where=Param("format"),
            hint=f"choose one of: {', '.join(sorted(_FORMATS))}",
        )
    return _FORMATS[name]


def write_engine(
    placement: Placement, fmt: str, path: str | Path, *, model: EngineModel
) -> list[str]:
    """Write ``placement`` in engine format ``fmt`` to ``path`` (atomically).

    Parameters
    ----------
    placement: the plan; its layers must be exactly the model's MoE layers.
    fmt: a name from :func:`engine_names`.
    path: output file.
    model: the served model (layer counts and ids, experts).

    Returns
    -------
    Lines telling how to load the file (server flags, config snippets).

    Raises
    ------
    EngineFormatError: the placement does not fit the model or the engine.
    """
    from placer.io.fileio import atomic_path

    engine = get_engine(fmt)
    engine.check_output(path)
    ordered = fit_to_model(placement, model, engine.engine, keep_mtp=engine.mtp_layers,
                           where=placement.meta.get("source") or str(path))
    with atomic_path(path) as tmp:
        hints = engine.write(ordered, tmp, model)
    return [line.replace("{path}", str(path)) for line in hints]


@dataclass(frozen=True)
class EngineExport:
    """One engine file written: its format, the engine that loads it, where it is, and
    the lines telling how to load it (server flags, config snippets)."""

    format: str
    engine: str
    path: str
    experimental: bool
    hints: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """``{format, engine, path, experimental, hints}`` (``--json``)."""
        return {"format": self.format, "engine": self.engine, "path": self.path,
                "experimental": self.experimental, "hints": list(self.hints)}

    def lines(self) -> list[str]:
        """A heading line (engine, experimental or not, path), then the hints."""
        note = " (experimental)" if self.experimental else ""
        return [f"# {self.engine}{note}: {self.path}", *self.hints]


def export_engine(
    placement: Placement, fmt: str, path: str | Path, *, model: EngineModel
) -> EngineExport:
    """:func:`write_engine`, and what was written: an :class:`EngineExport`."""
    engine = get_engine(fmt)
    hints = write_engine(placement, fmt, path, model=model)
    return EngineExport(fmt, engine.engine, str(path), engine.experimental, tuple(hints))


def read_engine(
    path: str | Path, fmt: str, *, model: EngineModel, num_gpus: int | None = None
) -> Placement:
    """Read an engine placement file back into a :class:`Placement`.

    Parameters
    ----------
    path: the engine file.
    fmt: a name from :func:`engine_names` (see :func:`sniff_engine`).
    model: the served model; gives the layer axis and expert count.
    num_gpus: EP size the engine ran with; needed by formats that do not record it
        (all but ``vllm-ascend``), checked against the file where it does.

    Raises
    ------
    EngineFormatError: the file breaks one of the engine's rules (the message says
        which, and where).
    """
    engine = get_engine(fmt)
    path = Path(path)
    check_input(path)
    if num_gpus is not None and num_gpus <= 0:
        raise UsageError(f"number of GPUs must be positive, got {num_gpus}", where=Param("ep_size"))
    try:
        return engine.read(path, model, num_gpus)
    except EngineFormatError as e:
        if e.hint:
            raise
        raise EngineFormatError(
            e.message, where=e.where,
            hint=f"is this {engine.engine}'s placement file for {model.name}? placer's"
            f" {engine.name!r} `format` writes one (docs/engines.md)",
        ) from None


def check_input(path: Path) -> None:
    """EngineFormatError unless ``path`` is a regular file (not missing, a folder, a link
    loop, a named pipe or a device)."""
    with reading(path, EngineFormatError, "engine file"):
        mode = path.stat().st_mode
    if stat.S_ISDIR(mode):
        raise EngineFormatError(
            "is a folder, not a file", where=str(path), hint="name the engine file itself"
        )
    if not stat.S_ISREG(mode):
        raise EngineFormatError(
            "not a regular file (a named pipe or a device)", where=str(path),
            hint="save the engine's placement file and import that",
        )


def sniff_engine(path: str | Path) -> str:
    """Guess the engine format of ``path``; UsageError when none or several match."""
    path = Path(path)
    check_input(path)  # sniffing a pipe would wait for a writer, and eat what it reads
    hits = [name for name, fmt in sorted(_FORMATS.items()) if _safe_sniff(fmt, path)]
    if len(hits) != 1:
        found = "no" if not hits else " and ".join(hits)
        raise UsageError(
            f"cannot tell the engine format of {path.name} ({found} format matches)",
            where=Param("format"),
            hint=f"pass `format`, one of: {', '.join(sorted(_FORMATS))}",
        )
    return hits[0]


def read_head(path: Path, size: int = 4096) -> str:
    """The first ``size`` characters of a text file, for ``sniff`` functions."""
    with path.open(encoding="utf-8", errors="replace") as f:
        return f.read(size)


def _safe_sniff(fmt: EngineFormat, path: Path) -> bool:
    try:
        return fmt.sniff(path)
    except (OSError, ValueError, UnicodeDecodeError):
        return False


# -- helpers shared by the engine modules -------------------------------------------


def fit_to_model(
    placement: Placement, model: EngineModel, engine: str, *, keep_mtp: bool = False,
    where: str | None = None,
) -> Placement:
    """``placement`` with its rows in the model's MoE-layer order, or EngineFormatError.

    Every engine needs one row for each MoE layer of the model and the model's
    expert count; a placement for other layers or another model is an error naming
    ``where`` (the placement's file, else the engine file) and the layer.  Rows of the
    model's MTP layers (``mtp_layer_ids``) follow when ``keep_mtp``, else are left out.
    """
    have = [int(i) for i in placement.layer_ids]
    known = {int(i) for i in (*model.moe_layer_ids, *model.mtp_layer_ids)}
    foreign = [row for row, layer in enumerate(have) if layer not in known]
    same_experts = int(model.num_experts) == placement.num_experts  # else that is the error
    place = f"{where}: layers[{foreign[0]}]" if where and foreign and same_experts else where
    try:
        placement.check_model(model, where=place)  # the experts and MoE layers of the model
    except PlacementError as e:
        raise EngineFormatError(e.message, where=e.where, hint=e.hint) from None
    want = [int(i) for i in model.moe_layer_ids]
    mtp = [int(i) for i in model.mtp_layer_ids]
    missing = sorted(set(want) - set(have))
    if missing:
        raise EngineFormatError(
            f"{engine} needs a placement for every MoE layer of {model.name};"
            f" {len(missing)} missing ({format_ranges(missing)})", where=where,
            hint="plan with statistics that cover every MoE layer",
        )
    if keep_mtp:
        want += [i for i in mtp if i in have]
    rows = [have.index(i) for i in want]
    return Placement(
        physical_to_logical=placement.physical_to_logical[rows],
        layer_ids=np.asarray(want, dtype=np.int64),
        num_experts=placement.num_experts,
        num_gpus=placement.num_gpus,
        meta=dict(placement.meta),
    )


def int_list(value: Any, where: str, what: str) -> list[int]:
    """``value`` as a list of ints, or EngineFormatError naming ``where``."""
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise EngineFormatError(
            f"{what} must be a list of integers", where=where,
            hint="expert ids are JSON integers (not strings, fractions, true/false or lists)",
        )
    return value


def check_exact_keys(doc: Any, keys: Sequence[str], where: str, rule: str) -> dict[str, Any]:
    """``doc`` as a dict with exactly ``keys``; EngineFormatError citing ``rule`` otherwise."""
    hint = "is this the right file, and `format` the engine that wrote it?"
    if not isinstance(doc, dict):
        raise EngineFormatError(
            f"expected an object with keys {', '.join(keys)}, got {type(doc).__name__}",
            where=where, hint=hint,
        )
    extra = [k for k in doc if k not in keys]
    if extra:
        raise EngineFormatError(f"unexpected key {extra[0]!r}: {rule}", where=where,
                                hint=f"remove {extra[0]!r}")
    missing = [k for k in keys if k not in doc]
    if missing:
        raise EngineFormatError(f"missing key {missing[0]!r}: {rule}", where=where, hint=hint)
    return doc


def check_slot_row(
    row: list[int], num_slots: int, num_experts: int, where: str, engine: str
) -> None:
    """One layer's slots: the right count, ids in range, every expert present."""
    if len(row) != num_slots:
        raise EngineFormatError(
            f"{len(row)} slots where {engine} expects {num_slots}", where=where,
            hint="every layer has the same number of slots (experts + redundant experts)",
        )
    bad = [i for i, e in enumerate(row) if not 0 <= e < num_experts]
    if bad:
        raise EngineFormatError(
            f"slot {bad[0]} holds expert {row[bad[0]]}, outside [0, {num_experts})",
            where=where,
            hint=f"expert ids run from 0 to {num_experts - 1}; is `model` the model the"
            " engine serves?",
        )
    absent = sorted(set(range(num_experts)) - set(row))
    if absent:
        raise EngineFormatError(
            f"expert {absent[0]} has no slot ({len(absent)} experts missing)",
            where=where,
            hint="every logical expert needs at least one replica",
        )


def check_num_gpus(num_slots: int, num_gpus: int | None, path: Path, engine: str) -> int:
    """The GPU count to split ``num_slots`` over; errors when absent or not a divisor."""
    if num_gpus is None:
        raise UsageError(
            f"{engine} placement files do not record the number of GPUs",
            where=Param("ep_size"),
            hint="pass `ep_size` with the EP size the engine serves with, or `topology` with"
            " the cluster it serves on",
        )
    if num_slots % num_gpus:
        raise EngineFormatError(
            f"{num_slots} slots per layer do not split over {num_gpus} GPUs"
            f" ({engine} needs the same number of slots on every GPU)",
            where=str(path), hint="check `ep_size` (or `topology`): the EP size the engine ran",
        )
    return num_gpus


def build_placement(
    physical_to_logical: np.ndarray,
    model: EngineModel,
    num_gpus: int,
    path: Path,
    engine: str,
) -> Placement:
    """A validated Placement over the model's MoE layers; errors carry the file.

    A GPU holding two replicas of one expert is accepted (SGLang, TensorRT-LLM and
    DeepSeek's EPLB produce and load such files) with a :class:`PlacerWarning` that
    names the first one (:meth:`Placement.duplicate_warning`).
    """
    try:
        placement = Placement(
            physical_to_logical=physical_to_logical,
            layer_ids=np.asarray(model.moe_layer_ids, dtype=np.int64),
            num_experts=model.num_experts,
            num_gpus=num_gpus,
            meta={"engine": engine, "source": str(path), "model": {"name": model.name}},
        )
    except PlacementError as e:
        raise EngineFormatError(e.message, where=str(path), hint=e.hint) from None
    placement.warn_duplicates(str(path), stacklevel=3)
    return placement


def read_json(path: Path) -> Any:
    """Parse a JSON file within placer's limits (size, nesting, int64, no NaN, UTF-8, each
    key once); EngineFormatError with the line on bad syntax."""
    data = read_document(path, EngineFormatError, what="engine file")
    return load_json(data, str(path), EngineFormatError, unique_keys=True,
                     hint="is the file complete? engines write these files as JSON")


def read_yaml_data(path: Path) -> Any:
    """Parse a YAML file within placer's limits (size, alias expansion, nesting, int64,
    UTF-8, each key once; safe tags only)."""
    data = read_document(path, EngineFormatError, what="engine file")
    text = decode_text(data, str(path), EngineFormatError)
    return parse_yaml(text, str(path), EngineFormatError).data


def write_json(path: Path, doc: Any) -> None:
    """Write ``doc`` as compact JSON (engines parse it; people use ``placer import``)."""
    path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
