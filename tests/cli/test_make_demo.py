"""The first minutes: ``make demo``, then the README's tour typed in a fresh shell.

``make`` installs ``placer`` in ``.venv``, which the user's shell has not activated, so
every ``placer ...`` line of the tour used to fail with ``command not found``.  The README
says where the tour starts how to get ``placer`` on the PATH, ``make shell`` opens a shell
with it, and the demo ends by saying so when ``placer`` is not on the PATH; it also makes
its output folder, since placer creates none.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from placer.cli import demo

ROOT = Path(__file__).resolve().parents[2]


def _run_demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
              path: str) -> str:
    """``python -m placer.cli.demo`` in ``tmp_path`` with PATH ``path``; the plan itself is
    replaced by a successful no-op.  Returns stderr."""
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "qwen3-30b-a3b.npz").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", path)
    ran: list[list[str]] = []

    def plan(args: list[str], prog_name: str) -> None:
        ran.append(args)
        raise SystemExit(0)

    monkeypatch.setattr(demo, "app", plan)
    with pytest.raises(SystemExit):
        demo.main([])
    assert ran and ran[0][0] == "plan"
    return capsys.readouterr().err


def test_the_demo_says_how_to_run_the_tour(tmp_path, monkeypatch, capsys) -> None:
    err = _run_demo(tmp_path, monkeypatch, capsys, path=str(tmp_path / "empty-bin"))
    assert err.splitlines()[0] == f"$ mkdir -p {tmp_path / 'out' / 'demo'}"
    assert (tmp_path / "out" / "demo").is_dir()
    assert "source .venv/bin/activate" in err and "make shell" in err
    assert ".venv/bin/placer" in err


def test_the_demo_says_nothing_more_when_placer_is_on_the_path(tmp_path, monkeypatch,
                                                                capsys) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "placer").write_text("#!/bin/sh\n")
    (bin_dir / "placer").chmod(0o755)
    err = _run_demo(tmp_path, monkeypatch, capsys, path=str(bin_dir))
    assert "activate" not in err


def test_make_shell_puts_the_venv_on_the_path() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^shell:.*\n((?:\t.*\n)+)", makefile, flags=re.M)
    assert recipe is not None, "make shell"
    assert 'PATH="$(CURDIR)/$(BIN):$$PATH"' in recipe.group(1)
    assert re.search(r"^\.PHONY:.*\bshell\b", makefile, flags=re.M)


def test_the_readme_tour_starts_by_saying_how_to_get_placer() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    tour = readme.split("## A tour", 1)[1]
    before_first_command = tour.split("$ ", 1)[0]
    assert "source .venv/bin/activate" in before_first_command
    assert "make shell" in before_first_command
