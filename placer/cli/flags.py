"""The library's parameter names, as the command line's flags.

The core names its parameters (``Param("slots_per_gpu")``, `` `model` `` in a hint);
this module turns them into what a user of the command line typed: the flag of the
same name with dashes (``--slots-per-gpu``) when some command has it, or the flag
:data:`FLAGS` lists for a parameter whose flag is named otherwise.
"""

from __future__ import annotations

import functools
import re
from contextvars import ContextVar
from typing import Any

from placer.errors import Param, PlacerError

#: Parameters whose flag is not ``--`` + the name with dashes.
FLAGS: dict[str, str] = {
    "total_time_limit_s": "--time-limit",
    "layer_time_limit_s": "--layer-time-limit",
    "held_out": "--eval",
    "trace_format": "--format",
    "options": "--option",
    "policy": "--dispatch",
    "dispatch_override": "--dispatch",
    "all_to_all_override": "--mode",
    "trace": "TRACE",
}

_NAME = re.compile(r"`([a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)?)`")


#: The root command of the command line now running (set when it builds its context): its
#: options are the flags :func:`flag_for` knows.
running_command: ContextVar[Any] = ContextVar("running_command", default=None)


def all_flags(command: Any = None) -> frozenset[str]:
    """Every long option of ``command`` and its subcommands; by default of the running
    command line (:data:`running_command`), none outside a command line."""
    command = command if command is not None else running_command.get()
    return frozenset() if command is None else _flags_of(command)


@functools.cache
def _flags_of(root: Any) -> frozenset[str]:
    found: set[str] = set()
    stack = [root]
    while stack:
        command = stack.pop()
        for param in command.params:
            found.update(o for o in getattr(param, "opts", []) if o.startswith("--"))
        stack.extend(getattr(command, "commands", {}).values())  # a group's commands
    return frozenset(found)


def flag_for(name: str) -> str | None:
    """The flag of parameter ``name`` (``options.KEY`` -> ``--option KEY``), or None."""
    if name in FLAGS:
        return FLAGS[name]
    if name.startswith("options."):
        return f"--option {name.split('.', 1)[1]}"
    flag = "--" + name.replace("_", "-")
    return flag if flag in all_flags() else None


def as_flags(text: str) -> str:
    """``text`` with each `` `parameter` `` that has a flag written as that flag."""
    return _NAME.sub(lambda m: flag_for(m.group(1)) or m.group(0), text)


def for_command_line(error: PlacerError) -> PlacerError:
    """``error`` in the command line's words: its place, message and hint with flags."""
    if isinstance(error.where, Param):
        error.where = flag_for(error.where) or str(error.where)
    elif error.where:
        error.where = as_flags(error.where)
    error.message = as_flags(error.message)
    error.args = (error.message,)
    if error.hint:
        error.hint = as_flags(error.hint)
    return error
