"""Model specifications: the shapes placement needs, and the bytes they weigh.

A :class:`ModelSpec` says which layers are MoE layers (absolute ids, never renumbered),
how many experts each has and how many a token selects, the expert FFN shape, and how
many parameters are *not* routed experts (attention, dense MLPs, shared experts,
embeddings).  Presets come from the catalog ``placer/data/models.yaml``; users can pass
their own YAML file with the same keys, a Hugging Face ``config.json`` (read by
:mod:`placer.model.hf_config`), or a known hub id (``deepseek-ai/DeepSeek-V3``).

Multi-token-prediction (MTP, "next-n") layers: DeepSeek-V3 / R1 ship one MoE decoder
block after the last hidden layer.  Engines that run it with expert parallelism give it
the layer id ``num_hidden_layers + i`` (TensorRT-LLM builds ``DeepseekV3MTP(61)``), so
statistics recorded with MTP on hold layer 61.  :attr:`ModelSpec.mtp_layer_ids` names
those ids; :attr:`ModelSpec.moe_layer_ids` stays the main model's MoE layers (what every
engine file and the memory budget cover).

Bytes, exactly (``h`` hidden size, ``f`` expert FFN size; gate and up are ``[f, h]``,
down is ``[h, f]``)::

    bf16   2 bytes x 3hf
    fp8    1 byte  x 3hf + float32 scale per 128x128 block: 4 x (2 ceil(f/128) ceil(h/128)
                                                               + ceil(h/128) ceil(f/128))
    mxfp4  0.5 byte x 3hf + one byte per 32 elements along the reduction axis:
           2 f ceil(h/32) + h ceil(f/32)

plus, for models with expert biases (gpt-oss), ``2f + h`` BF16 biases.  Non-expert
weights: BF16 when experts are BF16 or MXFP4 (gpt-oss keeps attention in BF16); with FP8
experts the non-expert matrices are FP8 too, except ``non_expert_bf16_params``
(embeddings, norms, routers) which stay BF16.  FP8 scales of non-expert matrices
(<0.1%) are not counted.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from placer.constants import (
    BF16_BYTES,
    BYTES_PER_PARAM,
    DTYPES,
    FP8_ACTIVATION_GROUP,
    FP8_SCALE_BYTES,
    FP8_WEIGHT_BLOCK,
    MAX_EXPERTS,
    MAX_LAYERS,
    MAX_MODEL_DIM,
    MAX_MODEL_PARAMS,
    MAX_TOP_K,
    MXFP4_BLOCK,
    MXFP4_SCALE_BYTES,
)
from placer.errors import ModelError, Param, UsageError
from placer.io.yaml_schema import (
    Section,
)

__all__ = [
    "DTYPES",
    "ModelSpec",
    "check_dtype",
    "model_to_dict",
    "spec_problems",
]


def check_dtype(dtype: str, where: str = Param("dtype")) -> str:
    """Return ``dtype`` lower-cased, or raise UsageError naming ``where``."""
    value = dtype.lower()
    if value not in DTYPES:
        raise UsageError(
            f"unknown dtype '{dtype}'", where=where, hint=f"expected one of: {', '.join(DTYPES)}"
        )
    return value


@dataclass(frozen=True)
class ModelSpec:
    """An MoE model's routing shape and sizes.

    Attributes
    ----------
    name: canonical name (``"deepseek-v3"``).
    num_hidden_layers: decoder layers, dense and MoE.
    moe_layer_ids: ``[moe layers]`` absolute ids of the MoE layers, increasing.
    num_experts: ``E`` routed experts per MoE layer.
    top_k: routed experts each token selects per layer.
    num_groups: expert groups for group-limited routing (1 = ungrouped).
    top_groups: groups a token may select from (``num_groups`` when ungrouped).
    num_shared_experts: experts every token uses (part of the non-expert weights:
        replicated, never placed).
    hidden_size: ``h``, model width.
    moe_intermediate_size: ``f``, one routed expert's FFN width.
    non_expert_params: every parameter that is not a routed expert.
    default_dtype: dtype of the published checkpoint's experts.
    non_expert_bf16_params: part of ``non_expert_params`` kept in BF16 whatever the dtype.
    expert_bias: experts carry BF16 biases (``2f + h`` per expert).
    num_nextn_predict_layers: MTP layers the checkpoint ships (DeepSeek-V3: 1); their
        ids are :attr:`mtp_layer_ids`.  Not counted in the parameters.
    architecture: the checkpoint's Hugging Face architecture
        (``"DeepseekV3ForCausalLM"``; ``""`` when unknown); engines choose features by it.
    hub_ids: Hugging Face repository ids that name this model
        (``"deepseek-ai/DeepSeek-V3"``).
    aliases: other accepted names.
    description: one line (where the figures come from).
    source: ``"preset NAME"`` or the file path it was read from.
    """

    name: str
    num_hidden_layers: int
    moe_layer_ids: tuple[int, ...]
    num_experts: int
    top_k: int
    num_groups: int
    top_groups: int
    num_shared_experts: int
    hidden_size: int
    moe_intermediate_size: int
    non_expert_params: int
    default_dtype: str
    non_expert_bf16_params: int = 0
    expert_bias: bool = False
    num_nextn_predict_layers: int = 0
    architecture: str = ""
    hub_ids: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    description: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        problems = spec_problems(self)
        if problems:
            key, message = problems[0]
            raise ModelError(
                message, where=f"{self.source or self.name}: {key}", hint=_SPEC_KEYS_HINT
            )

    # -- shapes -----------------------------------------------------------------------
    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layer_ids)

    @property
    def mtp_layer_ids(self) -> tuple[int, ...]:
        """``[next-n layers]`` ids of the MTP layers: ``num_hidden_layers + i``."""
        first = self.num_hidden_layers
        return tuple(range(first, first + self.num_nextn_predict_layers))

    @property
    def all_moe_layer_ids(self) -> tuple[int, ...]:
        """Every layer routing statistics may record: the MoE layers, then the MTP layers."""
        return self.moe_layer_ids + self.mtp_layer_ids

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert of one layer (biases included)."""
        h, f = self.hidden_size, self.moe_intermediate_size
        return 3 * h * f + (2 * f + h if self.expert_bias else 0)

    @property
    def total_params(self) -> int:
        """All parameters: non-expert plus every routed expert of every MoE layer."""
        return self.non_expert_params + self.num_moe_layers * self.num_experts * self.expert_params

    @property
    def active_params(self) -> int:
        """Parameters one token uses: non-expert plus ``top_k`` experts per MoE layer."""
        return self.non_expert_params + self.num_moe_layers * self.top_k * self.expert_params

    def _dtype(self, dtype: str | None) -> str:
        return self.default_dtype if dtype is None else check_dtype(dtype)

    # -- bytes ------------------------------------------------------------------------
    def expert_scale_bytes(self, dtype: str | None = None) -> int:
        """Quantization scale bytes of one expert of one layer (0 for BF16)."""
        dtype = self._dtype(dtype)
        h, f = self.hidden_size, self.moe_intermediate_size
        if dtype == "fp8":
            blocks = 3 * math.ceil(f / FP8_WEIGHT_BLOCK) * math.ceil(h / FP8_WEIGHT_BLOCK)
            return blocks * FP8_SCALE_BYTES
        if dtype == "mxfp4":
            # gate, up: [f, h] reduce over h; down: [h, f] reduces over f.
            groups = 2 * f * math.ceil(h / MXFP4_BLOCK) + h * math.ceil(f / MXFP4_BLOCK)
            return groups * MXFP4_SCALE_BYTES
        return 0

    def expert_bytes(self, dtype: str | None = None) -> int:
        """Bytes of one routed expert of one layer in ``dtype``, scales and biases included."""
        dtype = self._dtype(dtype)
        h, f = self.hidden_size, self.moe_intermediate_size
        weights = math.ceil(3 * h * f * BYTES_PER_PARAM[dtype])
        bias = (2 * f + h) * BF16_BYTES if self.expert_bias else 0
        return weights + self.expert_scale_bytes(dtype) + bias

    def non_expert_bytes(self, dtype: str | None = None) -> int:
        """Bytes of the non-expert weights when experts are served in ``dtype``."""
        dtype = self._dtype(dtype)
        if dtype != "fp8":
            return self.non_expert_params * BF16_BYTES
        quantized = self.non_expert_params - self.non_expert_bf16_params
        return int(quantized * BYTES_PER_PARAM["fp8"]) + self.non_expert_bf16_params * BF16_BYTES

    def activation_bytes(self, dtype: str | None = None) -> int:
        """Dispatch payload of one token copy: FP8 ``h + h/32`` (DeepEP scales), else ``2h``."""
        dtype = self._dtype(dtype)
        h = self.hidden_size
        if dtype == "fp8":
            return h + math.ceil(h / FP8_ACTIVATION_GROUP) * FP8_SCALE_BYTES
        return h * BF16_BYTES

    def combine_bytes(self) -> int:
        """Combine payload of one token copy (BF16 results): ``2h``."""
        return self.hidden_size * BF16_BYTES


