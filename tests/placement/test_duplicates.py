"""Two replicas of one expert on one GPU: placer's plans never hold one where the slots
allow without it, and each one is said once, by the command that first meets it.

- every solver but ``eplb`` (the reference as published) keeps one replica of an expert
  per GPU, on small instances (hypothesis), a synthetic trace and the bundled traces;
- ``placer plan --solver eplb`` says its duplicates once and records them in the file;
  reading the file back (evaluate, report, export, --current) says nothing of them, and a
  hand-edited copy with a duplicate the file does not record warns;
- ``Placement`` checks the length of its rows, and where a reader keeps one slot per
  expert on a GPU (vLLM-Ascend), ``check_distinct`` is a PlacementError with a hint.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from placer.cli.main import app
from placer.errors import PlacementError, PlacerWarning
from placer.placement import Placement
from placer.placement.document import read_placement, write_placement
from placer.planning.solvers import solve
from placer.problem import PlacementProblem, SolveParams
from placer.stats import ExpertStats

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "traces" / "synthetic-small.jsonl.gz"
#: The solvers placer plans with that keep replicas apart (``eplb`` is the reference).
APART = ("eplb-valid", "linear", "round_robin", "cpsat")
runner = CliRunner()


def _warnings(stderr: str, word: str = "replicas of expert") -> list[str]:
    return [line for line in stderr.splitlines()
            if line.startswith("warning:") and word in line]


# -- no plan of placer's holds a duplicate the slots allow without -----------------------------


@st.composite
def _problems(draw: st.DrawFn) -> PlacementProblem:
    """A problem whose slots allow one replica of an expert per GPU: at most as many slots
    per GPU as experts; loads from even to one expert taking almost everything."""
    gpus = draw(st.sampled_from([1, 2, 3, 4, 6]))
    experts = draw(st.integers(2, 12))
    fewest = -(-experts // gpus)
    slots = draw(st.integers(fewest, min(experts, fewest + 3)))
    layers = draw(st.integers(1, 2))
    windows = draw(st.integers(1, 2))
    skew = draw(st.floats(0.0, 4.0))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    base = 1000.0 / np.arange(1, experts + 1) ** skew
    load = np.stack([np.stack([np.round(base[rng.permutation(experts)]
                                        * rng.uniform(0.5, 1.5, experts))
                               for _ in range(layers)]) for _ in range(windows)])
    load[rng.random(load.shape) < 0.1] = 0
    stats = ExpertStats(load=load.astype(np.int64), tokens=np.full(windows, 100, np.int64),
                        layer_ids=np.arange(layers), top_k=1)
    nodes = 2 if gpus % 2 == 0 and draw(st.booleans()) else 1
    return PlacementProblem(stats=stats, num_gpus=gpus, slots_per_gpu=slots,
                            node_of_gpu=np.repeat(np.arange(nodes), gpus // nodes))


@settings(max_examples=150, deadline=None)
@given(_problems(), st.sampled_from(APART))
def test_no_plan_holds_an_expert_twice_where_the_slots_allow(problem, solver):
    params = SolveParams(time_limit_s=0.1, total_time_limit_s=1.0, jobs=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        placement = solve(problem, solver, params).placement
    assert not placement.duplicate_gpus.any(), (solver, placement.physical_to_logical)
    assert placement.slots_per_gpu == problem.slots_per_gpu


@pytest.mark.parametrize("solver", APART)
def test_no_plan_of_the_synthetic_trace_holds_an_expert_twice(solver, tmp_path):
    """The bundled synthetic trace on a DGX H100 with 8 redundant experts, where the
    reference EPLB puts experts twice on a GPU in 4 (layer, GPU) pairs."""
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["plan", str(SMALL), "-m", "gpt-oss-20b", "-t", "dgx-h100",
                                 "-r", "8", "--fit", "0:6", "--solver", solver,
                                 "--time-limit", "3", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.stderr
    assert _warnings(result.stderr) == []
    assert not read_placement(out).duplicate_gpus.any()


@pytest.mark.slow
@pytest.mark.parametrize(("trace", "model", "topology", "redundant"), [
    ("qwen3-30b-a3b.npz", "qwen3-30b-a3b", "2x-dgx-h100", 32),
    ("synthetic-dsv3-drift.npz", "deepseek-v3", "4x-dgx-h100", 32),
    ("synthetic-small.jsonl.gz", "gpt-oss-20b", "2x-dgx-h100", 16),
])
@pytest.mark.parametrize("solver", ["eplb-valid", "cpsat"])
def test_no_plan_of_the_bundled_traces_holds_an_expert_twice(trace, model, topology,
                                                             redundant, solver, tmp_path):
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["plan", str(REPO / "traces" / trace), "-m", model,
                                 "-t", topology, "-r", str(redundant), "--solver", solver,
                                 "--time-limit", "10", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.stderr
    assert _warnings(result.stderr) == []
    assert not read_placement(out).duplicate_gpus.any()


# -- said once ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def eplb_plan(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The README's EPLB plan (4 (layer, GPU) pairs hold an expert twice), and what
    ``placer plan`` said on stderr."""
    out = tmp_path_factory.mktemp("eplb") / "eplb.json"
    result = runner.invoke(app, ["plan", str(SMALL), "-m", "gpt-oss-20b", "-t", "dgx-h100",
                                 "-r", "8", "--fit", "0:6", "--solver", "eplb", "-o", str(out),
                                 "-q"])
    assert result.exit_code == 0, result.stderr
    return out, result.stderr


