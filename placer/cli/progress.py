"""Progress of long commands on stderr: a bar with an ETA on a terminal, plain
``[i/n]`` lines otherwise, nothing when quiet (results stay alone on stdout); and the
steps between (:func:`phases`), each said as it starts and when it ends, so that no
step of a second or more passes in silence."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from placer.cli.common import err
from placer.planning.run import AUTO_PHASE, FINISH_PHASE, JUDGE_PHASE, SUMMARY_PHASE

#: Without a terminal, a line every this share of the work (and at the end).
PLAIN_STEP = 0.1


@contextmanager
def progress(what: str, enabled: bool = True) -> Iterator[Callable[[int, int], None]]:
    """A ``report(done, total)`` callback for ``what`` (e.g. ``"layers planned"``)."""
    if not enabled:
        yield lambda done, total: None
        return
    if sys.stderr.isatty():
        bar = Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(),
                       TextColumn("eta"), TimeRemainingColumn(), console=err, transient=True)
        task = bar.add_task(what, total=None)
        with bar:
            def report(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            yield report
        return
    state = {"next": 0.0, "start": time.perf_counter()}

    def plain(done: int, total: int) -> None:
        if total <= 0 or done <= 0:
            return
        if done >= total or done / total >= state["next"]:
            state["next"] = done / total + PLAIN_STEP
            spent = time.perf_counter() - state["start"]
            eta = spent / done * (total - done)
            tail = f", eta {eta:.0f} s" if done < total else f" in {spent:.0f} s"
            err.print(f"[{done}/{total}] {what}{tail}", highlight=False)

    yield plain


#: What each step of :func:`placer.planning.run.plan_routing` does, in words.
PLAN_STEPS = {
    AUTO_PHASE: "each candidate slot count placed with EPLB and timed",
    JUDGE_PHASE: "each layer's plan, its hint and EPLB timed by the evaluator",
    FINISH_PHASE: "the placement put together from its layers",
    SUMMARY_PHASE: "the plan and EPLB timed on the judged windows, and the floor",
}


def phases(enabled: bool = True) -> Callable[[str], AbstractContextManager[None]]:
    """``phase(name)`` for :func:`placer.planning.run.plan_routing`: a line
    ``name: what ...`` (:data:`PLAN_STEPS`) on stderr as the step starts and
    ``name: done in N s`` when it ends (nothing when quiet)."""
    def phase(name: str) -> AbstractContextManager[None]:
        return _phase(name, PLAN_STEPS[name]) if enabled else nullcontext()

    return phase


@contextmanager
def _phase(name: str, what: str) -> Iterator[None]:
    err.print(f"{name}: {what} ...", highlight=False)
    start = time.perf_counter()
    yield
    spent = time.perf_counter() - start
    err.print(f"{name}: done in {spent:.1f} s" if spent < 10 else f"{name}: done in {spent:.0f} s",
              highlight=False)
