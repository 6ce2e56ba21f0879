"""How a documented command line runs in a test: in this process, or in a shell.

A ``placer ...`` line (with ``NAME=value`` assignments before it, a ``cd DIR &&`` before
that, globs, and a ``# comment``, a ``> FILE`` or a ``| head -N`` / ``| tail -N`` after
it) runs in this process, through
:data:`placer.cli.main.app` as the installed entry point calls it: no interpreter and
OR-Tools start-up per command (~1.5 s each).  Anything else a page shows (``cat``, ``ls``,
a pipe) runs with bash.  :func:`run` isolates an in-process run the way a fresh process
is isolated: its own working directory, environment, stdout and stderr, and every
``PLACER_*`` variable of the machine removed, so no setting leaks from one run into the
next.

``quick=True`` also cuts each plan's CP-SAT search to the least a layer ever gets
(``MIN_LAYER_SECONDS``) instead of its share of the default 50-second budget: the checks
that use it mask figures, so they need the plan's structure, not its quality.  The
shell form (``in_shell=True``) runs everything as written, with the real budget.
"""

from __future__ import annotations

import contextlib
import glob
import io
import os
import re
import subprocess
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: The directory of the interpreter running the tests: its ``placer`` is the installed one.
BIN = Path(sys.executable).parent

#: Variables every documented command sees (a wide terminal: tables are not wrapped).
ENV = {"COLUMNS": "200", "NO_COLOR": "1"}

_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
#: What only a shell does: pipes, lists, substitutions, here-documents, quotes.
_SHELL_ONLY = re.compile(r"[|;&`$()<'\"\\]")


@dataclass(frozen=True)
class Ran:
    """What a command did: its exit code and what it printed on each stream."""

    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Line:
    """A ``placer`` command line, split: the folder it runs in (relative to the working
    directory), its variables, placer's arguments, the file its stdout goes to, and the
    ``head``/``tail`` and line count it is piped into."""

    folder: str
    env: dict[str, str]
    args: list[str]
    stdout_to: str | None = None
    piped: tuple[str, int] | None = None

    def stdout(self, text: str) -> str:
        """What the line's stdout shows of what placer printed."""
        if self.piped is None:
            return text
        lines = text.splitlines(keepends=True)
        end, count = self.piped
        return "".join(lines[:count] if end == "head" else lines[-count:])


def parse(command: str) -> Line | None:
    """``command`` as a :class:`Line`, or None when it needs a shell (it is not a
    ``placer`` command, or it uses a pipe, a list, quotes or a substitution)."""
    folder = "."
    changed = re.fullmatch(r"cd (\S+) && (.*)", command)
    if changed:
        folder, command = changed.groups()
    command = command.split("#", 1)[0].strip()
    piped = None
    pipe = re.fullmatch(r"(.*?)\s*\|\s*(head|tail) -(\d+)", command)
    if pipe:
        command, piped = pipe[1], (pipe[2], int(pipe[3]))
    words = command.split()
    if _SHELL_ONLY.search(command):
        return None
    stdout_to = None
    if len(words) >= 2 and words[-2] == ">":
        stdout_to, words = words[-1], words[:-2]
    if ">" in words or any(w.startswith(">") for w in words):
        return None
    env = {}
    while words and _ASSIGNMENT.match(words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    if not words or words[0] != "placer":
        return None
    return Line(folder, env, words[1:], stdout_to, piped)


def _expand(args: list[str], cwd: Path) -> list[str]:
    """Globs expanded as bash does (sorted; a pattern that matches nothing stays)."""
    expanded: list[str] = []
    for arg in args:
        found = sorted(glob.glob(arg, root_dir=cwd)) if glob.has_magic(arg) else []
        expanded.extend(found or [arg])
    return expanded


def run(command: str, workdir: Path, *, in_shell: bool = False, quick: bool = False,
        timeout: float = 600) -> Ran:
    """Run ``command`` in ``workdir``: in this process where it can (:func:`parse`),
    else, or with ``in_shell``, with bash and the installed ``placer``."""
    line = None if in_shell else parse(command)
    if line is None:
        return _in_shell(command, workdir, timeout)
    cwd = (workdir / line.folder).resolve()
    ran = in_process(_expand(line.args, cwd), cwd, line.env, quick=quick)
    stdout = line.stdout(ran.stdout)
    if line.stdout_to is not None:
        (cwd / line.stdout_to).write_text(stdout, encoding="utf-8")
        stdout = ""
    return Ran(ran.returncode, stdout, ran.stderr)


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLACER_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **ENV}


def _in_shell(command: str, workdir: Path, timeout: float) -> Ran:
    done = subprocess.run(["bash", "-c", command], cwd=workdir, env=_clean_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)
    return Ran(done.returncode, done.stdout, done.stderr)


def in_process(args: list[str], cwd: Path, env: dict[str, str] | None = None, *,
               quick: bool = False) -> Ran:
    """``placer ARGS`` in this process, in ``cwd`` with ``env`` added to a clean
    environment; an exception that escapes placer is printed as a traceback (exit 1),
    as the interpreter would."""
    import typer.main

    from placer.cli.main import app

    out, err = _stream(), _stream()
    with _isolated(cwd, {**_clean_env(), **(env or {})}), _search_cut(quick), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            typer.main.get_command(app).main(args=args, prog_name="placer")
            code = 0
        except SystemExit as stop:
            code = _exit_code(stop.code, err)
        except Exception:  # what a real process would print before exiting 1
            traceback.print_exc(file=err)
            code = 1
        out.flush()
        err.flush()
    return Ran(code, _text(out), _text(err))


def _stream() -> io.TextIOWrapper:
    """A text stream over bytes (``.buffer`` exists, as on a real stdout)."""
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace",
                            write_through=True)


def _text(stream: io.TextIOWrapper) -> str:
    buffer = stream.buffer
    assert isinstance(buffer, io.BytesIO)
    return buffer.getvalue().decode("utf-8", errors="replace")


def _exit_code(code: object, err: io.TextIOWrapper) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    err.write(f"{code}\n")  # sys.exit("message") prints it and exits 1
    return 1


@contextlib.contextmanager
def _isolated(cwd: Path, env: dict[str, str]) -> Iterator[None]:
    """``cwd`` and exactly ``env`` for the duration; both restored after."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


@contextlib.contextmanager
def _search_cut(quick: bool) -> Iterator[None]:
    """With ``quick``, each layer's CP-SAT search gets ``MIN_LAYER_SECONDS`` (no share
    of the whole plan's budget)."""
    if not quick:
        yield
        return
    from placer.planning.solvers.cpsat import solver

    saved = solver.SEARCH_SHARE
    solver.SEARCH_SHARE = 0.0
    try:
        yield
    finally:
        solver.SEARCH_SHARE = saved
