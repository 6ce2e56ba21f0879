"""Every number a command takes has a range, and a value outside it is refused at once: exit
2, an ``error:`` line naming the option and the value, a ``hint:`` line with the valid range
and the nearest valid value, no traceback.

The options are found by walking the commands (a new number option without a range fails
:func:`test_every_number_option_declares_a_range`); the values that only a command's own
parser or the library can judge (lists, ranges, limits that follow another option) are
listed in :data:`LIBRARY_RANGES`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from placer.cli.command import _bounds, value_type
from placer.cli.config import SETTINGS
from placer.cli.main import app

runner = CliRunner()
TRACE = str(Path(__file__).resolve().parents[2] / "traces" / "synthetic-small.jsonl.gz")


def _leaves(command, path=()) -> list:
    """``(path, command)`` of every command that runs (not the groups)."""
    subs = getattr(command, "commands", None)
    if not subs:
        return [(path, command)]
    return [leaf for name, sub in subs.items() for leaf in _leaves(sub, (*path, name))]


LEAVES = _leaves(typer.main.get_command(app))


def _number_options() -> list[tuple[tuple[str, ...], str, object]]:
    return [(path, max(p.opts, key=len), p) for path, command in LEAVES for p in command.params
            if p.param_type_name == "option" and value_type(p) in (int, float)]


NUMBER_OPTIONS = _number_options()


def _shown(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def _out_of_range() -> list[tuple[tuple[str, ...], str, str, str]]:
    """``(command path, option, bad value, the range the hint must say)`` for one value
    below and one above each option's range (where it has that end)."""
    cases = []
    for path, option, param in NUMBER_OPTIONS:
        low, high = _bounds(param)
        kind = value_type(param)
        said = (f"from {_shown(low)} to {_shown(high)}" if low is not None and high is not None
                else f">= {_shown(low)}" if low is not None else f"<= {_shown(high)}")
        for end, step in ((low, -1), (high, 1)):
            if end is not None:
                bad = end + step if kind is int else float(end) + step
                cases.append((path, option, _shown(bad), said))
    return cases


OUT_OF_RANGE = _out_of_range()


@pytest.fixture(autouse=True)
def no_config(tmp_path, monkeypatch):
    """An empty folder and no ``PLACER_*`` variable: no config of the machine leaks in."""
    for setting in SETTINGS.values():
        monkeypatch.delenv(setting.env, raising=False)
    monkeypatch.chdir(tmp_path)


def test_the_walk_finds_every_command_s_numbers():
    found = {(" ".join(path), option) for path, option, _ in NUMBER_OPTIONS}
    assert {("plan", "--balance-tolerance"), ("plan", "--num-gpus"), ("compare", "--p99-slack"),
            ("synth", "--tokens"), ("synth", "--top-k"), ("synth", "--experts"),
            ("import", "--num-gpus"), ("report", "--dpi"), ("replay", "--segments")} <= found
    assert len(OUT_OF_RANGE) >= 80


@pytest.mark.parametrize(("path", "option", "param"), NUMBER_OPTIONS,
                         ids=[f"{' '.join(p)} {o}" for p, o, _ in NUMBER_OPTIONS])
def test_every_number_option_declares_a_range(path, option, param):
    """A number option says its valid values where it is declared (``min``/``max``, or
    ``OPTION_RANGES``), so the parser refuses the rest before any work."""
    assert _bounds(param) != (None, None), f"placer {' '.join(path)} {option} has no range"


def _help_command(hint: str) -> list[str]:
    """The ``placer ... -h`` a hint names, as words after ``placer``."""
    found = re.findall(r"`placer ((?:[a-z][a-z-]* )*)-h`", hint)
    return found[0].split() if found else []


@pytest.mark.parametrize(("path", "option", "value", "valid"), OUT_OF_RANGE,
                         ids=[f"{' '.join(p)} {o} {v}" for p, o, v, _ in OUT_OF_RANGE])
