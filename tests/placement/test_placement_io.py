"""Placement JSON v1: round trips, the shipped schema, and bad files with their messages."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placer.errors import PlacementError, PlacerWarning
from placer.model import ModelSpec, load_model
from placer.placement import Placement
from placer.placement.document import (
    placement_from_dict,
    placement_to_dict,
    read_placement,
    schema,
    schema_errors,
    write_placement,
)
from placer.problem import SolveResult


@pytest.fixture
def two_layers() -> Placement:
    """4 experts on 2 GPUs x 3 slots, MoE layers 3 and 4."""
    return Placement(
        np.array([[0, 1, 3, 2, 3, 0], [0, 1, 2, 3, 1, 0]]), np.array([3, 4]), 4, 2
    )


@pytest.fixture
def good_doc(two_layers) -> dict:
    """A valid v1 document of ``two_layers`` with every section filled."""
    return placement_to_dict(
        two_layers, model_name="toy", top_k=2,
        topology={"name": "pair", "num_gpus": 2, "num_nodes": 1},
        solver={"name": "eplb", "status": "HEURISTIC", "objective": 13.0, "seconds": 0.01},
        metrics={"hot_shard_ratio_median": 1.02},
    )


def _write(tmp_path: Path, doc) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc, indent=2))
    return path


def test_written_file_reads_back_equal_with_meta(tmp_path, two_layers):
    result = SolveResult(
        placement=two_layers, solver="eplb", status="HEURISTIC", objective=13.0,
        objective_unit="tokens", seconds=0.5, hot_shard=1.25,
        details={"policy": "global", "hottest_gpu_load": np.array([13.0, 12.0])},
    )
    path = write_placement(
        tmp_path / "out" / "plan.json", two_layers, model_name="toy", top_k=2,
        topology={"name": "pair", "num_gpus": 2, "num_nodes": 1}, solver=result.record(),
        metrics={"hot_shard_ratio_median": np.float64(1.25), "nan": float("nan")},
    )
    back = read_placement(path)
    assert back == two_layers
    assert back.meta["model"] == {"name": "toy", "num_experts": 4, "top_k": 2}
    assert back.meta["topology"] == {"name": "pair", "num_gpus": 2, "num_nodes": 1}
    assert back.meta["solver"] == {
        "name": "eplb", "status": "HEURISTIC", "objective": 13.0, "objective_unit": "tokens",
        "bound": None, "hot_shard": 1.25, "baseline": None, "seconds": 0.5, "policy": "global",
    }
    assert back.meta["metrics"] == {"hot_shard_ratio_median": 1.25, "nan": None}
    assert back.meta["source"] == str(path)


def test_written_file_has_one_layer_per_line(tmp_path, two_layers):
    path = write_placement(tmp_path / "plan.json", two_layers)
    lines = path.read_text().splitlines()
    assert '    {"layer": 3, "physical_to_logical": [0, 1, 3, 2, 3, 0]},' in lines
    assert '    {"layer": 4, "physical_to_logical": [0, 1, 2, 3, 1, 0]}' in lines


def test_writer_output_validates_against_the_shipped_schema(tmp_path, good_doc, two_layers):
    jsonschema.Draft202012Validator.check_schema(schema())
    jsonschema.validate(good_doc, schema())
    path = write_placement(tmp_path / "plan.json", two_layers)  # minimal: no solver, metrics
    jsonschema.validate(json.loads(path.read_text()), schema())


def test_rewriting_keeps_meta(tmp_path, good_doc):
    first = _write(tmp_path, good_doc)
    again = write_placement(tmp_path / "again.json", read_placement(first))
    assert json.loads(again.read_text()) == good_doc


def test_topology_with_other_gpu_count_is_refused_and_nothing_written(tmp_path, two_layers):
    path = tmp_path / "plan.json"
    path.write_text("old")
    with pytest.raises(PlacementError) as info:
        write_placement(path, two_layers, topology={"name": "big", "num_gpus": 8})
    assert str(info.value) == "the placement spans 2 GPUs but topology 'big' has 8"
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


@st.composite
def placements(draw) -> Placement:
    """Random valid placements: each layer a shuffled multiset with every expert once."""
    num_gpus = draw(st.integers(1, 4))
    num_experts = draw(st.integers(num_gpus, 10))
    slots = draw(st.integers(-(-num_experts // num_gpus), num_experts))
    num_layers = draw(st.integers(1, 3))
    layer_ids = draw(
        st.lists(st.integers(0, 90), min_size=num_layers, max_size=num_layers, unique=True)
    )
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(num_layers):
        # deal a random order of experts column-major: copies of one expert land on
        # different GPUs because each expert appears at most G times, consecutively
        counts = np.ones(num_experts, dtype=int)
        for _ in range(num_gpus * slots - num_experts):
            counts[rng.choice(np.flatnonzero(counts < num_gpus))] += 1
        order = rng.permutation(num_experts)
        items = np.repeat(order, counts[order])
        grid = np.empty((num_gpus, slots), dtype=int)
        for j, expert in enumerate(items):
            grid[j % num_gpus, j // num_gpus] = expert
        rows.append(grid.ravel())
    return Placement(np.array(rows), np.array(layer_ids), num_experts, num_gpus)


_VALIDATOR = jsonschema.Draft202012Validator(schema())


@given(placements(), st.sampled_from([None, "m"]), st.sampled_from([None, 8]))
@settings(max_examples=50, deadline=None)
def test_round_trip_through_dict_and_schema(placement, name, top_k):
    doc = placement_to_dict(placement, model_name=name, top_k=top_k)
    assert schema_errors(doc) == []
    _VALIDATOR.validate(doc)
    back = placement_from_dict(json.loads(json.dumps(doc)))
    assert back == placement
    assert placement_to_dict(back) == doc


# -- bad files ------------------------------------------------------------------------------


def test_bad_json_names_the_line(tmp_path):
    text = '{\n  "format": "placer-placement",\n  "version": 1\n  "model": {}\n}\n'
    path = _write(tmp_path, text)
    with pytest.raises(PlacementError) as info:
        read_placement(path)
    assert str(info.value) == f"{path}:4: invalid JSON: Expecting ',' delimiter (column 3)"


def test_missing_file(tmp_path):
    path = tmp_path / "nope.json"
    with pytest.raises(PlacementError) as info:
        read_placement(path)
    assert str(info.value) == f"{path}: file not found"
    assert info.value.hint == "check the path of the placement file"


def _mutated(doc: dict, change) -> dict:
    doc = json.loads(json.dumps(doc))
    change(doc)
    return doc


@pytest.mark.parametrize(
    "change,where,message",
    [
        (lambda d: d.update(format="sglang"), "format",
         "unknown format 'sglang', expected 'placer-placement'"),
        (lambda d: d.update(version=2), "version",
         "unsupported version 2; this placer reads version 1"),
        (lambda d: d.pop("layers"), "layers", "required field is missing"),
        (lambda d: d.pop("format"), "format", "required field is missing"),
        (lambda d: d["model"].update(num_experts="4"), "model.num_experts",
         'expected integer, got a string "4"'),
        (lambda d: d["layers"][1]["physical_to_logical"].__setitem__(2, 1.5),
         "layers[1].physical_to_logical[2]", "expected integer, got a number 1.5"),
        (lambda d: d["layers"][0].update(layer=-1), "layers[0].layer",
         "expected a value >= 0, got -1"),
        (lambda d: d.update(layers=[]), "layers", "expected at least 1 items, got 0"),
        (lambda d: d["layers"][1]["physical_to_logical"].pop(), "layers[1].physical_to_logical",
         "5 slots, expected num_physical_experts = 6"),
        (lambda d: d["layers"][1].update(physical_to_logical=[0, 1, 2, 2, 1, 0]),
         "layers[1].physical_to_logical", "expert 3 of layer 4 has no replica"),
        (lambda d: d["layers"][0].update(physical_to_logical=[0, 1, 4, 2, 3, 0]),
         "layers[0].physical_to_logical", "slot 2 of layer 3 holds expert 4, outside [0, 4)"),
        (lambda d: d["layers"][1].update(layer=3), "layers[1].layer", "layer 3 repeats layers[0]"),
        (lambda d: d.update(slots_per_gpu=2), "num_physical_experts",
         "2 GPUs x 2 slots per GPU = 4, not num_physical_experts = 6"),
        (lambda d: d["solver"].pop("status"), "solver.status", "required field is missing"),
    ],
)
def test_bad_documents_name_file_and_field(tmp_path, good_doc, change, where, message):
    path = _write(tmp_path, _mutated(good_doc, change))
    with pytest.raises(PlacementError) as info:
        read_placement(path)
    assert str(info.value) == f"{path}: {where}: {message}"


def test_builtin_validator_agrees_with_jsonschema_on_schema_errors(good_doc):
    """Every schema-level mutation above is also rejected by jsonschema itself."""
    for change in (
        lambda d: d.pop("layers"),
        lambda d: d["model"].update(num_experts="4"),
        lambda d: d["layers"][0].update(layer=-1),
        lambda d: d.update(layers=[]),
        lambda d: d.update(version=2),
        lambda d: d["solver"].pop("status"),
        lambda d: d.update(format="sglang"),
    ):
        bad = _mutated(good_doc, change)
        assert schema_errors(bad)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema())


def test_document_that_is_not_an_object(tmp_path):
    path = _write(tmp_path, "[1, 2]")
    with pytest.raises(PlacementError) as info:
        read_placement(path)
    assert str(info.value) == f"{path}: expected object, got an array"


def _toy_model(moe_layer_ids: tuple[int, ...]) -> ModelSpec:
    """A four-expert model with the given MoE layers (a preset, renamed and reshaped)."""
    return dataclasses.replace(load_model("mixtral-8x7b"), name="toy", num_experts=4,
                               top_k=2, moe_layer_ids=moe_layer_ids)


def test_read_checks_the_model_when_given(tmp_path, good_doc):
    path = _write(tmp_path, good_doc)
    model = _toy_model(moe_layer_ids=(1, 2, 3))
    with pytest.raises(PlacementError) as info:
        read_placement(path, model=model)
    assert str(info.value) == f"{path}: layer 4 of the placement is not a MoE layer of toy"
    ok = _toy_model(moe_layer_ids=(3, 4))
    assert read_placement(path, model=ok).layer_ids.tolist() == [3, 4]


def test_two_replicas_on_one_gpu_read_with_a_warning(tmp_path, good_doc):
    """DeepSeek's EPLB (and the eplb solver) put an expert twice on a GPU: accepted."""
    doc = _mutated(
        good_doc, lambda d: d["layers"][0].update(physical_to_logical=[0, 0, 1, 2, 3, 1])
    )
    path = _write(tmp_path, doc)
    with pytest.warns(PlacerWarning) as caught:
        placement = read_placement(path)
    assert str(caught[0].message).startswith(
        f"{path}: GPU 0 holds 2 replicas of expert 0 in layer 3: "
    )
    assert placement.physical_to_logical[0].tolist() == [0, 0, 1, 2, 3, 1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_placement(path, warn_duplicates=False)
    # and it is written back as read
    out = tmp_path / "again.json"
    write_placement(out, placement)
    assert json.loads(out.read_text())["layers"][0]["physical_to_logical"] == [0, 0, 1, 2, 3, 1]
