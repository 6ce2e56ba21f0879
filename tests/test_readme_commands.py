"""Every command of the README runs as written.

The ``$ ...`` lines of the README's fenced blocks are run in order, with a shell, in one
working directory that holds the bundled traces and small files shaped like the inputs
the README names but the repository does not bundle (an engine's dumps and statistics, a
timings CSV: ``readme_fixtures``).  ``make`` lines are the README's own entry points
(``make test`` is this suite; ``make demo`` runs the demo command the README prints next,
which is run here).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from readme_fixtures import REPO, readme_workdir


def shown_outputs(text: str) -> dict[str, list[str]]:
    """``command -> the output lines the README shows under it`` (fenced blocks)."""
    shown: dict[str, list[str]] = {}
    inside = False
    current: str | None = None
    pending: str | None = None
    for line in text.splitlines():
        if line.startswith("```"):
            inside, current, pending = not inside, None, None
            continue
        if not inside:
            continue
        if pending is not None or line.startswith("$ "):
            pending = (pending + " " + line.strip()) if pending is not None else line[2:].strip()
            if pending.endswith("\\"):
                pending = pending[:-1].rstrip()
                continue
            current, pending = pending, None
            shown[current] = []
        elif current is not None and line.strip() and line.strip() != "...":
            shown[current].append(line)  # "..." marks lines left out
    return shown


def _skeleton(line: str) -> str:
    """A line with its figures masked and its spacing collapsed: what must not drift."""
    masked = re.sub(r"\d+(?:[.,]\d+)*", "#", line)
    return " ".join(masked.replace("─", "").split())


def readme_commands(text: str) -> list[str]:
    """The ``$ ...`` commands of fenced blocks, continuation lines joined."""
    commands: list[str] = []
    inside = False
    pending: str | None = None
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            continue
        if not inside:
            continue
        if pending is not None:
            pending += " " + line.strip()
        elif line.startswith("$ "):
            pending = line[2:].strip()
        else:
            continue
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        commands.append(pending)
        pending = None
    return commands


COMMANDS = [c for c in readme_commands((REPO / "README.md").read_text(encoding="utf-8"))
            if not c.startswith("make ")]


def test_the_readme_has_commands() -> None:
    assert len(COMMANDS) >= 12
    assert not any(re.search(r"\b(TRACE|NEW_TRACE|FILE)\b", c) for c in COMMANDS)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return readme_workdir(tmp_path_factory.mktemp("readme"))


def test_every_readme_command_runs_as_written(workdir: Path) -> None:
    """Each command succeeds, and every line the README shows under it is still printed
    (figures masked: labels, units, rows and messages must not drift)."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["COLUMNS"] = "200"
    shown = shown_outputs((REPO / "README.md").read_text(encoding="utf-8"))
    compared = 0
    for command in COMMANDS:
        done = subprocess.run(["bash", "-c", command], cwd=workdir, env=env,
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, f"$ {command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        assert "Traceback" not in done.stderr, command
        printed = {_skeleton(line) for line in (done.stdout + done.stderr).splitlines()}
        missing = [line for line in shown.get(command, []) if _skeleton(line) not in printed]
        assert missing == [], f"$ {command}\nthe README shows lines it no longer prints:\n" + \
            "\n".join(missing)
        compared += len(shown.get(command, []))
    assert compared >= 50  # the README's outputs are really compared
