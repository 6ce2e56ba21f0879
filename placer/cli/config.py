"""Defaults for the command line: a config file and ``PLACER_*`` environment variables.

A setting is a default for the option of the same name in every command that has it
(``topology`` -> ``--topology`` of plan, evaluate, compare, report, capacity, ...).
Where an effective default comes from, highest first:

1. the command line (an option given there always wins; not handled here);
2. the environment: ``PLACER_TOPOLOGY``, ``PLACER_MODEL``, ``PLACER_JOBS``, ...;
3. the config file: ``placer.toml`` (top-level keys), or the ``[tool.placer]`` table of a
   ``pyproject.toml``, whichever is found first walking up from the working directory
   (``placer.toml`` first within one folder; a ``pyproject.toml`` without the table is
   passed over);
4. the command's built-in default.

Example ``placer.toml``::

    topology = "4x-dgx-h100"
    model = "deepseek-v3"
    engine = "sglang"
    jobs = 8

Keys may be written with ``-`` or ``_`` (``kv-reserve-gb``).  An unknown key, or a value of
the wrong type, is a :class:`ConfigError` naming the file (or variable) and the key.
"""

from __future__ import annotations

import contextlib
import difflib
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from placer.errors import UsageError
from placer.regime import ENGINES, WORKLOADS

#: Names of the config files, in the order they are looked for in each folder.
CONFIG_FILE = "placer.toml"
PYPROJECT_FILE = "pyproject.toml"
#: Prefix of the environment variables (``PLACER_TOPOLOGY``).
ENV_PREFIX = "PLACER_"

#: Where a default came from.
SOURCE_COMMAND_LINE, SOURCE_ENV, SOURCE_FILE, SOURCE_BUILT_IN = (
    "command line", "env", "file", "built-in")


class ConfigError(UsageError):
    """A config file or ``PLACER_*`` variable is malformed (exit code 2)."""


@dataclass(frozen=True)
class Setting:
    """One setting: a default for the option ``--<name with dashes>``.

    Parameters
    ----------
    name:
        Key in the config file, and the option's parameter name (``kv_reserve_gb``).
    kind:
        ``str``, ``int`` or ``float``: the type a value must have.
    help:
        What it sets, in a few words.
    """

    name: str
    kind: type
    help: str

    @property
    def env(self) -> str:
        """The environment variable: ``PLACER_KV_RESERVE_GB``."""
        return ENV_PREFIX + self.name.upper()

    @property
    def option(self) -> str:
        """The command-line option: ``--kv-reserve-gb``."""
        return "--" + self.name.replace("_", "-")


#: Every setting, in the order ``placer config`` lists them.
SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("topology", str, "cluster preset name or topology YAML file"),
    Setting("model", str, "model preset name, Hugging Face id or model YAML file"),
    Setting("engine", str, f"serving engine planned and judged for ({', '.join(ENGINES)})"),
    Setting("workload", str, f"batch regime ({', '.join(WORKLOADS)})"),
    Setting("tokens_per_gpu", int, "tokens each EP rank dispatches per step"),
    Setting("solver", str, "placement solver of plan and compare"),
    Setting("dtype", str, "expert weight dtype (bf16, fp8, mxfp4)"),
    Setting("kv_reserve_gb", float, "memory per GPU kept for the KV cache, GB"),
    Setting("jobs", int, "parallel processes (layers in plan, scenarios in compare)"),
    Setting("seed", int, "random seed"),
    Setting("ray", str, "Ray address to solve on (local, auto, ray://head:10001)"),
    Setting("dpi", int, "resolution of the report pictures, dots per inch"),
)}


@dataclass(frozen=True)
class Default:
    """The effective default of one setting and where it came from.

    ``value`` is None when the command's built-in default applies; ``where`` is the
    config file's path, the environment variable's name, or ``""`` (built-in).
    """

    setting: Setting
    value: Any
    source: str
    where: str = ""

    def origin(self) -> str:
        """In words: ``PLACER_JOBS=8``, ``placer.toml: jobs`` or ``built-in``."""
        if self.source == SOURCE_ENV:
            return f"{self.where}={self.value}"
        if self.source == SOURCE_FILE:
            return f"{self.where}: {self.setting.name}"
        return self.source


