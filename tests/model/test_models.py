"""placer.model: the catalog's figures against the models' published shapes and totals."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from placer.errors import ModelError, UsageError
from placer.model import DTYPES, ModelSpec, load_model, model_from_dict, model_names

#: the reference table of the models' shapes, as printed: MoE layers, experts, top-k,
#: shared, hidden, ffn, expert MB in BF16 and in the model's small dtype (FP8, or MXFP4
#: for gpt-oss).
PRESET_FIGURES = {
    "deepseek-v3": (58, 256, 8, 1, 7168, 2048, "88.1", "44.0", "fp8"),
    "kimi-k2": (60, 384, 8, 1, 7168, 2048, "88.1", "44.0", "fp8"),
    "qwen3-235b-a22b": (94, 128, 8, 0, 4096, 1536, "37.7", "18.9", "fp8"),
    "qwen3-30b-a3b": (48, 128, 8, 0, 2048, 768, "9.4", "4.7", "fp8"),
    "mixtral-8x7b": (32, 8, 2, 0, 4096, 14336, "352", "176", "fp8"),
    "llama4-maverick": (24, 128, 1, 1, 5120, 8192, "252", "126", "fp8"),
    "gpt-oss-120b": (36, 128, 4, 0, 2880, 2880, "49.8", "13.2", "mxfp4"),
    "gpt-oss-20b": (24, 32, 4, 0, 2880, 2880, "49.8", "13.2", "mxfp4"),
}

#: Published total parameters (technical reports and model cards), in billions, to the
#: precision they are quoted.
PUBLISHED_TOTAL_B = {
    "deepseek-v3": "671",
    "qwen3-235b-a22b": "235",
    "qwen3-30b-a3b": "30.5",
    "mixtral-8x7b": "46.7",
    "llama4-maverick": "401",
    "gpt-oss-120b": "116.8",
    "gpt-oss-20b": "20.9",
}


def _printed(value_mb: float, like: str) -> str:
    """``value_mb`` rounded as the table prints ``like`` (same number of decimals)."""
    decimals = len(like.split(".")[1]) if "." in like else 0
    return f"{value_mb:.{decimals}f}"


def _weights_only(model: ModelSpec, dtype: str) -> int:
    bias = (2 * model.moe_intermediate_size + model.hidden_size) * 2 if model.expert_bias else 0
    return model.expert_bytes(dtype) - model.expert_scale_bytes(dtype) - bias


def test_catalog_holds_the_issue_models():
    assert model_names() == list(PRESET_FIGURES)


@pytest.mark.parametrize("name", list(PRESET_FIGURES))
def test_design_table(name):
    layers, experts, top_k, shared, hidden, ffn, bf16_mb, small_mb, small = PRESET_FIGURES[name]
    m = load_model(name)
    assert (m.num_moe_layers, m.num_experts, m.top_k, m.num_shared_experts) == (
        layers,
        experts,
        top_k,
        shared,
    )
    assert (m.hidden_size, m.moe_intermediate_size) == (hidden, ffn)
    assert _printed(m.expert_bytes("bf16") / 1e6, bf16_mb) == bf16_mb
    # The table's FP8 figure is weights only (placer adds the 128x128 block scales
    # exactly); its MXFP4 figure is 4.25 bits per parameter, scales included.
    table_bytes = _weights_only(m, small)
    if small == "mxfp4":
        table_bytes += m.expert_scale_bytes(small)
    assert _printed(table_bytes / 1e6, small_mb) == small_mb


def test_deepseek_v3_exact_bytes():
    """3 x 7168 x 2048 = 44,040,192 params; FP8 adds 3 x 16 x 56 float32 block scales."""
    m = load_model("deepseek-v3")
    assert m.expert_params == 44_040_192
    assert m.expert_bytes("bf16") == 88_080_384
    assert m.expert_scale_bytes("fp8") == 3 * 16 * 56 * 4 == 10_752
    assert m.expert_bytes("fp8") == 44_040_192 + 10_752
    assert m.moe_layer_ids == tuple(range(3, 61))
    assert (m.num_groups, m.top_groups) == (8, 4)
    assert m.activation_bytes("fp8") == 7168 + 7168 // 32
    assert m.activation_bytes("bf16") == m.combine_bytes() == 2 * 7168
    # FP8 non-expert: quantized part at 1 byte, embeddings/norms/routers at 2
    assert m.non_expert_bytes("fp8") == (17_117_648_384 - 1_960_809_984) + 2 * 1_960_809_984
    assert m.non_expert_bytes("bf16") == 2 * 17_117_648_384
    assert m.default_dtype == "fp8"


def test_gpt_oss_mxfp4_is_4_25_bits_per_param():
    m = load_model("gpt-oss-120b")
    weights = 3 * 2880 * 2880
    assert m.expert_scale_bytes("mxfp4") == weights // 32
    assert _weights_only(m, "mxfp4") + m.expert_scale_bytes("mxfp4") == weights * 4.25 / 8
    assert m.expert_bytes("mxfp4") == weights * 4.25 / 8 + (2 * 2880 + 2880) * 2  # BF16 biases
    assert m.non_expert_bytes("mxfp4") == 2 * m.non_expert_params


@pytest.mark.parametrize("name", list(PUBLISHED_TOTAL_B))
def test_total_params_match_published(name):
    quoted = PUBLISHED_TOTAL_B[name]
    assert _printed(load_model(name).total_params / 1e9, quoted) == quoted


def test_mixtral_total_is_exact():
    assert load_model("mixtral-8x7b").total_params == 46_702_792_704


def test_layer_ids_are_absolute():
    assert load_model("llama4-maverick").moe_layer_ids == tuple(range(1, 48, 2))
    assert load_model("kimi-k2").moe_layer_ids == tuple(range(1, 61))
    assert load_model("qwen3-30b-a3b").moe_layer_ids == tuple(range(48))


def test_aliases_and_case():
    assert load_model("DeepSeek-R1") is load_model("deepseek-v3")
    assert load_model("QWEN3-30B-A3B").name == "qwen3-30b-a3b"


def test_unknown_model_suggests_a_close_name():
    with pytest.raises(ModelError) as e:
        load_model("qwen3-30b-a3")
    assert str(e.value) == "model: unknown model 'qwen3-30b-a3': not a preset and no such file"
    assert e.value.hint is not None and e.value.hint.startswith("did you mean 'qwen3-30b-a3b'?")


def test_unknown_dtype_is_a_usage_error():
    with pytest.raises(UsageError) as e:
        load_model("mixtral-8x7b").expert_bytes("int4")
    assert str(e.value) == "dtype: unknown dtype 'int4'"
    assert e.value.hint == "expected one of: bf16, fp8, mxfp4"


# -- user files -------------------------------------------------------------------------

TINY = """\
name: tiny-moe
num_hidden_layers: 4
moe_layer_ids: [1, 3]
num_experts: 16
top_k: 2
hidden_size: 256
moe_intermediate_size: 128
non_expert_params: 1000000
"""


def _write(tmp_path, text: str):
    path = tmp_path / "model.yaml"
    path.write_text(text)
    return path


def test_user_model_file(tmp_path):
    m = load_model(_write(tmp_path, TINY))
    assert m.name == "tiny-moe" and m.moe_layer_ids == (1, 3)
    assert m.default_dtype == "bf16" and m.num_groups == 1 and m.top_groups == 1
    assert m.expert_bytes() == 3 * 256 * 128 * 2
    assert m.expert_scale_bytes("fp8") == 3 * 1 * 2 * 4
    assert m.source == str(tmp_path / "model.yaml")


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("top_k: 2", "top_k: 20", "model.yaml:5: top_k: top_k 20 exceeds num_experts 16"),
        (
            "moe_layer_ids: [1, 3]",
            "moe_layer_ids: [1, 4]",
            "model.yaml:3: moe_layer_ids: MoE layer ids must lie in [0, 4), the hidden layers;"
            " got 1..4",
        ),
        (
            "moe_layer_ids: [1, 3]",
            "moe_layer_ids: [3, 1]",
            "model.yaml:3: moe_layer_ids: MoE layer ids must be increasing and distinct",
        ),
        (
            "moe_layer_ids: [1, 3]",
            "moe_layer_ids: [1, x]",
            "model.yaml:3: moe_layer_ids[1]: a layer id must be an integer >= 0, got 'x'",
        ),
        ("top_k: 2", "top_k: 2\ntopk: 2", "model.yaml:6: topk: unknown key 'topk'"),
        (
            "num_experts: 16",
            "num_experts: -16",
            "model.yaml:4: num_experts: num_experts must be at least 1, got -16",
        ),
        ("name: tiny-moe\n", "", "model.yaml:1: missing key 'name'"),
        (
            "top_k: 2",
            "top_k: 2\nnum_groups: 3",
            "model.yaml:6: num_groups: num_experts 16 is not a multiple of num_groups 3",
        ),
        (
            "top_k: 2",
            "top_k: 2\ndefault_dtype: fp4",
            "model.yaml:6: default_dtype: unknown default_dtype 'fp4'",
        ),
    ],
)
def test_user_model_errors(tmp_path, old, new, message):
    assert old in TINY
    path = _write(tmp_path, TINY.replace(old, new, 1))
    with pytest.raises(ModelError) as e:
        load_model(path)
    assert str(e.value) == f"{tmp_path}/{message}"


def test_typo_hint_names_the_close_key(tmp_path):
    path = _write(tmp_path, TINY.replace("top_k: 2", "top_k: 2\nhiden_size: 3"))
    with pytest.raises(ModelError) as e:
        load_model(path)
    assert e.value.hint is not None and e.value.hint.startswith("did you mean 'hidden_size'?")


def test_model_from_dict_range_form():
    m = model_from_dict(
        {
            "name": "r",
            "num_hidden_layers": 10,
            "moe_layer_ids": {"first": 2, "last": 9, "step": 3},
            "num_experts": 8,
            "top_k": 2,
            "hidden_size": 64,
            "moe_intermediate_size": 32,
            "non_expert_params": 0,
        }
    )
    assert m.moe_layer_ids == (2, 5, 8)


@given(
    hidden=st.integers(1, 9000),
    ffn=st.integers(1, 20000),
)
def test_scale_bytes_match_block_counting(hidden, ffn):
    """Scales equal a direct count of 128x128 blocks (FP8) and 32-element groups (MXFP4)."""
    m = ModelSpec("x", 1, (0,), 4, 1, 1, 1, 0, hidden, ffn, 0, "bf16")
    fp8_blocks = 0
    for rows, cols in ((ffn, hidden), (ffn, hidden), (hidden, ffn)):
        fp8_blocks += len(range(0, rows, 128)) * len(range(0, cols, 128))
    assert m.expert_scale_bytes("fp8") == 4 * fp8_blocks
    groups = 2 * ffn * len(range(0, hidden, 32)) + hidden * len(range(0, ffn, 32))
    assert m.expert_scale_bytes("mxfp4") == groups
    if min(hidden, ffn) >= 128:
        sizes = [m.expert_bytes(d) for d in DTYPES]
        assert sizes[0] > sizes[1] > sizes[2]
    assert m.expert_bytes("mxfp4") == math.ceil(3 * hidden * ffn / 2) + groups
