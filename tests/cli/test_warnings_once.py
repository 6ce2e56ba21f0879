"""Each warning once per command, after its output: the same text once; the same warning
for other files, layers or figures gathered into one line that counts them; and the
warnings of work that ran in other processes (``--jobs``) said as if it ran here."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from placer.cli.common import warning_lines
from placer.cli.main import app
from placer.errors import PlacerWarning, ScalingWarning, TraceWarning
from placer.parallel import Backend
from placer.placement import Placement
from placer.placement.document import write_placement

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "traces" / "synthetic-small.jsonl.gz"
runner = CliRunner()


def _caught(*said: tuple[str, type[Warning]]) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for text, category in said:
            warnings.warn(text, category, stacklevel=1)
    return caught


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning:")]


# -- the lines -----------------------------------------------------------------------------------


def test_the_same_warning_for_other_layers_is_one_line_naming_them():
    caught = _caught(*[(f"layer {n}: integer loads are precise to 1.{n}e-03 of the mean GPU"
                        " load", ScalingWarning) for n in (3, 4, 7, 9, 12, 15)])
    assert warning_lines(caught) == [
        "layer 3: integer loads are precise to 1.3e-03 of the mean GPU load (and the same for"
        " layers 4, 7, 9 and 2 more)"]


def test_the_same_warning_for_other_files_is_one_line_naming_them():
    caught = _caught(("a/plan.json: GPU 6 holds 2 replicas of expert 27 in layer 0", PlacerWarning),
                     ("b.json: GPU 1 holds 2 replicas of expert 3 in layer 2", PlacerWarning))
    assert warning_lines(caught) == [
        "a/plan.json: GPU 6 holds 2 replicas of expert 27 in layer 0 (and the same for b.json)"]


def test_a_warning_that_differs_in_its_figures_is_counted():
    caught = _caught(*[(f"the trace's source ranks go up to 31 but the topology has {g} GPUs;"
                        f" ranks are taken modulo {g}", TraceWarning) for g in (8, 16, 8)])
    assert warning_lines(caught) == [
        "the trace's source ranks go up to 31 but the topology has 8 GPUs; ranks are taken"
        " modulo 8 (and 1 more like it)"]


def test_other_categories_and_other_words_stay_apart():
    caught = _caught(("layer 3: x is 1", ScalingWarning), ("layer 4: x is 2", TraceWarning),
                     ("one window only", PlacerWarning), ("one window only", PlacerWarning),
                     ("odd", RuntimeWarning), ("odd", RuntimeWarning))
    lines = warning_lines(caught)
    assert lines[:3] == ["layer 3: x is 1", "layer 4: x is 2", "one window only"]
    assert len(lines) == 4 and lines[3].startswith("RuntimeWarning: odd (")


# -- commands that used to repeat ------------------------------------------------------------------


def test_evaluate_of_two_hand_made_files_says_their_duplicates_in_one_line(tmp_path):
    """Two placements a person wrote, each with an expert twice on a GPU: one line."""
    paths = []
    for name, layer, (a, b) in (("a.json", 1, (1, 32)), ("b.json", 2, (6, 37))):
        rows = np.tile(np.arange(40) % 32, (4, 1))  # gpt-oss-20b's 32 experts, 8 GPUs x 5
        rows[layer, [a, b]] = rows[layer, [b, a]]  # a swap: one GPU holds an expert twice
        write_placement(tmp_path / name, Placement(rows, np.arange(4), 32, 8),
                        model_name="gpt-oss-20b", topology={"name": "dgx-h100", "num_gpus": 8,
                                                             "num_nodes": 1})
        paths += ["-p", str(tmp_path / name)]
    result = runner.invoke(app, ["evaluate", str(SMALL), *paths, "-q"])
    assert result.exit_code == 0, result.stderr
    said = [w for w in _warnings(result.stderr) if "replicas of expert" in w]
    assert len(said) == 1, result.stderr
    assert said[0].startswith(f"warning: {tmp_path / 'a.json'}: GPU 0 holds 2 replicas")
    assert said[0].endswith(f" (and the same for {tmp_path / 'b.json'})")


@pytest.fixture(scope="module")
def ranks_32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic gpt-oss-20b trace recorded on 32 source ranks."""
    path = tmp_path_factory.mktemp("ranks") / "r32.npz"
    result = runner.invoke(app, ["synth", str(path), "--model", "gpt-oss-20b", "--layers", "4",
                                 "--tokens", "8192", "--tokens-per-step", "512", "--ranks",
                                 "32", "-q"])
    assert result.exit_code == 0, result.stderr
    return path


@pytest.mark.slow
def test_compare_says_the_same_warnings_whatever_runs_its_scenarios(ranks_32):
    """Each scenario warns (32 ranks on 8 or 16 GPUs); its pieces ran in this process, or
    in two worker processes whose warnings once went missing: one line either way."""
    said = []
    for jobs in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-m", "placer.cli.main", "compare", str(ranks_32), "-m",
             "gpt-oss-20b", "-t", "dgx-h100", "-t", "2x-dgx-h100", "-r", "0", "-s",
             "eplb,linear", "--jobs", jobs, "-q"],
            capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        said.append(_warnings(done.stderr))
    assert said[0] == said[1]
    ranks = [w for w in said[0] if "source ranks" in w]
    assert ranks == ["warning: the trace's source ranks go up to 31 but the topology has 8 GPUs;"
                     " ranks are taken modulo 8 (and 1 more like it)"]


def _warn_and_square(x: int) -> int:
    warnings.warn(f"piece {x} found something", PlacerWarning, stacklevel=1)
    return x * x


def test_workers_warnings_are_said_where_the_run_started():
    for backend in (Backend(jobs=1), Backend(jobs=2)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert backend.run(_warn_and_square, [1, 2, 3]) == [1, 4, 9]
        said = sorted(str(w.message) for w in caught if w.category is PlacerWarning)
        assert said == [f"piece {x} found something" for x in (1, 2, 3)], backend


@pytest.mark.slow
def test_warnings_come_after_the_output(tmp_path):
    """stdout and stderr into one file: the warnings are its last lines."""
    log = tmp_path / "log"
    with log.open("w") as both:
        done = subprocess.run(
            [sys.executable, "-m", "placer.cli.main", "plan", str(SMALL), "-m", "gpt-oss-20b",
             "-t", "dgx-h100", "-r", "8", "--solver", "eplb", "-o", str(tmp_path / "p.json"),
             "-q"], stdout=both, stderr=subprocess.STDOUT, timeout=300)
    assert done.returncode == 0
    lines = log.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("warning:"))
    assert lines[0].startswith("placement ")
    assert all(line.startswith("warning:") for line in lines[first:]), lines[first:]
    assert len(lines[first:]) == len(set(lines[first:]))
