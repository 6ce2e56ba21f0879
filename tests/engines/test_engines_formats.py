"""Engine placement formats: round trips, exact layouts, layer axes, bad files."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placer.engines import (
    engine_names,
    eplb_npz,
    read_engine,
    sglang,
    sniff_engine,
    trtllm,
    vllm,
    vllm_ascend,
    write_engine,
)
from placer.errors import EngineFormatError, PlacerWarning, UsageError
from placer.placement import Placement


@dataclass(frozen=True)
class ToyModel:
    """What the engine formats read from a ModelSpec, for small hand-checked cases."""

    name: str
    num_hidden_layers: int
    moe_layer_ids: tuple[int, ...]
    num_experts: int
    mtp_layer_ids: tuple[int, ...] = ()

    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layer_ids)


@pytest.fixture
def toy() -> ToyModel:
    """5 hidden layers of which 1, 2 and 4 are MoE (0 and 3 dense), 4 experts each."""
    return ToyModel("toy", num_hidden_layers=5, moe_layer_ids=(1, 2, 4), num_experts=4)


@pytest.fixture
def plan(toy: ToyModel) -> Placement:
    """2 GPUs x 3 slots over the toy's MoE layers; experts 0 and 3 replicated in layer 1."""
    return Placement(
        physical_to_logical=np.array(
            [[0, 1, 3, 2, 3, 0], [1, 0, 2, 3, 2, 1], [2, 3, 1, 0, 1, 3]]
        ),
        layer_ids=np.array([1, 2, 4]),
        num_experts=4,
        num_gpus=2,
    )


def _same(a: Placement, b: Placement) -> None:
    np.testing.assert_array_equal(a.physical_to_logical, b.physical_to_logical)
    np.testing.assert_array_equal(a.layer_ids, b.layer_ids)
    assert (a.num_experts, a.num_gpus) == (b.num_experts, b.num_gpus)


SUFFIX = {"sglang": ".json", "trtllm": ".yaml", "vllm": ".json", "vllm-ascend": ".json",
          "eplb": ".npz"}


# -- round trips -----------------------------------------------------------------


def test_every_engine_is_registered() -> None:
    assert engine_names() == ["eplb", "sglang", "trtllm", "vllm", "vllm-ascend"]


@pytest.mark.parametrize("fmt", ["sglang", "trtllm", "vllm", "vllm-ascend", "eplb"])
def test_round_trip_is_identical(fmt: str, plan: Placement, toy: ToyModel, tmp_path: Path) -> None:
    path = tmp_path / f"plan{SUFFIX[fmt]}"
    hints = write_engine(plan, fmt, path, model=toy)
    assert hints and all(isinstance(h, str) for h in hints)
    assert sniff_engine(path) == fmt
    back = read_engine(path, fmt, model=toy, num_gpus=2)
    _same(plan, back)
    assert back.meta["engine"]


@pytest.mark.parametrize("fmt", ["sglang", "trtllm", "vllm", "vllm-ascend", "eplb"])
def test_rows_are_reordered_to_the_models_layer_order(
    fmt: str, plan: Placement, toy: ToyModel, tmp_path: Path
) -> None:
    shuffled = Placement(plan.physical_to_logical[[2, 0, 1]], np.array([4, 1, 2]), 4, 2)
    path = tmp_path / f"plan{SUFFIX[fmt]}"
    write_engine(shuffled, fmt, path, model=toy)
    _same(plan, read_engine(path, fmt, model=toy, num_gpus=2))


