"""Shared CLI plumbing: consoles, error rendering, JSON output, atomic writes.

``atomic_path`` and ``write_text_atomic`` live in :mod:`placer.fileio` (the library
writes files too) and are re-exported here.
"""

from __future__ import annotations

import functools
import json
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import typer
from rich.console import Console

from placer.errors import PlacerError, PlacerWarning, UsageError
from placer.fileio import atomic_path, write_text_atomic
from placer.stats import RoutingData

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


# -- reading routing data, shared by every command that takes a TRACE ----------------------


def top_k_option() -> Any:
    """``--top-k``: for inputs that do not record it (SGLang stat dumps, bare load files)."""
    return typer.Option(
        None, "--top-k", min=1,
        help="Experts each token selects per layer, for inputs that do not record it"
        " (default: the model's, else the file's).",
    )


def num_experts_option() -> Any:
    """``--num-experts``: declared expert count, checked against the data."""
    return typer.Option(
        None, "--num-experts", min=1,
        help="Experts per layer, checked against the data (default: the model's, else inferred).",
    )


def read_trace(
    paths: Sequence[Path | str],
    trace_format: str | None = None,
    *,
    model: Any = None,
    top_k: int | None = None,
    num_experts: int | None = None,
    window_tokens: int | None = None,
    keep_tokens: bool = False,
) -> RoutingData:
    """Read the TRACE argument(s) of a command into RoutingData.

    ``top_k`` comes from ``--top-k`` when given, else from the model (``ModelSpec``)
    when one is named, so inputs that do not record it (SGLang ``stat`` dumps, aggregated
    loads without ``top_k``) read without extra flags, and a trace that contradicts the
    model is an error naming both figures.  ``num_experts`` is only what ``--num-experts``
    declares: planning checks the trace's experts against the model with its own message.
    """
    from placer.traces import read_routing

    for option, given, attr in (("--top-k", top_k, "top_k"),
                                ("--num-experts", num_experts, "num_experts")):
        declared = getattr(model, attr, None)
        if given is not None and declared is not None and given != declared:
            raise UsageError(
                f"{option} {given} contradicts the model {model.name} ({attr} = {declared})",
                where=option, hint=f"drop {option}, or name the model the trace came from",
            )
    if model is not None and top_k is None:
        top_k = model.top_k
    source: Any = [str(p) for p in paths] if len(paths) > 1 else paths[0]
    return read_routing(
        source, trace_format, window_tokens=window_tokens, keep_tokens=keep_tokens,
        top_k=top_k, num_experts=num_experts,
    )
