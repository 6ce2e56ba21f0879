"""Registry of trace formats: adding a format is adding one module that registers itself.

A format is a name, the file-name endings it claims, a ``sniff`` that looks at the
start of a file, and a ``read`` that streams the file into an
:class:`~placer.traces.accumulate.Accumulator`::

    register_format("jsonl", extensions=(".jsonl", ".jsonl.gz"), sniff=_sniff, read=_read)

Detection (:func:`detect_format`): the formats whose extensions end the file name are
tried in registration order and the first whose ``sniff`` accepts the file wins; when no
extension matches, every format's ``sniff`` is tried.  ``format=`` skips detection.

A folder is a format's when its ``sniff`` takes the folder itself (TensorRT-LLM's
statistics), or when the format names the files it reads in a folder (``files``, as an
engine writes them: SGLang's ``expert_distribution_recorder_*.pt``) and the first of
them sniffs as the format: the folder is then read as those files (:func:`folder_files`).
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from placer.errors import Param, TraceError, UsageError
from placer.io.fileio import reading

if TYPE_CHECKING:
    from placer.traces.accumulate import Accumulator

#: Bytes of a file's start handed to ``sniff`` (decompressed for ``.gz``).
SNIFF_BYTES = 1 << 16

SniffFn = Callable[[Path, bytes], bool]
ReadFn = Callable[[Path, "Accumulator"], None]
FilesFn = Callable[[Path], list[Path]]


@dataclass(frozen=True)
class TraceFormat:
    """One registered trace format.

    Attributes
    ----------
    name: what ``format=`` and ``--format`` accept.
    extensions: file-name endings it claims, lower case with the dot (``".jsonl.gz"``).
    sniff: ``sniff(path, head) -> bool``; ``head`` is the file's first bytes
        (decompressed for gzip), empty for a folder (formats that are folders, like
        TensorRT-LLM's statistics, recognise themselves from ``path``).
    read: ``read(path, accumulator)``; streams the file into the accumulator, raising
        :class:`~placer.errors.TraceError` for bad input.
    description: one line for help texts and docs.
    files: ``files(folder)``: the files of this format in ``folder`` that one read takes,
        in reading order (the names an engine gives them); None when a folder of them is
        not an input of this format.
    """

    name: str
    extensions: tuple[str, ...]
    sniff: SniffFn
    read: ReadFn
    description: str = ""
    files: FilesFn | None = None


_FORMATS: dict[str, TraceFormat] = {}


def register_format(
    name: str,
    *,
    extensions: tuple[str, ...] | list[str],
    sniff: SniffFn,
    read: ReadFn,
    description: str = "",
    files: FilesFn | None = None,
) -> TraceFormat:
    """Register a trace format under ``name`` (re-registering a name replaces it)."""
    fmt = TraceFormat(
        name=name,
        extensions=tuple(e.lower() for e in extensions),
        sniff=sniff,
        read=read,
        description=description,
        files=files,
    )
    _FORMATS[name] = fmt
    return fmt


def format_names() -> list[str]:
    """Names of the registered formats, in registration order."""
    return list(_FORMATS)


def get_format(name: str) -> TraceFormat:
    """The format called ``name``; UsageError listing the names when unknown."""
    try:
        return _FORMATS[name]
    except KeyError:
        raise UsageError(
            f"unknown trace format {name!r}",
            where=Param("format"),
            hint=f"formats: {', '.join(_FORMATS)}",
        ) from None


def read_head(path: Path, size: int = SNIFF_BYTES) -> bytes:
    """The first ``size`` bytes of ``path``, decompressed when it is gzip."""
    with reading(path, TraceError, "trace", folder="is a folder, not a trace file",
                 folder_hint="name the trace files in it"), open(path, "rb") as f:
        head = f.read(size)
    if head[:2] == b"\x1f\x8b":
        try:
            with gzip.open(path, "rb") as g:
                return g.read(size)
        except (OSError, EOFError, zlib.error) as e:
            raise TraceError(
                f"cannot read the file ({e})", where=str(path), hint="is the gzip file complete?"
            ) from None
    return head


def detect_format(path: Path) -> TraceFormat:
    """The format of ``path``, from its name's ending and its first bytes (a folder: see
    the module docstring)."""
    if path.is_dir():
        for fmt in _FORMATS.values():
            if fmt.sniff(path, b""):
                return fmt
            found = fmt.files(path) if fmt.files is not None else []
            if found and fmt.sniff(found[0], read_head(found[0])):
                return fmt
        raise TraceError(
            f"is a folder that no trace format recognises ({_contents(path)})",
            where=str(path),
            hint="name the trace files in it, or pass `format`",
        )
    head = read_head(path)
    if not head:
        raise TraceError(
            "the file is empty",
            where=str(path),
            hint="a trace needs at least one routing row (or a load array)",
        )
    name = path.name.lower()
    by_ext = [f for f in _FORMATS.values() if any(name.endswith(e) for e in f.extensions)]
    for fmt in by_ext:
        if fmt.sniff(path, head):
            return fmt
    others = [f for f in _FORMATS.values() if f not in by_ext]
    for fmt in others:
        if fmt.sniff(path, head):
            return fmt
    claimed = ", ".join(f"{f.name} ({' '.join(f.extensions)})" for f in _FORMATS.values())
    raise TraceError(
        "cannot tell the trace format from the name and content",
        where=str(path),
        hint=f"pass `format` one of: {claimed}",
    )


def folder_files(path: Path, fmt: TraceFormat) -> list[Path]:
    """The files a read of ``path`` in format ``fmt`` takes: ``path`` itself, or, for a
    folder of a format that names its files, those files (TraceError when there are
    none)."""
    if not path.is_dir() or fmt.files is None:
        return [path]
    found = fmt.files(path)
    if not found:
        raise TraceError(
            f"is a folder without {fmt.name} files ({_contents(path)})", where=str(path),
            hint="name the trace files in it, or pass another `format`",
        )
    return found


def _contents(folder: Path, shown: int = 3) -> str:
    """What a folder holds, in a few words (for messages)."""
    try:
        names = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
    except OSError:
        return "unreadable"
    if not names:
        return "it is empty"
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return "it holds " + ", ".join(names[:shown]) + more
