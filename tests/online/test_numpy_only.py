"""The policy is engine-neutral and numpy only: torch and vLLM are imported by the plugin
module alone, and only inside its functions (placer imports without them)."""

from __future__ import annotations

import ast
from pathlib import Path

ONLINE = Path(__file__).resolve().parents[2] / "placer" / "online"
ENGINE_PACKAGES = {"torch", "vllm"}


def _imports(path: Path) -> list[tuple[str, bool]]:
    """``(top-level package, at module level)`` of each import of a module."""
    tree = ast.parse(path.read_text("utf-8"))
    top = {id(n) for n in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name.split(".")[0], id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.module.split(".")[0], id(node) in top))
    return found


def test_only_the_plugin_touches_the_engine_and_only_when_called() -> None:
    for path in sorted(ONLINE.glob("*.py")):
        engine = [(name, top) for name, top in _imports(path) if name in ENGINE_PACKAGES]
        if path.name == "vllm.py":
            assert {name for name, _ in engine} == ENGINE_PACKAGES
            assert not any(top for _, top in engine), "imported when placer is"
        else:
            assert engine == [], path.name