def model_to_dict(model: ModelSpec) -> dict[str, Any]:
    """The spec's fields plus its byte figures per dtype (for ``--json`` and reports)."""
    result: dict[str, Any] = {
        "name": model.name,
        "aliases": list(model.aliases),
        "description": model.description,
        "source": model.source,
        "num_hidden_layers": model.num_hidden_layers,
        "moe_layer_ids": list(model.moe_layer_ids),
        "num_moe_layers": model.num_moe_layers,
        "num_nextn_predict_layers": model.num_nextn_predict_layers,
        "mtp_layer_ids": list(model.mtp_layer_ids),
        "architecture": model.architecture,
        "hub_ids": list(model.hub_ids),
        "num_experts": model.num_experts,
        "top_k": model.top_k,
        "num_groups": model.num_groups,
        "top_groups": model.top_groups,
        "num_shared_experts": model.num_shared_experts,
        "hidden_size": model.hidden_size,
        "moe_intermediate_size": model.moe_intermediate_size,
        "expert_bias": model.expert_bias,
        "non_expert_params": model.non_expert_params,
        "non_expert_bf16_params": model.non_expert_bf16_params,
        "expert_params": model.expert_params,
        "total_params": model.total_params,
        "active_params": model.active_params,
        "default_dtype": model.default_dtype,
        "bytes": {
            dtype: {
                "expert": model.expert_bytes(dtype),
                "expert_scales": model.expert_scale_bytes(dtype),
                "slot": model.expert_bytes(dtype) * model.num_moe_layers,
                "all_experts": model.expert_bytes(dtype) * model.num_moe_layers * model.num_experts,
                "non_expert": model.non_expert_bytes(dtype),
                "activation": model.activation_bytes(dtype),
            }
            for dtype in DTYPES
        },
    }
    return result


