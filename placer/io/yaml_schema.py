"""Strict reading of YAML documents, with errors that name the file, line and YAML path.

Topology and model files are small hand-written YAML.  A typo must not be silently
ignored, so every mapping is read through a :class:`Section` that takes the keys it
knows one by one and, at :meth:`Section.done`, rejects whatever key is left over
(with a "did you mean" hint).  Errors are raised as the error class the caller
chooses (``TopologyError``, ``ModelError``) with ``where="file.yaml:12: nodes[1].gpus"``.

Documents are hostile until read: a file is read whole only up to
``constants.MAX_DOCUMENT_BYTES`` (:func:`read_document`), YAML aliases are expanded up
to ``constants.MAX_YAML_NODES`` values ("billion laughs") and nesting stops at
``constants.MAX_NESTING`` levels (recursive aliases included); :func:`load_json` applies
the same depth limit to JSON and refuses integers beyond int64.  See docs/limits.md.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from placer import constants
from placer.errors import PlacerError
from placer.io.fileio import reading

_MISSING: Any = object()

#: Largest integer a document may hold (int64): beyond it, arithmetic on the value
#: would overflow numpy's integers.
INT64_MAX = (1 << 63) - 1


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


class _TooLarge(Exception):
    """A document past one of the limits (nesting depth or expanded values)."""

    def __init__(self, path: str, line: int, message: str, hint: str):
        super().__init__(message)
        self.path, self.line, self.message, self.hint = path, line, message, hint


class _Budget:
    """Values left to expand: every node visited counts, an alias's as often as it is used."""

    def __init__(self) -> None:
        self.left = constants.MAX_YAML_NODES

    def take(self, node: yaml.Node, path: str, depth: int) -> None:
        self.left -= 1
        if self.left < 0:
            raise _TooLarge(
                path, node.start_mark.line + 1,
                f"the document expands to more than {constants.MAX_YAML_NODES:,} values"
                " (aliases are expanded where they are used)",
                "a topology or model file is small: do not nest aliases of aliases"
                " (docs/limits.md)",
            )
        if depth > constants.MAX_NESTING:
            raise _TooLarge(
                path, node.start_mark.line + 1,
                f"the document nests deeper than {constants.MAX_NESTING} levels (or an"
                " alias refers to itself)",
                "flatten the document; an anchor cannot be used inside its own value",
            )


