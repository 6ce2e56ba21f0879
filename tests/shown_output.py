"""What a page shows under a command, compared with what the command printed.

The README's tour shows each command's output as a terminal shows it: stdout, then the
warnings on stderr after it (or before, where the command warns before its results).
:func:`differences` checks it both ways:

- the stdout lines shown are the lines printed, in order, none added and none left out
  except where the page writes ``...`` (blank lines aside; spacing collapsed, since it is
  layout: a column widens with its widest figure);
- the stderr lines shown (``warning:``, ``error:``, ``hint:``) are exactly the ones
  printed, in order: a command that starts warning fails until the page shows it.
  Progress lines (``[i/n]``, ``judge:``, ``summary:``, ``evaluating ...``) are not
  results and are not compared.

Figures are compared as :class:`Mode` says.  Measured durations of this machine (a
solver's seconds, the ``solve time, s`` row, the replay's ``decide s`` column) are never
compared: they are how long the run took, not what it found.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

#: Where a page leaves printed lines out.
GAP = "..."
#: The prefixes of the messages on stderr a page shows (progress lines are not shown).
MESSAGES = ("warning:", "error:", "hint:")
#: How far a figure of a search under a wall-clock budget may move from run to run:
#: relatively, or by one unit of its last shown digit.
TOLERANCE = 0.10

#: A figure, with its sign where it has one (``-6.47%``; not the dash of ``0-3``).
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:,\d{3})*(?:\.\d+)?|\d+(?:,\d{3})*(?:\.\d+)?")
#: A solver's status and seconds in a plan's ``solver`` line: ``cpsat (FEASIBLE, 17.04 s``.
_SOLVER_SECONDS = re.compile(r"(\((?:[A-Z_]+), )\d+(?:\.\d+)? s\b")
#: What a CP-SAT search reports when its wall clock runs out (and the judge's FALLBACK).
_STATUS = re.compile(r"\b(OPTIMAL|FEASIBLE|FALLBACK|UNKNOWN)\b")


class Example(Protocol):
    """A page's command (``readme_fixtures.Example``): its text and line."""

    @property
    def command(self) -> str: ...

    @property
    def line(self) -> int: ...


class Mode(enum.Enum):
    """How a shown figure is compared with the printed one.

    ``EXACT``: the same figure, digit for digit (commands whose output depends on the
    input alone).  ``TOLERANT``: within :data:`TOLERANCE`, for an example whose figures
    come from a CP-SAT search that stops at a wall-clock budget (``placer plan`` with the
    default solver, and any command that reads what such a plan wrote): where the search
    stops depends on the machine and its load, so the plan, its status and every figure
    judged from it move a little between runs, as they do for a user.  ``MASKED``: figures
    not compared at all, for such an example when the test cuts the search short
    (``make test``'s fast tier); the words, labels, rows and messages still are."""

    EXACT = "exact"
    TOLERANT = "tolerant"
    MASKED = "masked"


@dataclass(frozen=True)
class Shown:
    """A page's output of one command: stdout chunks (runs of lines with no ``...``
    between them), whether printed lines may precede the first and follow the last, and
    the stderr messages shown."""

    chunks: tuple[tuple[str, ...], ...]
    open_start: bool
    open_end: bool
    messages: tuple[str, ...]

    @classmethod
    def of(cls, lines: Sequence[str]) -> Shown:
        chunks: list[list[str]] = [[]]
        messages = []
        for line in lines:
            if not line.strip():
                continue
            if line.strip() == GAP:
                chunks.append([])
            elif line.startswith(MESSAGES):
                messages.append(line)
            else:
                chunks[-1].append(line)
        stripped = [line.strip() for line in lines if line.strip()
                    and not line.startswith(MESSAGES)]
        open_start = bool(stripped) and stripped[0] == GAP
        open_end = bool(stripped) and stripped[-1] == GAP
        return cls(tuple(tuple(c) for c in chunks if c), open_start, open_end,
                   tuple(messages))


def _collapse(line: str) -> str:
    return " ".join(line.replace("─", "").split())