def test_a_number_out_of_range_is_refused_with_its_range(path, option, value, valid):
    result = runner.invoke(app, [*path, option, value])
    stderr = result.stderr
    assert result.exit_code == 2, stderr
    assert "Traceback" not in result.output and "internal error" not in stderr
    first, *rest = stderr.splitlines()
    assert first.startswith(f"error: {option}: ") and first.endswith(f"got {value}"), stderr
    hint = next(line for line in rest if line.startswith("hint: "))
    assert f"give a value {valid}; the nearest valid one is " in hint, stderr
    assert _help_command(hint) == list(path), hint  # the help it names is the command's


def _synth(*args: str) -> list[str]:
    return ["synth", "out.npz", *args]


def _plan(*args: str) -> list[str]:
    return ["plan", TRACE, "-m", "gpt-oss-20b", "-t", "2x-dgx-h100", "-o", "p.json", "-q", *args]


def _compare(*args: str) -> list[str]:
    return ["compare", TRACE, "-m", "gpt-oss-20b", "-t", "2x-dgx-h100", "-q", *args]


#: Values that only the command or the library can judge, each with the option the error
#: must name and a piece of its hint.
LIBRARY_RANGES = [
    (_synth("--experts", "8", "--top-k", "8"), "--top-k", "from 1 to 7"),
    (_synth("--experts", "8", "--clusters", "9"), "--clusters", "from 0 to 8"),
    (_synth("--experts", "8", "--groups", "3"), "--groups", "8 groups of 32"),
    (_synth("--experts", "8", "--groups", "4", "--top-groups", "5"), "--top-groups",
     "from 1 to 4"),
    (_synth("--zipf", "-1"), "--zipf", "--zipf 1.0"),
    (_synth("--zipf", "1,2"), "--zipf", "one per layer"),
    (_synth("--zipf", "x"), "--zipf", "one per layer"),
    (_synth("--cluster-boost", "0"), "--cluster-boost", "--cluster-boost 4"),
    (_synth("--topics", "2", "--topic-overlap", "1.5"), "--topic-overlap",
     "--topic-overlap 0.5"),
    (_synth("--burst-every", "3"), "--burst-every", "--topics"),
    (_synth("--layers", "0"), "--layers", "3-60"),
    (_plan("-r", "-8"), "--redundant", "nearest valid one is 0"),
    (_plan("--option", "cvar_fraction=2"), "--option cvar_fraction", "`placer plan -h`"),
    (_plan("--option", "patience=0"), "--option patience", "`placer plan -h`"),
    (_plan("--fit", "9:3"), "--fit", "3:9"),
    (_compare("-r", "0,-8"), "--redundant", "nearest valid one is 0"),
    (_compare("--redundant", "-4"), "--redundant", "nearest valid one is 0"),
    (_compare("-S", "0"), "--slots-per-gpu", "valid on the GPUs"),
    (_compare("-S", "0..-2"), "--slots-per-gpu", "for example"),
    (["capacity", "-m", "gpt-oss-20b", "-t", "dgx-h100", "--kv-reserve-fraction", "1"],
     "--kv-reserve-fraction", "not including, 1"),
    (["replay", TRACE, "-m", "gpt-oss-20b", "-t", "2x-dgx-h100", "-P", "eplb:window=0"],
     "--rebalance", "e.g."),
]


@pytest.mark.parametrize(("argv", "option", "hint"), LIBRARY_RANGES,
                         ids=[" ".join(a[:1] + a[2:] if a[0] == "synth" else a[:1] + a[-2:])
                              for a, _, _ in LIBRARY_RANGES])
def test_a_value_the_library_judges_is_refused_with_a_hint(argv, option, hint):
    result = runner.invoke(app, argv)
    stderr = result.stderr
    assert result.exit_code == 2, stderr
    assert "Traceback" not in result.output and "internal error" not in stderr
    assert stderr.startswith(f"error: {option}: "), stderr
    hints = [line for line in stderr.splitlines() if line.startswith("hint: ")]
    assert hints and any(hint in line for line in hints), stderr
    assert not Path("out.npz").exists() and not Path("p.json").exists()
