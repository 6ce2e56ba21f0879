"""Every example in every command's ``-h`` runs as written.

The ``Examples:`` of each command's help (``placer.cli.command.examples``) run in order,
in this process, in a working directory of the command's own that holds the bundled
traces and ``bench/data`` and every file the examples name (:data:`INPUTS`: placer's own
outputs, made here, or small files shaped like an engine's); each must exit 0 and print
no traceback.  As for the README (``readme_fixtures.Walkthrough``), plans' searches are
cut (their figures are not read here) and the slowest examples are left to the slow tier.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import typer.main
from hf_configs import CONFIGS
from readme_fixtures import (
    REPO,
    Example,
    Walkthrough,
    example_params,
    fenced,
    run_placer,
    sglang_dumps,
)

from placer.cli.main import app


def _commands(group, path=()) -> list:
    found = [(path, group)]
    for name, command in getattr(group, "commands", {}).items():
        found.extend(_commands(command, (*path, name)))
    return found


def _examples(epilog: str | None) -> list[Example]:
    """The command lines under ``Examples:`` (up to the first blank line)."""
    if not epilog or "Examples:\n" not in epilog:
        return []
    block = epilog.split("Examples:\n", 1)[1].split("\n\n", 1)[0]
    return [Example(line.strip(), (), number)
            for number, line in enumerate(block.splitlines(), 1) if line.strip()]


#: ``{"topology show": [examples]}``, ``"placer"`` for the root's.
HELP = {" ".join(path) or "placer": _examples(command.epilog)
        for path, command in _commands(typer.main.get_command(app))}


# -- the files the examples name ---------------------------------------------------------------


def _deepseek(folder: Path, trace: str = "trace.npz", plan: str | None = "plan.json") -> None:
    """A small DeepSeek-V3 trace for 32 ranks and EPLB's plan of it on 4 x DGX H100 with
    32 redundant experts."""
    run_placer(folder, "synth", trace, "-m", "deepseek-v3", "-n", "2048", "--ranks", "32",
               "--seed", "1")
    if plan:
        run_placer(folder, "plan", trace, "-m", "deepseek-v3", "-t", "4x-dgx-h100", "-r", "32",
                   "--solver", "eplb", "-o", plan)


def _qwen_plans(folder: Path) -> None:
    """``eplb.json`` and ``cpsat.json``: the bundled Qwen3 trace on 2 x DGX H100, R=16."""
    for solver in ("eplb", "cpsat"):
        run_placer(folder, "plan", "traces/qwen3-30b-a3b.npz", "-m", "qwen3-30b-a3b", "-t",
                   "2x-dgx-h100", "-r", "16", "--solver", solver, "--time-limit", "1",
                   "-o", f"{solver}.json")


def _stats(folder: Path) -> None:
    run_placer(folder, "synth", "run.jsonl.gz", "--layers", "2", "--experts", "16", "--top-k",
               "2", "--tokens", "8192", "--seed", "1")
    sglang_dumps(folder / "dumps")


def _topology(folder: Path) -> None:
    (folder / "my-cluster.yaml").write_text(fenced("hardware.md", "yaml", "name: lab-a100"))


def _model(folder: Path) -> None:
    (folder / "path" / "to").mkdir(parents=True)
    (folder / "path" / "to" / "config.json").write_text(json.dumps(CONFIGS["qwen3-30b-a3b"]))


def _plan(folder: Path) -> None:
    sglang_dumps(folder / "dumps")
    _deepseek(folder, "new.npz", "deployed.json")


def _evaluate(folder: Path) -> None:
    for solver in ("eplb", "cpsat"):
        run_placer(folder, "plan", "traces/synthetic-small.jsonl.gz", "-m", "gpt-oss-20b", "-t",
                   "dgx-h100", "-r", "8", "--fit", "0:6", "--solver", solver, "-o",
                   f"{solver}.json")
    _deepseek(folder)


def _import(folder: Path) -> None:
    """SGLang's file for DeepSeek-V3 on 32 GPUs and vLLM's for Qwen3 on 16, each with the
    first experts replicated (one row per hidden layer for SGLang, per MoE layer for vLLM)."""
    sglang = [list(range(256)) + list(range(32))] * 61
    (folder / "deployed.sglang.json").write_text(json.dumps({"physical_to_logical_map": sglang}))
    (folder / "plan.vllm.json").write_text(json.dumps([list(range(128)) + list(range(16))] * 48))


def _export(folder: Path) -> None:
    """``plan.json``: a DeepSeek-V3 placement on 4 x DGX H100 (imported from SGLang's file)."""
    _import(folder)
    run_placer(folder, "import", "deployed.sglang.json", "--model", "deepseek-v3", "--topology",
               "4x-dgx-h100", "-o", "plan.json")


def _compare(folder: Path) -> None:
    _deepseek(folder, plan=None)
    (folder / "study.yaml").write_text(
        fenced("compare.md", "console", "$ cat study.yaml")
        .split("$ cat study.yaml\n", 1)[1].split("\n$ ", 1)[0])


def _report(folder: Path) -> None:
    _qwen_plans(folder)
    _deepseek(folder)


def _calibrate(folder: Path) -> None:
    run_placer(folder, "synth", "trace.jsonl", "-m", "gpt-oss-20b", "-n", "2048", "--ranks", "8",
               "--seed", "1")
    run_placer(folder, "plan", "trace.jsonl", "-m", "gpt-oss-20b", "-t", "dgx-h800", "-r", "8",
               "--solver", "eplb", "-o", "plan.json")


#: What each command's examples read beyond the bundled traces and ``bench/data``.
INPUTS: dict[str, Callable[[Path], None]] = {
    "stats": _stats, "topology": _topology, "topology show": _topology,
    "topology validate": _topology, "model show": _model, "plan": _plan,
    "evaluate": _evaluate, "export": _export, "import": _import, "compare": _compare,
    "report": _report, "replay": _deepseek, "calibrate": _calibrate,
}

#: Examples left to the slow tier, per command (a part of the command: why).
SLOW: dict[str, dict[str, str]] = {
    "placer": {"traces/qwen3-30b-a3b.npz -m": "Qwen3 plans, judged (10-30 s)"},
    "synth": {"placer synth": "50,000 DeepSeek-V3 tokens; topic shifts over 32 ranks"},
    "plan": {"placer plan": "DeepSeek-V3 and Qwen3 plans, judged"},
    "compare": {"placer compare": "scenarios of Qwen3 and DeepSeek-V3 plans"},
    "report": {"placer report": "Qwen3 and DeepSeek-V3 reports with pictures"},
    "calibrate": {"placer": "the fit (20 s), then what reads the overlay it writes"},
    "replay": {"placer replay": "DeepSeek-V3 replayed step by step under several policies"},
}


def workdir(folder: Path, command: str) -> Path:
    """A working directory for ``command``'s examples (:data:`INPUTS`)."""
    folder.mkdir(parents=True)
    for shared in ("traces", "bench"):
        (folder / shared).symlink_to(REPO / shared, target_is_directory=True)
    # the folder the examples' --png-dir names, made as a user makes it (placer makes none)
    (folder / "pictures").mkdir()
    if command in INPUTS:
        INPUTS[command](folder)
    return folder


def test_every_command_has_examples_and_known_inputs() -> None:
    assert all(HELP.values()), [name for name, examples in HELP.items() if not examples]
    assert set(INPUTS) <= set(HELP) and set(SLOW) <= set(HELP)
    for command, keys in SLOW.items():
        for key in keys:
            assert any(key in e.command for e in HELP[command]), f"{command}: no {key!r}"


class _Commands:
    """A :class:`Walkthrough` per command, made when its first example runs."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory, self.commands = factory, {}

    def __getitem__(self, command: str) -> Walkthrough:
        if command not in self.commands:
            folder = self.factory.mktemp(command.replace(" ", "-")) / "work"
            self.commands[command] = Walkthrough(HELP[command], workdir(folder, command),
                                                 f"placer {command} -h", SLOW.get(command))
        return self.commands[command]


@pytest.fixture(scope="module")
def commands(tmp_path_factory: pytest.TempPathFactory) -> _Commands:
    return _Commands(tmp_path_factory)


@pytest.mark.parametrize(("command", "example"), [
    pytest.param(command, p.values[0], id=f"{command}:{p.values[0].command}", marks=p.marks)
    for command, examples in HELP.items()
    for p in example_params(examples, f"help {command}", SLOW.get(command))])
def test_help_example_runs_as_written(command: str, example: Example,
                                      commands: _Commands) -> None:
    """The example exits 0 and prints no traceback (``readme_fixtures.check_example``)."""
    assert commands[command].check(example) == 0
