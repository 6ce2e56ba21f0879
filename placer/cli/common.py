"""Shared CLI plumbing: consoles, error rendering, JSON output, atomic writes.

``atomic_path`` and ``write_text_atomic`` live in :mod:`placer.io.fileio` (the library
writes files too) and are re-exported here.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import math
import os
import re
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import typer
from rich.console import Console

from placer.errors import PlacerError, PlacerWarning, UsageError
from placer.io.fileio import atomic_path, write_text_atomic
from placer.stats import RoutingData

if TYPE_CHECKING:
    from placer.model import ModelSpec
    from placer.traces import TokenSample

#: Results go to stdout; messages, warnings and progress to stderr.
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)

__all__ = [
    "atomic_path",
    "configured_options",
    "err",
    "fail",
    "handle_errors",
    "out",
    "print_json",
    "to_jsonable",
    "write_text_atomic",
]

F = TypeVar("F", bound=Callable[..., Any])


#: Options of the running command whose value came from a ``PLACER_*`` variable or the
#: config file, and from where (``{"--engine": "PLACER_ENGINE=sglang"}``); set by
#: :class:`placer.cli.command.PlacerCommand` so that an error about them says so.
configured_options: ContextVar[dict[str, str] | None] = ContextVar("configured_options",
                                                                  default=None)


def fail(error: PlacerError) -> None:
    """Print ``error: ...`` / ``hint: ...`` on stderr and exit with the error's code.

    Parameters the library names are shown as their flags (:mod:`placer.cli.flags`).
    When the error names an option whose value came from the environment or the config
    file, a second hint says so (the user did not type it)."""
    from placer.cli.flags import for_command_line

    error = for_command_line(error)
    if not error.hint and isinstance(error, UsageError):
        error.hint = _help_hint(error.where)
    sys.stderr.write(f"error: {error}\n")
    if error.hint:
        sys.stderr.write(f"hint: {error.hint}\n")
    origin = (configured_options.get() or {}).get(error.where or "")
    if origin is not None:
        sys.stderr.write(f"hint: {error.where} was not on the command line: it came from"
                         f" {origin} (`placer config` shows every default)\n")
    raise typer.Exit(error.exit_code)


def _help_hint(where: str | None) -> str:
    """The hint of a usage error that came without one: the running command's help, which
    says what the option (``where``) takes."""
    module = sys.modules[typer.BadParameter.__module__].__name__.rsplit(".", 1)[0]
    ctx = importlib.import_module(f"{module}.globals").get_current_context(silent=True)
    path = getattr(ctx, "command_path", None) or "placer"
    said = f"what {where.split()[0]} takes" if where and where.startswith("-") else "the usage"
    return f"`{path} -h` says {said}, with examples"


#: Exit code of a run stopped by Ctrl-C, SIGTERM or SIGHUP (128 + SIGINT, as shells report
#: it).
EXIT_INTERRUPTED = 130
#: Exit code of an unexpected exception: a bug in placer, never the user's data.
EXIT_INTERNAL = 3
#: Exit code when the reader of stdout went away (128 + SIGPIPE, as shells report it).
EXIT_BROKEN_PIPE = 141


#: The warnings each running command has recorded so far (innermost last).
_RECORDING: list[list[warnings.WarningMessage]] = []


def said_warnings() -> list[str]:
    """placer's warnings the running command has recorded so far, as its ``warning:`` lines
    will say them (once each, alike ones gathered: :func:`warning_lines`): for pages that
    carry what the terminal says."""
    recorded = _RECORDING[-1] if _RECORDING else []
    return warning_lines([w for w in recorded if issubclass(w.category, PlacerWarning)])


def handle_errors(fn: F) -> F:
    """Decorator for commands: PlacerError -> clean message and exit code; warnings ->
    stderr (placer's as ``warning:`` lines, others as Python shows them, once each, after
    the command's output); Ctrl-C / SIGTERM / SIGHUP -> ``interrupted`` and exit 130
    (outputs not written: :mod:`placer.io.fileio`; worker processes stopped); any other
    exception -> ``error: internal error`` and exit 3.

    A command that fails on placer's error (data or usage) says only the error and its
    hint: the data's warnings (a synthetic trace, never-routed experts) would bury it, and
    the run that works says them."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        previous = _signals_as_interrupt()
        caught: list[warnings.WarningMessage] = []
        try:
            with warnings.catch_warnings(record=True) as recorded:
                caught = recorded
                _RECORDING.append(recorded)
                warnings.simplefilter("always", PlacerWarning)
                try:
                    return fn(*args, **kwargs)
                except PlacerError as e:
                    caught[:] = []  # the error ends the output alone; the run that works
                    fail(e)  # says the data's warnings
                except KeyboardInterrupt:
                    _say("interrupted: nothing was written\n")  # the terminal may be gone
                    raise typer.Exit(EXIT_INTERRUPTED) from None
                except BrokenPipeError:  # `placer ... | head`: the reader left; stop quietly
                    devnull = os.open(os.devnull, os.O_WRONLY)
                    os.dup2(devnull, sys.stdout.fileno())
                    raise typer.Exit(EXIT_BROKEN_PIPE) from None
                except (typer.Exit, typer.Abort, SystemExit):
                    raise
                except Exception as e:  # a bug: say so, never a traceback
                    shown, caught[:] = list(caught), []
                    show_warnings(shown)
                    sys.stderr.write(
                        f"error: internal error: {type(e).__name__}: {e}\n"
                        "hint: this is a bug in placer, not in your input; please report it"
                        " with the command line (PLACER_DEBUG=1 shows the traceback)\n")
                    if os.environ.get("PLACER_DEBUG"):
                        raise
                    raise typer.Exit(EXIT_INTERNAL) from None
        finally:
            if _RECORDING:
                _RECORDING.pop()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            show_warnings(list(caught))  # after the recording context: not re-recorded
        return None

    return wrapper  # type: ignore[return-value]


def _flag_texts(obj: Any) -> Any:
    """Every string of a JSON-able ``obj`` through :func:`as_flags`."""
    if isinstance(obj, str):
        return as_flags(obj) if "`" in obj else obj
    if isinstance(obj, dict):
        return {k: _flag_texts(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_flag_texts(v) for v in obj]
    return obj


def as_flags(text: str) -> str:
    """``text`` with the parameters the library names in backticks as their flags."""
    from placer.cli.flags import as_flags as convert

    return convert(text)


def show_warnings(caught: Sequence[warnings.WarningMessage]) -> None:
    """Write recorded warnings on stderr as ``warning: ...`` lines, once each
    (:func:`warning_lines`), after what the command wrote on stdout (flushed first, so a
    terminal or a file taking both streams shows the warnings last)."""
    lines = warning_lines(caught)
    if lines:
        with contextlib.suppress(OSError, ValueError):  # the reader of stdout went away
            sys.stdout.flush()
    for line in lines:
        sys.stderr.write(f"warning: {line}\n")


#: What a warning may be about, at its start: a file (``plan.json: GPU 6 holds ...``) or a
#: layer (``layer 3: integer loads ...``).
_SUBJECT = re.compile(r"^(?:layer (?P<layer>\d+)|(?P<file>[^\s:]*[./][^\s:]*)): ")
_FIGURE = re.compile(r"\d+")


def warning_lines(caught: Sequence[warnings.WarningMessage]) -> list[str]:
    """The texts of recorded warnings, each said once: placer's with the library's
    parameters as flags; others with their category and source line.

    A warning said again for another file, layer or figure is gathered with the first
    one: placer's warnings of one category whose texts differ only in their subject (a
    leading ``FILE:`` or ``layer N:``) and their figures make one line, the first text,
    with the others counted (``(and the same for b.json)``, ``(and 5 more like it)``)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for w in caught:
        if issubclass(w.category, PlacerWarning):
            text = as_flags(str(w.message))
            key = (w.category.__name__, _FIGURE.sub("#", _SUBJECT.sub("", text)))
        else:  # said where it was raised, the first time
            text = f"{w.category.__name__}: {w.message}"
            key, text = ("", text), f"{text} ({w.filename}:{w.lineno})"
        texts = groups.setdefault(key, [])
        if text not in texts and not (key[0] == "" and texts):
            texts.append(text)
    return [texts[0] + _others(texts) for texts in groups.values()]


def _others(texts: list[str]) -> str:
    """What follows the first of alike warnings: the other subjects, or their count."""
    if len(texts) == 1:
        return ""
    found = [_SUBJECT.match(t) for t in texts]
    if all(found):
        subjects = [m for m in found if m is not None][1:]
        if all(m.group("layer") for m in subjects):
            names = [m.group("layer") for m in subjects]
            what = "layer" if len(names) == 1 else "layers"
        else:
            names = [m.group("file") or f"layer {m.group('layer')}" for m in subjects]
            what = ""
        shown = names if len(names) <= 4 else [*names[:3], f"{len(names) - 3} more"]
        listed = shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]
        return f" (and the same for {what + ' ' if what else ''}{listed})"
    return f" (and {len(texts) - 1} more like it)"


#: Signals that stop a command as Ctrl-C does: a polite kill, and the terminal lost.
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP")
                     if hasattr(signal, name))


def _signals_as_interrupt() -> dict[int, Any]:
    """Make SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread, so outputs are
    cleaned up and worker processes stopped as on Ctrl-C; returns the previous handlers
    (none off the main thread).  A signal the process was started ignoring (``nohup``
    ignores SIGHUP) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = {}
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, stop)
    return previous


def _say(text: str) -> None:
    """Write ``text`` on stderr if it is still there (a hung-up terminal is not)."""
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]],
          right: Sequence[int] | None = None) -> str:
    """A plain-text table: columns two spaces apart; the columns ``right`` right-aligned
    (by default those whose every value is a number); None shown as ``-``."""
    cells = [[str(h) for h in headers]] + [[cell(v) for v in row] for row in rows]
    if right is None:
        right = [i for i in range(len(headers)) if all(
            isinstance(row[i], int | float) and not isinstance(row[i], bool) for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.rjust(w) if i in right else c.ljust(w)
                  for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
        for r in cells
    )


def cell(value: Any) -> str:
    """A value as a table cell: ``-`` for None, ``inf``, floats as ``%g``."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:g}"
    return str(value)


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
    """Write ``obj`` as indented JSON on stdout; the library's `parameter` names in its
    texts are shown as the flags that set them, as everywhere on the command line."""
    sys.stdout.write(json.dumps(_flag_texts(to_jsonable(obj)), indent=2) + "\n")
    sys.stdout.flush()


# -- reading routing data, shared by every command that takes a TRACE ----------------------


def read_trace(
    paths: Sequence[Path | str],
    trace_format: str | None = None,
    *,
    model: ModelSpec | None = None,
    top_k: int | None = None,
    num_experts: int | None = None,
    window_tokens: int | None = None,
    keep_tokens: bool = False,
    keep_warmup: bool = False,
    allow_model_mismatch: bool = False,
    **options: Any,
) -> RoutingData:
    """Read the TRACE argument(s) of a command into RoutingData.

    ``top_k`` comes from ``--top-k`` when given, else from the model (``ModelSpec``)
    when one is named, so inputs that do not record it (SGLang ``stat`` dumps, aggregated
    loads without ``top_k``) read without extra flags, and a trace that contradicts the
    model is an error naming both figures.  ``num_experts`` likewise: ``--num-experts``,
    else the model's, so that an expert id the model does not have is an error naming
    the file and line (or array index) where it is, and a trace whose ids stop short of
    the model's last expert still has the model's experts.  With a model, the trace
    must have been recorded on it (:func:`placer.planning.build.check_trace_model`;
    ``allow_model_mismatch`` turns a declared name that differs into a warning).
    ``options``: more of :func:`placer.traces.read_routing`'s (``sample``, ``affinity``,
    ``pair_tokens``).
    """
    from placer.planning.build import check_trace_model
    from placer.traces import read_routing

    for option, given, attr in (("--top-k", top_k, "top_k"),
                                ("--num-experts", num_experts, "num_experts")):
        if model is None:
            break
        declared = getattr(model, attr)
        if given is not None and given != declared:
            raise UsageError(
                f"{option} {given} contradicts the model {model.name} ({attr} = {declared})",
                where=option, hint=f"drop {option}, or name the model the trace came from",
            )
    if model is not None and top_k is None:
        top_k = model.top_k
    if model is not None and num_experts is None:
        num_experts = model.num_experts
    source: Any = [str(p) for p in paths] if len(paths) > 1 else paths[0]
    routing = read_routing(
        source, trace_format, window_tokens=window_tokens, keep_tokens=keep_tokens,
        top_k=top_k, num_experts=num_experts, keep_warmup=keep_warmup, **options,
    )
    if model is not None:
        check_trace_model(routing.stats, model, allow_mismatch=allow_model_mismatch)
    return routing


def judge_sample_for(batch_tokens: int, seed: int) -> TokenSample:
    """The per-token routing to keep for a judge's replay
    (:class:`placer.traces.TokenSample`), the same for every command that judges (plan,
    evaluate, report, compare): the whole trace up to
    ``placer.summary.JUDGE_WHOLE_SELECTIONS`` selections, else
    ``JUDGE_BATCHES_PER_WINDOW`` whole batches of ``batch_tokens`` per window, drawn
    with ``seed``: memory stays bounded whatever the trace's length."""
    from placer.summary import JUDGE_BATCHES_PER_WINDOW, JUDGE_WHOLE_SELECTIONS
    from placer.traces import TokenSample

    return TokenSample(batch_tokens, JUDGE_BATCHES_PER_WINDOW, seed,
                       whole_selections=JUDGE_WHOLE_SELECTIONS)


