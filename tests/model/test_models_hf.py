"""placer.model.hf_config: Hugging Face config.json files and hub ids as models.

The configs below carry the fields of the published config.json files that placer reads
(the rest are left out); for the catalog's models the derived figures must equal the
catalog's, which were cross-checked against the published totals.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hf_configs import CONFIGS
from typer.testing import CliRunner

from placer.cli.main import app
from placer.errors import ModelError
from placer.model import ModelSpec, load_model, model_to_dict

#: Fields that name a model rather than describe it.
_IDENTITY = ("name", "aliases", "description", "source", "hub_ids")


def _config(tmp_path: Path, doc: dict[str, Any], name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc, indent=2))
    return path


def _shape(model: ModelSpec) -> dict[str, Any]:
    return {k: v for k, v in model_to_dict(model).items() if k not in _IDENTITY}


@pytest.mark.parametrize("preset", list(CONFIGS))
def test_config_json_reproduces_the_preset(tmp_path: Path, preset: str) -> None:
    """Layers, routing, shapes, the derived non-expert figures and the dtype all agree."""
    derived = load_model(_config(tmp_path, CONFIGS[preset]))
    assert _shape(derived) == _shape(load_model(preset))
    assert derived.source == str(tmp_path / "config.json")
    assert derived.name == tmp_path.name  # the folder's name


def test_deepseek_v3_config_figures(tmp_path: Path) -> None:
    """The worked example of docs/models.md: MLA, 3 dense layers, 58 MoE layers, MTP."""
    m = load_model(_config(tmp_path, CONFIGS["deepseek-v3"]))
    attention = (7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168)
    norms = 7168 + 61 * 2 * 7168 + 61 * (1536 + 512)
    embeddings = 2 * 129280 * 7168
    routers = 58 * (256 * 7168 + 256)
    assert m.non_expert_bf16_params == embeddings + norms + routers
    assert m.non_expert_params == (
        m.non_expert_bf16_params + 61 * attention + 3 * 3 * 7168 * 18432 + 58 * 3 * 7168 * 2048
    ) == 17_117_648_384
    assert (m.num_groups, m.top_groups, m.default_dtype) == (8, 4, "fp8")
    assert m.mtp_layer_ids == (61,) and m.architecture == "DeepseekV3ForCausalLM"


@pytest.mark.parametrize(
    ("hub_id", "preset"),
    [
        ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
        ("deepseek-ai/DeepSeek-R1", "deepseek-v3"),
        ("deepseek-ai/deepseek-r1-0528", "deepseek-v3"),
        ("moonshotai/Kimi-K2-Instruct", "kimi-k2"),
        ("Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b"),
        ("Qwen/Qwen3-235B-A22B", "qwen3-235b-a22b"),
        ("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
        ("meta-llama/Llama-4-Maverick-17B-128E-Instruct", "llama4-maverick"),
        ("openai/gpt-oss-20b", "gpt-oss-20b"),
        ("openai/gpt-oss-120b", "gpt-oss-120b"),
        ("https://huggingface.co/deepseek-ai/DeepSeek-V3", "deepseek-v3"),
    ],
)
def test_known_hub_ids_name_presets(hub_id: str, preset: str) -> None:
    assert load_model(hub_id) is load_model(preset)


def test_unknown_hub_id_says_to_download_the_config() -> None:
    with pytest.raises(ModelError) as e:
        load_model("deepseek-ai/DeepSeek-V2")
    assert str(e.value) == (
        "model: unknown model 'deepseek-ai/DeepSeek-V2': no preset has this Hugging Face id,"
        " and placer does not download"
    )
    assert e.value.hint == (
        "download its config.json (huggingface-cli download deepseek-ai/DeepSeek-V2 config.json"
        " --local-dir DIR) and pass `model` DIR/config.json"
    )


def test_a_folder_and_the_hub_cache_layout(tmp_path: Path) -> None:
    """A model folder is read through its config.json; a hub-cache snapshot is named by
    its repository, not by the snapshot hash."""
    folder = tmp_path / "Mixtral-8x7B"
    folder.mkdir()
    _config(folder, CONFIGS["mixtral-8x7b"])
    assert load_model(folder).name == "Mixtral-8x7B"
    assert load_model(str(folder)).num_experts == 8
    snapshot = tmp_path / "models--openai--gpt-oss-20b" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    assert load_model(_config(snapshot, CONFIGS["gpt-oss-20b"])).name == "gpt-oss-20b"


#: Families with no preset: published totals (billions, as quoted) and MoE layers.
OTHERS: dict[str, tuple[dict[str, Any], str, tuple[int, ...], tuple[int, ...]]] = {
    # deepseek-ai/DeepSeek-V2-Lite: MLA without q_lora_rank, greedy (ungrouped) routing
    "deepseek-v2-lite": (
        {
            "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
            "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
            "kv_lora_rank": 512, "q_lora_rank": None, "num_attention_heads": 16,
            "num_key_value_heads": 16, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "num_hidden_layers": 27, "first_k_dense_replace": 1,
            "moe_layer_freq": 1, "n_routed_experts": 64, "n_shared_experts": 2,
            "num_experts_per_tok": 6, "n_group": 1, "topk_group": 1, "topk_method": "greedy",
            "vocab_size": 102400, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        "15.7", tuple(range(1, 27)), (),
    ),
    # Qwen/Qwen1.5-MoE-A2.7B: one gated shared expert, biased q/k/v
    "qwen1.5-moe-a2.7b": (
        {
            "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
            "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408,
            "shared_expert_intermediate_size": 5632, "num_attention_heads": 16,
            "num_key_value_heads": 16, "num_hidden_layers": 24, "num_experts": 60,
            "num_experts_per_tok": 4, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "vocab_size": 151936, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        },
        "14.3", tuple(range(24)), (),
    ),
    # zai-org/GLM-4.5-Air: one dense layer, one MTP layer (46)
    "glm-4.5-air": (
        {
            "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
            "hidden_size": 4096, "intermediate_size": 10944, "moe_intermediate_size": 1408,
            "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
            "num_hidden_layers": 46, "first_k_dense_replace": 1, "n_routed_experts": 128,
            "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1,
            "vocab_size": 151552, "attention_bias": True, "use_qk_norm": False,
            "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
        },
        "107", tuple(range(1, 46)), (46,),
    ),
}


@pytest.mark.parametrize("name", list(OTHERS))
def test_families_without_a_preset(tmp_path: Path, name: str) -> None:
    config, total_b, moe_layers, mtp_layers = OTHERS[name]
    m = load_model(_config(tmp_path, config, f"{name}.json"))
    assert f"{m.total_params / 1e9:.{len(total_b.partition('.')[2])}f}" == total_b
    assert m.moe_layer_ids == moe_layers and m.mtp_layer_ids == mtp_layers
    assert m.name == f"{name}"  # the file's stem when it is not called config.json
    assert (m.num_groups, m.top_groups) == (1, 1)


def test_layer_rules(tmp_path: Path) -> None:
    """mlp_only_layers and decoder_sparse_step (Qwen), moe_layer_freq (DeepSeek), and an
    explicit moe_layers list (Llama 4) each pick the MoE layers."""
    qwen = {**CONFIGS["qwen3-30b-a3b"], "num_hidden_layers": 8, "mlp_only_layers": [0, 5],
            "decoder_sparse_step": 2}
    assert load_model(_config(tmp_path, qwen, "q.json")).moe_layer_ids == (1, 3, 7)
    deepseek = {**CONFIGS["deepseek-v3"], "num_hidden_layers": 9, "moe_layer_freq": 2}
    assert load_model(_config(tmp_path, deepseek, "d.json")).moe_layer_ids == (4, 6, 8)
    llama = json.loads(json.dumps(CONFIGS["llama4-maverick"]))
    llama["text_config"]["moe_layers"] = [2, 3, 40]
    assert load_model(_config(tmp_path, llama, "l.json")).moe_layer_ids == (2, 3, 40)


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"model_type": "deepseek_v32"}, "model_type",
         "model_type 'deepseek_v32' is not one placer reads"),
        ({"num_hidden_layers": "61"}, "num_hidden_layers",
         "num_hidden_layers must be an integer, got a string '61'"),
        ({"num_experts_per_tok": 300}, "num_experts_per_tok",
         "top_k 300 exceeds num_experts 256"),
        ({"n_group": 3}, "n_group", "num_experts 256 is not a multiple of num_groups 3"),
        ({"vocab_size": None}, "", "missing field 'vocab_size'"),
        ({"n_routed_experts": 0}, "n_routed_experts",
         "no routed experts (n_routed_experts, num_experts or num_local_experts): not a"
         " mixture-of-experts config"),
        ({"quantization_config": {"quant_method": "awq"}}, "quantization_config.quant_method",
         "quantization method 'awq' is not one placer sizes"),
        ({"quantization_config": None, "torch_dtype": "int8"}, "torch_dtype",
         "torch_dtype 'int8' is not a float dtype placer sizes"),
        ({"first_k_dense_replace": 70}, "first_k_dense_replace",
         "first_k_dense_replace leaves no MoE layer among 61"),
    ],
)
def test_bad_config_names_file_line_and_field(
    tmp_path: Path, change: dict[str, Any], field: str, message: str
) -> None:
    """``field`` is the config's field the message names ("" for the file itself)."""
    doc = {**CONFIGS["deepseek-v3"], **change}
    doc = {k: v for k, v in sorted(doc.items()) if v is not None}
    path = _config(tmp_path, doc)
    with pytest.raises(ModelError) as e:
        load_model(path)
    where = f":{_line(path, field.split('.')[-1])}: {field}" if field else ""
    assert str(e.value) == f"{path}{where}: {message}"


