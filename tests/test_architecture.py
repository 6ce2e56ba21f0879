"""The import graph layers as docs/ARCHITECTURE.md says, and the document names real code.

Reads the package's source (module-level imports, not those inside functions, which
load optional or heavy dependencies late) and the "Layers" table of the document.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "placer"
DOC = ROOT / "docs" / "ARCHITECTURE.md"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []
    for node in tree.body:
        body = [node]
        if isinstance(node, ast.If):
            if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
                continue
            body = node.body
        elif isinstance(node, ast.Try):
            body = node.body
        found += [n for n in body if isinstance(n, ast.Import | ast.ImportFrom)]
    return found


def _graph() -> nx.DiGraph:
    modules = _modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _top_level_imports(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    head = ".".join(parts[: len(parts) - node.level + 1])
                    base = f"{head}.{base}" if base else head
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            for target in targets:
                if target in modules and target != name:
                    graph.add_edge(name, target)
    return graph


def _layers() -> dict[str, int]:
    text = DOC.read_text("utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    layers = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].isdigit():
            for unit in re.findall(r"`([a-z_]+)`", cells[2]):
                layers[unit] = int(cells[0])
    return layers


def _unit(module: str) -> str:
    """``placer.traces.npz`` -> ``traces``; ``placer`` -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_table_names_every_module_once():
    layers = _layers()
    units = {_unit(m) for m in _modules()} - {""}
    assert units - set(layers) == set(), "modules missing from docs/ARCHITECTURE.md's Layers"
    assert set(layers) - units == set(), "the Layers table names modules that do not exist"


def test_imports_go_down_the_layers_only():
    layers = _layers()
    wrong = [
        f"{a} (layer {layers[_unit(a)]}) imports {b} (layer {layers[_unit(b)]})"
        for a, b in _graph().edges
        if _unit(a) and _unit(b) and layers[_unit(b)] > layers[_unit(a)]
    ]
    assert wrong == []


def test_no_import_cycle():
    assert list(nx.simple_cycles(_graph())) == []


def test_the_judge_does_not_know_the_planner():
    wrong = [(a, b) for a, b in _graph().edges
             if _unit(a) == "evaluate" and _unit(b) in ("planning", "solvers")]
    assert wrong == []


def test_nothing_imports_the_command_line_but_itself():
    wrong = [(a, b) for a, b in _graph().edges
             if _unit(b) == "cli" and _unit(a) not in ("cli", "demo", "")]
    assert wrong == []


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


#: Layers that may speak the command line's language: the command line itself and the
#: study pages (compare, report), which describe how they were run.
SPEAKS_FLAGS = {"cli", "demo", "compare", "compare_scenarios", "compare_sweep", "compare_rows",
                "compare_recommend", "compare_study", "report"}
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
    from placer.cli.flags import _all_flags

    flags = _all_flags()
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