def check_trace_header(paths: Sequence[Path], trace_format: str | None, model: ModelSpec,
                       allow_model_mismatch: bool = False) -> None:
    """For a command that streams its trace (``replay``): the model an NPZ trace declares
    checked against ``model`` from its header alone, before any work
    (:func:`placer.planning.build.check_declared_model`).  Other inputs are checked
    where they are read."""
    from placer.planning.build import check_declared_model
    from placer.traces import detect_format, read_npz_header

    if len(paths) != 1 or not Path(paths[0]).is_file() or trace_format not in (None, "npz"):
        return
    if trace_format is None and detect_format(Path(paths[0])).name != "npz":
        return
    try:
        header = read_npz_header(paths[0])
    except PlacerError:
        return  # not per-token routing, or damaged: the reader says so, with its figures
    if header.get("layer_ids") is None:
        return
    shape = header["shape"]
    check_declared_model(
        header.get("model"), model,
        num_experts=int(header.get("num_experts") or model.num_experts),
        top_k=int(header.get("top_k") or (shape[-1] if len(shape) > 1 else model.top_k)),
        layer_ids=np.asarray(header["layer_ids"]), where=str(paths[0]),
        allow_mismatch=allow_model_mismatch)


def write_pictures(pictures: tuple[tuple[str, bytes], ...], folder: Path,
                   quiet: bool = False) -> None:
    """Each picture as ``folder/<stem>.png`` (:func:`placer.report.files.write_pictures`);
    says so on stderr unless quiet."""
    from placer.report.files import write_pictures as write

    written = write(pictures, folder)
    if not quiet:
        sys.stderr.write(f"wrote {len(written)} PNG file(s) to {folder}\n")


