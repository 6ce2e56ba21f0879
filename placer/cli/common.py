"""Shared CLI plumbing: consoles, error rendering, JSON output, atomic writes.

``atomic_path`` and ``write_text_atomic`` live in :mod:`placer.fileio` (the library
writes files too) and are re-exported here.
"""

from __future__ import annotations

import functools
import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import typer
from rich.console import Console

from placer.errors import PlacerError, PlacerWarning
from placer.fileio import atomic_path, write_text_atomic

#: Results go to stdout; messages, warnings and progress to stderr.
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)

__all__ = [
    "atomic_path",
    "err",
    "fail",
    "handle_errors",
    "out",
    "print_json",
    "to_jsonable",
    "write_text_atomic",
]

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