def spec_problems(m: Any) -> list[tuple[str, str]]:
    """``(key, message)`` for every inconsistency between a model's fields."""
    out: list[tuple[str, str]] = []
    ids = m.moe_layer_ids
    if not ids:
        out.append(("moe_layer_ids", "a MoE model needs at least one MoE layer"))
    if any(b <= a for a, b in itertools.pairwise(ids)):
        out.append(("moe_layer_ids", "MoE layer ids must be increasing and distinct"))
    if ids and (ids[0] < 0 or ids[-1] >= m.num_hidden_layers):
        out.append(
            (
                "moe_layer_ids",
                f"MoE layer ids must lie in [0, {m.num_hidden_layers}), the hidden"
                f" layers; got {ids[0]}..{ids[-1]}",
            )
        )
    if m.top_k > m.num_experts:
        out.append(("top_k", f"top_k {m.top_k} exceeds num_experts {m.num_experts}"))
    elif m.top_k > MAX_TOP_K:
        out.append(("top_k", f"top_k {m.top_k} is more than placer handles ({MAX_TOP_K})"))
    if m.num_experts % m.num_groups:
        out.append(
            (
                "num_groups",
                f"num_experts {m.num_experts} is not a multiple of num_groups {m.num_groups}",
            )
        )
    elif m.top_groups > m.num_groups:
        out.append(("top_groups", f"top_groups {m.top_groups} exceeds num_groups {m.num_groups}"))
    elif m.top_k > m.top_groups * (m.num_experts // m.num_groups):
        out.append(
            (
                "top_k",
                f"top_k {m.top_k} exceeds the {m.top_groups} x"
                f" {m.num_experts // m.num_groups} experts of the top groups",
            )
        )
    if m.num_nextn_predict_layers < 0:
        out.append(("num_nextn_predict_layers", "num_nextn_predict_layers must be 0 or more"))
    if m.non_expert_bf16_params > m.non_expert_params:
        out.append(("non_expert_bf16_params", "non_expert_bf16_params exceeds non_expert_params"))
    if m.default_dtype not in DTYPES:
        out.append(("default_dtype", f"unknown dtype '{m.default_dtype}'"))
    return out


# -- reading --------------------------------------------------------------------------

SPEC_KEYS_DOC = "see docs/hardware.md, 'Model YAML'"
_SPEC_KEYS_HINT = f"make the model's figures agree with each other; {SPEC_KEYS_DOC}"


def _layer_ids(section: Section, num_hidden_layers: int) -> tuple[int, ...]:
    key = "moe_layer_ids"
    value = section.raw(key, None)
    if value is None:
        return tuple(range(num_hidden_layers))
    if isinstance(value, dict):
        spec = Section(section.doc, value, section.sub(key))
        first = spec.integer("first", minimum=0, maximum=MAX_LAYERS - 1)
        last = spec.integer("last", minimum=0, maximum=MAX_LAYERS - 1)
        step = spec.integer("step", 1, maximum=MAX_LAYERS)
        spec.done()
        if last < first:
            raise spec.fail(
                "last", f"last {last} is before first {first}",
                hint="moe_layer_ids: {first: F, last: L} with F <= L",
            )
        return tuple(range(first, last + 1, step))
    if isinstance(value, list):
        ids: list[int] = []
        for i, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, int) or item < 0:
                raise section.doc.fail(
                    f"{section.sub(key)}[{i}]",
                    f"a layer id must be an integer >= 0, got {item!r:.40}",
                    hint="layer ids are the model's absolute layer indices, from 0",
                )
            if item >= MAX_LAYERS:
                raise section.doc.fail(
                    f"{section.sub(key)}[{i}]",
                    f"layer id {item} is more than placer handles ({MAX_LAYERS} layers)",
                    hint="check the figure (limits: docs/limits.md)",
                )
            ids.append(item)
        return tuple(ids)
    raise section.fail(
        key,
        f"{key} must be a list of layer ids or {{first, last, step}}",
        hint="e.g. moe_layer_ids: {first: 3, last: 60}",
    )


