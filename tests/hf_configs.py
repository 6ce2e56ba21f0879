"""The fields of the published Hugging Face ``config.json`` files that placer reads, per
catalog model (the rest are left out): shared by the model tests and the docs' examples."""

from __future__ import annotations

from typing import Any

_MLA = {
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "topk_method": "noaux_tc",
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}
_QWEN3 = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "head_dim": 128,
    "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "vocab_size": 151936, "tie_word_embeddings": False, "attention_bias": False,
    "torch_dtype": "bfloat16",
}
_GPT_OSS = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
    "intermediate_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8,
    "head_dim": 64, "num_experts_per_tok": 4, "experts_per_token": 4, "vocab_size": 201088,
    "attention_bias": True, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "mxfp4",
                            "modules_to_not_convert": ["model.layers.*.self_attn"]},
}

#: preset -> the fields of its config.json that placer reads.
CONFIGS: dict[str, dict[str, Any]] = {
    "deepseek-v3": {
        **_MLA, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "first_k_dense_replace": 3, "n_group": 8, "topk_group": 4, "n_routed_experts": 256,
        "num_attention_heads": 128, "num_key_value_heads": 128, "num_nextn_predict_layers": 1,
        "vocab_size": 129280,
    },
    "kimi-k2": {
        **_MLA, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
        "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "n_routed_experts": 384,
        "num_attention_heads": 64, "num_key_value_heads": 64, "num_nextn_predict_layers": 0,
        "vocab_size": 163840,
    },
    "qwen3-235b-a22b": {
        **_QWEN3, "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 1536,
        "num_attention_heads": 64, "num_key_value_heads": 4, "num_hidden_layers": 94,
    },
    "qwen3-30b-a3b": {
        **_QWEN3, "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_attention_heads": 32, "num_key_value_heads": 4, "num_hidden_layers": 48,
    },
    "mixtral-8x7b": {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
        "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
        "num_hidden_layers": 32, "num_local_experts": 8, "num_experts_per_tok": 2,
        "vocab_size": 32000, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    },
    "llama4-maverick": {
        "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "text_config": {
            "model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192,
            "intermediate_size_mlp": 16384, "num_attention_heads": 40, "num_key_value_heads": 8,
            "head_dim": 128, "num_hidden_layers": 48, "num_local_experts": 128,
            "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "moe_layers": None,
            "vocab_size": 202048, "torch_dtype": "bfloat16",
        },
        "vision_config": {"hidden_size": 1408, "num_hidden_layers": 34},
    },
    "gpt-oss-120b": {**_GPT_OSS, "num_hidden_layers": 36, "num_local_experts": 128},
    "gpt-oss-20b": {**_GPT_OSS, "num_hidden_layers": 24, "num_local_experts": 32},
}
