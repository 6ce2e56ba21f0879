"""The cost model is written once: no unit conversion or cost constant is defined in two
modules of placer, and no cost formula is written in two.

Three rules over the module-level constants of a package (numbers, or arithmetic of
numbers and names, bound to an upper-case name):

1. a unit or cost constant (a name that mentions a unit or a factor: ``_PER_``,
   ``FACTOR``, ``BYTES``, ``FLOPS``, ``GBPS``, ``US``, ``GB``...) is defined in one module;
2. a conversion between the same units is defined in one module, whichever way round it
   is named (``_US_PER_BYTE_GBPS`` and ``_BYTES_PER_GBPS_US`` are one conversion);
3. a formula's constant (a ``*_FACTOR``) is read in arithmetic in one module only: the
   formula around it (``FACTOR * hidden * ffn``) is written there and nowhere else.

Each rule is shown to fail on a small synthetic package.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

PLACER = Path(__file__).resolve().parents[1] / "placer"

#: Name parts that make a constant a unit or cost constant.
_UNIT_WORDS = {"PER", "FACTOR", "BYTE", "BYTES", "FLOP", "FLOPS", "TFLOPS", "GBPS", "US",
               "MS", "KB", "MB", "GB", "TB"}
#: Unit words, each with its singular, for comparing conversions.
_UNITS = {"BYTE": "BYTE", "BYTES": "BYTE", "FLOP": "FLOP", "FLOPS": "FLOP",
          "TFLOPS": "TFLOPS", "GBPS": "GBPS", "US": "US", "MS": "MS", "KB": "KB", "MB": "MB",
          "GB": "GB", "TB": "TB"}


def _words(name: str) -> list[str]:
    return [w for w in name.strip("_").split("_") if w]


def _is_number_expr(node: ast.expr) -> bool:
    """A number, or arithmetic of numbers and names (``1 / BYTES_PER_GBPS_US``)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _is_number_expr(node.operand)
    if isinstance(node, ast.BinOp):
        return _is_number_expr(node.left) or _is_number_expr(node.right) or (
            isinstance(node.left, (ast.Name, ast.Attribute))
            and isinstance(node.right, (ast.Name, ast.Attribute)))
    return False


def _constants(tree: ast.Module) -> list[str]:
    """Upper-case module-level names bound to a number (or arithmetic of numbers)."""
    out = []
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if (isinstance(target, ast.Name) and target.id.strip("_").isupper()
                    and _is_number_expr(value)):
                out.append(target.id)
    return out


def _is_unit_constant(name: str) -> bool:
    return bool(_UNIT_WORDS & set(_words(name)))


def _conversion(name: str) -> frozenset[str] | None:
    """The units a ``X_PER_Y`` constant converts between (None for other names)."""
    words = _words(name)
    if "PER" not in words:
        return None
    units = frozenset(_UNITS[w] for w in words if w in _UNITS)
    return units if len(units) >= 2 else None


def _read_in_arithmetic(tree: ast.Module, names: set[str]) -> set[str]:
    """Which of ``names`` (as a name or an attribute) an arithmetic expression reads."""
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.BinOp):
            continue
        for side in (node.left, node.right):
            if isinstance(side, ast.Name) and side.id in names:
                found.add(side.id)
            elif isinstance(side, ast.Attribute) and side.attr in names:
                found.add(side.attr)
    return found


def cost_constant_problems(root: Path) -> list[str]:
    """What breaks the three rules (module docstring) in the package at ``root``."""
    trees = {str(p.relative_to(root.parent)): ast.parse(p.read_text(encoding="utf-8"))
             for p in sorted(root.rglob("*.py"))}
    by_name: dict[str, set[str]] = defaultdict(set)
    by_units: dict[frozenset[str], set[str]] = defaultdict(set)
    factors: set[str] = set()
    for module, tree in trees.items():
        for name in _constants(tree):
            if not _is_unit_constant(name):
                continue
            by_name[name.strip("_")].add(module)
            units = _conversion(name)
            if units is not None:
                by_units[units].add(module)
            if _words(name)[-1] == "FACTOR":
                factors.add(name)
    problems = [f"{name} is defined in {', '.join(sorted(mods))}"
                for name, mods in sorted(by_name.items()) if len(mods) > 1]
    problems += [f"a conversion between {' and '.join(sorted(units))} is defined in "
                 f"{', '.join(sorted(mods))}"
                 for units, mods in sorted(by_units.items(), key=lambda kv: sorted(kv[0]))
                 if len(mods) > 1]
    readers: dict[str, set[str]] = defaultdict(set)
    for module, tree in trees.items():
        for name in _read_in_arithmetic(tree, factors):
            readers[name].add(module)
    problems += [f"the formula of {name} is written in {', '.join(sorted(mods))}"
                 for name, mods in sorted(readers.items()) if len(mods) > 1]
    return problems


