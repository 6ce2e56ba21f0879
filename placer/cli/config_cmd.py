"""``placer config``: the effective defaults and where each came from.

Thin: :func:`placer.cli.config.load_config` finds the config file and reads the ``PLACER_*``
variables; this module lists each setting with its value, its source (the file's path,
the variable, or built-in) and the commands whose option it sets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from placer.cli.command import PlacerCommand, examples
from placer.cli.common import handle_errors, print_json
from placer.cli.config import (
    CONFIG_FILE,
    PYPROJECT_FILE,
    SOURCE_BUILT_IN,
    Config,
    load_config,
)
from placer.cli.options import (
    json_option,
)

EXAMPLES = examples(
    "placer config",
    "PLACER_TOPOLOGY=4x-dgx-h100 PLACER_JOBS=8 placer config --json",
    note="A placer.toml, for example:\n\n"
    "\b\n"
    '  topology = "4x-dgx-h100"\n'
    '  model = "deepseek-v3"\n'
    '  engine = "sglang"\n\n'
    "Precedence: command line > PLACER_* variables > config file > built-in (docs/cli.md).",
)


def commands_with(root: Any) -> dict[str, list[str]]:
    """``{option parameter name: ["plan", "compare", ...]}`` over every command of ``root``."""
    found: dict[str, list[str]] = {}

    def visit(group: Any, prefix: str) -> None:
        for name, command in getattr(group, "commands", {}).items():
            if getattr(command, "commands", None):
                visit(command, f"{prefix}{name} ")
                continue
            for param in command.params:
                if param.param_type_name == "option":
                    found.setdefault(param.name, []).append(prefix + name)

    visit(root, "")
    return found


def config_document(config: Config, users: dict[str, list[str]]) -> dict[str, Any]:
    """The ``--json`` document: the file read, and one object per setting."""
    return {
        "file": None if config.file is None else str(config.file),
        "table": config.table or None,
        "searched_from": str(config.searched_from),
        "precedence": ["command line", "env", "file", "built-in"],
        "settings": [
            {"name": name, "value": d.value, "source": d.source, "where": d.where or None,
             "env": d.setting.env, "option": d.setting.option,
             "commands": users.get(name, []), "help": d.setting.help}
            for name, d in config.defaults.items()
        ],
    }


def render(config: Config, users: dict[str, list[str]]) -> str:
    """The text table of ``placer config``."""
    if config.file is None:
        head = (f"config file   none ({CONFIG_FILE}, or [tool.placer] in {PYPROJECT_FILE},"
                f" in {config.searched_from} or a folder above)")
    else:
        table = f" [{config.table}]" if config.table else ""
        head = f"config file   {config.file}{table}"
    rows = [("setting", "value", "from", "sets")]
    for name, d in config.defaults.items():
        if d.source == SOURCE_BUILT_IN:
            value, source = "-", "built-in"
        else:
            value, source = str(d.value), d.where  # the variable, or the file's path
        commands = users.get(name, [])
        rows.append((name, value, source, f"{d.setting.option} of {', '.join(commands)}"
                     if commands else d.setting.option))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [head, ""]
    lines += ["  ".join([*(r[i].ljust(widths[i]) for i in range(3)), r[3]]).rstrip()
              for r in rows]
    lines += ["", "precedence: command line > PLACER_* variables > config file > built-in"
              " (- : each command's own default)"]
    return "\n".join(lines)


@handle_errors
def config(
    ctx: typer.Context,
    json_out: bool = json_option("the defaults"),
) -> None:
    """Show the defaults from PLACER_* variables and the config file, and where each came
    from."""
    settings = load_config(Path.cwd())
    users = commands_with(ctx.find_root().command)
    if json_out:
        print_json(config_document(settings, users))
    else:
        typer.echo(render(settings, users))


def register(app: typer.Typer) -> None:
    """Add ``placer config`` to ``app``."""
    app.command("config", cls=PlacerCommand, epilog=EXAMPLES)(config)