def without_durations(lines: Sequence[str]) -> list[str]:
    """``lines`` with the measured durations blanked (``#``): a solver's seconds, the
    figures of the ``solve time, s`` row and of a table's ``decide s`` column."""
    out = []
    decide_column = False
    for line in lines:
        if not line.strip():
            decide_column = False
        line = _SOLVER_SECONDS.sub(r"\1# s", line)
        if line.startswith("solve time, s"):
            line = "solve time, s " + _NUMBER.sub("#", line[len("solve time, s"):])
        elif decide_column:
            line = re.sub(r"\d+(?:\.\d+)?\s*$", "#", line)
        if line.rstrip().endswith("decide s"):
            decide_column = True
        out.append(line)
    return out


def _figures(line: str) -> tuple[str, list[str]]:
    return _NUMBER.sub("#", line), _NUMBER.findall(line)


def _close(shown: str, printed: str) -> bool:
    a, b = float(shown.replace(",", "")), float(printed.replace(",", ""))
    decimals = len(shown.split(".", 1)[1]) if "." in shown else 0
    return abs(a - b) <= max(TOLERANCE * max(abs(a), abs(b)), 10.0 ** -decimals)


def same_line(mode: Mode) -> Callable[[str, str], bool]:
    """Whether a shown line and a printed one agree under ``mode`` (spacing collapsed;
    under TOLERANT and MASKED a search's status word too: it is where the search stopped)."""

    def agree(shown: str, printed: str) -> bool:
        shown, printed = _collapse(shown), _collapse(printed)
        if mode is Mode.EXACT:
            return shown == printed
        shown, printed = _STATUS.sub("STATUS", shown), _STATUS.sub("STATUS", printed)
        (text_a, figures_a), (text_b, figures_b) = _figures(shown), _figures(printed)
        if text_a != text_b:
            return False
        return mode is Mode.MASKED or all(map(_close, figures_a, figures_b))

    return agree


def _matches_at(chunk: Sequence[str], printed: Sequence[str], at: int,
                agree: Callable[[str, str], bool]) -> bool:
    return at + len(chunk) <= len(printed) and all(
        agree(s, p) for s, p in zip(chunk, printed[at:at + len(chunk)], strict=False))


def differences(shown_lines: Sequence[str], stdout: str, stderr: str, mode: Mode) -> list[str]:
    """What differs between the output a page shows (its lines, ``...`` included) and what
    the command printed on each stream; empty when they agree."""
    shown = Shown.of(without_durations(shown_lines))
    agree = same_line(mode)
    printed = [line for line in without_durations(stdout.splitlines()) if line.strip()]
    problems = []
    at = 0
    for number, chunk in enumerate(shown.chunks):
        free = shown.open_start if number == 0 else True
        starts = range(at, len(printed)) if free else range(at, at + 1)
        found = next((s for s in starts if _matches_at(chunk, printed, s, agree)), None)
        if found is None:
            problems.append("these shown lines are not printed, in this order, there:\n"
                            + "\n".join(chunk))
            break
        at = found + len(chunk)
    else:
        if at < len(printed) and not shown.open_end:
            problems.append("printed lines the page does not show (end them with ...):\n"
                            + "\n".join(printed[at:]))
    messages = [line for line in stderr.splitlines() if line.startswith(MESSAGES)]
    if len(messages) != len(shown.messages) or not all(
            agree(s, p) for s, p in zip(shown.messages, messages, strict=True)):
        problems.append("stderr messages differ\n--- shown:\n" + "\n".join(shown.messages)
                        + "\n--- printed:\n" + "\n".join(messages))
    return problems


#: Options naming a file a command writes.
WRITES = re.compile(r"(?:^|\s)(?:-o|--output)\s+(\S+)|--export\s+\w[\w-]*:(\S+)")


def searched(examples: Sequence[Example]) -> set[int]:
    """The lines of the examples whose figures come from a CP-SAT search under a
    wall-clock budget: ``placer plan`` with the default solver (cpsat), and every command
    that reads a file such a command wrote."""
    written: set[str] = set()
    found = set()
    for e in examples:
        words = e.command.split()
        solver = next((words[i + 1] for i, w in enumerate(words[:-1])
                       if w in ("--solver", "-s")), "cpsat")
        plans = words[:2] == ["placer", "plan"] and solver == "cpsat"
        if plans or any(path in words for path in written):
            found.add(e.line)
            written.update(p for pair in WRITES.findall(e.command) for p in pair if p)
    return found