def test_placer_writes_each_cost_constant_and_formula_once():
    assert cost_constant_problems(PLACER) == []


def _package(root: Path, files: dict[str, str]) -> Path:
    package = root / "pkg"
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return package


def test_a_constant_defined_in_two_modules_fails(tmp_path: Path):
    package = _package(tmp_path, {
        "bound.py": "_US_PER_BYTE_GBPS = 1e-3\n",
        "floor.py": "_US_PER_BYTE_GBPS = 1e-3\nLIMIT = 4\n",
        "other.py": "LIMIT = 4\n",  # not a unit: may repeat
    })
    problems = cost_constant_problems(package)
    assert "US_PER_BYTE_GBPS is defined in pkg/bound.py, pkg/floor.py" in problems
    assert not any("LIMIT" in p for p in problems)


def test_one_conversion_named_both_ways_in_two_modules_fails(tmp_path: Path):
    package = _package(tmp_path, {
        "timing.py": "_BYTES_PER_GBPS_US = 1e3\n",
        "bound.py": "_US_PER_BYTE_GBPS = 1e-3\n",
    })
    assert cost_constant_problems(package) == [
        "a conversion between BYTE and GBPS and US is defined in pkg/bound.py, pkg/timing.py"]


def test_both_ways_in_one_module_pass(tmp_path: Path):
    package = _package(tmp_path, {
        "costs.py": "BYTES_PER_GBPS_US = 1e3\nUS_PER_BYTE_GBPS = 1 / BYTES_PER_GBPS_US\n",
        "timing.py": "from pkg.costs import BYTES_PER_GBPS_US\n"
                     "def t(b, g):\n    return b / g / BYTES_PER_GBPS_US\n",
    })
    assert cost_constant_problems(package) == []


def test_a_formula_written_in_two_modules_fails(tmp_path: Path):
    package = _package(tmp_path, {
        "constants.py": "EXPERT_FFN_FLOPS_FACTOR = 6\n",
        "simulate.py": "from pkg import constants\n"
                       "def flops(m):\n"
                       "    return constants.EXPERT_FFN_FLOPS_FACTOR * m.hidden * m.ffn\n",
        "fit.py": "from pkg.constants import EXPERT_FFN_FLOPS_FACTOR\n"
                  "def flops(row):\n    return EXPERT_FFN_FLOPS_FACTOR * row.hidden * row.ffn\n",
    })
    assert cost_constant_problems(package) == [
        "the formula of EXPERT_FFN_FLOPS_FACTOR is written in pkg/fit.py, pkg/simulate.py"]
    (package / "fit.py").write_text("from pkg.simulate import flops\n", encoding="utf-8")
    assert cost_constant_problems(package) == []


def test_the_rules_read_the_code_as_it_was(tmp_path: Path):
    """The three copies the cost model replaced, as they were written: each rule fires."""
    package = _package(tmp_path, {
        "constants.py": "EXPERT_FFN_FLOPS_FACTOR = 6\n",
        "timing.py": "_BYTES_PER_GBPS_US = 1e3\n_FLOPS_PER_TFLOPS_US = 1e6\n",
        "bound.py": "from pkg import constants\n"
                    "_US_PER_BYTE_GBPS = 1e-3\n_US_PER_FLOP_TFLOPS = 1e-6\n"
                    "def f(m):\n"
                    "    return constants.EXPERT_FFN_FLOPS_FACTOR * m.hidden_size * m.ffn\n",
        "hot_floor.py": "from pkg import constants\n"
                        "_US_PER_BYTE_GBPS = 1e-3\n_US_PER_FLOP_TFLOPS = 1e-6\n"
                        "def f(m):\n"
                        "    return constants.EXPERT_FFN_FLOPS_FACTOR * m.hidden_size * m.ffn\n",
    })
    problems = cost_constant_problems(package)
    assert len(problems) == 5, problems
    assert re.search(r"US_PER_FLOP_TFLOPS is defined in pkg/bound.py, pkg/hot_floor.py",
                     "\n".join(problems))
    assert any(p.startswith("the formula of EXPERT_FFN_FLOPS_FACTOR") for p in problems)