@st.composite
def placements(draw: st.DrawFn) -> tuple[Placement, ToyModel]:
    """A random valid placement and a model whose MoE layers it covers."""
    num_experts = draw(st.integers(1, 6))
    num_gpus = draw(st.integers(1, 4))
    slots = draw(st.integers(max(1, -(-num_experts // num_gpus)), num_experts))
    hidden = draw(st.integers(1, 5))
    moe = sorted(draw(st.sets(st.integers(0, hidden - 1), min_size=1)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rows = []
    for _ in moe:
        # Every expert once, then fill each GPU with experts it lacks.
        order = rng.permutation(num_experts).tolist()
        gpus: list[list[int]] = [[] for _ in range(num_gpus)]
        for i, e in enumerate(order):
            gpus[i % num_gpus].append(e)
        for g in gpus:
            spare = [e for e in rng.permutation(num_experts).tolist() if e not in g]
            g.extend(spare[: slots - len(g)])
        rows.append([e for g in gpus for e in g])
    placement = Placement(np.array(rows), np.array(moe), num_experts, num_gpus)
    return placement, ToyModel("random", hidden, tuple(moe), num_experts)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=placements(), fmt=st.sampled_from(["sglang", "trtllm", "vllm", "vllm-ascend", "eplb"]))
def test_round_trip_any_placement(
    case: tuple[Placement, ToyModel], fmt: str, tmp_path: Path
) -> None:
    placement, model = case
    path = tmp_path / f"any{SUFFIX[fmt]}"
    write_engine(placement, fmt, path, model=model)
    _same(placement, read_engine(path, fmt, model=model, num_gpus=placement.num_gpus))


# -- exact layouts and layer axes ----------------------------------------------------


def test_sglang_rows_are_hidden_layers_with_trivial_dense_rows(
    plan: Placement, toy: ToyModel, tmp_path: Path
) -> None:
    path = tmp_path / "sglang.json"
    hints = write_engine(plan, "sglang", path, model=toy)
    doc = json.loads(path.read_text())
    assert list(doc) == ["physical_to_logical_map"]
    rows = doc["physical_to_logical_map"]
    assert len(rows) == toy.num_hidden_layers
    assert rows[0] == rows[3] == [0, 1, 2, 3, 0, 1]  # SGLang's trivial arange(P) % E
    assert rows[1] == [0, 1, 3, 2, 3, 0] and rows[4] == [2, 3, 1, 0, 1, 3]
    assert hints[0] == (
        f"--tp-size 2 --ep-size 2 --moe-a2a-backend deepep --init-expert-location {path}"
        " --ep-num-redundant-experts 2"
    )


def test_trtllm_keys_are_absolute_moe_layer_ids(
    plan: Placement, toy: ToyModel, tmp_path: Path
) -> None:
    path = tmp_path / "lb.yaml"
    hints = write_engine(plan, "trtllm", path, model=toy)
    text = path.read_text()
    assert text == (
        "num_slots: 6\n"
        "initial_global_assignments:\n"
        "  1: [0, 1, 3, 2, 3, 0]\n"
        "  2: [1, 0, 2, 3, 2, 1]\n"
        "  4: [2, 3, 1, 0, 1, 3]\n"
        "layer_updates_per_iter: 0\n"
    )
    doc = yaml.safe_load(text)
    assert list(doc) == ["num_slots", "initial_global_assignments", "layer_updates_per_iter"]
    assert f"  load_balancer: {path}" in hints


def test_vllm_rows_are_moe_layers_and_marked_experimental(
    plan: Placement, toy: ToyModel, tmp_path: Path
) -> None:
    path = tmp_path / "vllm.json"
    hints = write_engine(plan, "vllm", path, model=toy)
    assert json.loads(path.read_text()) == plan.physical_to_logical.tolist()
    assert hints[0].startswith("# experimental:")
    assert vllm.FORMAT.experimental


def test_vllm_reads_one_map_shared_by_all_layers(toy: ToyModel, tmp_path: Path) -> None:
    """The proposal also accepts a single flat list used for every MoE layer."""
    path = tmp_path / "flat.json"
    path.write_text("[0, 1, 2, 3, 0, 1]")
    back = read_engine(path, "vllm", model=toy, num_gpus=2)
    assert back.physical_to_logical.tolist() == [[0, 1, 2, 3, 0, 1]] * 3


def test_vllm_ascend_layout(plan: Placement, toy: ToyModel, tmp_path: Path) -> None:
    path = tmp_path / "ascend.json"
    write_engine(plan, "vllm-ascend", path, model=toy)
    doc = json.loads(path.read_text())
    assert list(doc) == ["moe_layer_count", "layer_list"]
    assert doc["moe_layer_count"] == 3
    first = doc["layer_list"][0]
    assert list(first) == ["layer_id", "device_count", "device_list"]
    assert [layer["layer_id"] for layer in doc["layer_list"]] == [0, 1, 2]  # MoE position
    assert first["device_list"] == [
        {"device_id": 0, "device_expert": [0, 1, 3]},
        {"device_id": 1, "device_expert": [2, 3, 0]},
    ]


def test_eplb_arrays(plan: Placement, toy: ToyModel, tmp_path: Path) -> None:
    path = tmp_path / "eplb.npz"
    write_engine(plan, "eplb", path, model=toy)
    with np.load(path) as data:
        assert sorted(data.files) == ["log2phy", "logcnt", "phy2log"]
        np.testing.assert_array_equal(data["phy2log"], plan.physical_to_logical)
        assert data["log2phy"].shape == (3, 4, 3)  # X = R + 1, as EPLB sizes it
        np.testing.assert_array_equal(data["log2phy"][0, 0], [0, 5, -1])
        np.testing.assert_array_equal(data["logcnt"][0], [2, 1, 1, 2])


# -- placements that do not fit the model ------------------------------------------


def test_write_refuses_another_models_expert_count(
    plan: Placement, toy: ToyModel, tmp_path: Path
) -> None:
    other = ToyModel("big", 5, (1, 2, 4), 8)
    with pytest.raises(EngineFormatError, match="placement has 4 experts per layer but big has 8"):
        write_engine(plan, "sglang", tmp_path / "x.json", model=other)
    assert not (tmp_path / "x.json").exists()


def test_write_refuses_missing_and_foreign_layers(plan: Placement, tmp_path: Path) -> None:
    wider = ToyModel("wider", 6, (1, 2, 4, 5), 4)
    with pytest.raises(EngineFormatError, match=r"TensorRT-LLM needs a placement for every MoE"
                       r" layer of wider; 1 missing \(5\)"):
        write_engine(plan, "trtllm", tmp_path / "x.yaml", model=wider)
    narrower = ToyModel("narrow", 5, (1, 2), 4)
    with pytest.raises(EngineFormatError, match="layer 4 of the placement is not a MoE layer"):
        write_engine(plan, "trtllm", tmp_path / "x.yaml", model=narrower)


def test_unknown_format_lists_the_choices(plan: Placement, toy: ToyModel, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="unknown engine format 'deepspeed'") as info:
        write_engine(plan, "deepspeed", tmp_path / "x", model=toy)
    assert info.value.hint == "choose one of: eplb, sglang, trtllm, vllm, vllm-ascend"


# -- bad engine files --------------------------------------------------------------


def _json(tmp_path: Path, doc: object, name: str = "bad.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def _sglang_rows(toy: ToyModel) -> list[list[int]]:
    return [[0, 1, 2, 3, 0, 1]] * toy.num_hidden_layers


def test_sglang_extra_key(toy: ToyModel, tmp_path: Path) -> None:
    path = _json(tmp_path, {"physical_to_logical_map": _sglang_rows(toy), "ep_size": 2})
    with pytest.raises(EngineFormatError) as info:
        read_engine(path, "sglang", model=toy, num_gpus=2)
    assert str(info.value) == (
        f"{path}: unexpected key 'ep_size': SGLang passes the file as keyword arguments,"
        " so physical_to_logical_map must be its only key"
    )


def test_sglang_rows_must_cover_every_hidden_layer(toy: ToyModel, tmp_path: Path) -> None:
    path = _json(tmp_path, {"physical_to_logical_map": _sglang_rows(toy)[:3]})
    with pytest.raises(EngineFormatError, match="has 3 rows but SGLang needs one per hidden layer"
                       r" \(5 for toy, dense layers included\)"):
        read_engine(path, "sglang", model=toy, num_gpus=2)


def test_sglang_row_of_wrong_length(toy: ToyModel, tmp_path: Path) -> None:
    rows = _sglang_rows(toy)
    rows[2] = [0, 1, 2, 3]
    path = _json(tmp_path, {"physical_to_logical_map": rows})
    with pytest.raises(EngineFormatError) as info:
        read_engine(path, "sglang", model=toy, num_gpus=2)
    assert str(info.value) == f"{path}: physical_to_logical_map[2]: 4 slots where SGLang expects 6"


def test_sglang_missing_expert(toy: ToyModel, tmp_path: Path) -> None:
    rows = _sglang_rows(toy)
    rows[4] = [0, 1, 2, 0, 1, 2]
    path = _json(tmp_path, {"physical_to_logical_map": rows})
    with pytest.raises(EngineFormatError, match=r"\[4\]: expert 3 has no slot"):
        read_engine(path, "sglang", model=toy, num_gpus=2)


def test_sglang_needs_the_gpu_count(toy: ToyModel, tmp_path: Path) -> None:
    path = _json(tmp_path, {"physical_to_logical_map": _sglang_rows(toy)})
    with pytest.raises(UsageError, match="files do not record the number of GPUs") as info:
        read_engine(path, "sglang", model=toy)
    assert info.value.where == "ep_size"
    with pytest.raises(EngineFormatError, match="6 slots per layer do not split over 4 GPUs"):
        read_engine(path, "sglang", model=toy, num_gpus=4)


def test_expert_id_out_of_range(toy: ToyModel, tmp_path: Path) -> None:
    path = _json(tmp_path, [[0, 1, 2, 3, 0, 9]] * 3)
    with pytest.raises(EngineFormatError, match=r"\[0\]: slot 5 holds expert 9, outside \[0, 4\)"):
        read_engine(path, "vllm", model=toy, num_gpus=2)


# -- two replicas of one expert on one GPU (DeepSeek's EPLB makes them) --------------------


@pytest.fixture
def duplicated(toy: ToyModel) -> Placement:
    """The toy plan with expert 0 twice on GPU 0 in layer 1 and expert 1 twice on GPU 1 in
    layer 4."""
    return Placement(
        physical_to_logical=np.array(
            [[0, 0, 1, 2, 3, 0], [1, 0, 2, 3, 2, 1], [2, 3, 0, 1, 1, 3]]
        ),
        layer_ids=np.array([1, 2, 4]),
        num_experts=4,
        num_gpus=2,
    )


@pytest.mark.parametrize("fmt", ["sglang", "trtllm", "vllm", "eplb"])
def test_duplicates_round_trip_with_a_warning(
    fmt: str, duplicated: Placement, toy: ToyModel, tmp_path: Path
) -> None:
    """SGLang, TensorRT-LLM, vLLM and EPLB's arrays hold them: written, read back with a
    warning naming the first one."""
    path = tmp_path / f"dup{SUFFIX[fmt]}"
    write_engine(duplicated, fmt, path, model=toy)
    with pytest.warns(PlacerWarning) as caught:
        back = read_engine(path, fmt, model=toy, num_gpus=2)
    _same(duplicated, back)
    messages = [str(w.message) for w in caught if issubclass(w.category, PlacerWarning)]
    assert messages == [
        f"{path}: GPU 0 holds 2 replicas of expert 0 in layer 1 (and 1 more (layer, GPU)"
        " pairs): a second replica on one GPU takes a slot of memory but adds no dispatch"
        " bandwidth; SGLang, TensorRT-LLM and vLLM load such placements, vLLM-Ascend's"
        " expert map cannot express them"
    ]


def test_eplb_arrays_of_a_duplicate_list_both_slots(
    duplicated: Placement, toy: ToyModel
) -> None:
    arrays = eplb_npz.to_arrays(duplicated)
    assert arrays["logcnt"][0].tolist() == [3, 1, 1, 1]
    assert arrays["log2phy"][0, 0].tolist() == [0, 1, 5]


def test_vllm_ascend_refuses_duplicates_on_write(
    duplicated: Placement, toy: ToyModel, tmp_path: Path
) -> None:
    path = tmp_path / "map.json"
    with pytest.raises(EngineFormatError) as info:
        write_engine(duplicated, "vllm-ascend", path, model=toy)
    assert str(info.value) == (
        "device 0 holds expert 0 twice in layer 1 (2 (layer, device) pairs in all);"
        " vLLM-Ascend's expert map keeps one slot per expert on a device"
    )
    assert "`solver` eplb-valid" in (info.value.hint or "")
    assert not path.exists()


def test_vllm_ascend_map_with_a_duplicate_reads_with_a_warning(
    duplicated: Placement, toy: ToyModel, tmp_path: Path
) -> None:
    path = _json(tmp_path, vllm_ascend.to_document(duplicated))
    with pytest.warns(PlacerWarning, match="vLLM-Ascend's expert map cannot express them"):
        back = read_engine(path, "vllm-ascend", model=toy)
    _same(duplicated, back)


def _trtllm(tmp_path: Path, doc: dict[str, object]) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _assignments() -> dict[int, list[int]]:
    return {1: [0, 1, 2, 3, 0, 1], 2: [0, 1, 2, 3, 0, 1], 4: [0, 1, 2, 3, 0, 1]}


def test_trtllm_slots_not_divisible_by_ep_size(toy: ToyModel, tmp_path: Path) -> None:
    path = _trtllm(tmp_path, {"num_slots": 6, "initial_global_assignments": _assignments(),
                              "layer_updates_per_iter": 0})
    with pytest.raises(EngineFormatError) as info:
        read_engine(path, "trtllm", model=toy, num_gpus=4)
    assert str(info.value) == (
        f"{path}: num_slots: num_slots 6 is not divisible by ep_size 4"
        " (TensorRT-LLM requires num_slots % ep_size == 0)"
    )


def test_trtllm_extra_key(toy: ToyModel, tmp_path: Path) -> None:
    path = _trtllm(tmp_path, {"num_slots": 6, "initial_global_assignments": _assignments(),
                              "layer_updates_per_iter": 0, "ep_size": 2})
    with pytest.raises(EngineFormatError, match="unexpected key 'ep_size': TensorRT-LLM's"
                       " MoeLoadBalancerConfig takes exactly num_slots"):
        read_engine(path, "trtllm", model=toy, num_gpus=2)


def test_trtllm_keys_must_be_absolute_moe_layers(toy: ToyModel, tmp_path: Path) -> None:
    """Keys 0, 1, 2 (MoE positions) instead of 1, 2, 4 (absolute ids) are caught."""
    positions = {i: row for i, row in enumerate(_assignments().values())}
    path = _trtllm(tmp_path, {"num_slots": 6, "initial_global_assignments": positions,
                              "layer_updates_per_iter": 0})
    with pytest.raises(EngineFormatError, match="layer 0 is not a MoE layer of toy; TensorRT-LLM"
                       r" keys are absolute MoE layer ids \(1..4\)"):
        read_engine(path, "trtllm", model=toy, num_gpus=2)


def test_trtllm_missing_layer_and_wrong_length(toy: ToyModel, tmp_path: Path) -> None:
    few = _assignments()
    del few[2]
    path = _trtllm(tmp_path, {"num_slots": 6, "initial_global_assignments": few,
                              "layer_updates_per_iter": 0})
    with pytest.raises(EngineFormatError, match="MoE layer 2 has no assignment"):
        read_engine(path, "trtllm", model=toy, num_gpus=2)
    short = _assignments()
    short[4] = [0, 1, 2, 3]
    path = _trtllm(tmp_path, {"num_slots": 6, "initial_global_assignments": short,
                              "layer_updates_per_iter": 0})
    with pytest.raises(EngineFormatError, match=r"initial_global_assignments\[4\]: 4 slots where"
                       r" TensorRT-LLM \(num_slots\) expects 6"):
        read_engine(path, "trtllm", model=toy, num_gpus=2)


def test_trtllm_online_updates_warn(toy: ToyModel, tmp_path: Path) -> None:
    path = _trtllm(tmp_path, {"num_slots": 6, "initial_global_assignments": _assignments(),
                              "layer_updates_per_iter": 2})
    with pytest.warns(UserWarning, match="only the initial placement"):
        read_engine(path, "trtllm", model=toy, num_gpus=2)


def test_vllm_ascend_device_count_mismatch(plan: Placement, toy: ToyModel, tmp_path: Path) -> None:
    doc = vllm_ascend.to_document(plan)
    doc["layer_list"][1]["device_count"] = 3
    path = _json(tmp_path, doc)
    with pytest.raises(EngineFormatError) as info:
        read_engine(path, "vllm-ascend", model=toy)
    assert str(info.value) == (
        f"{path}: layer_list[1]: device_count is 3 but device_list has 2 devices"
    )


def test_vllm_ascend_uneven_devices_and_layer_ids(
    plan: Placement, toy: ToyModel, tmp_path: Path
) -> None:
    doc = vllm_ascend.to_document(plan)
    doc["layer_list"][0]["device_list"][1]["device_expert"] = [2, 3]
    with pytest.raises(EngineFormatError, match="2 experts where device 0 of layer 0 has 3"):
        read_engine(_json(tmp_path, doc), "vllm-ascend", model=toy)
    doc = vllm_ascend.to_document(plan)
    doc["layer_list"][2]["layer_id"] = 4
    with pytest.raises(EngineFormatError, match="layer_id is 4 but vLLM-Ascend indexes layers by"
                       " position: expected 2"):
        read_engine(_json(tmp_path, doc), "vllm-ascend", model=toy)


def test_vllm_ascend_gpu_count_is_checked(plan: Placement, toy: ToyModel, tmp_path: Path) -> None:
    path = _json(tmp_path, vllm_ascend.to_document(plan))
    assert read_engine(path, "vllm-ascend", model=toy).num_gpus == 2
    with pytest.raises(EngineFormatError, match="the map has 2 devices but `ep_size` is 3"):
        read_engine(path, "vllm-ascend", model=toy, num_gpus=3)


def test_eplb_inconsistent_arrays(plan: Placement, toy: ToyModel, tmp_path: Path) -> None:
    arrays = eplb_npz.to_arrays(plan)
    arrays["logcnt"] = arrays["logcnt"].copy()
    arrays["logcnt"][1, 2] = 3
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(EngineFormatError, match=r"logcnt\[1\]: logcnt says expert 2 has 3"
                       " replicas but phy2log gives it 2"):
        read_engine(path, "eplb", model=toy, num_gpus=2)
    np.savez(path, phy2log=arrays["phy2log"], logcnt=arrays["logcnt"])
    with pytest.raises(EngineFormatError, match="missing array 'log2phy': an EPLB file holds"
                       " exactly phy2log, log2phy and logcnt"):
        read_engine(path, "eplb", model=toy, num_gpus=2)


def test_invalid_json_reports_the_line(toy: ToyModel, tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"physical_to_logical_map": [\n[0, 1,\n')
    with pytest.raises(EngineFormatError, match="invalid JSON") as info:
        read_engine(path, "sglang", model=toy, num_gpus=2)
    assert info.value.where == f"{path}:3"


def test_documents_match_the_modules(plan: Placement, toy: ToyModel) -> None:
    """The pure document builders agree with what the writers put in files."""
    assert sglang.to_document(plan, toy)["physical_to_logical_map"][2] == [1, 0, 2, 3, 2, 1]
    assert trtllm.to_document(plan)["initial_global_assignments"][4] == [2, 3, 1, 0, 1, 3]
