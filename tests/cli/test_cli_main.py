"""The CLI shell: version, help, and that every command documents itself."""

from __future__ import annotations

import subprocess
import sys

import typer
import typer.main
from typer.testing import CliRunner

from placer import __version__
from placer.cli.main import app

runner = CliRunner()


def _commands(group, prefix: str = "") -> list:
    """(name, command) for every command below ``group``, depth first."""
    out = []
    for name, cmd in sorted(getattr(group, "commands", {}).items()):
        out.append((prefix + name, cmd))
        if getattr(cmd, "commands", None):
            out.extend(_commands(cmd, prefix + name + " "))
    return out


def test_version_prints_package_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"placer {__version__}"


def test_every_command_has_help_text():
    root = typer.main.get_command(app)
    commands = _commands(root)
    assert commands, "no commands registered"
    for name, cmd in commands:
        assert (cmd.help or cmd.short_help or "").strip(), f"`placer {name}` has no help text"


def test_unknown_command_is_a_usage_error():
    result = runner.invoke(app, ["no-such-command"])
    assert result.exit_code == 2


def test_installed_entry_point_runs():
    proc = subprocess.run(
        [sys.executable, "-m", "placer.cli.main", "--version"], capture_output=True, text=True
    )
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"placer {__version__}"


def test_every_command_is_documented_in_the_readme():
    """sqlite-utils' habit: a command nobody documented fails the build."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    root = typer.main.get_command(app)
    top_level = [name for name, _ in _commands(root) if " " not in name]
    assert top_level
    missing = [name for name in top_level if f"placer {name}" not in readme]
    assert not missing, f"commands missing from README.md: {missing}"
