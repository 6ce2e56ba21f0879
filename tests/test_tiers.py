"""The suite's tiers (``tests/conftest.py``): what ``make test`` leaves to the slow tier is
still there to run, and examples are grouped by page."""

from __future__ import annotations

import pytest
from conftest import SLOW, SLOW_USED, xdist_group


def test_every_slow_entry_names_a_test(request: pytest.FixtureRequest) -> None:
    """A renamed or removed test must not leave a stale entry (nor a renamed one slip
    into the fast tier unnoticed)."""
    config = request.config
    if config.args_source != pytest.Config.ArgsSource.TESTPATHS or config.getoption("keyword"):
        pytest.skip("only the whole suite collects every test SLOW names")
    assert set(SLOW) - config.stash[SLOW_USED] == set()


def test_examples_group_by_page_and_hostile_inputs_by_module() -> None:
    readme = "tests/test_readme_commands.py::test_readme_command_runs_as_written"
    assert xdist_group(f"{readme}[README.md:54]") == f"{readme}[README.md"
    docs = "tests/test_docs_commands.py::test_docs_command_runs_as_written"
    assert xdist_group(f"{docs}[compare.md:84]") == xdist_group(f"{docs}[compare.md:561]")
    assert xdist_group(f"{docs}[compare.md:84]") != xdist_group(f"{docs}[engines.md:30]")
    helps = "tests/cli/test_help_examples.py::test_help_example_runs_as_written"
    assert xdist_group(f"{helps}[topology show:placer topology show a:b]") == (
        f"{helps}[topology show")
    hostile = "tests/test_hostile_inputs.py"
    assert xdist_group(f"{hostile}::test_hostile_input[jsonl-empty]") == hostile
    assert xdist_group("tests/test_code_size.py::test_module_is_small[x]") is None
