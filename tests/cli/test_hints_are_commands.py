"""Every hint that shows an example shows one that works: the policy specs, sweeps and
``--flag value`` examples go through the parsers that reject the original input, and every
``placer ...`` command a hint names exists."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from placer.cli.main import app
from placer.errors import UsageError
from placer.replay.policies import KEYS, parse_policy, parse_sweep, policy_help

PLACER = Path(__file__).resolve().parents[2] / "placer"

#: ``e.g. X`` / ``for example X``: X up to a space, a parenthesis or the end.
_EXAMPLE = re.compile(r"(?:e\.g\.|for example) ([^\s()]+)")


def _hint(spec: str) -> str:
    with pytest.raises(UsageError) as caught:
        parse_policy(spec, where="--rebalance")
    assert caught.value.hint, f"{spec!r} is rejected without a hint"
    return caught.value.hint


#: Every way a policy is rejected with an example in its hint.
BAD_POLICIES = ["eplb", "eplb:", "eplb:window=4", "placer:window=4,async", "oracle",
                "oracle:", "eplb:window=4,interval=4,async=1", "eplb:interval=4,window",
                "placer:interval=4,max-moves", "eplb:interval=x", "eplb:interval=4,decide-ms=y",
                "eplb:interval=4,decide-ms=-1", "placer:interval=4,first"]


@pytest.mark.parametrize("spec", BAD_POLICIES)
def test_a_policy_hints_example_is_a_policy_that_parses(spec):
    hint = _hint(spec)
    found = _EXAMPLE.findall(hint)
    assert found, f"{spec!r}: hint {hint!r} shows no example"
    for example in found:
        example = example.rstrip(".;")
        if ":" not in example:  # a key=value to put in place of the bad one
            kind, _, rest = spec.partition(":")
            key = example.partition("=")[0]
            kept = [p for p in rest.split(",") if p and p.partition("=")[0] != key]
            example = f"{kind}:{','.join([*kept, example])}"
        parse_policy(example, where="--rebalance")  # raises if the hint misleads


def test_the_policies_listed_in_hints_parse_with_numbers_in_place():
    listed = [p.strip() for p in policy_help().replace("|", ";").split(";")]
    assert {p.partition(":")[0] for p in listed} == set(KEYS)
    for spec in listed:
        if spec != "static:FILE":
            parse_policy(spec.replace("=N", "=4"), where="--rebalance")


@pytest.mark.parametrize("items", [["intervall=4"], ["interval=x"], ["window=0"]])
def test_a_sweep_hints_example_is_a_sweep_that_parses(items):
    with pytest.raises(UsageError) as caught:
        parse_sweep(items)
    (example,) = _EXAMPLE.findall(caught.value.hint or "")
    assert parse_sweep([example])


def _hints() -> list[tuple[str, str]]:
    """``(file:line, text)`` of every ``hint=`` argument in placer's sources, the values
    of f-strings as ``{}``."""
    out = []
    for path in sorted(PLACER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            for kw in node.keywords:
                if kw.arg == "hint":
                    out.append((f"{path.relative_to(PLACER.parent)}:{kw.value.lineno}",
                                _text(kw.value)))
    return out


def _text(node: ast.AST) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v) if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _text(node.left) + _text(node.right)
    return "{}"


def _commands_of(root: object) -> dict[str, object]:
    """Every command under ``root`` by its words (``"topology show"``), groups too."""
    out: dict[str, object] = {}
    stack: list[tuple[str, object]] = [("", root)]
    while stack:
        words, command = stack.pop()
        out[words] = command
        for name, sub in getattr(command, "commands", {}).items():
            stack.append(((f"{words} {name}").strip(), sub))
    return out


HINTS = _hints()
COMMANDS = _commands_of(typer.main.get_command(app))
RUNNER = CliRunner()


def test_hints_are_found():
    assert len(HINTS) > 200
    assert any("e.g. --kv-reserve-gb 20" in text for _, text in HINTS)


def test_every_placer_command_a_hint_names_exists():
    named = [(where, m) for where, text in HINTS
             for m in [*re.findall(r"`placer ((?:[a-z][a-z-]* ?)+)", text),
                       *re.findall(r"^placer ((?:[a-z][a-z-]* )+)\{\}$", text)]]
    assert len(named) >= 5
    for where, words in named:
        words = words.strip()
        # the longest run of words that is a command; its first word must be one
        parts = words.split()
        assert parts[0] in COMMANDS, f"{where}: `placer {words}` is no command"
        if parts[0] in ("model", "topology") and len(parts) > 1:
            assert f"{parts[0]} {parts[1]}" in COMMANDS, f"{where}: `placer {words}`"


#: ``--flag value``: a flag, then a value that is no placeholder (NAME, {}) nor a flag.
_FLAG_VALUE = re.compile(r"(?<![\w-])(--?[a-z][a-z0-9-]*)[ =]([a-z0-9.][^\s,;()`'\"]*)")


#: Words after a flag that are the sentence's, not the flag's value ("--drift and --seed").
_PROSE = {"and", "or", "is", "are", "takes", "reads", "says", "to", "with"}


#: The serving engines' own flags, which hints name for the engine's command line.
_ENGINES = {"--expert-distribution-recorder-mode"}


def _no_op(callback: Any) -> Any:
    """``callback``'s signature (so its options), doing nothing."""
    @functools.wraps(callback)
    def run(*_: Any, **__: Any) -> None:
        return None
    return run


def test_every_flag_with_a_value_in_a_hint_is_accepted_by_a_command(monkeypatch):
    """Each ``--flag value`` a hint shows is parsed by a command that takes the flag (the
    commands' bodies replaced by no-ops, so the parser alone answers)."""
    shown = [(where, flag, value) for where, text in HINTS
             for flag, value in _FLAG_VALUE.findall(text)
             if "{" not in value and value not in _PROSE and flag not in _ENGINES]
    assert len(shown) >= 8
    infos = [*app.registered_commands, *(c for g in app.registered_groups
                                         for c in g.typer_instance.registered_commands)]
    for info in infos:
        monkeypatch.setattr(info, "callback", _no_op(info.callback))
    for where, flag, value in shown:
        takers = [words for words, c in COMMANDS.items()
                  if any(flag in getattr(p, "opts", ()) for p in c.params)]
        assert takers, f"{where}: no command takes {flag}"
        answers = [RUNNER.invoke(app, [*words.split(), flag, value]) for words in takers]
        # parsed: it runs (the no-op), or stops at something else than this flag
        assert any(a.exit_code == 0 or flag not in a.output for a in answers), \
            f"{where}: {flag} {value} is rejected: {answers[0].output}"
