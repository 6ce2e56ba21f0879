"""Safe file writing, shared by the library's writers and the CLI.

Outputs are never half-written: data goes to a temporary file beside the target, which
is renamed over it only when writing succeeded.  Only a regular file (or nothing) is
ever replaced: an existing device or FIFO (``-o /dev/stdout``, ``-o /dev/null``) is
written into directly once the data is complete, and a directory, a parent that is a
file or a folder that cannot be written is a clear error before any work.

:func:`all_or_nothing` groups the outputs of one command: inside it, every
:func:`atomic_path` waits for the block to finish, so the outputs land together or, when
anything fails (an exception, Ctrl-C, SIGTERM turned into an exception by the CLI), not
at all and no temporary file stays behind.  :func:`check_not_inputs` refuses an output
that is one of the command's inputs.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from placer.errors import PlacerError, UsageError

#: Pending ``(temporary, target)`` renames of the innermost :func:`all_or_nothing` block.
_PENDING: ContextVar[list[tuple[Path, Path]] | None] = ContextVar("_PENDING", default=None)


def check_output_path(path: str | os.PathLike[str], where: str | None = None) -> Path:
    """UsageError when nothing can be written at ``path`` (checked before the work)."""
    target = Path(path)
    where = where or str(target)
    if target.is_dir():
        raise UsageError(f"{target} is a directory", where=where,
                         hint="give a file name inside it, e.g. " + str(target / "plan.json"))
    parent = target.parent
    for folder in (parent, *parent.parents):
        if folder.exists():
            if not folder.is_dir():
                raise UsageError(f"{folder} is not a directory", where=where,
                                 hint="choose an output path whose folders are folders")
            if is_stream(target):
                break
            if not os.access(folder, os.W_OK | os.X_OK):
                raise UsageError(f"cannot write in {folder} (permission denied)", where=where,
                                 hint="choose a folder you can write in")
            break
    return target


def check_not_inputs(outputs: Iterable[tuple[str, str | os.PathLike[str] | None]],
                     inputs: Iterable[str | os.PathLike[str] | None]) -> None:
    """UsageError when an output (``(option, path)``) is one of ``inputs``."""
    existing = [Path(p) for p in inputs if p is not None and Path(p).exists()]
    for option, out in outputs:
        if out is None:
            continue
        target = Path(out)
        if not target.exists() or is_stream(target):
            continue
        for source in existing:
            try:
                same = target.samefile(source) or (
                    source.is_dir() and target.resolve().is_relative_to(source.resolve()))
            except OSError:
                same = False
            if same:
                raise UsageError(
                    f"{target} is an input of this command; writing it would destroy it",
                    where=option, hint="write the output to another file")


@contextmanager
def reading(
    path: str | os.PathLike[str], error: type[PlacerError], what: str, *,
    folder: str = "is a folder, not a file", folder_hint: str | None = None,
) -> Iterator[None]:
    """Opening or reading input ``path`` inside the block: a missing file, a folder, a
    link loop or any other OS error becomes ``error`` naming the path, with a hint
    (``what`` names the file: "trace", "engine file"; ``folder``, ``folder_hint``: what a
    folder is told)."""
    where = str(path)
    try:
        yield
    except FileNotFoundError:
        raise error("file not found", where=where, hint=f"check the path of the {what}") from None
    except IsADirectoryError:
        raise error(folder, where=where, hint=folder_hint or f"name the {what} itself") from None
    except OSError as e:
        raise error(
            f"cannot read the file ({e.strerror or e})", where=where,
            hint="check that it exists and is readable (and not a link loop)",
        ) from None


@contextmanager
def all_or_nothing() -> Iterator[None]:
    """Hold back every :func:`atomic_path` rename inside the block until it succeeds."""
    pending: list[tuple[Path, Path]] = []
    token = _PENDING.set(pending)
    try:
        yield
    except BaseException:
        for tmp, _ in pending:
            tmp.unlink(missing_ok=True)
        raise
    finally:
        _PENDING.reset(token)
    for tmp, target in pending:
        _commit(tmp, target)


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; put it at ``path`` on success.

    A crash or an exception leaves ``path`` untouched: outputs are never half-written.
    The file gets the mode a plain ``open(path, "w")`` would give (``0666 & ~umask``),
    not ``mkstemp``'s private 0600, so a serving engine running as another user can
    read it.  Inside :func:`all_or_nothing` the file lands when the block ends.
    """
    target = check_output_path(path)
    special = is_stream(target)
    folder = Path(tempfile.gettempdir()) if special else target.parent
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    tmp_path = Path(tmp)
    pending = _PENDING.get()
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~_umask())
        if pending is not None:
            pending.append((tmp_path, target))
            return
        _commit(tmp_path, target)
    finally:
        if (pending is None or (tmp_path, target) not in pending) and tmp_path.exists():
            tmp_path.unlink()


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def _commit(tmp: Path, target: Path) -> None:
    """Put the finished ``tmp`` at ``target``: renamed over a regular file (or nothing),
    copied into a device or FIFO."""
    try:
        if is_stream(target):
            with open(tmp, "rb") as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def is_stream(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` exists and is neither a regular file nor a directory (a device, a
    FIFO, a socket: written into, never replaced)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _umask() -> int:
    """The process umask (reading it requires setting it; restore at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
