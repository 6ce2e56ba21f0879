"""The examples in the package's docstrings run, and give what they show.

Every module of placer whose docstrings hold ``>>>`` examples is imported and run with
:mod:`doctest` as part of ``make test``, so an example cannot drift from the code.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "placer"


def _modules_with_examples() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if ">>> " in path.read_text("utf-8"):
            parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
            names.append(".".join(parts).removesuffix(".__init__"))
    return names


def test_there_are_examples_to_run():
    assert len(_modules_with_examples()) >= 5


@pytest.mark.parametrize("name", _modules_with_examples())
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             verbose=False, report=True)
    assert result.attempted > 0, f"{name}: '>>> ' found but no example collected"
    assert result.failed == 0
