"""Every command of the README runs as written.

The ``$ ...`` lines of the README's fenced blocks are run in order, with a shell, in one
working directory that holds the bundled traces and small files shaped like the inputs
the README names but the repository does not bundle (an engine's dumps and statistics, a
timings CSV: ``readme_fixtures``), and every output line the README shows under a command
must still be printed (figures masked).  ``make`` lines are the README's own entry points
(``make test`` is this suite; ``make demo`` runs the demo command the README prints next,
which is run here).  docs/*.md get the same check (``test_docs_commands``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from readme_fixtures import REPO, check_examples, doc_examples, readme_workdir

EXAMPLES = [e for e in doc_examples((REPO / "README.md").read_text(encoding="utf-8"))
            if not e.command.startswith("make ")]


def test_the_readme_has_commands() -> None:
    assert len(EXAMPLES) >= 12
    assert not any(re.search(r"\b(TRACE|NEW_TRACE|FILE)\b", e.command) for e in EXAMPLES)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return readme_workdir(tmp_path_factory.mktemp("readme"))


def test_every_readme_command_runs_as_written(workdir: Path) -> None:
    """Each command succeeds, and every line the README shows under it is still printed
    (figures masked: labels, units, rows and messages must not drift)."""
    compared = check_examples(EXAMPLES, workdir, name="README.md")
    assert compared >= 50  # the README's outputs are really compared
