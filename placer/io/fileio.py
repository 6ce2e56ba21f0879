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

Faults.  A full disk or an I/O error while an output is written is an
:class:`OutputError` that names the file and says why ("the disk is full"); the target
keeps its previous content and the temporary file is removed.  The data reaches the disk
(``fsync``) before the rename, so a crash of the machine leaves the old file or the new
one.  Two runs writing one output at once each write their own temporary file: the
output is one run's whole file, and a reader opening it meanwhile reads the old file or
the new one.  A run killed by SIGKILL cannot remove its temporary file: temporary files
are named ``.NAME.placer-tmp-HOST-PID-XXXXXXXX`` beside the output, and the next write
into that folder removes those of this host older than its own start whose process is
gone (:func:`remove_leftovers`).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from pathlib import Path

from placer.errors import PlacerError, UsageError


class _Batch:
    """What the innermost :func:`all_or_nothing` block holds back: ``(temporary, target)``
    renames, and the folders its writes created (removed again if the block fails)."""

    def __init__(self) -> None:
        self.renames: list[tuple[Path, Path]] = []
        self.folders: list[Path] = []


_PENDING: ContextVar[_Batch | None] = ContextVar("_PENDING", default=None)

#: What marks placer's temporary files: ``.NAME`` + this + ``HOST-PID-XXXXXXXX``.
TMP_MARK = ".placer-tmp-"
#: This host in temporary names: letters, digits and ``_`` of its first label, 24 at most.
_HOST = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname().split(".")[0])[:24] or "host"
_LEFTOVER = re.compile(r"^\..+" + re.escape(TMP_MARK) + r"(?P<host>[A-Za-z0-9_]+)-(?P<pid>\d+)-")
#: When this process began writing (leftovers older than this are not a live run's).
_STARTED = time.time()
#: Folders this process has already cleared of leftovers.
_CLEARED: set[Path] = set()
#: OS errors of writing (not of the code that writes): the disk, the quota, the device.
WRITE_ERRORS = {errno.ENOSPC: "the disk is full (no space left on device)",
                errno.EDQUOT: "the disk quota is exceeded",
                errno.EFBIG: "the file is too large for the file system",
                errno.EIO: "an I/O error of the device",
                errno.EROFS: "the file system is read-only"}


class OutputError(PlacerError):
    """An output cannot be written (the disk is full, an I/O error): exit code 1, nothing
    was written."""


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
    batch = _Batch()
    token = _PENDING.set(batch)
    try:
        yield
    except BaseException:
        for tmp, _ in batch.renames:
            tmp.unlink(missing_ok=True)
        _remove_folders(batch.folders)
        raise
    finally:
        _PENDING.reset(token)
    for i, (tmp, target) in enumerate(batch.renames):
        try:
            _commit(tmp, target)
        except BaseException:
            for later, _ in batch.renames[i + 1 :]:
                later.unlink(missing_ok=True)
            raise


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; put it at ``path`` on success.

    A crash or an exception leaves ``path`` untouched: outputs are never half-written.
    The file gets the mode a plain ``open(path, "w")`` would give (``0666 & ~umask``),
    not ``mkstemp``'s private 0600, so a serving engine running as another user can
    read it.  Inside :func:`all_or_nothing` the file lands when the block ends.  A full
    disk or an I/O error while writing is an :class:`OutputError` naming ``path``.
    """
    target = check_output_path(path)
    special = is_stream(target)
    folder = Path(tempfile.gettempdir()) if special else target.parent
    batch = _PENDING.get()
    created = [f for f in (folder, *folder.parents) if not f.exists()][::-1]
    if batch is not None:
        batch.folders.extend(created)
    landed = False
    try:
        with _writing(target, None):
            folder.mkdir(parents=True, exist_ok=True)
            remove_leftovers(folder)
            fd, tmp = tempfile.mkstemp(
                prefix=f".{target.name}{TMP_MARK}{_HOST}-{os.getpid()}-", dir=folder)
            os.close(fd)
        tmp_path = Path(tmp)
        try:
            with _writing(target, tmp_path):
                yield tmp_path
                os.chmod(tmp_path, 0o666 & ~_umask())
                _sync(tmp_path)
            if batch is not None:
                batch.renames.append((tmp_path, target))
            else:
                _commit(tmp_path, target)
            landed = True
        finally:
            if not landed:
                tmp_path.unlink(missing_ok=True)
    finally:
        if not landed and batch is None:
            _remove_folders(created)


@contextmanager
def _writing(target: Path, tmp: Path | None) -> Iterator[None]:
    """OS errors of writing ``target`` (through ``tmp``) inside the block as OutputError;
    other errors of the code in the block pass unchanged."""
    try:
        yield
    except OSError as e:
        if e.errno not in WRITE_ERRORS and (tmp is None or e.filename not in (tmp, str(tmp))):
            raise
        why = WRITE_ERRORS.get(e.errno or 0, e.strerror or str(e))
        where = target.parent if str(target.parent) not in ("", ".") else Path.cwd()
        hint = ("free space on the disk that holds " + str(where) + ", or write elsewhere"
                if e.errno in (errno.ENOSPC, errno.EDQUOT) else
                "check the disk and the folder, or write elsewhere")
        raise OutputError(f"cannot write the file: {why}; nothing was written",
                          where=str(target),
                          hint=hint + " (an earlier version of the file is unchanged)") from None


def _remove_folders(folders: list[Path]) -> None:
    """Remove the folders a failed write created, deepest first, where still empty."""
    for folder in reversed(folders):
        with suppress(OSError):
            folder.rmdir()


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def _sync(path: Path) -> None:
    """Flush ``path``'s data to the disk (a crash after the rename finds it whole)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _commit(tmp: Path, target: Path) -> None:
    """Put the finished ``tmp`` at ``target``: renamed over a regular file (or nothing),
    copied into a device or FIFO."""
    try:
        with _writing(target, tmp):
            if is_stream(target):
                with open(tmp, "rb") as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
            else:
                os.replace(tmp, target)
                _sync_folder(target.parent)
    finally:
        tmp.unlink(missing_ok=True)


def _sync_folder(folder: Path) -> None:
    """Flush a folder's entries (the rename) to the disk, where the system allows it."""
    with suppress(OSError):
        fd = os.open(folder if str(folder) else ".", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove_leftovers(folder: Path) -> list[Path]:
    """Remove the temporary files placer runs killed before they could (SIGKILL, a crash)
    left in ``folder``: those of this host, older than this process's start, whose
    process is gone.  Once per folder and process; returns what was removed."""
    folder = Path(folder)
    if folder in _CLEARED:
        return []
    _CLEARED.add(folder)
    removed = []
    try:
        entries = [e for e in os.scandir(folder) if TMP_MARK in e.name]
    except OSError:
        return []
    for entry in entries:
        found = _LEFTOVER.match(entry.name)
        if found is None or found["host"] != _HOST or _alive(int(found["pid"])):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_mtime >= _STARTED:
                continue
            os.unlink(entry.path)
        except OSError:
            continue
        removed.append(Path(entry.path))
    return removed


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (ours counts; unsure counts as yes)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process, or the system will not say
        return True
    return True


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
