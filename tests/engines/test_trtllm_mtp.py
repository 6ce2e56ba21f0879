"""TensorRT-LLM with multi-token prediction: DeepSeek-V3's MTP layer 61 through statistics,
plan, import and export; and the architectures whose load balancer TensorRT-LLM ignores."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors_fixture import write_safetensors
from typer.testing import CliRunner

from placer.cli.main import app
from placer.engines import read_engine, trtllm, write_engine
from placer.errors import EngineFormatError, TraceError
from placer.model import load_model, model_names
from placer.placement import Placement
from placer.placement.document import read_placement, write_placement
from placer.planning.build import ProblemSpec, build_problem
from placer.traces import read_routing

runner = CliRunner()

E, G, S = 256, 32, 9  # DeepSeek-V3 experts; 32 GPUs x 9 slots (32 redundant)
LAYERS = tuple(range(3, 62))  # MoE layers 3..60 and the MTP layer 61
PLAN = ["--model", "deepseek-v3", "--num-gpus", str(G), "--redundant", "32",
        "--solver", "eplb-valid"]


def _layer_load(layer: int, it: int, rank: int) -> np.ndarray:
    """``[E]`` counts: flat for the main layers; the MTP layer 61 leans on experts 0-15."""
    counts = np.full(E, 10 + rank + it % 3 + layer % 5, dtype=np.int64)
    if layer == 61:
        counts[:16] += 400
    return counts


@pytest.fixture
def mtp_statistics(tmp_path: Path) -> Path:
    """TensorRT-LLM expert statistics of DeepSeek-V3 served with MTP, load balancer off:
    2 ranks, iterations 100-103, keys ``{iter}_{layer}`` for layers 3..61."""
    folder = tmp_path / "expert_statistic"
    folder.mkdir()
    (folder / "meta_info.json").write_text(json.dumps({"num_experts": E,
                                                       "num_experts_per_token": 8}))
    for rank in range(2):
        write_safetensors(folder / f"rank{rank}.safetensors", {
            f"{it}_{layer}": _layer_load(layer, it, rank)
            for it in range(100, 104) for layer in LAYERS
        })
    return folder


#: The 32 redundant slots hold experts 128..159 (never a second copy on one GPU below).
REPLICAS = list(range(128, 160))


def _placement(layers: tuple[int, ...]) -> Placement:
    """Every expert once in order, then :data:`REPLICAS`: ``[layers, 288]``."""
    row = np.concatenate([np.arange(E), REPLICAS])
    return Placement(np.tile(row, (len(layers), 1)), np.array(layers), E, G)


def _load_balancer_yaml(path: Path, layers: tuple[int, ...]) -> Path:
    rows = {layer: [(e + layer) % E for e in range(E)] + REPLICAS for layer in layers}
    path.write_text(yaml.safe_dump({"num_slots": E + 32, "initial_global_assignments": rows,
                                    "layer_updates_per_iter": 0}))
    return path


# -- the model ------------------------------------------------------------------------


def test_presets_declare_their_mtp_layers() -> None:
    """DeepSeek-V3 / R1 ship one next-n layer, numbered after the 61 hidden layers."""
    v3 = load_model("deepseek-r1")
    assert v3.num_nextn_predict_layers == 1 and v3.mtp_layer_ids == (61,)
    assert v3.all_moe_layer_ids == LAYERS
    assert v3.moe_layer_ids == tuple(range(3, 61))  # engines' files and memory: unchanged
    others = [name for name in model_names() if name != "deepseek-v3"]
    assert all(load_model(name).mtp_layer_ids == () for name in others)


# -- plan -----------------------------------------------------------------------------


def test_statistics_recorded_with_mtp_hold_layer_61(mtp_statistics: Path) -> None:
    stats = read_routing(mtp_statistics).stats
    assert stats.layer_ids.tolist() == list(LAYERS)


def test_slot_statistics_map_back_through_the_mtp_key(tmp_path: Path) -> None:
    """Load balancer on: TensorRT-LLM counts slots, layer 61 included; the YAML next to
    the statistics (with key 61) maps them back to experts."""
    folder = tmp_path / "expert_statistic"
    folder.mkdir()
    (folder / "meta_info.json").write_text(json.dumps({"num_experts": E + 32,
                                                       "num_experts_per_token": 8}))
    write_safetensors(folder / "rank0.safetensors",
                 {f"100_{layer}": np.arange(1, E + 33) for layer in LAYERS})
    _load_balancer_yaml(folder / "lb.yaml", LAYERS)
    stats = read_routing(folder).stats
    assert stats.layer_ids.tolist() == list(LAYERS)
    # layer 61: expert 128 sits in slot (128 - 61) and in the first redundant slot (256)
    assert stats.load[0, -1, 128] == (128 - 61 + 1) + (256 + 1)


def test_plan_plans_the_mtp_layer_like_any_other(mtp_statistics: Path, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["plan", str(mtp_statistics), *PLAN, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "layers 3-61" in result.stdout
    plan = read_placement(out)
    assert plan.layer_ids.tolist() == list(LAYERS)
    mtp_counts = plan.replica_counts[-1]
    assert mtp_counts[:16].min() >= 2 and mtp_counts[16:].max() == 1  # its hot experts


def test_layer_61_needs_a_model_with_mtp(mtp_statistics: Path) -> None:
    no_mtp = replace(load_model("deepseek-v3"), num_nextn_predict_layers=0)
    with pytest.raises(TraceError) as info:
        build_problem(read_routing(mtp_statistics), ProblemSpec(model=no_mtp, num_gpus=G))
    assert info.value.message == (
        "trace layer 61 is not an MoE layer of deepseek-v3 (trace layers: 3-61)"
    )
    assert info.value.hint == (
        "deepseek-v3's MoE layers are 3-60; layer 61 is past the 61 hidden layers, as a"
        " multi-token-prediction (MTP) layer is: give a model with num_nextn_predict_layers"
        " (a model YAML or the checkpoint's config.json)"
    )


# -- export ---------------------------------------------------------------------------


def test_default_assignments_follow_tensorrt_llm() -> None:
    """Rank r's slot i holds (r * E // G + i) % E: 8 experts on 4 ranks x 3 slots."""
    assert trtllm.default_assignments(8, 4, 3) == [0, 1, 2, 2, 3, 4, 4, 5, 6, 6, 7, 0]
    assert trtllm.default_assignments(8, 4, 2) == list(range(8))
    for experts, gpus in ((256, 32), (128, 12), (384, 48), (7, 3)):
        slots = -(-experts // gpus)
        for extra in range(3):
            row = trtllm.default_assignments(experts, gpus, slots + extra)
            assert len(row) == gpus * (slots + extra) and set(row) == set(range(experts))


def test_export_writes_the_default_layout_for_an_unplanned_mtp_layer(tmp_path: Path) -> None:
    path = tmp_path / "lb.yaml"
    hints = write_engine(_placement(LAYERS[:-1]), "trtllm", path, model=load_model("deepseek-v3"))
    rows = yaml.safe_load(path.read_text())["initial_global_assignments"]
    assert list(rows) == list(LAYERS)
    assert rows[61] == trtllm.default_assignments(E, G, S)
    assert rows[61][:10] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 8]  # rank 1 starts at expert 8
    assert hints[-1] == (
        "# MTP layer 61 (used when serving with MTP): TensorRT-LLM's default layout"
        " (no statistics for it)"
    )


