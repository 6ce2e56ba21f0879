"""The evaluator's code stays in parts small enough to read: no function over 80 lines
(its docstring included) and no module over 600 lines in ``placer/evaluate``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

EVALUATE = Path(__file__).resolve().parents[1] / "placer" / "evaluate"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600
MODULES = sorted(EVALUATE.glob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_functions_and_modules_are_short(path: Path) -> None:
    text = path.read_text("utf-8")
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == []
    assert len(text.splitlines()) <= MAX_MODULE_LINES
