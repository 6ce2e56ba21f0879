"""Every option two commands share is declared once, in ``placer.cli.options``.

The check reads the command line's source: each ``typer.Option(...)`` call and the long
option names it declares.  An option that two commands take must come from a factory
of :mod:`placer.cli.options` (one declaration: names, type, help, completion, range), so
it reads the same in every command; a second declaration anywhere else fails here.  The
check is tried on small made-up sources too, so that it is known to fail when it should.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from placer.cli.main import app
from placer.cli.options import policy_hint

CLI = Path(__file__).resolve().parents[1] / "placer" / "cli"
#: The module of option factories.
FACTORIES = "options.py"


def declared_options(source: str) -> list[tuple[str, int, str]]:
    """``(long option name, line, function)`` of every ``typer.Option(...)`` call in
    ``source``; ``function`` is the one whose code or signature holds the call."""
    found: list[tuple[str, int, str]] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = (child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
                     else function)
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                    and child.func.attr == "Option"):
                found.extend((arg.value.split("/")[0], child.lineno, function)
                             for arg in child.args if isinstance(arg, ast.Constant)
                             and isinstance(arg.value, str) and arg.value.startswith("--"))
            visit(child, inner)

    visit(ast.parse(source), "")
    return found


def declared_twice(sources: dict[str, str], shared: set[str]) -> list[str]:
    """Problems: an option of ``shared`` (taken by two commands or more) declared outside
    the factories' module, or any option declared in two functions (one factory may
    declare the forms of its option)."""
    places: dict[str, dict[str, int]] = defaultdict(dict)
    problems = []
    for name, source in sorted(sources.items()):
        for option, line, function in declared_options(source):
            places[option].setdefault(f"{name}:{function}", line)
            if option in shared and name != FACTORIES:
                problems.append(f"{option} is shared by commands but declared in"
                                f" {name}:{line}, not by a factory of {FACTORIES}")
    problems += [f"{option} is declared in {len(at)} functions: "
                 + ", ".join(f"{where} (line {line})" for where, line in at.items())
                 for option, at in sorted(places.items()) if len(at) > 1]
    return problems


def shared_options(root: object) -> set[str]:
    """Long options that two or more commands of ``root`` take."""
    users: dict[str, set[str]] = defaultdict(set)
    stack: list[tuple[str, object]] = [("placer", root)]
    while stack:
        path, command = stack.pop()
        for param in getattr(command, "params", []):
            for option in getattr(param, "opts", []):
                if option.startswith("--"):
                    users[option].add(path)
        stack.extend((f"{path} {name}", sub)
                     for name, sub in getattr(command, "commands", {}).items())
    return {option for option, paths in users.items() if len(paths) > 1}


def cli_sources() -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(CLI.glob("*.py"))}


# -- the check on made-up sources -------------------------------------------------------


TWO_COMMANDS = '''
import typer

def plan(topology: str = typer.Option(None, "--topology", "-t", help="Topology.")): ...

def evaluate(topology: str = typer.Option(None, "--topology", help="A topology.")): ...
'''

FACTORY = '''
import typer

def topology_option():
    return typer.Option(None, "--topology", "-t", help="Topology preset name or YAML file.")
'''

USES_FACTORY = '''
from placer.cli.options import topology_option

def plan(topology: str = topology_option()): ...

def evaluate(topology: str = topology_option()): ...
'''


def test_the_check_fails_on_an_option_two_commands_declare():
    problems = declared_twice({"plan_cmd.py": TWO_COMMANDS}, {"--topology"})
    assert problems == [
        "--topology is shared by commands but declared in plan_cmd.py:4, not by a factory"
        " of options.py",
        "--topology is shared by commands but declared in plan_cmd.py:6, not by a factory"
        " of options.py",
        "--topology is declared in 2 functions: plan_cmd.py:plan (line 4),"
        " plan_cmd.py:evaluate (line 6)",
    ]


def test_the_check_fails_on_a_copy_beside_the_factory():
    problems = declared_twice({FACTORIES: FACTORY, "plan_cmd.py": TWO_COMMANDS.split(
        "def evaluate")[0]}, {"--topology"})
    assert problems == [
        "--topology is shared by commands but declared in plan_cmd.py:4, not by a factory"
        " of options.py",
        f"--topology is declared in 2 functions: {FACTORIES}:topology_option (line 5),"
        " plan_cmd.py:plan (line 4)",
    ]


def test_the_check_passes_commands_that_call_the_factory():
    assert declared_twice({FACTORIES: FACTORY, "plan_cmd.py": USES_FACTORY},
                          {"--topology"}) == []
    assert declared_options(USES_FACTORY) == []


# -- the check on placer's command line -----------------------------------------------------


def test_every_shared_option_is_declared_once_by_a_factory():
    shared = shared_options(typer.main.get_command(app))
    assert {"--topology", "--model", "--json", "--dispatch", "--time-limit"} <= shared
    assert declared_twice(cli_sources(), shared) == []


def test_one_option_one_help_across_commands():
    """A shared option reads the same wherever its factory is called without a purpose:
    ``--time-limit`` of plan and compare, ``--dtype`` of every command."""
    helps: dict[str, set[str]] = defaultdict(set)
    stack: list[object] = [typer.main.get_command(app)]
    while stack:
        command = stack.pop()
        for param in getattr(command, "params", []):
            for option in ("--time-limit", "--layer-time-limit", "--dtype", "--engine",
                           "--dispatch", "--seed", "--dpi", "--kv-reserve-gb"):
                if option in getattr(param, "opts", []):
                    helps[option].add(f"{param.help} default={param.default!r}")
        stack.extend(getattr(command, "commands", {}).values())
    assert {option: len(texts) for option, texts in helps.items()
            if option != "--engine"} == {
        "--time-limit": 1, "--layer-time-limit": 1, "--dtype": 1, "--dispatch": 1,
        "--seed": 2, "--dpi": 1, "--kv-reserve-gb": 1}  # compare's seed: unset by default


# -- --policy, which meant two things -------------------------------------------------------


RUNNER = CliRunner()


@pytest.mark.parametrize(("command", "value", "hint"), [
    ("plan", "sglang", "hint: use --dispatch sglang"),
    ("evaluate", "round_robin", "hint: use --dispatch round_robin"),
    ("compare", "vllm_hash", "hint: use --dispatch vllm_hash"),
    ("report", "local_first", "hint: use --dispatch local_first"),
    ("replay", "sglang", "hint: use --dispatch sglang"),
    ("replay", "eplb:window=16,interval=16",
     "hint: use --rebalance eplb:window=16,interval=16"),
])
def test_policy_names_the_option_to_use(command, value, hint):
    result = RUNNER.invoke(app, [command, "t.npz", "--policy", value])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: --policy: no such option: the dispatch rule is --dispatch, replay's"
        " rebalancing policies --rebalance", hint]
    # the hint's words parse: the same command line with them asks only for help
    words = hint.removeprefix("hint: use ").split(" ")
    again = RUNNER.invoke(app, [command, "t.npz", *words, "-h"])
    assert again.exit_code == 0, again.output
    assert f"{words[0]} " in again.stdout


def test_policy_in_a_command_without_the_option_says_which_has_it():
    result = RUNNER.invoke(app, ["plan", "t.npz", "-o", "p.json", "--policy=static:default"])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[1] == (
        "hint: --rebalance is an option of another command: placer replay ..."
        " --rebalance static:default")


def test_policy_hint_for_a_value_of_neither_kind_lists_both():
    hint = policy_hint(["fastest"], ["--dispatch"])
    assert hint.startswith("--dispatch POLICY names the dispatch rule (vllm_hash,")
    assert hint.endswith("--rebalance SPEC a rebalancing policy of placer replay")
    assert policy_hint(["sglang", "oracle:interval=8"], ["--dispatch", "--rebalance"]) == (
        "use --dispatch sglang --rebalance oracle:interval=8")


def test_rebalance_keeps_its_short_name():
    result = RUNNER.invoke(app, ["replay", "t.npz", "-P", "nonsense", "-m", "deepseek-v3",
                                 "-t", "4x-dgx-h100"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --rebalance: unknown policy 'nonsense'")


# -- where a default comes from: one order, and the yields a command declares ---------------


def _probe_app(seen: dict[str, object]) -> typer.Typer:
    """A one-command app whose configured ``--topology`` yields to ``--num-gpus``."""
    from placer.cli.command import given, new_typer, placer_command
    from placer.cli.common import configured_options
    from placer.cli.options import num_gpus_option, topology_option

    probe = new_typer()

    @probe.command("probe", cls=placer_command(topology=given("num_gpus")))
    def probe_cmd(topology: str | None = topology_option(),
                  num_gpus: int | None = num_gpus_option()) -> None:
        seen.update(topology=topology, num_gpus=num_gpus,
                    configured=dict(configured_options.get() or {}))

    @probe.command("other")
    def other_cmd() -> None: ...

    return probe


@pytest.mark.parametrize(("args", "env", "topology", "configured"), [
    ([], {}, None, {}),
    ([], {"PLACER_TOPOLOGY": "dgx-h100"}, "dgx-h100",
     {"--topology": "PLACER_TOPOLOGY=dgx-h100"}),
    (["-t", "gb200-nvl72"], {"PLACER_TOPOLOGY": "dgx-h100"}, "gb200-nvl72", {}),
    (["-g", "8"], {"PLACER_TOPOLOGY": "dgx-h100"}, None, {}),  # yields to --num-gpus
    (["-g", "8", "-t", "gb200-nvl72"], {"PLACER_TOPOLOGY": "dgx-h100"}, "gb200-nvl72", {}),
])
def test_a_configured_default_yields_where_the_command_says(tmp_path, monkeypatch, args, env,
                                                             topology, configured):
    """The command line, else ``PLACER_*`` (else placer.toml), else the built-in; a
    configured value the command's rule drops is no longer said to be configured."""
    monkeypatch.chdir(tmp_path)
    seen: dict[str, object] = {}
    result = RUNNER.invoke(_probe_app(seen), ["probe", *args], env=env)
    assert result.exit_code == 0, result.output
    assert seen["topology"] == topology
    assert seen["configured"] == configured


def test_the_placements_model_outranks_a_configured_one(tmp_path, monkeypatch):
    """``placer export``: the model the placement records wins over ``PLACER_MODEL``; a
    placement that records none takes the configured one."""
    import numpy as np

    from placer.placement import Placement
    from placer.placement.document import write_placement

    monkeypatch.chdir(tmp_path)
    rows = [np.roll(np.arange(128), layer).reshape(8, 16).ravel() for layer in range(24)]
    placement = Placement(np.array(rows), np.arange(1, 48, 2), 128, 8)
    write_placement(tmp_path / "named.json", placement, model_name="llama4-maverick", top_k=1)
    write_placement(tmp_path / "bare.json", placement)
    env = {"PLACER_MODEL": "deepseek-v3"}  # 256 experts: the placement's 128 do not fit
    named = RUNNER.invoke(app, ["export", "named.json", "-f", "vllm", "-o", "n.json"], env=env)
    assert named.exit_code == 0, named.output
    bare = RUNNER.invoke(app, ["export", "bare.json", "-f", "vllm", "-o", "b.json"], env=env)
    assert bare.exit_code == 1
    assert bare.stderr.startswith("error: bare.json: the placement has 128 experts per layer"
                                  " but deepseek-v3 has 256\n")
