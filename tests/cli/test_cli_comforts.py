"""The command line's comforts, through the real entry point: ``-h``, examples and plain
metavars in every help, usage errors in placer's ``error:``/``hint:`` form, NaN refused by
every float option, ``--quiet`` and ``--json``, shell completion, defaults from
``placer.toml`` and ``PLACER_*`` variables with ``placer config``, and warnings said once."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from placer.cli.command import PlacerCommand, PlacerGroup, value_type
from placer.cli.common import show_warnings
from placer.cli.config import SETTINGS
from placer.cli.main import app
from placer.errors import PlacerWarning

runner = CliRunner()

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "traces" / "synthetic-small.jsonl.gz"
#: The installed entry point (completion needs the program's own name).
PLACER = Path(sys.executable).parent / "placer"


def _commands(group, path=()) -> list:
    """``(path, command)`` for the root, every group and every command, depth first."""
    found = [(path, group)]
    for name, command in getattr(group, "commands", {}).items():
        found.extend(_commands(command, (*path, name)))
    return found


ROOT_COMMAND = typer.main.get_command(app)
EVERY = _commands(ROOT_COMMAND)
LEAVES = [(path, c) for path, c in EVERY if not getattr(c, "commands", None)]


@pytest.fixture(autouse=True)
def no_config(tmp_path, monkeypatch):
    """Every test runs in an empty folder with no ``PLACER_*`` setting in the environment,
    so that no config file or variable of the machine leaks in."""
    for setting in SETTINGS.values():
        monkeypatch.delenv(setting.env, raising=False)
    monkeypatch.chdir(tmp_path)


def _run(*args: str, env: dict[str, str] | None = None):
    return runner.invoke(app, list(args), env=env)


# -- help ---------------------------------------------------------------------------------


def test_every_command_is_built_with_placer_classes():
    for path, command in EVERY:
        expected = PlacerGroup if getattr(command, "commands", None) else PlacerCommand
        assert isinstance(command, expected), f"placer {' '.join(path)}"


@pytest.mark.parametrize("path", [p for p, _ in EVERY], ids=lambda p: " ".join(p) or "placer")
def test_dash_h_is_help_with_examples_and_no_python_types(path):
    short = _run(*path, "-h")
    long = _run(*path, "--help")
    assert short.exit_code == 0, short.stderr
    assert short.stdout == long.stdout
    text = short.stdout
    assert text.startswith(f"Usage: {' '.join(('placer', *path))} ")
    assert "Examples:\n" in text
    for python_type in (r"<\w[\w\[\], ]*>", r"\{\w+\}", r"list\[", r"int range", r"float range",
                        r"<str>", r"<path>"):
        assert not re.search(python_type, text), f"{python_type!r} in `placer {path} -h`"
    assert "-h, --help" in text


@pytest.mark.parametrize("path", [p for p, _ in LEAVES], ids=lambda p: " ".join(p))
def test_examples_use_only_options_the_command_has(path):
    """Every ``--flag`` in a command's examples is one of its options (or the help's)."""
    command = dict(LEAVES)[path]
    options = {"-h", "--help"}
    for param in command.params:
        options.update([*param.opts, *param.secondary_opts])
    prefix = " ".join(("placer", *path)) + " "
    lines = [line.strip() for line in command.epilog.splitlines()]
    examples = [line[line.index(prefix):] for line in lines if prefix in line]
    assert examples, f"no example of `{prefix.strip()}`"
    for example in examples:
        words = shlex.split(example.replace(">", " "))
        unknown = [w.split("=")[0] for w in words
                   if w.startswith("-") and w.split("=")[0] not in options]
        assert not unknown, f"`{example}` uses {unknown}"


def test_usage_line_names_arguments_in_capitals():
    assert _run("plan", "-h").stdout.startswith("Usage: placer plan [OPTIONS] TRACE...\n")
    text = _run("plan", "-h").stdout
    assert "  -t, --topology NAME|FILE" in text
    assert "  --time-limit SECONDS" in text
    assert "[default: 0.005; 0.0 to 0.999]" in text
    assert _run("compare", "-h").stdout.startswith("Usage: placer compare [OPTIONS] [TRACE...]\n")


# -- usage errors -------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "stderr"), [
    (["plan", "t.npz", "--redundnat", "3", "-o", "p.json"],
     "error: --redundnat: no such option\n"
     "hint: did you mean --redundant? (`placer plan -h` lists the options, with examples)\n"),
    (["topology", "show", "--jsn", "dgx-h100"],
     "error: --jsn: no such option\n"
     "hint: did you mean --json? (`placer topology show -h` lists the options, with examples)\n"),
    (["plan", "t.npz", "-y"],
     "error: -y: no such option\nhint: `placer plan -h` lists the options, with examples\n"),
    (["stat", "t.npz"],
     "error: no such command 'stat'\nhint: did you mean stats? (`placer -h` lists the commands)\n"),
    (["topology", "shw"],
     "error: no such command 'shw'\n"
     "hint: did you mean show? (`placer topology -h` lists the commands)\n"),
    (["plan", "t.npz", "-o", "p.json", "--time-limit", "abc"],
     "error: --time-limit: expected a number, got 'abc'\n"
     "hint: `placer plan -h` says what it takes\n"),
    (["stats", "t.npz", "--top", "2.5"],
     "error: --top: expected a whole number, got '2.5'\n"
     "hint: `placer stats -h` says what it takes\n"),
    (["plan", "t.npz", "-o", "p.json", "--jobs", "0"],
     "error: --jobs: expected a value >= 1, got 0\n"
     "hint: give a value >= 1; the nearest valid one is 1 (`placer plan -h`)\n"),
    (["plan", "t.npz"],
     "error: --output: missing: the command needs this option\n"
     "hint: `placer plan -h` shows what it takes, with examples\n"),
    (["plan", "-o", "p.json"],
     "error: TRACE: missing: the command needs this argument\n"
     "hint: `placer plan -h` shows what it takes, with examples\n"),
    (["plan", "t.npz", "-o"],
     "error: -o: needs a value\nhint: `placer plan -h` lists the options, with examples\n"),
    (["model", "list", "extra"],
     "error: unexpected argument(s): extra\n"
     "hint: `placer model list -h` shows what it takes (quote a value with spaces)\n"),
])
def test_usage_errors_in_placer_form(args, stderr):
    result = _run(*args)
    assert (result.exit_code, result.stderr, result.stdout) == (2, stderr, "")


def _float_options() -> list[tuple[tuple[str, ...], str]]:
    found = []
    for path, command in LEAVES:
        for param in command.params:
            if param.param_type_name == "option" and value_type(param) is float:
                found.append((path, max(param.opts, key=len)))
    return found


FLOAT_OPTIONS = _float_options()


def test_float_options_are_found():
    assert (("plan",), "--time-limit") in FLOAT_OPTIONS
    assert (("compare",), "--time-limit") in FLOAT_OPTIONS
    assert (("capacity",), "--kv-reserve-fraction") in FLOAT_OPTIONS
    assert (("synth",), "--drift") in FLOAT_OPTIONS


@pytest.mark.parametrize(("path", "option"), FLOAT_OPTIONS,
                         ids=[f"{' '.join(p)} {o}" for p, o in FLOAT_OPTIONS])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_every_float_option_refuses_nan_and_infinity(path, option, value):
    result = _run(*path, option, value)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {option}: expected a finite number, got {value}\n")


def test_zipf_list_refuses_nan():
    result = _run("synth", "out.npz", "--zipf", "1.0,nan")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --zipf: cannot read Zipf exponent(s) '1.0,nan'\n")


def test_usage_error_leaves_out_the_datas_warnings():
    """The trace warns (synthetic, ...), but a flag is wrong: only the error is said."""
    result = _run("plan", str(BUNDLED), "-t", "dgx-h100", "-o", "p.json", "--fit", "9:3")
    assert result.exit_code == 2
    assert [line.split(":")[0] for line in result.stderr.splitlines()] == ["error", "hint"]


def test_show_warnings_says_each_message_once(capsys):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            warnings.warn("12 of 64 (layer, expert) pairs were never routed to", PlacerWarning,
                          stacklevel=1)
        warnings.warn("odd", RuntimeWarning, stacklevel=1)
    show_warnings(caught)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "warning: 12 of 64 (layer, expert) pairs were never routed to"
    assert len(lines) == 2 and lines[1].startswith("warning: RuntimeWarning: odd (")


# -- --quiet and --json -------------------------------------------------------------------


def test_compare_quiet_prints_only_the_table():
    args = ["compare", str(BUNDLED), "-m", "gpt-oss-20b", "-t", "dgx-h100", "-r", "0",
            "--keep-warmup"]
    loud, quiet = _run(*args), _run(*args, "-q")
    assert loud.exit_code == quiet.exit_code == 0, loud.stderr
    assert "[1/1] dgx-h100 R=0 eplb: ok" in loud.stderr
    assert "scenario(s)" not in quiet.stderr and "[1/1]" not in quiet.stderr
    assert all(line.startswith("warning: ") for line in quiet.stderr.splitlines())
    assert quiet.stdout == loud.stdout


def test_topology_validate_json(tmp_path):
    path = tmp_path / "one.yaml"
    path.write_text("name: one\nextends: dgx-h100\n")
    result = _run("topology", "validate", str(path), "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert (doc["ok"], doc["file"], doc["name"], doc["num_gpus"]) == (True, str(path), "one", 8)


def test_report_json_and_quiet(tmp_path):
    pytest.importorskip("matplotlib")
    plan = _run("plan", str(BUNDLED), "-m", "gpt-oss-20b", "-t", "dgx-h100", "-s", "eplb",
                "-o", str(tmp_path / "eplb.json"), "-q")
    assert plan.exit_code == 0, plan.stderr
    result = _run("report", str(BUNDLED), "-p", str(tmp_path / "eplb.json"), "-m", "gpt-oss-20b",
                  "-t", "dgx-h100", "-o", str(tmp_path / "r.html"), "--json", "-q")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["output"] == str(tmp_path / "r.html") and (tmp_path / "r.html").is_file()
    assert [p["name"] for p in doc["placements"]] == ["eplb"]
    assert doc["placements"][0]["metrics"]["num_layers"] > 0
    assert "wrote" not in result.stderr and "evaluating" not in result.stderr


def test_every_command_that_prints_results_has_json():
    without = [" ".join(p) for p, c in LEAVES
               if not any("--json" in param.opts for param in c.params)]
    assert without == []


# -- shell completion ---------------------------------------------------------------------


def _complete(words: str) -> list[str]:
    env = {**os.environ, "_PLACER_COMPLETE": "complete_bash", "COMP_WORDS": words,
           "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))}
    proc = subprocess.run([str(PLACER)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


@pytest.mark.skipif(not PLACER.exists(), reason="placer is not installed in this environment")
def test_completion_completes_commands_options_and_presets():
    assert _complete("placer pl") == ["plan"]
    assert _complete("placer plan --redun") == ["--redundant"]
    assert _complete("placer topology s") == ["show"]
    assert "4x-dgx-h100" in _complete("placer plan -t 4x")
    assert _complete("placer plan --model deepseek") == ["deepseek-v3"]
    assert _complete("placer compare --solver ep") == ["eplb", "eplb-valid"]


@pytest.mark.skipif(not PLACER.exists(), reason="placer is not installed in this environment")
def test_completion_script_and_options():
    env = {**os.environ, "_PLACER_COMPLETE": "source_bash"}
    proc = subprocess.run([str(PLACER)], env=env, capture_output=True, text=True, timeout=60)
    assert "complete -o default -F _placer_completion placer" in proc.stdout
    text = _run("-h").stdout
    assert "--install-completion" in text and "--show-completion" in text


# -- defaults from placer.toml and PLACER_* -----------------------------------------------


def test_config_file_supplies_defaults_and_the_command_line_wins(tmp_path):
    (tmp_path / "placer.toml").write_text('model = "qwen3-30b-a3b"\ntopology = "dgx-h100"\n')
    configured = _run("capacity", "--json")
    explicit = _run("capacity", "-m", "qwen3-30b-a3b", "-t", "dgx-h100", "--json")
    assert configured.exit_code == 0, configured.stderr
    assert configured.stdout == explicit.stdout
    wider = _run("capacity", "-t", "2x-dgx-h100")
    assert wider.stdout.startswith("qwen3-30b-a3b (bf16) on 2x-dgx-h100: 16 GPUs")


def test_environment_wins_over_the_file(tmp_path):
    (tmp_path / "placer.toml").write_text('model = "qwen3-30b-a3b"\ntopology = "dgx-h100"\n')
    result = _run("capacity", env={"PLACER_TOPOLOGY": "2x-dgx-h100"})
    assert result.stdout.startswith("qwen3-30b-a3b (bf16) on 2x-dgx-h100: 16 GPUs")


def test_pyproject_table_found_from_a_subfolder(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.placer]\nmodel = "qwen3-30b-a3b"\ntopology = "dgx-h100"\n')
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    result = _run("capacity")
    assert result.stdout.startswith("qwen3-30b-a3b (bf16) on dgx-h100: 8 GPUs")


def test_placer_config_says_where_each_default_came_from(tmp_path):
    (tmp_path / "placer.toml").write_text('topology = "dgx-h100"\njobs = 2\n')
    result = _run("config", "--json", env={"PLACER_JOBS": "4"})
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["file"] == str((tmp_path / "placer.toml").resolve())
    rows = {s["name"]: s for s in doc["settings"]}
    assert (rows["topology"]["value"], rows["topology"]["source"]) == ("dgx-h100", "file")
    assert (rows["jobs"]["value"], rows["jobs"]["source"], rows["jobs"]["where"]) == (
        4, "env", "PLACER_JOBS")
    assert (rows["model"]["value"], rows["model"]["source"]) == (None, "built-in")
    assert "plan" in rows["jobs"]["commands"] and "compare" in rows["jobs"]["commands"]
    text = _run("config", env={"PLACER_JOBS": "4"}).stdout
    assert f"config file   {(tmp_path / 'placer.toml').resolve()}\n" in text
    assert re.search(r"\njobs +4 +PLACER_JOBS +--jobs of plan, compare, replay\n", text)
    assert re.search(r"\nmodel +- +built-in +--model of ", text)


def test_placer_config_without_a_file():
    text = _run("config").stdout
    assert text.startswith("config file   none (placer.toml, or [tool.placer] in pyproject.toml,")


def test_unknown_key_is_an_error_naming_file_and_key(tmp_path):
    toml = tmp_path / "placer.toml"
    toml.write_text('topolgy = "dgx-h100"\n')
    result = _run("capacity", "-m", "qwen3-30b-a3b")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {toml.resolve()}: unknown setting 'topolgy'\n"
                                    "hint: did you mean topology? (settings: ")
    assert _run("capacity", "-h").exit_code == 0  # help works whatever the config says
    assert _run("config").exit_code == 2


def test_an_error_about_a_configured_value_says_where_it_came_from():
    result = _run("capacity", "-m", "qwen3-30b-a3b", "-t", "dgx-h100",
                  env={"PLACER_DTYPE": "fp3"})
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == "error: --dtype: unknown dtype 'fp3'"
    assert result.stderr.splitlines()[-1] == (
        "hint: the value came from PLACER_DTYPE=fp3: fix it there (one of bf16, fp8, mxfp4),"
        " or give --dtype on the command line")
    bounds = _run("plan", "t.npz", "-o", "p.json", env={"PLACER_JOBS": "0"})
    assert bounds.stderr == ("error: --jobs: expected a value >= 1, got 0\n"
                             "hint: the value came from PLACER_JOBS=0: fix it there (a value"
                             " >= 1; the nearest valid one is 1), or give --jobs on the command"
                             " line\n")


def test_a_configured_topology_yields_to_num_gpus_on_the_command_line(tmp_path):
    result = _run("plan", str(BUNDLED), "-g", "8", "-s", "eplb", "-o", str(tmp_path / "p.json"),
                  "-q", "--json", env={"PLACER_TOPOLOGY": "2x-dgx-h100"})
    assert result.exit_code == 0, result.stderr
    problem = json.loads(result.stdout)["problem"]
    assert (problem["num_gpus"], problem["topology"]) == (8, None)


def test_data_error_leaves_out_the_datas_warnings(tmp_path):
    """The trace warns (synthetic, never-routed experts), but the placement does not fit the
    cluster: the error and its hint alone."""
    plan = tmp_path / "p.json"
    made = _run("plan", str(BUNDLED), "-m", "gpt-oss-20b", "-t", "dgx-h100", "-r", "8",
                "--solver", "eplb", "-o", str(plan), "-q")
    assert made.exit_code == 0, made.stderr
    result = _run("evaluate", str(BUNDLED), "-p", str(plan), "-t", "2x-dgx-h100", "-q")
    assert result.exit_code == 1, result.stderr
    assert [line.split(":")[0] for line in result.stderr.splitlines()] == ["error", "hint"]


def _commands_with(option: str) -> list[str]:
    """The commands (``group sub`` joined by a space) that take ``option``."""
    names = []
    root = typer.main.get_command(app)
    for name, command in root.commands.items():  # type: ignore[attr-defined]
        subs = getattr(command, "commands", None)
        for sub_name, sub in (subs or {name: command}).items():
            if any(option in p.opts for p in sub.params):
                names.append(name if subs is None else f"{name} {sub_name}")
    return names


@pytest.mark.parametrize("command", _commands_with("--dtype"))
def test_an_unknown_dtype_is_refused_even_without_a_model(command: str) -> None:
    result = _run(*command.split(), "--dtype", "fp7")
    assert result.exit_code == 2, result.output
    assert "error: --dtype: unknown dtype 'fp7'" in result.output
    assert f"hint: give one of bf16, fp8, mxfp4 (`placer {command} -h`)" in result.output


def test_the_dtype_option_is_on_the_commands_that_size_experts() -> None:
    assert {"plan", "evaluate", "compare"} <= set(_commands_with("--dtype"))