def recorded_by(param: str, key: str) -> Callable[[dict[str, Any]], bool]:
    """The rule "the placement file(s) the command line gives as ``param`` record one
    ``key`` (model or topology) name", under which a configured default of that option
    yields (:func:`placer.cli.command.placer_command`); a file that does not read is the
    command's to report, not the rule's."""
    def rule(params: dict[str, Any]) -> bool:
        from placer.placement.document import read_placement

        given = params.get(param)
        paths = list(given) if isinstance(given, list | tuple) else [given]
        try:
            with warnings.catch_warnings():  # the command reads them again, and says them
                warnings.simplefilter("ignore")
                placements = [read_placement(p) for p in paths if p is not None]
        except PlacerError:
            return False
        return bool(placements) and records(placements, key)
    return rule


def records(placements: list[Any], key: str) -> bool:
    """Whether the placements record one model or topology name (see :func:`recorded_name`)."""
    try:
        recorded_name(placements, key, "")
    except UsageError:
        return False
    return True


def recorded_name(placements: list[Any], key: str, option: str) -> str:
    """The model or topology name the placements record, when they agree; else a
    UsageError naming ``option`` (the flag that gives it)."""
    names = set()
    for pl in placements:
        value = pl.meta.get(key)
        name = value.get("name") if isinstance(value, dict) else value
        if name:
            names.add(str(name))
    if len(names) != 1:
        what = "no" if not names else "different"
        raise UsageError(
            f"the placements record {what} {key} names", where=option,
            hint=f"pass {option} NAME_OR_FILE",
        )
    return names.pop()
