"""Load a topology by preset name or file path.

Presets are the YAML files of ``placer/data/topologies/`` (packaged with placer; the
repository's top-level ``topologies/`` is a link to that folder), named by file stem.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

from placer.errors import TopologyError
from placer.io.yaml_schema import YamlDoc, parse_yaml, read_yaml
from placer.topology.graph import build_topology
from placer.topology.schema import read_calibration, read_spec
from placer.topology.types import Topology

#: Longest chain of overlays (``extends:``) followed before giving up.
_MAX_EXTENDS = 8

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


def closest_preset(name: str, names: list[str]) -> str | None:
    """The preset ``name`` most likely meant: the one sharing most of its words
    (``4x-h100`` -> ``4x-dgx-h100``, not ``dgx-h100``), closest in spelling among those;
    None when nothing is near."""
    words = set(re.split(r"[-_ ]+", name.lower())) - {""}
    close = set(difflib.get_close_matches(name.lower(), names, n=3, cutoff=0.5))

    def shared(preset: str) -> int:
        return len(words & set(preset.split("-")))

    candidates = [n for n in names if n in close or shared(n) == len(words) > 0]
    if not candidates:
        return None
    return max(candidates, key=lambda n: (shared(n), difflib.SequenceMatcher(
        None, name.lower(), n).ratio()))


def _unknown(name: str) -> TopologyError:
    names = preset_names()
    close = closest_preset(name, names)
    hint = f"did you mean '{close}'? " if close else ""
    return TopologyError(
        f"unknown topology '{name}': not a preset and no such file",
        where="topology",
        hint=f"{hint}presets: {', '.join(names)}; or pass a YAML file path",
    )


def topology_from_doc(
    doc: YamlDoc, source: str | None = None, *, _chain: tuple[str, ...] = ()
) -> Topology:
    """Check and build a parsed document (a topology, or an overlay with ``extends:``)."""
    if isinstance(doc.data, dict) and "extends" in doc.data:
        return _overlay(doc, source, _chain)
    return build_topology(read_spec(doc), source or doc.source)


def _overlay(doc: YamlDoc, source: str | None, chain: tuple[str, ...]) -> Topology:
    """A base topology with the overlay's ``calibration``, ``name`` and ``description``."""
    root = doc.root()
    base = root.string("extends")
    name = root.string("name", None)
    description = root.string("description", None)
    section = root.section("calibration", None)
    calibration = read_calibration(section) if section is not None else None
    for key in list(root.value):
        if key not in ("extends", "name", "description", "calibration"):
            raise root.fail(
                str(key), f"an overlay (extends: {base}) cannot set '{key}'",
                hint="an overlay sets only name, description and calibration; copy the base"
                " file and edit it to change the cluster itself",
            )
    root.done()
    here = Path(doc.source)
    target: str | Path = base
    if base.lower() not in preset_names() or Path(base).suffix in (".yaml", ".yml"):
        target = here.parent / base if here.is_file() and not Path(base).is_absolute() else base
    key = str(Path(target).resolve()) if isinstance(target, Path) else f"preset {base}"
    if key in chain or len(chain) >= _MAX_EXTENDS:
        raise root.fail(
            "extends", f"overlays extend each other in a loop or too deep ({len(chain) + 1})",
            hint=f"make the chain end at a preset or a full topology file (at most {_MAX_EXTENDS})",
        )
    topology = _load(target, (*chain, key))
    if calibration is not None:
        topology = topology.with_calibration(calibration)
    return replace(
        topology,
        name=name or topology.name,
        description=description if description is not None else topology.description,
        source=source or doc.source,
    )


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
    return _load(name_or_path, ())


def _load(name_or_path: str | Path, chain: tuple[str, ...]) -> Topology:
    text = str(name_or_path)
    path = Path(text)
    if isinstance(name_or_path, Path) or path.suffix in (".yaml", ".yml") or path.is_file():
        return topology_from_doc(read_yaml(path, TopologyError), _chain=chain)
    name = text.lower()
    if name not in preset_names():
        raise _unknown(text)
    doc = parse_yaml(preset_text(name), f"preset {name}", TopologyError)
    return topology_from_doc(doc, _chain=chain)