QWEN3 = REPO / "traces" / "qwen3-30b-a3b.npz"


@pytest.fixture(scope="module")
def qwen3_eplb_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference EPLB on the bundled Qwen3 statistics (every MoE layer: engines' files
    take it), 2 x DGX H100 with 16 redundant experts: it holds experts twice."""
    out = tmp_path_factory.mktemp("qwen3") / "eplb.json"
    result = runner.invoke(app, ["plan", str(QWEN3), "-m", "qwen3-30b-a3b", "-t",
                                 "2x-dgx-h100", "-r", "16", "--solver", "eplb", "-o", str(out),
                                 "-q"])
    assert result.exit_code == 0, result.stderr
    assert len(_warnings(result.stderr)) == 1
    return out


def test_the_plan_says_its_duplicates_once_and_why(eplb_plan):
    path, stderr = eplb_plan
    said = _warnings(stderr)
    assert said == [
        "warning: GPU 6 holds 2 replicas of expert 27 in layer 0 (and 3 more (layer, GPU)"
        " pairs), as DeepSeek's reference EPLB packs replicas by load alone (--solver"
        " eplb-valid or cpsat keeps them apart): a second replica on one GPU takes a slot of"
        " memory but adds no dispatch bandwidth; SGLang, TensorRT-LLM and vLLM load such"
        " placements, vLLM-Ascend's expert map cannot express them"]
    doc = json.loads(path.read_text())
    assert doc["duplicates"]["pairs"] == [[0, 6], [0, 7], [1, 0], [3, 6]]
    assert "reference EPLB" in doc["duplicates"]["why"]


@pytest.mark.parametrize("command", ["evaluate", "report", "replan"])
def test_reading_the_plan_back_does_not_say_them_again(command, eplb_plan, tmp_path):
    path, _ = eplb_plan
    args = {
        "evaluate": ["evaluate", str(SMALL), "-p", str(path), "--fit", "0:6"],
        "report": ["report", str(SMALL), "-p", str(path), "-o", str(tmp_path / "r.html")],
        "replan": ["plan", str(SMALL), "-m", "gpt-oss-20b", "-t", "dgx-h100", "-r", "8",
                   "--fit", "6:32", "--solver", "eplb-valid", "--current", str(path),
                   "-o", str(tmp_path / "replan.json")],
    }[command]
    if command == "report":
        pytest.importorskip("matplotlib")
    result = runner.invoke(app, [*args, "-q"])
    assert result.exit_code == 0, result.stderr
    assert _warnings(result.stderr) == []


@pytest.mark.parametrize("engine", ["sglang", "trtllm", "eplb"])
def test_exporting_the_plan_does_not_say_them_again(engine, qwen3_eplb_plan, tmp_path):
    out = tmp_path / ("x.yaml" if engine == "trtllm" else "x.npz" if engine == "eplb"
                      else "x.json")
    result = runner.invoke(app, ["export", str(qwen3_eplb_plan), "-f", engine,
                                 "-m", "qwen3-30b-a3b", "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    assert _warnings(result.stderr) == []


def test_a_replan_that_keeps_the_deployed_layers_keeps_their_record(eplb_plan, tmp_path):
    """``--max-moves 0`` keeps EPLB's deployed layers, duplicates and all: said when that
    plan was made, so not again, and the re-plan records them as kept."""
    path, _ = eplb_plan
    out = tmp_path / "replan.json"
    result = runner.invoke(app, ["plan", str(SMALL), "-m", "gpt-oss-20b", "-t", "dgx-h100",
                                 "-r", "8", "--fit", "6:32", "--current", str(path),
                                 "--max-moves", "0", "--time-limit", "3", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.stderr
    assert _warnings(result.stderr) == []
    doc = json.loads(out.read_text())
    assert doc["duplicates"] == {"pairs": [[0, 6], [0, 7], [1, 0], [3, 6]],
                                 "why": "kept as deployed (`current`)"}


def test_a_hand_edited_duplicate_still_warns(eplb_plan, tmp_path):
    """A duplicate the file does not record (here: one more, made by hand) is said,
    naming the file; the ones it records are not what the warning names."""
    path, _ = eplb_plan
    doc = json.loads(path.read_text())
    row = doc["layers"][2]["physical_to_logical"]  # layer 2: no duplicate yet
    assert len(set(row[0:5])) == 5
    row[1] = row[0]
    missing = set(range(32)) - set(row)
    row[next(i for i, e in enumerate(row) if row.count(e) > 1 and i > 4)] = missing.pop() \
        if missing else row[1]
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(doc))
    result = runner.invoke(app, ["evaluate", str(SMALL), "-p", str(edited), "--fit", "0:6", "-q"])
    assert result.exit_code == 0, result.stderr
    said = _warnings(result.stderr)
    assert len(said) == 1
    assert said[0].startswith(f"warning: {edited}: GPU 0 holds 2 replicas of expert {row[0]}"
                              " in layer 2: ")  # the one added, alone
    del doc["duplicates"]  # a file that records none: every duplicate is said
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(doc))
    with pytest.warns(PlacerWarning, match=r"bare.json: GPU 6 holds 2 replicas of expert 27 in"
                      r" layer 0 \(and 4 more \(layer, GPU\) pairs\)"):
        placement = read_placement(bare)
    with warnings.catch_warnings():  # said once: written again, it records them
        warnings.simplefilter("error")
        write_placement(tmp_path / "again.json", placement)
        read_placement(tmp_path / "again.json")


def test_an_engine_file_is_said_once_on_import_and_not_again(qwen3_eplb_plan, tmp_path):
    """An engine's file records nothing: importing it says its duplicates; the placement
    import writes records them, so reading that back says nothing."""
    sglang = tmp_path / "init.json"
    assert runner.invoke(app, ["export", str(qwen3_eplb_plan), "-f", "sglang",
                               "-m", "qwen3-30b-a3b", "-o", str(sglang)]).exit_code == 0
    back = tmp_path / "back.json"
    result = runner.invoke(app, ["import", str(sglang), "-f", "sglang", "-m", "qwen3-30b-a3b",
                                 "-t", "2x-dgx-h100", "-o", str(back)])
    assert result.exit_code == 0, result.stderr
    assert len(_warnings(result.stderr)) == 1
    again = runner.invoke(app, ["export", str(back), "-f", "sglang", "-m", "qwen3-30b-a3b",
                                "-o", str(tmp_path / "again.json")])
    assert again.exit_code == 0, again.stderr
    assert _warnings(again.stderr) == []


def test_two_hand_made_files_with_duplicates_make_one_line(tmp_path):
    """The same warning for two files is one line naming the second."""
    rows = {"a.json": [0, 0, 1, 2, 3, 3], "b.json": [1, 1, 0, 2, 3, 2]}
    for name, row in rows.items():
        write_placement(tmp_path / name, Placement(np.array([row]), np.array([0]), 4, 2),
                        model_name="toy", topology={"name": None, "num_gpus": 2})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name in rows:
            read_placement(tmp_path / name)
    from placer.cli.common import warning_lines

    lines = warning_lines(caught)
    assert len(lines) == 1
    assert lines[0].startswith(f"{tmp_path / 'a.json'}: GPU 0 holds 2 replicas of expert 0")
    assert lines[0].endswith(f" (and the same for {tmp_path / 'b.json'})")


def test_duplicates_forced_by_the_replica_counts_are_said_to_be_forced():
    """5 replicas of expert 0 on 4 GPUs: whatever the arrangement, a GPU holds two."""
    placement = Placement(np.array([[0, 0, 1, 0, 2, 0, 3, 0]]), np.array([3]), 4, 4)
    assert placement.forced_duplicates
    with pytest.warns(PlacerWarning) as said:
        placement.warn_duplicates("forced.json")
    assert str(said[0].message).startswith(
        "forced.json: GPU 0 holds 2 replicas of expert 0 in layer 3, forced by the replica"
        " counts (expert 0 of layer 3 has 5 replicas for 4 GPUs): ")
    with warnings.catch_warnings():  # said: the placement records it, and says it once
        warnings.simplefilter("error")
        placement.warn_duplicates("forced.json")
    assert placement.meta["duplicates"]["pairs"] == [[3, 0]]


# -- what a placement checks of itself ----------------------------------------------------------


@pytest.mark.parametrize(("rows", "message", "hint"), [
    ([[0, 1, 2, 3], [0, 1, 2]], "layer row 1 has 3 slots, row 0 has 4",
     "every row lists the expert of each slot: 2 GPUs x the same slots per GPU"),
    ([[0, 1, 2, 3, 0]], "5 slots per layer do not split evenly over 2 GPUs",
     "engines need the same number of slots on every GPU: a row lists 2 GPUs x S slots per GPU"),
    ([[0, 1, 2, "a"]], "physical_to_logical holds 'a', not an expert id",
     "each slot holds the integer id of the logical expert it serves"),
    ([[0, 1.5, 2, 3]], "physical_to_logical holds 1.5, not an expert id",
     "each slot holds the integer id of the logical expert it serves"),
])
def test_a_row_of_the_wrong_length_or_content_is_a_placement_error(rows, message, hint):
    layers = np.arange(len(rows))
    with pytest.raises(PlacementError) as info:
        Placement(rows, layers, 4, 2)
    assert info.value.message == message
    assert info.value.hint == hint


def test_a_reader_that_keeps_one_slot_per_expert_refuses_a_duplicate():
    placement = Placement(np.array([[0, 1, 2, 3, 0, 1], [0, 0, 1, 2, 3, 3]]),
                          np.array([3, 4]), 4, 2)
    with pytest.raises(PlacementError) as info:
        placement.check_distinct("vLLM-Ascend's expert map keeps one slot per expert on a GPU",
                                 hint="plan with `solver` eplb-valid")
    assert info.value.message == (
        "GPU 0 holds expert 0 twice in layer 4 (2 (layer, GPU) pairs in all); vLLM-Ascend's"
        " expert map keeps one slot per expert on a GPU")
    assert info.value.hint == "plan with `solver` eplb-valid"
    Placement(np.array([[0, 1, 2, 3]]), np.array([0]), 4, 2).check_distinct("x", hint="y")
