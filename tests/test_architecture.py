"""The import graph layers as docs/ARCHITECTURE.md says, and the document names real code.

Reads every import of the package's source, wherever it stands: at the top of a module,
inside a function (a late import of a heavy or optional dependency), under
``if TYPE_CHECKING:``.  A deferred import that closes a circle is still a circle, and an
import made only for a type annotation is still a dependency.  The layer table of the
document is by unit: a package (``placer.traces``) or a module of the package's root
(``placer.errors``).
"""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "placer"
DOC = ROOT / "docs" / "ARCHITECTURE.md"


@cache
def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


@dataclass(frozen=True)
class Import:
    """One name one module takes from another module of the package."""

    source: str  # the importing module
    target: str  # the module imported from (or imported)
    name: str  # the name taken ("" for ``import placer.x``)
    line: int


def _resolve(package: str, node: ast.ImportFrom) -> str:
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        head = ".".join(parts[: len(parts) - node.level + 1])
        base = f"{head}.{base}" if base else head
    return base


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The module of the package that ``name`` (dotted) is, or lives in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports_in(name: str, text: str, modules: dict[str, Path]) -> list[Import]:
    """The imports of package modules that module ``name`` (source ``text``) makes."""
    is_package = name.count(".") == 0 or modules.get(name, Path()).name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: list[Import] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _owner(alias.name, modules)
                if target and target != name:
                    found.append(Import(name, target, "", node.lineno))
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(package, node)
            if not base.startswith("placer"):
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                target = full if full in modules else _owner(base, modules)
                taken = "" if full in modules else alias.name
                if target and target != name:
                    found.append(Import(name, target, taken, node.lineno))
    return found


@cache
def _imports() -> tuple[Import, ...]:
    """Every import of a package module by a package module, wherever it stands."""
    modules = _modules()
    return tuple(i for name, path in modules.items()
                 for i in _imports_in(name, path.read_text("utf-8"), modules))


def _graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from(_modules())
    graph.add_edges_from((i.source, i.target) for i in _imports())
    return graph