@dataclass(frozen=True)
class Config:
    """Effective defaults: ``defaults[name]`` for every name of :data:`SETTINGS`.

    ``file`` is the config file read (None when none was found) and ``table`` the TOML
    table read in it (``""`` for placer.toml, ``"tool.placer"`` for pyproject.toml).
    """

    defaults: dict[str, Default]
    file: Path | None = None
    table: str = ""
    searched_from: Path = field(default_factory=Path.cwd)

    def given(self) -> dict[str, Default]:
        """The settings that are not built-in (set by the environment or the file)."""
        return {n: d for n, d in self.defaults.items() if d.source != SOURCE_BUILT_IN}


def find_config_file(start: Path) -> tuple[Path, str] | None:
    """The first ``placer.toml``, or ``pyproject.toml`` with ``[tool.placer]``, from
    ``start`` upward; returns ``(path, table)`` or None."""
    for folder in (start, *start.parents):
        candidate = folder / CONFIG_FILE
        if candidate.is_file():
            return candidate, ""
        candidate = folder / PYPROJECT_FILE
        if candidate.is_file() and _placer_table(_read_toml(candidate)) is not None:
            return candidate, "tool.placer"
    return None


def read_config_file(path: Path, table: str = "") -> dict[str, Any]:
    """The settings of a config file, checked: ``{name: value}`` (names with ``_``).

    ``table`` is ``"tool.placer"`` for a pyproject.toml, ``""`` for placer.toml.
    """
    document = _read_toml(path)
    raw = _placer_table(document) if table else document
    if raw is None:
        raise ConfigError(f"no [{table}] table", where=str(path),
                          hint="add the table, or put the settings in placer.toml")
    prefix = f"[{table}] " if table else ""
    values = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        setting = SETTINGS.get(name)
        if setting is None:
            raise ConfigError(
                f"unknown setting {prefix}{key!r}", where=str(path), hint=_unknown_hint(name),
            )
        values[name] = _checked(setting, value, where=f"{path}: {key}")
    return values


def read_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings given as ``PLACER_<NAME>`` variables (empty ones are not given).

    Other ``PLACER_*`` variables (``PLACER_DEBUG``) are not settings and are left alone.
    """
    values = {}
    for name, setting in SETTINGS.items():
        text = environ.get(setting.env, "").strip()
        if text:
            values[name] = _checked(setting, text, where=setting.env)
    return values


def load_config(start: Path | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Effective defaults from the environment and the config file found from ``start``
    (default: the working directory) upward; raises :class:`ConfigError`."""
    start = Path.cwd() if start is None else start
    environ = os.environ if environ is None else environ
    found = find_config_file(start.resolve())
    from_file = read_config_file(*found) if found is not None else {}
    from_env = read_environment(environ)
    file = str(found[0]) if found is not None else ""
    defaults = {}
    for name, setting in SETTINGS.items():
        if name in from_env:
            defaults[name] = Default(setting, from_env[name], SOURCE_ENV, setting.env)
        elif name in from_file:
            defaults[name] = Default(setting, from_file[name], SOURCE_FILE, file)
        else:
            defaults[name] = Default(setting, None, SOURCE_BUILT_IN)
    return Config(defaults, file=found[0] if found else None, table=found[1] if found else "",
                  searched_from=start)


# -- helpers ----------------------------------------------------------------------------


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"not valid TOML: {e}", where=str(path),
                          hint="fix the file, or move it out of the way") from None
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror or e}", where=str(path)) from None


def _placer_table(document: dict[str, Any]) -> dict[str, Any] | None:
    tool = document.get("tool")
    table = tool.get("placer") if isinstance(tool, dict) else None
    return table if isinstance(table, dict) else None


def _unknown_hint(name: str) -> str:
    close = difflib.get_close_matches(name, SETTINGS, n=1)
    known = ", ".join(SETTINGS)
    if close:
        return f"did you mean {close[0]}? (settings: {known})"
    return f"settings: {known}"


def _checked(setting: Setting, value: Any, *, where: str) -> Any:
    """``value`` as ``setting.kind``; ConfigError naming ``where`` otherwise.  Strings
    (environment variables) are converted; file values must have the type already."""
    kind = setting.kind
    if isinstance(value, str) and kind is not str:
        with contextlib.suppress(ValueError):  # a wrong type is said below
            value = kind(value.strip())
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        words = {str: "a string", int: "a whole number", float: "a number"}[kind]
        raise ConfigError(f"expected {words}, got {value!r}", where=where,
                          hint=f"{setting.name}: {setting.help}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"expected a finite number, got {value!r}", where=where,
                          hint=f"{setting.name}: {setting.help}")
    if isinstance(value, str) and not value.strip():
        raise ConfigError("expected a value, got an empty string", where=where,
                          hint=f"{setting.name}: {setting.help}; leave the key out for the"
                          " built-in default")
    return value