def _plain(
    node: yaml.Node, path: str, lines: dict[str, int], loader: yaml.SafeLoader,
    budget: _Budget, depth: int = 0,
) -> Any:
    """Turn a composed YAML node into plain values, recording each path's line."""
    budget.take(node, path, depth)
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        # YAML merge keys (<<: *anchor) bring inherited pairs first; own keys override them.
        num_own = sum(1 for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge")
        loader.flatten_mapping(node)
        num_inherited = len(node.value) - num_own
        result: dict[Any, Any] = {}
        own: set[Any] = set()
        for index, (key_node, value_node) in enumerate(node.value):
            if not isinstance(key_node, yaml.ScalarNode):
                raise _TooLarge(
                    path, key_node.start_mark.line + 1,
                    "a mapping key must be a plain value, not a list or a mapping",
                    "write keys as names or numbers",
                )
            key = loader.construct_object(key_node, deep=True)
            sub = _join(path, str(key))
            if index >= num_inherited:
                if key in own:
                    raise _DuplicateKey(sub, key_node.start_mark.line + 1, lines.get(sub))
                own.add(key)
            lines[sub] = key_node.start_mark.line + 1
            result[key] = _plain(value_node, sub, lines, loader, budget, depth + 1)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [
            _plain(v, _join(path, i), lines, loader, budget, depth + 1)
            for i, v in enumerate(node.value)
        ]
    return loader.construct_object(node, deep=True)


def parse_yaml(text: str, source: str, error: type[PlacerError]) -> YamlDoc:
    """Parse YAML text into a :class:`YamlDoc`; syntax errors and documents past the
    limits (docs/limits.md) become ``error``."""
    lines: dict[str, int] = {}
    loader: yaml.SafeLoader | None = None
    try:
        loader = yaml.SafeLoader(text)  # refuses control characters at once
        node = loader.get_single_node()
        data = None if node is None else _plain(node, "", lines, loader, _Budget())
    except _DuplicateKey as e:
        first = f" (first given on line {e.first_line})" if e.first_line else ""
        raise error(
            f"duplicate key {e.path}{first}", where=f"{source}:{e.line}: {e.path}",
            hint="keep one of the two (YAML takes each key once)"
        ) from None
    except _TooLarge as e:
        path = e.path if len(e.path) <= 60 else e.path[:57] + "..."
        where = f"{source}:{e.line}: {path}" if path else f"{source}:{e.line}"
        raise error(e.message, where=where, hint=e.hint) from None
    except RecursionError:
        raise error(
            f"the document nests deeper than {constants.MAX_NESTING} levels",
            where=source, hint="flatten the document (docs/limits.md)",
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(e, "problem", None) or str(e)
        raise error(f"not valid YAML: {problem}", where=where,
                    hint="check the indentation and brackets at this line") from None
    finally:
        if loader is not None:
            loader.dispose()
    _check_ints(data, source, error, lines, "")
    return YamlDoc(data=data, source=source, error=error, lines=lines)


def _check_ints(
    value: Any, source: str, error: type[PlacerError], lines: dict[str, int], path: str
) -> None:
    """Refuse integers beyond int64 anywhere in a parsed document."""
    stack = [(value, path)]
    while stack:
        v, p = stack.pop()
        if isinstance(v, dict):
            stack.extend((x, _join(p, str(k))) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, _join(p, i)) for i, x in enumerate(v))
        elif isinstance(v, int) and not isinstance(v, bool) and abs(v) > INT64_MAX:
            line = lines.get(p)
            loc = f"{source}:{line}" if line is not None else source
            raise error(
                f"the integer {_short(v)} is beyond the 64-bit range",
                where=f"{loc}: {p}" if p else loc,
                hint="check the figure; placer's integers are 64-bit",
            )


def _brief(value: Any) -> str:
    """``repr`` of a value for a message, cut at 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _short(v: int) -> str:
    """An integer for a message: long ones cut to their first digits and digit count."""
    text = str(v) if abs(v) < 10**30 else f"{str(v)[:12]}... ({len(str(abs(v)))} digits)"
    return text


def read_document(path: Path, error: type[PlacerError], *, what: str = "file") -> bytes:
    """The bytes of a file read whole, at most ``constants.MAX_DOCUMENT_BYTES``.

    Missing, unreadable (a folder, a link loop) or too large (``/dev/zero``) files
    become ``error`` naming ``path``; ``what`` names the file in hints.
    """
    with reading(path, error, what), open(path, "rb") as f:
        data = f.read(constants.MAX_DOCUMENT_BYTES + 1)
    if len(data) > constants.MAX_DOCUMENT_BYTES:
        raise error(
            f"the file is larger than {constants.MAX_DOCUMENT_BYTES >> 20} MiB, the most"
            f" placer reads of a {what}",
            where=str(path), hint="is this the right file? (limits: docs/limits.md)",
        )
    return data


def decode_text(data: bytes, where: str, error: type[PlacerError]) -> str:
    """UTF-8 text of ``data`` (a leading byte-order mark dropped); a clear error otherwise."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise error(
            f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})",
            where=f"{where}:{line}",
            hint="save the file as UTF-8",
        ) from None


class _DuplicateJsonKey(Exception):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateJsonKey(key)
        result[key] = value
    return result


def load_json(
    data: bytes | str, where: str, error: type[PlacerError], *,
    hint: str = "check the JSON syntax at this place", unique_keys: bool = False,
) -> Any:
    """Parse a JSON document with placer's limits: UTF-8, nesting at most
    ``constants.MAX_NESTING`` levels, integers within int64, no NaN or Infinity.
    ``hint`` goes with syntax errors.  ``unique_keys``: an object that gives a key
    twice is an error (JSON readers silently keep the last)."""
    text = decode_text(data, where, error) if isinstance(data, bytes) else data
    depth = _json_depth(text)
    if depth > constants.MAX_NESTING:
        raise error(
            f"the JSON nests deeper than {constants.MAX_NESTING} levels",
            where=where, hint="is this the right file? (limits: docs/limits.md)",
        )

    constants_seen: list[_NotANumber] = []

    def constant(name: str) -> _NotANumber:
        constants_seen.append(_NotANumber(name))
        return constants_seen[-1]

    try:
        doc = json.loads(text, parse_constant=constant,
                         object_pairs_hook=_unique_pairs if unique_keys else None)
    except _DuplicateJsonKey as e:
        raise error(
            f"duplicate key {_brief(e.key)} in one object", where=where,
            hint="keep one of the two (other JSON readers silently take the last)",
        ) from None
    except json.JSONDecodeError as e:
        raise error(
            f"invalid JSON: {e.msg} (column {e.colno})", where=f"{where}:{e.lineno}", hint=hint,
        ) from None
    except (ValueError, RecursionError) as e:  # 4300+ digit integers
        raise error(
            f"invalid JSON: {e}", where=where, hint="numbers must be finite JSON numbers",
        ) from None
    if constants_seen:
        _check_constants(doc, text, where, error)
    _check_ints(doc, where, error, {}, "")
    return doc


class _NotANumber:
    """Where a JSON document says ``NaN``, ``Infinity`` or ``-Infinity`` (Python's reader
    takes them; JSON has no such numbers): found and reported by :func:`_check_constants`."""

    def __init__(self, name: str):
        self.name = name


