"""A solver's own options: a frozen dataclass, filled from values or ``KEY=VALUE`` strings.

PyVRP-style: :class:`placer.problem.SolveParams` holds what every solver shares (time,
seed, parallelism, the regime, the move budget); each solver that has knobs of its
own declares them as a dataclass and reads ``SolveParams.options`` through
:func:`coerce`, which accepts an instance of that class, a mapping of field names to
values or to strings (the command line's ``--option KEY=VALUE``), or None (the
defaults).  Strings are parsed against the field's annotation (``int``, ``float``,
``bool``, ``str``, optionally ``| None``), and unknown names are an error that lists
the known ones.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from placer.errors import Param, UsageError

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def coerce(cls: type[T], options: Any, solver: str) -> T:
    """``options`` as an instance of the dataclass ``cls`` (see the module docstring)."""
    if isinstance(options, cls):
        return options
    if options is None:
        return cls()
    if not isinstance(options, Mapping):
        raise UsageError(f"solver {solver} takes its options as {cls.__name__} or a mapping,"
                         f" got {type(options).__name__}", where="options")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for key, raw in options.items():
        if key not in known:
            raise UsageError(f"unknown {solver} option {key!r}", where=Param("options"),
                             hint=f"{solver} options: {', '.join(sorted(known))}")
        values[key] = _parse(raw, hints[key], key)
    return cls(**values)


def _parse(raw: Any, annotation: Any, key: str) -> Any:
    kinds = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (
        annotation,)
    optional = type(None) in kinds
    kind = next(k for k in kinds if k is not type(None))
    if raw is None or (optional and isinstance(raw, str) and raw.strip().lower() == "none"):
        if optional:
            return None
        raise UsageError(f"option {key} needs a value", where=Param("options"))
    if not isinstance(raw, str):
        if kind is float and isinstance(raw, int | float) and not isinstance(raw, bool):
            return _finite(float(raw), key)
        if isinstance(raw, kind) and not (kind is int and isinstance(raw, bool)):
            return raw
        raise UsageError(f"option {key} expects a {kind.__name__}, got {raw!r}",
                         where=Param("options"))
    text = raw.strip()
    try:
        if kind is bool:
            if text.lower() in _TRUE | _FALSE:
                return text.lower() in _TRUE
            raise ValueError(text)
        if kind is float:
            return _finite(float(text), key)
        return kind(text)
    except ValueError:
        example = "true or false" if kind is bool else f"a {kind.__name__}"
        raise UsageError(f"option {key} expects {example}, got {raw!r}",
                         where=Param("options")) from None


def _finite(value: float, key: str) -> float:
    if not math.isfinite(value):
        raise UsageError(f"option {key} expects a finite number, got {value}",
                         where=Param("options"))
    return value
