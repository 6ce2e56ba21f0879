"""A Hugging Face ``config.json`` read as a :class:`~placer.model.ModelSpec`.

A checkpoint's ``config.json`` gives the routing shape directly; the figures placement
also needs (the non-expert parameter count and its BF16 part) are derived from the
tensor shapes it declares.  Field names by family (``model_type``):

- deepseek_v2, deepseek_v3, kimi_k2, glm4_moe: experts ``n_routed_experts`` of
  ``moe_intermediate_size``; layer ``i`` is MoE when ``i >= first_k_dense_replace`` and
  ``i % moe_layer_freq == 0``.
- qwen2_moe, qwen3_moe: ``num_experts`` of ``moe_intermediate_size``; MoE when ``i`` is
  not in ``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0``.
- mixtral, gpt_oss: ``num_local_experts`` of ``intermediate_size``; every layer.
- llama4 (fields under ``text_config``): ``num_local_experts`` of ``intermediate_size``;
  the ``moe_layers`` list, else ``(i + 1) % interleave_moe_layer_step == 0``.

Top-k is ``num_experts_per_tok`` (gpt-oss also ``experts_per_token``); expert groups
``n_group`` / ``topk_group`` (DeepSeek, GLM; ignored when ``topk_method`` is
``greedy``); shared experts ``n_shared_experts`` of ``moe_intermediate_size`` (DeepSeek,
GLM), one of ``shared_expert_intermediate_size`` (Qwen2-MoE) or one of
``intermediate_size`` (Llama 4); MTP layers ``num_nextn_predict_layers``.  The default
dtype is ``quantization_config.quant_method`` (``fp8``, ``fbgemm_fp8`` -> fp8; ``mxfp4``),
else ``torch_dtype`` (or ``dtype``): 16- and 32-bit floats are served as BF16.

Non-expert parameters, with ``h`` the hidden size, ``V`` the vocabulary, ``E`` experts::

    embeddings     V h, twice unless tie_word_embeddings (the LM head)
    norms          h (final) + 2h per layer, + q/k norms 2d per layer (Qwen3-MoE,
                   GLM with use_qk_norm), + MLA's q_lora_rank + kv_lora_rank per layer
    attention GQA  h n_q d + 2 h n_kv d + n_q d h    (q, k, v, o; d = head_dim or h / n_q)
                   + n_q d + 2 n_kv d biases when q, k, v have them (attention_bias;
                   Qwen2-MoE qkv_bias), + h o-bias and n_q sinks (gpt-oss)
    attention MLA  h r_q + r_q n (d_nope + d_rope)   (h n (d_nope + d_rope) without q_lora_rank)
                   + h (r_kv + d_rope) + r_kv n (d_nope + d_v) + n d_v h
    dense layer    3 h f_dense    (gate, up, down; f_dense: Llama 4's intermediate_size_mlp)
    MoE layer      router E h, + E bias (DeepSeek noaux_tc correction, GLM, gpt-oss)
                   + 3 h f_shared per shared expert, + h shared-expert gate (Qwen2-MoE)

``non_expert_bf16_params`` (kept BF16 in FP8 checkpoints): embeddings, LM head, norms,
routers, biases and sinks.  MTP modules and vision towers are not counted (as in the
catalog).  On the configs of the catalog's models the formula gives the catalog's figures
exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from placer.constants import MAX_EXPERTS, MAX_LAYERS, MAX_MODEL_DIM
from placer.errors import ModelError
from placer.io.yaml_schema import Section, YamlDoc
from placer.model.spec import ModelSpec, spec_problems

__all__ = ["FAMILIES", "is_hf_config", "model_from_hf_config"]

_MODEL_DOC = "write a model YAML instead (docs/models.md)"


@dataclass(frozen=True)
class Family:
    """How one ``model_type`` lays out its layers and weights.

    Attributes
    ----------
    attention: ``"mla"`` (DeepSeek's latent attention) or ``"gqa"``.
    layers: rule for the MoE layers: ``"first_k_dense"``, ``"sparse_step"``,
        ``"interleave"`` or ``"all"``.
    expert_ffn: key of the routed experts' FFN width.
    dense_ffn: key of the dense layers' FFN width.
    shared: shared experts: ``"none"``, ``"n_shared"``, ``"qwen2"`` or ``"llama4"``.
    qkv_bias: key and default of the flag that gives q, k, v biases (None: never).
    o_bias: the output projection is biased along with q, k, v.
    qk_norm: True, False, or the key of the flag that adds q/k norms.
    sinks: one attention sink per query head.
    router_bias: ``"never"``, ``"always"`` or ``"noaux_tc"`` (when ``topk_method`` is).
    expert_bias: routed experts carry biases.
    """

    attention: str
    layers: str
    expert_ffn: str
    dense_ffn: str = "intermediate_size"
    shared: str = "none"
    qkv_bias: tuple[str, bool] | None = ("attention_bias", False)
    o_bias: bool = False
    qk_norm: bool | str = False
    sinks: bool = False
    router_bias: str = "never"
    expert_bias: bool = False


_DEEPSEEK = Family(
    "mla", "first_k_dense", "moe_intermediate_size", shared="n_shared", qkv_bias=None,
    router_bias="noaux_tc",
)
_LLAMA4 = Family("gqa", "interleave", "intermediate_size", "intermediate_size_mlp",
                 shared="llama4")

#: ``model_type`` -> its :class:`Family`.
FAMILIES: dict[str, Family] = {
    "deepseek_v2": _DEEPSEEK,
    "deepseek_v3": _DEEPSEEK,
    "kimi_k2": _DEEPSEEK,
    "glm4_moe": Family("gqa", "first_k_dense", "moe_intermediate_size", shared="n_shared",
                       qk_norm="use_qk_norm", router_bias="always"),
    "qwen2_moe": Family("gqa", "sparse_step", "moe_intermediate_size", shared="qwen2",
                        qkv_bias=("qkv_bias", True)),
    "qwen3_moe": Family("gqa", "sparse_step", "moe_intermediate_size", qk_norm=True),
    "mixtral": Family("gqa", "all", "intermediate_size"),
    "llama4": _LLAMA4,
    "llama4_text": _LLAMA4,
    "gpt_oss": Family("gqa", "all", "intermediate_size", o_bias=True, sinks=True,
                      router_bias="always", expert_bias=True),
}

_EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")
_TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token")

#: Most any integer field may be (vocabularies, heads, head sizes: all far below), and
#: the tighter limits of the fields that size arrays (docs/limits.md).
_FIELD_MAX = 1 << 24
_FIELD_LIMITS = {
    "num_hidden_layers": MAX_LAYERS,
    "num_nextn_predict_layers": MAX_LAYERS,
    "first_k_dense_replace": MAX_LAYERS,
    **{key: MAX_EXPERTS for key in (*_EXPERT_KEYS, "n_group", "topk_group", "n_shared_experts")},
    **{key: MAX_EXPERTS for key in _TOP_K_KEYS},  # MAX_TOP_K: spec_problems
    **{key: MAX_MODEL_DIM for key in (
        "hidden_size", "intermediate_size", "moe_intermediate_size",
        "shared_expert_intermediate_size", "intermediate_size_mlp",
    )},
}
_QUANT_DTYPES = {"fp8": "fp8", "fbgemm_fp8": "fp8", "mxfp4": "mxfp4"}
_FLOAT_DTYPES = {"bfloat16": "bf16", "float16": "bf16", "float32": "bf16"}
_SNAPSHOT = re.compile(r"^[0-9a-f]{40}$")


def is_hf_config(data: Any) -> bool:
    """Whether a parsed document is a Hugging Face ``config.json`` (not a model YAML)."""
    return isinstance(data, dict) and ("model_type" in data or "architectures" in data)


class _Fields:
    """A config's fields: ``text_config``'s first (Llama 4), then the top level."""

    def __init__(self, doc: YamlDoc):
        self.doc = doc
        self.root = doc.root()
        text = self.root.value.get("text_config")
        self.sections = [Section(doc, text, "text_config"), self.root] if isinstance(
            text, dict
        ) else [self.root]

    def section(self, key: str) -> Section:
        for section in self.sections:
            if section.value.get(key) is not None:
                return section
        return self.sections[0]

    def has(self, key: str) -> bool:
        return any(s.value.get(key) is not None for s in self.sections)

    def first(self, keys: tuple[str, ...]) -> str | None:
        return next((k for k in keys if self.has(k)), None)

    def where(self, key: str) -> str:
        section = self.section(key)
        return self.doc.where(section.sub(key))

    def fail(self, key: str, message: str, hint: str | None = None) -> ModelError:
        return ModelError(message, where=self.where(key), hint=hint)

    def integer(self, key: str, default: int | None = None, *, minimum: int = 1) -> int:
        """The integer under ``key``; ``default`` when absent (required when None)."""
        if not self.has(key):
            if default is None:
                top = self.sections[0].path
                raise ModelError(
                    f"missing field '{key}'",
                    where=self.doc.where(top) if top else self.doc.source,
                    hint="placer needs it to size the model; is this a config.json of a"
                    f" supported model ({', '.join(FAMILIES)})?",
                )
            return default
        return self.section(key).integer(
            key, minimum=minimum, maximum=_FIELD_LIMITS.get(key, _FIELD_MAX)
        )

    def optional(self, key: str, *, minimum: int = 1) -> int | None:
        return self.integer(key, minimum=minimum) if self.has(key) else None

    def flag(self, key: str, default: bool) -> bool:
        return self.section(key).boolean(key, default) if self.has(key) else default

    def text(self, key: str) -> str | None:
        return self.section(key).string(key) if self.has(key) else None

    def int_list(self, key: str) -> list[int]:
        if not self.has(key):
            return []
        value = self.section(key).value[key]
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
        ):
            raise self.fail(
                key, f"{key} must be a list of layer indices, got {value!r:.60}",
                hint="layer indices are whole numbers >= 0, e.g. [0, 1, 2]",
            )
        return list(value)


def model_from_hf_config(doc: YamlDoc) -> ModelSpec:
    """The model a parsed ``config.json`` describes; errors name the file, line and field.

    Raises
    ------
    ModelError: a model_type placer does not read, a missing or mistyped field, or
        fields that contradict each other (``num_experts_per_tok`` above the experts).
    """
    fields = _Fields(doc)
    model_type = fields.root.value.get("model_type")
    if not isinstance(model_type, str):
        raise ModelError(
            "missing field 'model_type'", where=doc.source,
            hint=f"placer reads the config.json of: {', '.join(FAMILIES)}; or {_MODEL_DOC}",
        )
    family = FAMILIES.get(model_type)
    if family is None:
        raise fields.fail(
            "model_type", f"model_type '{model_type}' is not one placer reads",
            hint=f"placer reads: {', '.join(FAMILIES)}; for another model {_MODEL_DOC}",
        )
    experts_key = fields.first(_EXPERT_KEYS)
    if experts_key is None or fields.integer(experts_key, minimum=0) == 0:
        raise ModelError(
            f"no routed experts ({', '.join(_EXPERT_KEYS[:-1])} or {_EXPERT_KEYS[-1]}):"
            " not a mixture-of-experts config",
            where=doc.source if experts_key is None else fields.where(experts_key),
            hint="placer places the experts of MoE models",
        )
    top_k_key = fields.first(_TOP_K_KEYS) or _TOP_K_KEYS[0]
    num_layers = fields.integer("num_hidden_layers")
    layer_key, moe_layers = _moe_layers(fields, family, num_layers)
    if not moe_layers:
        raise fields.fail(
            layer_key, f"{layer_key} leaves no MoE layer among {num_layers}",
            hint="check the config against the model's published config.json",
        )
    groups, top_groups = _groups(fields, family)
    counts = _parameters(fields, family, num_layers, moe_layers, fields.integer(experts_key))
    values: dict[str, Any] = dict(
        name=_name(Path(doc.source), fields.root.value),
        num_hidden_layers=num_layers,
        moe_layer_ids=tuple(moe_layers),
        num_experts=fields.integer(experts_key),
        top_k=fields.integer(top_k_key),
        num_groups=groups,
        top_groups=top_groups,
        num_shared_experts=counts.num_shared,
        hidden_size=fields.integer("hidden_size"),
        moe_intermediate_size=fields.integer(family.expert_ffn),
        non_expert_params=counts.non_expert,
        non_expert_bf16_params=counts.bf16,
        default_dtype=_default_dtype(fields),
        expert_bias=family.expert_bias,
        num_nextn_predict_layers=fields.integer("num_nextn_predict_layers", 0, minimum=0),
        architecture=_architecture(fields.root.value),
        source=doc.source,
    )
    problems = spec_problems(SimpleNamespace(**values))
    if problems:
        key, message = problems[0]
        field = {"top_k": top_k_key, "num_experts": experts_key, "num_groups": "n_group",
                 "top_groups": "topk_group", "moe_layer_ids": layer_key}.get(key, key)
        raise ModelError(
            message, where=fields.where(field) if fields.has(field) else doc.source,
            hint="check the config against the model's published config.json",
        )
    spec = ModelSpec(**values)
    label = spec.architecture or model_type
    return ModelSpec(**{
        **values,
        "description": f"{label} from {Path(doc.source).name}: {spec.total_params / 1e9:.1f}B"
        f" total, {spec.active_params / 1e9:.1f}B active (figures derived from its shapes)",
    })


def _moe_layers(fields: _Fields, family: Family, num_layers: int) -> tuple[str, list[int]]:
    """The field that decides the MoE layers, and their absolute ids."""
    layers = range(num_layers)
    if family.layers == "first_k_dense":
        first = fields.integer("first_k_dense_replace", 0, minimum=0)
        every = fields.integer("moe_layer_freq", 1)
        return "first_k_dense_replace", [i for i in layers if i >= first and i % every == 0]
    if family.layers == "sparse_step":
        step = fields.integer("decoder_sparse_step", 1)
        dense = set(fields.int_list("mlp_only_layers"))
        return "decoder_sparse_step", [i for i in layers if i not in dense and (i + 1) % step == 0]
    if family.layers == "interleave":
        if fields.has("moe_layers"):
            listed = set(fields.int_list("moe_layers"))
            return "moe_layers", [i for i in layers if i in listed]
        step = fields.integer("interleave_moe_layer_step", 1)
        return "interleave_moe_layer_step", [i for i in layers if (i + 1) % step == 0]
    return "num_hidden_layers", list(layers)


def _groups(fields: _Fields, family: Family) -> tuple[int, int]:
    """``(num_groups, top_groups)`` of group-limited routing."""
    if family.layers != "first_k_dense" or fields.text("topk_method") == "greedy":
        return 1, 1
    groups = fields.integer("n_group", 1)
    return groups, fields.integer("topk_group", groups)


@dataclass(frozen=True)
class _Counts:
    non_expert: int
    bf16: int
    num_shared: int


def _parameters(
    fields: _Fields, family: Family, num_layers: int, moe_layers: list[int], num_experts: int
) -> _Counts:
    """Non-expert parameters and their BF16 part (the module docstring's formula)."""
    h = fields.integer("hidden_size")
    vocab = fields.integer("vocab_size")
    tied = fields.flag("tie_word_embeddings", False)
    attention, attention_bf16 = _attention(fields, family, h)
    num_moe, num_dense = len(moe_layers), num_layers - len(moe_layers)
    dense = 3 * h * fields.integer(family.dense_ffn) * num_dense if num_dense else 0

    num_shared, shared_ffn, shared_gate = 0, 0, 0
    if family.shared == "n_shared":
        num_shared = fields.integer("n_shared_experts", 0, minimum=0)
        shared_ffn = fields.integer(family.expert_ffn) * num_shared
    elif family.shared == "qwen2":
        shared_ffn = fields.integer("shared_expert_intermediate_size", 0, minimum=0)
        num_shared = 1 if shared_ffn else 0
        shared_gate = h if shared_ffn else 0
    elif family.shared == "llama4":
        num_shared, shared_ffn = 1, fields.integer(family.expert_ffn)
    noaux = fields.text("topk_method") == "noaux_tc"
    router_bias = family.router_bias == "always" or (family.router_bias == "noaux_tc" and noaux)
    router = num_experts * h + (num_experts if router_bias else 0) + shared_gate

    embeddings = vocab * h * (1 if tied else 2)
    norms = h + 2 * h * num_layers
    bf16 = embeddings + norms + num_layers * attention_bf16 + num_moe * router
    linear = num_layers * attention + dense + num_moe * 3 * h * shared_ffn
    return _Counts(non_expert=linear + bf16, bf16=bf16, num_shared=num_shared)


def _attention(fields: _Fields, family: Family, h: int) -> tuple[int, int]:
    """``(matrices, BF16 extras)`` of one layer's attention: weights, then norms/biases/sinks."""
    heads = fields.integer("num_attention_heads")
    if family.attention == "mla":
        q_lora = fields.optional("q_lora_rank")
        kv_lora = fields.integer("kv_lora_rank")
        nope, rope = fields.integer("qk_nope_head_dim"), fields.integer("qk_rope_head_dim")
        v = fields.integer("v_head_dim")
        q = h * q_lora + q_lora * heads * (nope + rope) if q_lora else h * heads * (nope + rope)
        kv = h * (kv_lora + rope) + kv_lora * heads * (nope + v)
        return q + kv + heads * v * h, (q_lora or 0) + kv_lora
    kv_heads = fields.integer("num_key_value_heads", heads)
    head_dim = fields.optional("head_dim")
    if head_dim is None:
        if h % heads:
            raise fields.fail(
                "num_attention_heads",
                f"hidden_size {h} is not a multiple of num_attention_heads {heads}",
                hint="give head_dim",
            )
        head_dim = h // heads
    matrices = 2 * h * heads * head_dim + 2 * h * kv_heads * head_dim
    extras = 0
    biased = family.qkv_bias is not None and fields.flag(*family.qkv_bias)
    if biased:
        extras += heads * head_dim + 2 * kv_heads * head_dim + (h if family.o_bias else 0)
    qk_norm = fields.flag(family.qk_norm, False) if isinstance(family.qk_norm, str) else (
        family.qk_norm
    )
    if qk_norm:
        extras += 2 * head_dim
    if family.sinks:
        extras += heads
    return matrices, extras


def _default_dtype(fields: _Fields) -> str:
    """The checkpoint's expert dtype: its quantization method, else its float dtype."""
    quant = fields.section("quantization_config").value.get("quantization_config")
    if quant is not None:
        method = quant.get("quant_method") if isinstance(quant, dict) else None
        if method not in _QUANT_DTYPES:
            path = fields.section("quantization_config").sub("quantization_config")
            raise ModelError(
                f"quantization method {method!r} is not one placer sizes",
                where=fields.doc.where(f"{path}.quant_method"),
                hint="placer sizes bf16, fp8 and mxfp4 experts: pass the unquantized model's"
                " config.json, or write a model YAML with default_dtype (docs/models.md)",
            )
        return _QUANT_DTYPES[method]
    key = "torch_dtype" if fields.has("torch_dtype") else "dtype"
    value = fields.text(key)
    if value is None:
        return "bf16"
    if value not in _FLOAT_DTYPES:
        raise fields.fail(
            key, f"{key} '{value}' is not a float dtype placer sizes",
            hint=f"expected one of: {', '.join(_FLOAT_DTYPES)} (served as BF16)",
        )
    return _FLOAT_DTYPES[value]


def _architecture(data: dict[str, Any]) -> str:
    names = data.get("architectures")
    if isinstance(names, list) and names and isinstance(names[0], str):
        return names[0]
    return ""


def _name(path: Path, data: dict[str, Any]) -> str:
    """The model's name: ``_name_or_path``'s last part, else its folder (hub cache aware)."""
    declared = data.get("_name_or_path")
    if isinstance(declared, str) and declared.strip("/ "):
        return declared.rstrip("/").split("/")[-1]
    folder = path.resolve().parent
    if _SNAPSHOT.match(folder.name) and folder.parent.name == "snapshots":
        cache = folder.parent.parent.name  # models--org--name
        return cache.split("--")[-1]
    if path.name == "config.json" and folder.name:
        return folder.name
    return path.stem
