"""Load a topology by preset name or file path.

Presets are the YAML files of ``placer/data/topologies/`` (packaged with placer; the
repository's top-level ``topologies/`` is a link to that folder), named by file stem.
"""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path
from typing import Any

from placer.errors import TopologyError
from placer.topology.graph import build_topology
from placer.topology.schema import read_spec
from placer.topology.types import Topology
from placer.yaml_schema import YamlDoc, parse_yaml, read_yaml

_PRESET_PACKAGE = "placer"
_PRESET_FOLDER = ("data", "topologies")


def _preset_dir() -> Any:
    folder = resources.files(_PRESET_PACKAGE)
    for part in _PRESET_FOLDER:
        folder = folder.joinpath(part)
    return folder


def preset_names() -> list[str]:
    """Names of the built-in topologies, sorted (empty if the folder was not packaged)."""
    folder = _preset_dir()
    if not folder.is_dir():
        return []
    return sorted(
        entry.name.removesuffix(".yaml")
        for entry in folder.iterdir()
        if entry.name.endswith(".yaml")
    )


def preset_text(name: str) -> str:
    """The YAML text of preset ``name`` (comments included)."""
    if name not in preset_names():
        raise _unknown(name)
    return str(_preset_dir().joinpath(f"{name}.yaml").read_text(encoding="utf-8"))


def _unknown(name: str) -> TopologyError:
    names = preset_names()
    close = difflib.get_close_matches(name.lower(), names, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return TopologyError(
        f"unknown topology '{name}': not a preset and no such file",
        where="topology",
        hint=f"{hint}presets: {', '.join(names)}; or pass a YAML file path",
    )


def topology_from_doc(doc: YamlDoc, source: str | None = None) -> Topology:
    """Check and build a parsed document."""
    return build_topology(read_spec(doc), source or doc.source)


def topology_from_dict(data: dict[str, Any], source: str = "<dict>") -> Topology:
    """Build a topology from plain values shaped like the YAML schema (for tests and APIs)."""
    return topology_from_doc(YamlDoc(data=data, source=source, error=TopologyError))


def topology_from_text(text: str, source: str = "<text>") -> Topology:
    """Build a topology from YAML text."""
    return topology_from_doc(parse_yaml(text, source, TopologyError))


def load_topology(name_or_path: str | Path) -> Topology:
    """Load a preset by name (``"dgx-h100"``) or a topology YAML file by path.

    A value naming an existing file, or ending in ``.yaml``/``.yml``, is read as a file;
    anything else is looked up among :func:`preset_names` (case-insensitive).

    Raises
    ------
    TopologyError: unknown preset, missing file, or an invalid document (the message
    names the file, line and YAML path).
    """
    text = str(name_or_path)
    path = Path(text)
    if isinstance(name_or_path, Path) or path.suffix in (".yaml", ".yml") or path.is_file():
        return topology_from_doc(read_yaml(path, TopologyError))
    name = text.lower()
    if name not in preset_names():
        raise _unknown(text)
    doc = parse_yaml(preset_text(name), f"preset {name}", TopologyError)
    return topology_from_doc(doc)