def _line(path: Path, key: str) -> int:
    """1-based line of ``"key":`` in a JSON file."""
    lines = path.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if f'"{key}":' in line)


def test_invalid_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{\n  "model_type": "mixtral",\n  "hidden_size": 4096,\n}\n')
    with pytest.raises(ModelError) as e:
        load_model(path)
    assert str(e.value) == f"{path}:4: invalid JSON: Expecting property name enclosed in double" \
        " quotes (column 1)"


def test_missing_file_and_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelError) as e:
        load_model(tmp_path / "nope" / "config.json")
    assert str(e.value) == f"{tmp_path / 'nope' / 'config.json'}: file not found"
    with pytest.raises(ModelError) as e:
        load_model(tmp_path)
    assert str(e.value) == f"{tmp_path}: folder has no config.json"


# -- the command line -------------------------------------------------------------------

runner = CliRunner()


def test_model_show_reads_a_config_and_a_hub_id(tmp_path: Path) -> None:
    path = _config(tmp_path, CONFIGS["deepseek-v3"])
    result = runner.invoke(app, ["model", "show", str(path)])
    assert result.exit_code == 0, result.output
    assert "MTP layers             1 (id 61, when served with MTP)" in result.stdout
    assert "non-expert params      17,117,648,384" in result.stdout
    hub = runner.invoke(app, ["model", "show", "deepseek-ai/DeepSeek-V3", "--json"])
    assert hub.exit_code == 0
    data = json.loads(hub.stdout)
    assert data["name"] == "deepseek-v3" and data["mtp_layer_ids"] == [61]
    assert "deepseek-ai/DeepSeek-R1" in data["hub_ids"]


