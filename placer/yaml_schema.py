"""Strict reading of YAML documents, with errors that name the file, line and YAML path.

Topology and model files are small hand-written YAML.  A typo must not be silently
ignored, so every mapping is read through a :class:`Section` that takes the keys it
knows one by one and, at :meth:`Section.done`, rejects whatever key is left over
(with a "did you mean" hint).  Errors are raised as the error class the caller
chooses (``TopologyError``, ``ModelError``) with ``where="file.yaml:12: nodes[1].gpus"``.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from placer.errors import PlacerError

_MISSING: Any = object()


@dataclass
class YamlDoc:
    """A parsed YAML document and where each of its values came from.

    Attributes
    ----------
    data: the plain Python value (dicts, lists, scalars).
    source: file name (or ``"<preset NAME>"``, ``"<dict>"``) used in messages.
    lines: YAML path (``"nodes[1].gpus"``) -> 1-based line number.
    error: the PlacerError subclass raised for problems in this document.
    """

    data: Any
    source: str
    error: type[PlacerError]
    lines: dict[str, int] = field(default_factory=dict)

    def where(self, path: str) -> str:
        """``"file.yaml:12: nodes[1].gpus"`` (line when known, path unless top level)."""
        line = self.lines.get(path)
        loc = f"{self.source}:{line}" if line is not None else self.source
        return f"{loc}: {path}" if path else loc

    def fail(self, path: str, message: str, hint: str | None = None) -> PlacerError:
        """Build (not raise) the error for ``path``."""
        return self.error(message, where=self.where(path), hint=hint)

    def root(self) -> Section:
        return Section(self, self.data, "")


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


class _DuplicateKey(Exception):
    def __init__(self, path: str, line: int, first_line: int | None):
        super().__init__(path)
        self.path, self.line, self.first_line = path, line, first_line


def _plain(node: yaml.Node, path: str, lines: dict[str, int], loader: yaml.SafeLoader) -> Any:
    """Turn a composed YAML node into plain values, recording each path's line."""
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        # YAML merge keys (<<: *anchor) bring inherited pairs first; own keys override them.
        num_own = sum(1 for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge")
        loader.flatten_mapping(node)
        num_inherited = len(node.value) - num_own
        result: dict[Any, Any] = {}
        own: set[Any] = set()
        for index, (key_node, value_node) in enumerate(node.value):
            key = loader.construct_object(key_node, deep=True)
            sub = _join(path, str(key))
            if index >= num_inherited:
                if key in own:
                    raise _DuplicateKey(sub, key_node.start_mark.line + 1, lines.get(sub))
                own.add(key)
            lines[sub] = key_node.start_mark.line + 1
            result[key] = _plain(value_node, sub, lines, loader)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_plain(v, _join(path, i), lines, loader) for i, v in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def parse_yaml(text: str, source: str, error: type[PlacerError]) -> YamlDoc:
    """Parse YAML text into a :class:`YamlDoc`; syntax errors become ``error``."""
    loader = yaml.SafeLoader(text)
    lines: dict[str, int] = {}
    try:
        node = loader.get_single_node()
        data = None if node is None else _plain(node, "", lines, loader)
    except _DuplicateKey as e:
        first = f" (first given on line {e.first_line})" if e.first_line else ""
        raise error(
            f"duplicate key {e.path}{first}", where=f"{source}:{e.line}: {e.path}"
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(e, "problem", None) or str(e)
        raise error(f"not valid YAML: {problem}", where=where) from None
    finally:
        loader.dispose()
    return YamlDoc(data=data, source=source, error=error, lines=lines)


def read_yaml(path: Path, error: type[PlacerError]) -> YamlDoc:
    """Read and parse a YAML file; a missing or unreadable file becomes ``error``."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error("file not found", where=str(path)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"cannot read file: {e}", where=str(path)) from None
    return parse_yaml(text, str(path), error)


def _type_name(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


class Section:
    """A YAML mapping read key by key; unknown keys are errors at :meth:`done`.

    Parameters
    ----------
    doc: the document (for messages).
    value: the mapping itself (anything else is an error).
    path: its YAML path (``""`` for the top level).
    """

    def __init__(self, doc: YamlDoc, value: Any, path: str):
        self.doc = doc
        self.path = path
        if not isinstance(value, dict):
            what = path if path else "the document"
            raise doc.fail(path, f"expected a mapping for {what}, got {_type_name(value)}")
        self.value: dict[Any, Any] = value
        self._used: set[Any] = set()

    # -- raw access -------------------------------------------------------------------
    def has(self, key: str) -> bool:
        return key in self.value

    def sub(self, key: str) -> str:
        return _join(self.path, key)

    def fail(self, key: str | None, message: str, hint: str | None = None) -> PlacerError:
        """Build the error for ``key`` of this section (or the section itself)."""
        return self.doc.fail(self.path if key is None else self.sub(key), message, hint)

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        self._used.add(key)
        if key not in self.value or self.value[key] is None:
            if default is _MISSING:
                typos = difflib.get_close_matches(key, [str(k) for k in self.value], n=1)
                hint = f"found '{typos[0]}': did you mean '{key}'?" if typos else None
                raise self.doc.fail(self.path, f"missing key '{key}'", hint)
            return default
        return self.value[key]

    # -- typed access -----------------------------------------------------------------
    def number(
        self,
        key: str,
        default: Any = _MISSING,
        *,
        minimum: float = 0.0,
        strict: bool = True,
        zero_hint: str | None = None,
    ) -> float:
        """A finite number; ``strict`` means it must be > ``minimum``, else >= it."""
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value  # type: ignore[no-any-return]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, f"{key} must be a number, got {_type_name(value)} {value!r}")
        if not math.isfinite(value):
            raise self.fail(key, f"{key} must be finite, got {value}")
        if strict and value <= minimum:
            word = "positive" if minimum == 0 else f"greater than {minimum:g}"
            hint = zero_hint if value == 0 else None
            raise self.fail(key, f"{key} must be {word}, got {value:g}", hint)
        if not strict and value < minimum:
            word = "zero or more" if minimum == 0 else f"at least {minimum:g}"
            raise self.fail(key, f"{key} must be {word}, got {value:g}")
        return float(value)

    def integer(self, key: str, default: Any = _MISSING, *, minimum: int = 1) -> int:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value  # type: ignore[no-any-return]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"{key} must be an integer, got {_type_name(value)} {value!r}")
        if value < minimum:
            raise self.fail(key, f"{key} must be at least {minimum}, got {value}")
        return int(value)

    def string(
        self, key: str, default: Any = _MISSING, *, choices: tuple[str, ...] | None = None
    ) -> str:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value  # type: ignore[no-any-return]
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise self.fail(key, f"{key} must be a string, got {_type_name(value)}")
        text = str(value)
        if not text.strip():
            raise self.fail(key, f"{key} must not be empty")
        if choices is not None and text not in choices:
            raise self.fail(
                key, f"unknown {key} '{text}'", hint=f"expected one of: {', '.join(choices)}"
            )
        return text

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, f"{key} must be true or false, got {value!r}")
        return value

    def section(self, key: str, default: Any = _MISSING) -> Section | None:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return None
        return Section(self.doc, value, self.sub(key))

    def mapping(self, key: str) -> Section:
        """The required mapping under ``key``."""
        return Section(self.doc, self.raw(key), self.sub(key))

    def items(self, key: str, default: Any = _MISSING) -> Iterator[tuple[str, Any]]:
        """Yield ``(path, value)`` for each element of the list under ``key``."""
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return
        if not isinstance(value, list):
            raise self.fail(key, f"{key} must be a list, got {_type_name(value)}")
        for i, element in enumerate(value):
            yield _join(self.sub(key), i), element

    def done(self) -> None:
        """Raise on the first key that was never read (a typo or an unsupported field)."""
        known = sorted(str(k) for k in self._used)
        for key in self.value:
            if key in self._used:
                continue
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean '{close[0]}'?" if close else None
            allowed = f"allowed keys: {', '.join(known)}"
            hint = f"{hint} {allowed}" if hint else allowed
            raise self.doc.fail(self.sub(str(key)), f"unknown key '{key}'", hint)
