"""Atomic file writing, shared by the library's writers and the CLI.

Outputs are never half-written: data goes to a temporary file beside the target,
which is renamed over it only when writing succeeded.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it over ``path`` on success.

    A crash or an exception leaves ``path`` untouched: outputs are never half-written.
    The file gets the mode a plain ``open(path, "w")`` would give (``0666 & ~umask``),
    not ``mkstemp``'s private 0600, so a serving engine running as another user can
    read it.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~_umask())
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def _umask() -> int:
    """The process umask (reading it requires setting it; restore at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