def _check_constants(doc: Any, text: str, where: str, error: type[PlacerError]) -> None:
    """Refuse the first NaN or infinity of a parsed document, naming its line and path."""
    stack: list[tuple[Any, str]] = [(doc, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, _NotANumber):
            line = _constant_line(text, value.name)
            place = f"{where}:{line}" if line else where
            raise error(
                f"invalid JSON: {value.name} is not a JSON number",
                where=f"{place}: {path}" if path else place,
                hint="numbers must be finite JSON numbers: write the figure, or leave the"
                " entry out",
            )
        if isinstance(value, dict):  # reversed: the first in the text is checked first
            stack.extend((v, _join(path, str(k))) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((v, _join(path, i)) for i, v in reversed(list(enumerate(value))))


def _constant_line(text: str, name: str) -> int | None:
    """The line of the first ``name`` (``NaN``, ``Infinity``) outside strings, 1-based."""
    for i, ch in _outside_strings(text):
        if ch == name[0] and text.startswith(name, i):
            return text.count("\n", 0, i) + 1
    return None


def _json_depth(text: str) -> int:
    """Deepest nesting of brackets outside strings (an upper bound is enough)."""
    if text.count("[") + text.count("{") <= constants.MAX_NESTING:
        return 0
    depth = best = 0
    for _, ch in _outside_strings(text):
        if ch in "[{":
            depth += 1
            if depth > best:
                best = depth
                if best > constants.MAX_NESTING:
                    return best
        elif ch in "]}":
            depth -= 1
    return best


def _outside_strings(text: str) -> Iterator[tuple[int, str]]:
    """``(index, character)`` of each character of JSON ``text`` outside its strings
    (quotes and escapes read as JSON reads them)."""
    in_string = escaped = False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        else:
            yield i, ch


def read_yaml(path: Path, error: type[PlacerError]) -> YamlDoc:
    """Read and parse a YAML file; a missing, unreadable, too large or non-UTF-8 file
    becomes ``error``."""
    text = decode_text(read_document(path, error, what="YAML file"), str(path), error)
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
            raise doc.fail(
                path, f"expected a mapping for {what}, got {_type_name(value)}",
                hint="write it as 'key: value' lines (or {key: value})",
            )
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
                hint = (f"found '{typos[0]}': did you mean '{key}'?" if typos
                        else f"add '{key}: ...' at this place")
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
            raise self.fail(
                key, f"{key} must be a number, got {_type_name(value)} {_brief(value)}",
                hint=f"write {key}: followed by a number",
            )
        if not math.isfinite(value):
            raise self.fail(
                key, f"{key} must be finite, got {value}", hint="give a finite number"
            )
        if strict and value <= minimum:
            word = "positive" if minimum == 0 else f"greater than {minimum:g}"
            hint = zero_hint if value == 0 and zero_hint else f"give {key} a {word} value"
            raise self.fail(key, f"{key} must be {word}, got {value:g}", hint)
        if not strict and value < minimum:
            word = "zero or more" if minimum == 0 else f"at least {minimum:g}"
            raise self.fail(
                key, f"{key} must be {word}, got {value:g}",
                hint=f"give a number of at least {minimum:g}",
            )
        return float(value)

    def integer(
        self, key: str, default: Any = _MISSING, *, minimum: int = 1, maximum: int | None = None
    ) -> int:
        """An integer in ``[minimum, maximum]``; ``maximum`` is one of placer's limits
        (docs/limits.md), checked before anything is sized by the value."""
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value  # type: ignore[no-any-return]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(
                key, f"{key} must be an integer, got {_type_name(value)} {_brief(value)}",
                hint=f"write a whole number, e.g. {key}: {max(minimum, 1)}",
            )
        if value < minimum:
            raise self.fail(key, f"{key} must be at least {minimum}, got {value}",
                            hint=f"give {key} a whole number of at least {minimum}")
        if maximum is not None and value > maximum:
            raise self.fail(
                key, f"{key} {_short(value)} is more than placer handles ({maximum:,})",
                hint="check the figure (limits: docs/limits.md)",
            )
        return int(value)

    def string(
        self, key: str, default: Any = _MISSING, *, choices: tuple[str, ...] | None = None
    ) -> str:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value  # type: ignore[no-any-return]
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise self.fail(
                key, f"{key} must be a string, got {_type_name(value)}",
                hint=f"write {key}: followed by a name",
            )
        text = str(value)
        if not text.strip():
            raise self.fail(key, f"{key} must not be empty", hint=f"give {key} a value")
        if choices is not None and text not in choices:
            raise self.fail(
                key, f"unknown {key} '{text}'", hint=f"expected one of: {', '.join(choices)}"
            )
        return text

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self.fail(
                key, f"{key} must be true or false, got {_brief(value)}",
                hint=f"write {key}: true or {key}: false",
            )
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
            raise self.fail(
                key, f"{key} must be a list, got {_type_name(value)}",
                hint=f"write {key} as lines starting with '- ' (or [a, b])",
            )
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
