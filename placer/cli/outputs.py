"""Where the commands write: each output path checked before any work.

A command that plans for a minute must not then fail, or quietly create a folder a typo
named, when it writes: :func:`check_output` refuses, up front, a path that cannot be
written (:func:`placer.io.fileio.check_output_path`) and one whose folder does not exist
(placer creates no folders: not the one ``--png-dir`` names either), with the command
that makes the folder as the hint.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from placer.errors import UsageError
from placer.io.fileio import check_output_path, is_stream


def check_output(path: str | os.PathLike[str], where: str) -> Path:
    """``path`` as a Path once it can be written: its folder exists (``-``, stdout,
    passes).  UsageError naming ``where`` (the option) otherwise."""
    target = check_output_path(path, where=where)
    if not is_stream(target):
        _check_folder(target.parent, where)
    return target


def check_output_folder(path: str | os.PathLike[str], where: str) -> Path:
    """``path``, a folder the command fills (``--png-dir``): it must exist, as the folder
    of any other output must."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{folder} is not a folder", where=where,
                         hint="give a folder, not a file")
    _check_folder(folder, where)
    return folder


def _check_folder(folder: Path, where: str) -> None:
    if str(folder) in ("", ".") or folder.is_dir():
        return
    if folder.exists():
        raise UsageError(f"{folder} is not a folder", where=where,
                         hint="choose an output path whose folders are folders")
    raise UsageError(
        f"folder {folder} does not exist", where=where,
        hint=f"create it first (mkdir -p {shlex.quote(str(folder))}), or write elsewhere:"
        " placer creates no folders, so that a mistyped path fails now, not after the work",
    )
