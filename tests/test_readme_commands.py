"""Every command of the README runs as written, and the tour prints what it shows.

The ``$ ...`` lines of the README's fenced blocks run in order in one working directory
that holds the bundled traces and small files shaped like the inputs the README names
but the repository does not bundle (an engine's dumps and statistics, a timings CSV:
``readme_fixtures``).  ``make`` lines are the README's own entry points (``make test`` is
this suite; ``make demo`` runs the demo command the README prints next, which is run
here).  docs/*.md get the same check (``test_docs_commands``).

The tour (the "A tour" section) runs on the bundled data, so what it shows is what a
newcomer gets: each command's output is compared with what it prints now, both ways,
stderr warnings included (``shown_output.differences``): digit for digit, except the
figures of a CP-SAT search under a wall-clock budget and what is judged from them
(``shown_output.searched``), which move a little from run to run and are compared within
``shown_output.TOLERANCE`` when the search has its real budget, and masked when this
suite cuts it short.  The engine section's commands read small stand-ins for an engine's
files, so only the lines they show are looked for (figures masked).

Each command is a test of its own, run in this process with the plans' search cut
(``console``); the slowest are left to the slow tier (:data:`SLOW`), which also runs the
whole README once as a user would, in a shell with the installed ``placer`` and the real
time budgets.
"""

from __future__ import annotations

import re
from pathlib import Path

import console
import pytest
from readme_fixtures import (
    REPO,
    SHOWN_WORKDIR,
    Example,
    Walkthrough,
    check_example,
    doc_examples,
    example_params,
    readme_workdir,
)
from shown_output import WRITES, Mode, differences, searched

README = (REPO / "README.md").read_text(encoding="utf-8")
EXAMPLES = [e for e in doc_examples(README) if not e.command.startswith("make ")]

#: Commands left to the slow tier (a part of the command: why).
SLOW = {
    "--output out/demo/": "the demo's plan: 48 layers of CP-SAT and the evaluator, 15 s",
    "placer calibrate": "the fit replays DeepEP's 40 benchmark cases hundreds of times, 20 s",
    "--topology out/tour/my-cluster.yaml": "reads the calibrated overlay the fit above writes",
    "--model deepseek-v3 --topology 4x-dgx-h100 --redundant 32": "DeepSeek-V3-size plans,"
    " 10-25 s",
}


def _tour_lines(text: str) -> range:
    """The README's lines (1-based) of its "A tour" section."""
    lines = text.splitlines()
    start = lines.index("## A tour") + 1
    end = next((n for n in range(start, len(lines)) if lines[n].startswith("## ")), len(lines))
    return range(start + 1, end + 1)


#: The tour's commands that print something (``mkdir`` aside).
TOUR = [e for e in EXAMPLES if e.line in _tour_lines(README) and e.command.startswith("placer ")]

SEARCHED = searched(EXAMPLES)


def tour_differences(example: Example, ran: console.Ran, workdir: Path, *,
                     cut: bool) -> list[str]:
    """What the tour shows under ``example`` and it no longer prints (or prints and the
    tour does not show); ``cut``: the run had its CP-SAT search cut short."""
    searched_here = example.line in SEARCHED
    mode = (Mode.MASKED if cut else Mode.TOLERANT) if searched_here else Mode.EXACT
    stdout, stderr = (s.replace(str(workdir), SHOWN_WORKDIR) for s in (ran.stdout, ran.stderr))
    problems = differences(example.lines, stdout, stderr, mode)
    if ran.returncode != 0:
        problems.insert(0, f"exit code {ran.returncode}\n{stderr[-2000:]}")
    return [f"README.md:{example.line}: $ {example.command} ({mode.value})\n{p}"
            + f"\n--- it printed:\n{stdout}{stderr}" for p in problems]


def test_the_readme_has_commands() -> None:
    assert len(EXAMPLES) >= 12
    assert not any(re.search(r"\b(TRACE|NEW_TRACE|FILE)\b", e.command) for e in EXAMPLES)
    assert sum(len(e.shown) for e in EXAMPLES) >= 50  # the README's outputs are compared
    for key in SLOW:
        assert any(key in e.command for e in EXAMPLES), f"no README command holds {key!r}"


def test_the_tour_shows_outputs_and_knows_which_are_searched() -> None:
    assert len(TOUR) >= 10
    assert all(e.lines for e in TOUR), [e.command for e in TOUR if not e.lines]
    exact = [e for e in TOUR if e.line not in SEARCHED]
    assert len(exact) >= 5  # stats, topology, capacity, calibrate, EPLB's plan, replay
    assert any("-p out/tour/cpsat.json" in e.command for e in TOUR if e.line in SEARCHED)
    assert not any("--solver eplb" in e.command for e in TOUR if e.line in SEARCHED)


def test_the_tour_writes_only_under_out() -> None:
    for e in TOUR:
        for pair in WRITES.findall(e.command):
            for path in filter(None, pair):
                assert path.startswith("out/"), f"README.md:{e.line} writes {path}"


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory: pytest.TempPathFactory) -> Walkthrough:
    return Walkthrough(EXAMPLES, readme_workdir(tmp_path_factory.mktemp("readme")),
                       "README.md", SLOW)


@pytest.mark.parametrize("example", example_params(EXAMPLES, "README.md", SLOW))
def test_readme_command_runs_as_written(example: Example, walkthrough: Walkthrough) -> None:
    """The command succeeds (exits 1 or 2 where the README shows an ``error:``); a tour
    command prints what the tour shows under it and nothing it leaves out, its warnings
    included; elsewhere every line shown is still printed (figures masked)."""
    ran = walkthrough.run(example)
    if example in TOUR:
        problems = tour_differences(example, ran, walkthrough.workdir, cut=True)
        assert not problems, "\n\n".join(problems)
    else:
        assert check_example(example, ran, walkthrough.workdir, name="README.md") == len(
            example.shown)


@pytest.mark.slow
def test_every_readme_command_runs_in_a_shell(tmp_path: Path) -> None:
    """The README as a user runs it: bash, the installed ``placer``, the real budgets."""
    workdir = readme_workdir(tmp_path / "readme")
    problems = []
    for example in EXAMPLES:
        ran = console.run(example.command, workdir, in_shell=True)
        if example in TOUR:
            problems += tour_differences(example, ran, workdir, cut=False)
        else:
            check_example(example, ran, workdir, name="README.md")
    assert not problems, "\n\n".join(problems)
