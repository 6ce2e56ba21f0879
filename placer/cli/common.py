"""Shared CLI plumbing: consoles, error rendering, JSON output, atomic writes."""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import typer
from rich.console import Console

from placer.errors import PlacerError, PlacerWarning

#: Results go to stdout; messages, warnings and progress to stderr.
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)

F = TypeVar("F", bound=Callable[..., Any])


def fail(error: PlacerError) -> None:
    """Print ``error: ...`` / ``hint: ...`` on stderr and exit with the error's code."""
    sys.stderr.write(f"error: {error}\n")
    if error.hint:
        sys.stderr.write(f"hint: {error.hint}\n")
    raise typer.Exit(error.exit_code)


def handle_errors(fn: F) -> F:
    """Decorator for commands: PlacerError -> clean message and exit code; warnings -> stderr."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", PlacerWarning)
            try:
                return fn(*args, **kwargs)
            except PlacerError as e:
                fail(e)
            finally:
                for w in caught:
                    if issubclass(w.category, PlacerWarning):
                        sys.stderr.write(f"warning: {w.message}\n")
                    else:
                        warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        return None

    return wrapper  # type: ignore[return-value]


def to_jsonable(obj: Any) -> Any:
    """Convert numpy scalars/arrays, tuples and dataclass-free containers for json.dumps."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating | float):
        f = float(obj)
        return f if np.isfinite(f) else None
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, Path):
        return str(obj)
    return obj


def print_json(obj: Any) -> None:
    """Write ``obj`` as indented JSON on stdout."""
    sys.stdout.write(json.dumps(to_jsonable(obj), indent=2) + "\n")
    sys.stdout.flush()


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it over ``path`` on success.

    A crash or an exception leaves ``path`` untouched: outputs are never half-written.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
