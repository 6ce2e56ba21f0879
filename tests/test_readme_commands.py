"""Every command of the README runs as written.

The ``$ ...`` lines of the README's fenced blocks run in order in one working directory
that holds the bundled traces and small files shaped like the inputs the README names
but the repository does not bundle (an engine's dumps and statistics, a timings CSV:
``readme_fixtures``), and every output line the README shows under a command must still
be printed (figures masked).  ``make`` lines are the README's own entry points (``make
test`` is this suite; ``make demo`` runs the demo command the README prints next, which
is run here).  docs/*.md get the same check (``test_docs_commands``).

Each command is a test of its own, run in this process with the plans' search cut
(``console``: the figures are masked); the slowest are left to the slow tier
(:data:`SLOW`), which also runs the whole README once as a user would, in a shell with
the installed ``placer`` and the real time budgets.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from readme_fixtures import (
    REPO,
    Example,
    Walkthrough,
    check_examples,
    doc_examples,
    example_params,
    readme_workdir,
)

EXAMPLES = [e for e in doc_examples((REPO / "README.md").read_text(encoding="utf-8"))
            if not e.command.startswith("make ")]

#: Commands left to the slow tier (a part of the command: why).
SLOW = {
    "--output out/demo/": "the demo's plan: 48 layers of CP-SAT and the evaluator, 15 s",
    "placer calibrate": "the fit replays DeepEP's 40 benchmark cases hundreds of times, 20 s",
    "--topology my-cluster.yaml": "reads the calibrated overlay the fit above writes",
    "--model deepseek-v3 --topology 4x-dgx-h100 --redundant 32": "DeepSeek-V3-size plans,"
    " 10-25 s",
}


def test_the_readme_has_commands() -> None:
    assert len(EXAMPLES) >= 12
    assert not any(re.search(r"\b(TRACE|NEW_TRACE|FILE)\b", e.command) for e in EXAMPLES)
    assert sum(len(e.shown) for e in EXAMPLES) >= 50  # the README's outputs are compared
    for key in SLOW:
        assert any(key in e.command for e in EXAMPLES), f"no README command holds {key!r}"


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory: pytest.TempPathFactory) -> Walkthrough:
    return Walkthrough(EXAMPLES, readme_workdir(tmp_path_factory.mktemp("readme")),
                       "README.md", SLOW)


@pytest.mark.parametrize("example", example_params(EXAMPLES, "README.md", SLOW))
def test_readme_command_runs_as_written(example: Example, walkthrough: Walkthrough) -> None:
    """The command succeeds (exits 1 or 2 where the README shows an ``error:``), and every
    line the README shows under it is still printed (figures masked: labels, units, rows
    and messages must not drift)."""
    assert walkthrough.check(example) == len(example.shown)


@pytest.mark.slow
def test_every_readme_command_runs_in_a_shell(tmp_path: Path) -> None:
    """The README as a user runs it: bash, the installed ``placer``, the real budgets."""
    compared = check_examples(EXAMPLES, readme_workdir(tmp_path / "readme"), name="README.md",
                              in_shell=True)
    assert compared == sum(len(e.shown) for e in EXAMPLES)