def test_capacity_takes_a_config_json(tmp_path: Path) -> None:
    """Anything that takes --model takes a config.json (here `placer capacity`)."""
    path = _config(tmp_path, CONFIGS["deepseek-v3"])
    by_file = runner.invoke(app, ["capacity", "-m", str(path), "-t", "4x-dgx-h100", "--json"])
    by_name = runner.invoke(app, ["capacity", "-m", "deepseek-v3", "-t", "4x-dgx-h100", "--json"])
    assert by_file.exit_code == by_name.exit_code == 0
    a, b = json.loads(by_file.stdout), json.loads(by_name.stdout)
    assert a["slots_per_gpu"] == b["slots_per_gpu"] and a["slot_bytes"] == b["slot_bytes"]


def test_cli_errors_are_one_error_and_one_hint(tmp_path: Path) -> None:
    unknown = runner.invoke(app, ["model", "show", "acme/MoE-1T"])
    assert unknown.exit_code == 1
    assert unknown.stderr.splitlines() == [
        "error: model: unknown model 'acme/MoE-1T': no preset has this Hugging Face id, and"
        " placer does not download",
        "hint: download its config.json (huggingface-cli download acme/MoE-1T config.json"
        " --local-dir DIR) and pass --model DIR/config.json",
    ]
    path = _config(tmp_path, {**CONFIGS["mixtral-8x7b"], "model_type": "mistral"})
    bad = runner.invoke(app, ["model", "show", str(path)])
    assert bad.exit_code == 1 and "Traceback" not in bad.output
    lines = bad.stderr.splitlines()
    line = _line(path, "model_type")
    assert lines[0] == (
        f"error: {path}:{line}: model_type: model_type 'mistral' is not one placer reads"
    )
    assert lines[1].startswith("hint: placer reads: deepseek_v2, deepseek_v3, kimi_k2, glm4_moe")