def _strings(section: Section, key: str, what: str) -> tuple[str, ...]:
    """The optional list of strings under ``key`` (aliases, hub ids)."""
    values: list[str] = []
    for path, value in section.items(key, None):
        if not isinstance(value, str):
            raise section.doc.fail(
                path, f"{what} must be a string, got {value!r:.60}", hint="quote it"
            )
        values.append(value)
    return tuple(values)


def model_from_section(section: Section, source: str) -> ModelSpec:
    """Read one model mapping (catalog entry or user file); unknown keys are errors."""
    # limits first: num_hidden_layers: 100000000 must not build 10^8 layer ids
    num_hidden_layers = section.integer("num_hidden_layers", maximum=MAX_LAYERS)
    num_experts = section.integer("num_experts", maximum=MAX_EXPERTS)
    num_groups = section.integer("num_groups", 1, maximum=MAX_EXPERTS)
    values: dict[str, Any] = dict(
        name=section.string("name"),
        num_hidden_layers=num_hidden_layers,
        moe_layer_ids=_layer_ids(section, num_hidden_layers),
        num_experts=num_experts,
        top_k=section.integer("top_k", maximum=MAX_EXPERTS),
        num_groups=num_groups,
        top_groups=section.integer("top_groups", num_groups, maximum=MAX_EXPERTS),
        num_shared_experts=section.integer("num_shared_experts", 0, minimum=0,
                                           maximum=MAX_EXPERTS),
        hidden_size=section.integer("hidden_size", maximum=MAX_MODEL_DIM),
        moe_intermediate_size=section.integer("moe_intermediate_size", maximum=MAX_MODEL_DIM),
        non_expert_params=section.integer("non_expert_params", minimum=0,
                                          maximum=MAX_MODEL_PARAMS),
        non_expert_bf16_params=section.integer("non_expert_bf16_params", 0, minimum=0,
                                               maximum=MAX_MODEL_PARAMS),
        default_dtype=section.string("default_dtype", "bf16", choices=DTYPES),
        expert_bias=section.boolean("expert_bias", False),
        num_nextn_predict_layers=section.integer("num_nextn_predict_layers", 0, minimum=0,
                                                 maximum=MAX_LAYERS),
        architecture=section.string("architecture", ""),
        hub_ids=_strings(section, "hub_ids", "a hub id"),
        aliases=_strings(section, "aliases", "an alias"),
        description=section.string("description", ""),
        source=source,
    )
    section.done()
    problems = spec_problems(SimpleNamespace(**values))
    if problems:
        key, message = problems[0]
        raise section.fail(key if section.has(key) else None, message, _SPEC_KEYS_HINT)
    return ModelSpec(**values)
