"""Finding a model: the preset catalog (``placer/data/models.yaml``), a model YAML, or a
Hugging Face ``config.json`` (:mod:`placer.model.hf_config`) -- :func:`load_model` knows all
three, so neither the specification nor the config reader needs the other's loader."""

from __future__ import annotations

import difflib
import re
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

from placer.errors import ModelError
from placer.io.yaml_schema import (
    Section,
    YamlDoc,
    decode_text,
    load_json,
    parse_yaml,
    read_document,
)
from placer.model.hf_config import is_hf_config, model_from_hf_config
from placer.model.spec import SPEC_KEYS_DOC, ModelSpec, model_from_section

__all__ = ["load_model", "model_from_dict", "model_names"]


def _catalog() -> dict[str, ModelSpec]:
    text = resources.files("placer").joinpath("data", "models.yaml").read_text(encoding="utf-8")
    doc = parse_yaml(text, "placer/data/models.yaml", ModelError)
    root = doc.root()
    models: dict[str, ModelSpec] = {}
    for path, value in root.items("models"):
        spec = model_from_section(Section(doc, value, path), "")
        models[spec.name] = replace(spec, source=f"preset {spec.name}")
    root.done()
    return models


_CACHE: dict[str, ModelSpec] = {}


def _presets() -> dict[str, ModelSpec]:
    if not _CACHE:
        _CACHE.update(_catalog())
    return _CACHE


def model_names() -> list[str]:
    """Canonical names of the catalog's models, in catalog order."""
    return list(_presets())


#: ``org/name``: how a Hugging Face repository id looks (``deepseek-ai/DeepSeek-V3``).
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
#: Prefixes of hub addresses that name the same repository id.
_HUB_PREFIXES = ("https://huggingface.co/", "http://huggingface.co/", "huggingface.co/", "hf.co/")


def _hub_id(text: str) -> str:
    """``text`` without a ``https://huggingface.co/`` prefix or a trailing slash."""
    for prefix in _HUB_PREFIXES:
        if text.lower().startswith(prefix):
            return text[len(prefix):].rstrip("/")
    return text


def _lookup(name: str) -> ModelSpec | None:
    key = name.lower()
    hub = _hub_id(name).lower()
    for spec in _presets().values():
        if key == spec.name.lower() or key in (a.lower() for a in spec.aliases):
            return spec
        if hub in (h.lower() for h in spec.hub_ids):
            return spec
    return None


def model_from_dict(data: dict[str, Any], source: str = "<dict>") -> ModelSpec:
    """Build a model from plain values shaped like the model YAML (for tests and APIs)."""
    doc = YamlDoc(data=data, source=source, error=ModelError)
    return model_from_section(doc.root(), source)


def _read_document(path: Path) -> YamlDoc:
    """A model file's document: JSON (checked as JSON first, for its error messages) or YAML."""
    if not path.exists() and not path.is_symlink():
        raise ModelError(
            "file not found", where=str(path),
            hint="pass a preset name, a model YAML or a Hugging Face config.json that exists",
        )
    text = decode_text(read_document(path, ModelError, what="model file"), str(path), ModelError)
    if path.suffix == ".json" or text.lstrip().startswith("{"):
        data = load_json(
            text, str(path), ModelError, hint="a Hugging Face config.json is one JSON object"
        )
        try:
            return parse_yaml(text, str(path), ModelError)  # the same values, with line numbers
        except ModelError:
            return YamlDoc(data=data, source=str(path), error=ModelError)
    return parse_yaml(text, str(path), ModelError)


def _load_file(path: Path) -> ModelSpec:
    """A model YAML file, or a Hugging Face ``config.json`` (recognised by its keys) or
    the folder holding it."""
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise ModelError(
                "folder has no config.json", where=str(path),
                hint="pass a Hugging Face model folder, its config.json, or a model YAML",
            )
        path = config
    doc = _read_document(path)
    if is_hf_config(doc.data):
        return model_from_hf_config(doc)
    return model_from_section(doc.root(), str(path))


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A catalog model by name, alias or hub id (case-insensitive), or a model file.

    Files: a model YAML, or a Hugging Face ``config.json`` (or the folder holding it)
    whose figures :mod:`placer.model.hf_config` derives.  Hub ids of the catalog's models
    (``deepseek-ai/DeepSeek-V3``) name their preset; placer never downloads.

    Raises
    ------
    ModelError: unknown name or hub id, missing file, or an invalid document (file,
        line, key).
    """
    text = str(name_or_path)
    path = Path(text)
    if (
        isinstance(name_or_path, Path)
        or path.suffix in (".yaml", ".yml", ".json")
        or path.is_file()
        or (path / "config.json").is_file()
    ):
        return _load_file(path)
    spec = _lookup(text)
    if spec is not None:
        return spec
    if _HUB_ID.match(_hub_id(text)):
        hub = _hub_id(text)
        raise ModelError(
            f"unknown model '{text}': no preset has this Hugging Face id, and placer does"
            " not download",
            where="model",
            hint=f"download its config.json (huggingface-cli download {hub}"
            " config.json --local-dir DIR) and pass `model` DIR/config.json",
        )
    names = model_names()
    all_names = names + [a for s in _presets().values() for a in s.aliases]
    close = difflib.get_close_matches(text.lower(), [n.lower() for n in all_names], n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    raise ModelError(
        f"unknown model '{text}': not a preset and no such file",
        where="model",
        hint=f"{hint}presets: {', '.join(names)}; or pass a model YAML file ({SPEC_KEYS_DOC})"
        " or a Hugging Face config.json",
    )
