"""The library names its parameters; the command line shows them as flags."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import typer

from placer.cli.flags import all_flags, as_flags, flag_for, for_command_line, running_command
from placer.cli.main import app
from placer.errors import Param, UsageError


@pytest.fixture(autouse=True)
def _in_the_command_line() -> Iterator[None]:
    """Flags are the running command line's: run each test as the ``placer`` app does."""
    token = running_command.set(typer.main.get_command(app))
    yield
    running_command.reset(token)


def test_outside_a_command_line_no_flag_is_known():
    token = running_command.set(None)
    try:
        assert all_flags() == frozenset()
        assert flag_for("slots_per_gpu") is None
    finally:
        running_command.reset(token)


def test_parameters_map_to_their_flags():
    assert flag_for("slots_per_gpu") == "--slots-per-gpu"
    assert flag_for("held_out") == "--eval"
    assert flag_for("total_time_limit_s") == "--time-limit"
    assert flag_for("layer_time_limit_s") == "--layer-time-limit"
    assert flag_for("options.patience") == "--option patience"
    assert flag_for("not_a_parameter_of_any_command") is None


def test_text_and_places_in_flag_terms():
    assert as_flags("pass `model` and `topology`") == "pass --model and --topology"
    assert as_flags("see `placer config`; `unknown_name` stays") == (
        "see `placer config`; `unknown_name` stays")
    error = for_command_line(UsageError("give `fit` as START:STOP", where=Param("fit"),
                                        hint="for example `fit` 0:8"))
    assert str(error) == "--fit: give --fit as START:STOP"
    assert error.hint == "for example --fit 0:8"
    plain = for_command_line(UsageError("bad", where="trace.jsonl:3"))
    assert plain.where == "trace.jsonl:3"


def test_the_library_shows_parameter_names():
    error = UsageError("must be positive", where=Param("slots_per_gpu"))
    assert str(error) == "slots_per_gpu: must be positive"
