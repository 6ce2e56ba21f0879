"""The package stays in parts small enough to read: no module over 600 lines and no
function over 80 lines, its docstring included.  A command of the command line is measured
from the end of its signature (typer declares every option there; the body is what must
stay short: parse, one library call, render)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "placer"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600
MODULES = sorted(PACKAGE.rglob("*.py"))


def _is_command(node: ast.FunctionDef | ast.AsyncFunctionDef, path: Path) -> bool:
    """A CLI command: a function of placer/cli whose parameters default to typer options."""
    if path.parent.name != "cli":
        return False
    defaults = [*node.args.defaults, *node.args.kw_defaults]
    return any(isinstance(d, ast.Call) and "typer" in ast.unparse(d.func) for d in defaults if d)


def _lines(node: ast.FunctionDef | ast.AsyncFunctionDef, path: Path) -> int:
    assert node.end_lineno is not None
    if _is_command(node, path):
        return node.end_lineno - node.body[0].lineno + 1  # the body, docstring included
    return node.end_lineno - node.lineno + 1


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_functions_and_modules_are_short(path: Path) -> None:
    text = path.read_text("utf-8")
    long = [f"{node.name} ({_lines(node, path)} lines)"
            for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and _lines(node, path) > MAX_FUNCTION_LINES]
    assert long == []
    assert len(text.splitlines()) <= MAX_MODULE_LINES


def test_commands_are_recognised():
    """The signature allowance applies to the commands, which exist."""
    plan = PACKAGE / "cli" / "plan_cmd.py"
    tree = ast.parse(plan.read_text("utf-8"))
    commands = [n.name for n in ast.walk(tree)
                if isinstance(n, ast.FunctionDef) and _is_command(n, plan)]
    assert commands == ["plan"]
