"""Entry point of the ``placer`` command."""

from __future__ import annotations

import importlib
import os
import sys

import typer

from placer import __version__
from placer.cli.command import examples, new_typer

app = new_typer(
    name="placer",
    help="Expert-placement optimizer for serving Mixture-of-Experts models.",
    epilog=examples(
        "placer stats traces/qwen3-30b-a3b.npz",
        "placer plan traces/qwen3-30b-a3b.npz -m qwen3-30b-a3b -t 2x-dgx-h100 -r 16"
        " -o plan.json",
        "placer compare traces/qwen3-30b-a3b.npz -m qwen3-30b-a3b -t dgx-h100"
        " -t 2x-dgx-h100 -r 0,16",
        note="`placer COMMAND -h` shows a command's options and examples. Defaults for"
        " --topology, --model, --engine, --jobs, ... come from PLACER_* variables and"
        " placer.toml (`placer config`); docs/cli.md.",
    ),
    add_completion=True,
    pretty_exceptions_enable=False,
)

#: Command modules, in help order; each exposes ``register(app)``.
COMMAND_MODULES = (
    "stats_cmd",      # placer stats, placer synth
    "hardware_cmd",   # placer topology ..., placer model ..., placer capacity
    "plan_cmd",       # placer plan
    "evaluate_cmd",   # placer evaluate
    "engines_cmd",    # placer export, placer import
    "compare_cmd",    # placer compare
    "report_cmd",     # placer report
    "replay_cmd",     # placer replay
    "calibrate_cmd",  # placer calibrate
    "config_cmd",     # placer config
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"placer {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Expert-placement optimizer for serving Mixture-of-Experts models."""


for _name in COMMAND_MODULES:
    try:
        _module = importlib.import_module(f"placer.cli.{_name}")
    except ModuleNotFoundError as _e:
        if _e.name != f"placer.cli.{_name}":
            raise
        continue
    _module.register(app)


def main() -> None:
    try:
        app()
    finally:
        _flush_quietly()


def _flush_quietly() -> None:
    """Flush stdout now, so a reader that left (``placer ... | head``) ends the run with
    exit 141 instead of a message from the interpreter's shutdown."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(141)


if __name__ == "__main__":
    main()
