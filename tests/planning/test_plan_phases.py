"""Every step of a plan that may take a second or more is said as it starts.

A DeepSeek-V3 plan's progress used to end at ``[58/58] layers planned in 35 s``; then
nothing for 23 s while the solver's judge timed every layer and the summary timed the plan,
EPLB and the floor.  :func:`placer.planning.run.plan_routing` says each step to a
``phase`` callback (the redundancy search, the judge after the last layer, the summary),
and ``placer plan`` prints them on stderr, nothing with ``--quiet`` or ``--json``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from placer.cli.main import app
from placer.model import load_model
from placer.planning.build import ProblemSpec
from placer.planning.run import AUTO_PHASE, JUDGE_PHASE, PHASES, SUMMARY_PHASE, plan_routing
from placer.problem import SolveParams
from placer.topology import load_topology
from placer.traces import read_routing

SYNTH = Path(__file__).resolve().parents[2] / "traces" / "synthetic-small.jsonl.gz"


@pytest.fixture(scope="module")
def synth():
    """The bundled synthetic trace (4 layers of gpt-oss-20b's shape), on a DGX H100."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        routing = read_routing(SYNTH, keep_tokens=True)
    return routing, load_model("gpt-oss-20b"), load_topology("dgx-h100")


def _recorder() -> tuple[list[str], object, object]:
    """A log of events, and the ``progress`` and ``phase`` that write it."""
    log: list[str] = []

    @contextmanager
    def progress() -> Iterator[object]:
        yield lambda done, total: log.append(f"layer {done}/{total}")
        log.append("layers end")

    @contextmanager
    def phase(name: str) -> Iterator[None]:
        log.append(f"{name} start")
        yield
        log.append(f"{name} end")

    return log, progress(), phase


def test_after_the_last_layer_the_judge_then_the_summary_are_said(synth) -> None:
    routing, model, topology = synth
    log, progress, phase = _recorder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan_routing(routing, ProblemSpec(model=model, topology=topology, redundant=8), "cpsat",
                     SolveParams(jobs=1, total_time_limit_s=2), progress=progress, phase=phase)
    last = log.index("layer 4/4")  # the solver may report a start (0/4) first
    assert all(entry.startswith("layer ") for entry in log[:last])
    assert log[last + 1:] == ["judge start", "layers end", "judge end", "summary start",
                              "summary end"]
    assert JUDGE_PHASE == "judge" and SUMMARY_PHASE == "summary"


def test_the_redundancy_search_is_said(synth) -> None:
    routing, model, topology = synth
    log, progress, phase = _recorder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan_routing(routing, ProblemSpec(model=model, topology=topology), "eplb",
                     SolveParams(jobs=1), auto=True, progress=progress, phase=phase)
    assert log == [f"{AUTO_PHASE} start", f"{AUTO_PHASE} end", "layers end",
                   "summary start", "summary end"]


def test_placer_plan_prints_the_steps_after_the_last_layer(tmp_path: Path) -> None:
    args = ["plan", str(SYNTH), "-m", "gpt-oss-20b", "-t", "dgx-h100", "-r", "8",
            "--time-limit", "2", "-o", str(tmp_path / "plan.json")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if not line.startswith("warning:")]
    last = next(i for i, line in enumerate(lines) if line.startswith("[4/4] layers planned in"))
    assert lines[last + 1:] == [
        "judge: each layer's plan, its hint and EPLB timed by the evaluator ...",
        lines[last + 2], "summary: the plan and EPLB timed on the judged windows, and the"
        " floor ...", lines[last + 4]]
    assert lines[last + 2].startswith("judge: done in ")
    assert lines[last + 4].startswith("summary: done in ")
    for quiet in ("--quiet", "--json"):
        result = CliRunner().invoke(app, [*args, quiet])
        assert result.exit_code == 0, result.stderr
        assert all(line.startswith("warning:") for line in result.stderr.splitlines())


def test_the_command_has_words_for_every_step() -> None:
    """The library names its steps; the command line says what each does."""
    from placer.cli.progress import PLAN_STEPS

    assert set(PLAN_STEPS) == set(PHASES)