def _layers() -> dict[str, int]:
    text = DOC.read_text("utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    layers = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].isdigit():
            for unit in re.findall(r"`([a-z_]+)/?`", cells[2]):
                layers[unit] = int(cells[0])
    return layers


def _unit(module: str) -> str:
    """``placer.traces.formats.npz`` -> ``traces``; ``placer.errors`` -> ``errors``;
    ``placer`` -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_table_names_every_unit_once():
    layers = _layers()
    units = {_unit(m) for m in _modules()} - {""}
    assert units - set(layers) == set(), "units missing from docs/ARCHITECTURE.md's Layers"
    assert set(layers) - units == set(), "the Layers table names units that do not exist"


def test_every_family_is_a_package():
    """The root holds the few modules every layer shares; every family is a package."""
    loose = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert loose == ["constants", "errors", "limits", "metrics", "parallel", "problem", "regime"]
    prefixes = [p.stem.split("_")[0] for p in PACKAGE.rglob("*.py") if "_" in p.stem.strip("_")]
    families = {p for p in prefixes if prefixes.count(p) >= 3}
    assert families == set(), "a family marked by a name prefix belongs in a package"


def test_imports_go_down_the_layers_only():
    layers = _layers()
    wrong = sorted({
        f"{i.source} (layer {layers[_unit(i.source)]}) imports {i.target}"
        f" (layer {layers[_unit(i.target)]}), line {i.line}"
        for i in _imports()
        if _unit(i.source) and _unit(i.target)
        and layers[_unit(i.target)] > layers[_unit(i.source)]
    })
    assert wrong == []


def test_no_import_circle_deferred_or_not():
    assert list(nx.simple_cycles(_graph())) == []


def test_no_circle_between_units():
    """Packages of one layer may use each other, one way only."""
    units = nx.DiGraph()
    units.add_edges_from((_unit(i.source), _unit(i.target)) for i in _imports()
                         if _unit(i.source) and _unit(i.target)
                         and _unit(i.source) != _unit(i.target))
    assert list(nx.simple_cycles(units)) == []


def test_no_private_name_crosses_a_module():
    """``from placer.x import _name`` reaches into another module's privates: a name
    another module needs is public in its own."""
    wrong = sorted(f"{i.source}:{i.line} takes {i.target}.{i.name}"
                   for i in _imports() if i.name.startswith("_") and not i.name.startswith("__"))
    assert wrong == []


def test_the_reader_sees_deferred_and_type_only_imports():
    """A test of the test: imports inside functions and under TYPE_CHECKING count (the
    reader before this one took only the top of a file, and missed five circles)."""
    text = ("from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from placer.stats import ExpertStats\n"
            "def f():\n    from placer.errors import _private\n    import placer.topology\n")
    found = _imports_in("placer.example", text, _modules())
    assert [(i.target, i.name, i.line) for i in found] == [
        ("placer.stats", "ExpertStats", 3), ("placer.errors", "_private", 5),
        ("placer.topology", "", 6)]


def test_the_judge_does_not_know_the_planner():
    wrong = [(i.source, i.target) for i in _imports()
             if _unit(i.source) == "evaluate" and _unit(i.target) == "planning"]
    assert wrong == []


def test_nothing_imports_the_command_line_but_itself():
    wrong = [(i.source, i.target) for i in _imports()
             if _unit(i.target) == "cli" and _unit(i.source) not in ("cli", "")]
    assert wrong == []


#: Libraries that draw on the terminal: the command line's alone (the library returns
#: data and takes callbacks; the CLI renders them).
TERMINAL_LIBRARIES = ("typer", "rich", "click")


def _outside_imports(text: str) -> list[tuple[str, int]]:
    """``(top-level package, line)`` of every import of a package outside placer,
    wherever it stands."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found += [(alias.name.partition(".")[0], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append((node.module.partition(".")[0], node.lineno))
    return found


def test_only_the_command_line_draws_on_the_terminal():
    """Below ``cli/`` no module imports typer, click or rich, not even inside a function."""
    wrong = sorted(f"{name}:{line} imports {lib}" for name, path in _modules().items()
                   if _unit(name) != "cli"
                   for lib, line in _outside_imports(path.read_text("utf-8"))
                   if lib in TERMINAL_LIBRARIES)
    assert wrong == []


def test_the_terminal_check_sees_deferred_imports():
    """A test of the test: a late ``from rich.progress import ...`` counts."""
    text = "def bar():\n    from rich.progress import Progress\n    import typer.main\n"
    assert _outside_imports(text) == [("rich", 2), ("typer", 3)]


def _dotted_names() -> list[str]:
    names = set()
    for match in re.finditer(r"`(placer(?:\.[A-Za-z_][A-Za-z0-9_]*)+)", DOC.read_text("utf-8")):
        names.add(match.group(1))
    return sorted(names)


@pytest.mark.parametrize("name", _dotted_names())
def test_every_name_the_document_cites_exists(name):
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            assert hasattr(obj, attr), f"{name}: {'.'.join(parts[:cut])} has no {attr}"
            obj = getattr(obj, attr)
        return
    pytest.fail(f"{name} is not a module")


def test_every_path_the_document_cites_exists():
    paths = re.findall(r"`(placer/[\w/.]+)`", DOC.read_text("utf-8"))
    assert paths, "the document names the package's files"
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert missing == []


#: Layers that may speak the command line's language: the command line itself and the
#: study pages (compare, report), which describe how they were run.
SPEAKS_FLAGS = {"cli", "compare", "report"}
#: A serving engine's own launch flags that share a name with one of placer's.
ENGINE_FLAGS = {("engines", "--ep-size")}


def _docstring_nodes(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def test_the_core_names_parameters_not_flags():
    """Messages and hints of the core refer to parameters (``Param``, `` `name` ``);
    placer.cli.flags turns them into flags for the command line."""
    import typer

    from placer.cli.flags import all_flags
    from placer.cli.main import app

    flags = all_flags(typer.main.get_command(app))
    found = []
    for name, path in _modules().items():
        unit = _unit(name)
        if unit in SPEAKS_FLAGS or not unit:
            continue
        tree = ast.parse(path.read_text("utf-8"))
        docs = _docstring_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in docs:
                for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", node.value):
                    if flag in flags and (unit, flag) not in ENGINE_FLAGS:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {flag}")
    assert found == []


# -- the house: the layout drawn from the code ---------------------------------------------

HOUSE_BEGIN = "<!-- house: generated from the code by tests/test_architecture.py -->"
HOUSE_END = "<!-- /house -->"


def _purpose(path: Path) -> str:
    """The first sentence of a module's docstring, shortened to fit one line."""
    doc = ast.get_docstring(ast.parse(path.read_text("utf-8"))) or ""
    first = " ".join(doc.split("\n\n", 1)[0].split())
    first = re.split(r"(?<=[a-z)`])[.:;] ", first, maxsplit=1)[0].rstrip(".:")
    return first if len(first) <= 72 else first[:71].rsplit(" ", 1)[0] + " ..."


def house() -> str:
    """Every layer, top floor first; in each, its units and their modules with purposes."""
    layers = _layers()
    modules = _modules()
    lines = []
    for layer in sorted(set(layers.values()), reverse=True):
        lines.append(f"layer {layer}")
        for unit in sorted(u for u, n in layers.items() if n == layer):
            root = PACKAGE / unit
            if root.is_dir():
                lines.append(f"  {unit}/  {_purpose(root / '__init__.py')}")
                inside = sorted((m.split(".")[2:], m) for m in modules
                                if _unit(m) == unit and m.count(".") > 1)
                for parts, name in inside:
                    label = parts[-1] + ("/" if modules[name].name == "__init__.py" else ".py")
                    lines.append(f"    {'  ' * (len(parts) - 1)}{label}  {_purpose(modules[name])}")
            else:
                lines.append(f"  {unit}.py  {_purpose(root.with_suffix('.py'))}")
    return "\n".join(lines)


def test_the_document_draws_the_house_the_code_has():
    text = DOC.read_text("utf-8")
    drawn = text.split(HOUSE_BEGIN, 1)[1].split(HOUSE_END, 1)[0].strip().strip("`").strip()
    assert drawn == house(), "regenerate: python tests/test_architecture.py"


if __name__ == "__main__":  # print the house, to paste between the markers
    print(house())