def test_a_planned_mtp_row_is_written_as_planned() -> None:
    plan = _placement(LAYERS)
    mtp_row = np.concatenate([np.arange(E)[::-1], REPLICAS])
    plan = Placement(np.vstack([plan.physical_to_logical[:-1], mtp_row]), plan.layer_ids, E, G)
    doc = trtllm.to_document(plan, (61,))
    assert doc["initial_global_assignments"][61] == mtp_row.tolist()


def test_plan_export_writes_the_planned_mtp_layer(mtp_statistics: Path, tmp_path: Path) -> None:
    out, lb = tmp_path / "plan.json", tmp_path / "lb.yaml"
    result = runner.invoke(app, ["plan", str(mtp_statistics), *PLAN, "-o", str(out),
                                 "--export", f"trtllm:{lb}"])
    assert result.exit_code == 0, result.output
    rows = yaml.safe_load(lb.read_text())["initial_global_assignments"]
    assert rows[61] == read_placement(out).physical_to_logical[-1].tolist()


# -- import ---------------------------------------------------------------------------


def test_import_reads_the_mtp_key(tmp_path: Path) -> None:
    lb = _load_balancer_yaml(tmp_path / "lb.yaml", LAYERS)
    out = tmp_path / "current.json"
    result = runner.invoke(app, ["import", str(lb), "-m", "deepseek-v3", "-g", str(G),
                                 "-o", str(out)])
    assert result.exit_code == 0, result.output
    current = read_placement(out)
    assert current.layer_ids.tolist() == list(LAYERS)
    assert current.physical_to_logical[-1, :3].tolist() == [61, 62, 63]


def test_the_mtp_key_is_optional(tmp_path: Path) -> None:
    """A file written for serving without MTP (keys 3..60) still reads."""
    lb = _load_balancer_yaml(tmp_path / "lb.yaml", LAYERS[:-1])
    plan = read_engine(lb, "trtllm", model=load_model("deepseek-v3"), num_gpus=G)
    assert plan.layer_ids.tolist() == list(LAYERS[:-1])


def test_key_61_for_a_model_without_mtp(tmp_path: Path) -> None:
    """Kimi K2 has 61 hidden layers (MoE 1..60) and no MTP module: key 61 is refused."""
    rows = {layer: list(range(384)) for layer in range(1, 62)}
    lb = tmp_path / "lb.yaml"
    lb.write_text(yaml.safe_dump({"num_slots": 384, "initial_global_assignments": rows,
                                  "layer_updates_per_iter": 0}))
    with pytest.raises(EngineFormatError) as info:
        read_engine(lb, "trtllm", model=load_model("kimi-k2"), num_gpus=8)
    assert str(info.value) == (
        f"{lb}: initial_global_assignments: layer 61 is not a MoE layer of kimi-k2;"
        " TensorRT-LLM keys are absolute MoE layer ids (1..60)"
    )
    assert info.value.hint == (
        "layer 61 follows kimi-k2's 61 hidden layers, as a multi-token-prediction (MTP) layer"
        " does: give a model with num_nextn_predict_layers (its config.json or a model YAML)"
    )


def test_round_trip_keeps_the_mtp_row(tmp_path: Path) -> None:
    lb = _load_balancer_yaml(tmp_path / "lb.yaml", LAYERS)
    model = load_model("deepseek-v3")
    plan = read_engine(lb, "trtllm", model=model, num_gpus=G)
    assert trtllm.to_document(plan, model.mtp_layer_ids) == yaml.safe_load(lb.read_text())


# -- architectures whose load balancer TensorRT-LLM ignores ----------------------------


def _export(tmp_path: Path, model: str, layers: tuple[int, ...], experts: int, gpus: int):
    row = np.arange(experts)
    plan = tmp_path / f"{model}.json"
    write_placement(plan, Placement(np.tile(row, (len(layers), 1)), np.array(layers), experts,
                                    gpus), model_name=model, top_k=4)
    return runner.invoke(app, ["export", str(plan), "-f", "trtllm", "-o",
                               str(tmp_path / f"{model}.yaml")])


def test_export_warns_for_gpt_oss(tmp_path: Path) -> None:
    result = _export(tmp_path, "gpt-oss-20b", tuple(range(24)), 32, 4)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[-1] == (
        "warning: gpt-oss-20b is GptOssForCausalLM, for which TensorRT-LLM does not create its"
        " MoE load balancer (only for DeepseekV3ForCausalLM, MixtralForCausalLM,"
        " Llama4ForConditionalGeneration, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM): it ignores"
        " moe_config.load_balancer and keeps its experts in their default layout, unreplicated"
    )


def test_no_warning_for_supported_architectures(tmp_path: Path) -> None:
    result = _export(tmp_path, "mixtral-8x7b", tuple(range(32)), 8, 4)
    assert result.exit_code == 0, result.output
    assert "warning:" not in result.stderr
    assert load_model("qwen3-30b-a3b").architecture in trtllm.LOAD_BALANCER_ARCHITECTURES
    assert load_model("kimi-k2").architecture in trtllm.LOAD_BALANCER_ARCHITECTURES


def test_evaluate_times_the_mtp_layer(mtp_statistics: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", str(mtp_statistics), "--model", "deepseek-v3",
                                 "--topology", "4x-dgx-h100", "--redundant", "32",
                                 "--solver", "eplb-valid", "-o", str(tmp_path / "p.json")])
    assert result.exit_code == 0, result.output
    assert "evaluator refused" not in result.stdout


def test_other_engines_leave_the_mtp_row_out(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    write_engine(_placement(LAYERS), "sglang", path, model=load_model("deepseek-v3"))
    assert len(json.loads(path.read_text())["physical_to_logical_map"]) == 61
