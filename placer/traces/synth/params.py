"""What a synthetic trace is made of: :class:`SynthParams`, validated, and its header.

The knobs are explained in the package docstring (:mod:`placer.traces.synth`) and in
docs/stats.md.  Defaults keep the generator as it was before topics existed: a
trace made with the old knobs only has the same tokens and the same header.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from placer import constants
from placer.errors import Param, UsageError

if TYPE_CHECKING:
    from placer.model import ModelSpec

__all__ = ["TOPIC_FIELDS", "SynthParams", "params_for_model"]

#: Topic overlap of the shallowest and the deepest layer given, when not set: shallow
#: layers route more by the token itself, deep layers more by what the request is about.
OVERLAP_SHALLOW, OVERLAP_DEEP = 0.7, 0.3

#: The settings of the topic model; they exist in a trace's header only when it has topics.
TOPIC_FIELDS = ("topics", "topic_overlap", "burst_every", "burst_share", "mix_period",
                "request_steps")


def _bad(message: str, option: str, hint: str | None = None) -> UsageError:
    return UsageError(message, where=Param(option), hint=hint)


def _at_least(low: int) -> str:
    """The hint of a value below ``low``."""
    return f"give a value >= {low}; the nearest valid one is {low}"


def _within(low: float, high: float, got: float) -> str:
    """The hint of ``got`` outside ``low`` to ``high``."""
    nearest = low if not got >= low else high  # NaN: the low end
    return f"give a value from {low:g} to {high:g}; the nearest valid one is {nearest:g}"


#: How weight falls with popularity rank (:attr:`SynthParams.popularity`).
POPULARITY_SHAPES = ("zipf", "lognormal")


def _per_layer(value: float | tuple[float, ...], num_layers: int) -> np.ndarray:
    if isinstance(value, tuple):
        return np.asarray(value, dtype=np.float64)
    return np.full(num_layers, float(value))


@dataclass(frozen=True)
class SynthParams:
    """What to generate.  Validates itself; bad values raise UsageError naming the option.

    Attributes
    ----------
    num_tokens: tokens to generate (each routed through every layer).
    layer_ids: absolute layer index of each MoE layer, ``[layers]``.
    num_experts: logical experts per layer ``E``.
    top_k: experts selected per token per layer.
    num_groups: expert groups ``G`` for group-limited routing (1 = ungrouped); must
        divide ``E``.
    top_groups: groups a token may use (``<= G``); ``top_groups * E / G >= top_k``.
    zipf: the skew of expert popularity, one for all layers or one per layer: the Zipf
        exponent (``popularity`` ``"zipf"``) or the standard deviation of the log
        weights (``"lognormal"``); 0 = uniform.
    popularity: how weight falls with popularity rank ``r``: ``"zipf"``,
        ``(1 + r) ** -zipf``; ``"lognormal"``, ``exp(zipf x z(r))`` with ``z(r)`` the
        standard normal quantile of ``1 - (r + 0.5) / E`` (measured routing's shape: many
        warm experts, no single dominant one; :mod:`placer.traces.synth.skew`).
    clusters: co-activation clusters per layer (0 = none).
    cluster_boost: weight multiplier of a token's own cluster (> 0; 1 = no effect).
    drift: popularity ranks rotated per step (0 = stationary).
    tokens_per_step: tokens in one forward step (batch).
    num_ranks: data-parallel source ranks; tokens of a step are dealt round-robin;
        0 = not recorded (readers then deal a step's tokens over the GPUs planned for).
    weights: also emit ``topk_weights`` (the chosen experts' weights, normalized).
    seed: random seed.
    model: model name written in the header.
    chunk_tokens: tokens generated at a time (memory bound; part of the seed's meaning
        without topics).
    topics: request topics (0 = none: one popularity profile for every token).
    topic_overlap: share of an expert's popularity score common to every topic, in
        ``[0, 1]`` (1: topics alike); one value, one per layer, or None for a depth
        profile from ``OVERLAP_SHALLOW`` (first layer) to ``OVERLAP_DEEP`` (last).
    burst_every: mean steps between switches of the dominant topic (0 = never).
    burst_share: share of new requests that take the dominant topic, in ``[0, 1]``.
    mix_period: steps of one slow cycle of the background topic mix (0 = constant).
    request_steps: mean steps a request lasts (>= 1); it keeps its topic throughout.
    """

    num_tokens: int = 65_536
    layer_ids: tuple[int, ...] = (0, 1, 2, 3)
    num_experts: int = 64
    top_k: int = 4
    num_groups: int = 1
    top_groups: int = 1
    zipf: float | tuple[float, ...] = 1.0
    popularity: str = "zipf"
    clusters: int = 0
    cluster_boost: float = 4.0
    drift: float = 0.0
    tokens_per_step: int = 256
    num_ranks: int = 0
    weights: bool = False
    seed: int = 0
    model: str | None = None
    chunk_tokens: int = constants.SYNTH_CHUNK_TOKENS
    topics: int = 0
    topic_overlap: float | tuple[float, ...] | None = None
    burst_every: float = 0.0
    burst_share: float = 0.5
    mix_period: float = 0.0
    request_steps: float = 64.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer_ids", tuple(int(i) for i in self.layer_ids))
        for name in ("zipf", "topic_overlap"):
            value = getattr(self, name)
            if isinstance(value, list | tuple | np.ndarray):
                object.__setattr__(self, name, tuple(float(z) for z in value))
            elif value is not None:
                object.__setattr__(self, name, float(value))
        self._validate_shape()
        self._validate_skew()
        self._validate_steps()
        self._validate_topics()

    def _validate_shape(self) -> None:
        e, k = self.num_experts, self.top_k
        if self.num_tokens < 1:
            raise _bad(f"expected at least 1 token, got {self.num_tokens}", "tokens",
                       hint=_at_least(1))
        if not self.layer_ids:
            raise _bad("expected at least one layer", "layers",
                       hint="give a count (4: ids 0-3) or ids such as 3-60 or 0,2,4")
        if len(set(self.layer_ids)) != len(self.layer_ids) or min(self.layer_ids) < 0:
            raise _bad(f"layer ids must be distinct and >= 0, got {list(self.layer_ids)}",
                       "layers", hint="give a count (4: ids 0-3) or ids such as 3-60 or 0,2,4")
        if not 2 <= e <= constants.SYNTH_MAX_EXPERTS:
            raise _bad(f"expected 2 to {constants.SYNTH_MAX_EXPERTS} experts, got {e}",
                       "experts", hint=_within(2, constants.SYNTH_MAX_EXPERTS, e))
        if not 1 <= k <= min(e - 1, constants.SYNTH_MAX_TOP_K):
            most = min(e - 1, constants.SYNTH_MAX_TOP_K)
            raise _bad(f"expected top-k in [1, {most}] for {e} experts, got {k}", "top_k",
                       hint=_within(1, most, k) + " (a token selects fewer experts than"
                       " there are)")
        if self.num_groups < 1 or e % self.num_groups:
            raise _bad(f"groups must divide the {e} experts, got {self.num_groups}", "groups",
                       hint="DeepSeek-V3 uses 8 groups of 32 experts")
        if not 1 <= self.top_groups <= self.num_groups:
            raise _bad(f"expected top groups in [1, {self.num_groups}], got {self.top_groups}",
                       "top_groups", hint=_within(1, self.num_groups, self.top_groups))
        if self.top_groups * (e // self.num_groups) < k:
            raise _bad(f"{self.top_groups} groups of {e // self.num_groups} experts cannot "
                       f"hold top-{k}", "top_groups", hint="raise `top_groups` or lower `top_k`")

    def _validate_skew(self) -> None:
        zipf = self.zipf_per_layer()
        if zipf.shape != (self.num_layers,):
            raise _bad(f"expected one Zipf exponent or {self.num_layers} (one per layer), "
                       f"got {zipf.size}", "zipf",
                       hint="give one number (1.2) or one per layer (0.8,1.0,1.2)")
        if not np.isfinite(zipf).all() or (zipf < 0).any():
            raise _bad(f"Zipf exponents must be finite and >= 0, got {zipf.tolist()}", "zipf",
                       hint="give exponents >= 0 (0: uniform popularity), e.g. `zipf` 1.0")
        if self.popularity not in POPULARITY_SHAPES:
            raise _bad(f"unknown popularity shape {self.popularity!r}", "popularity",
                       hint=f"use one of {', '.join(POPULARITY_SHAPES)}")
        if self.clusters < 0 or self.clusters > self.num_experts:
            raise _bad(f"expected 0 to {self.num_experts} clusters, got {self.clusters}",
                       "clusters", hint=_within(0, self.num_experts, self.clusters))
        if not (math.isfinite(self.cluster_boost) and self.cluster_boost > 0):
            raise _bad(f"cluster boost must be > 0, got {self.cluster_boost}", "cluster_boost",
                       hint="give a factor > 0, e.g. `cluster_boost` 4 (1: no effect)")
        if not (math.isfinite(self.drift) and self.drift >= 0):
            raise _bad(f"drift must be >= 0 ranks per step, got {self.drift}", "drift",
                       hint=_at_least(0))

    def _validate_steps(self) -> None:
        if self.tokens_per_step < 1:
            raise _bad(f"expected at least 1 token per step, got {self.tokens_per_step}",
                       "tokens_per_step", hint=_at_least(1))
        if self.num_ranks < 0:
            raise _bad(f"expected 0 (not recorded) or more ranks, got {self.num_ranks}",
                       "ranks", hint=_at_least(0))
        if self.chunk_tokens < 1:
            raise UsageError(f"expected chunks of at least 1 token, got {self.chunk_tokens}",
                             where="chunk_tokens", hint=_at_least(1))

    def _validate_topics(self) -> None:
        if self.topics < 0:
            raise _bad(f"expected 0 (none) or more topics, got {self.topics}", "topics",
                       hint=_at_least(0))
        if not self.topics:
            moved = [name for name in TOPIC_FIELDS[1:]
                     if getattr(self, name) != SynthParams.__dataclass_fields__[name].default]
            if moved:
                raise _bad("shapes request topics, but `topics` is 0", moved[0],
                           hint="give `topics` (2 or more) to use it")
            return
        overlap = self.topic_overlap_per_layer()
        if overlap.shape != (self.num_layers,):
            raise _bad(f"expected one topic overlap or {self.num_layers} (one per layer), "
                       f"got {overlap.size}", "topic_overlap",
                       hint="give one share (0.5) or one per layer (0.7,0.5,0.3)")
        if not ((overlap >= 0) & (overlap <= 1)).all():
            raise _bad(f"topic overlaps must be in [0, 1], got {overlap.tolist()}",
                       "topic_overlap", hint="give shares from 0 to 1, e.g. `topic_overlap` 0.5")
        if not (math.isfinite(self.burst_every) and self.burst_every >= 0):
            raise _bad(f"expected 0 (no bursts) or more steps between bursts, got "
                       f"{self.burst_every}", "burst_every", hint=_at_least(0))
        if not 0 <= self.burst_share <= 1:
            raise _bad(f"burst share must be in [0, 1], got {self.burst_share}", "burst_share",
                       hint=_within(0, 1, self.burst_share))
        if not (math.isfinite(self.mix_period) and self.mix_period >= 0):
            raise _bad(f"expected 0 (constant mix) or more steps per cycle, got "
                       f"{self.mix_period}", "mix_period", hint=_at_least(0))
        if not (math.isfinite(self.request_steps) and self.request_steps >= 1):
            raise _bad(f"requests last at least 1 step on average, got {self.request_steps}",
                       "request_steps", hint=_at_least(1))

    @property
    def num_layers(self) -> int:
        return len(self.layer_ids)

    def zipf_per_layer(self) -> np.ndarray:
        """``[layers]`` float64 Zipf exponent of each layer."""
        return _per_layer(self.zipf, self.num_layers)

    def topic_overlap_per_layer(self) -> np.ndarray:
        """``[layers]`` float64 topic overlap of each layer (the depth profile when unset).

        The profile is linear in the absolute layer id, from ``OVERLAP_SHALLOW`` at the
        smallest id given to ``OVERLAP_DEEP`` at the largest (their mean for one layer).
        """
        if self.topic_overlap is not None:
            return _per_layer(self.topic_overlap, self.num_layers)
        ids = np.asarray(self.layer_ids, dtype=np.float64)
        span = ids.max() - ids.min()
        depth = (ids - ids.min()) / span if span else np.full(ids.size, 0.5)
        return OVERLAP_SHALLOW + (OVERLAP_DEEP - OVERLAP_SHALLOW) * depth

    def header(self) -> dict[str, Any]:
        """Trace metadata: the header fields of docs/traces.md, then ``synth_*`` generator settings.

        Flat scalars (and the per-layer lists), so both the JSONL header and the NPZ
        scalar members can hold them.  The topic model's settings are written only when
        it is on (``topics > 0``), the topic overlap per layer.
        """
        head: dict[str, Any] = {
            "model": self.model or "synthetic",
            "num_layers": self.num_layers,
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "synthetic": True,
            "generator": "placer.traces.synth",
        }
        skip = {"layer_ids", "model", "num_experts", "top_k", "chunk_tokens", *TOPIC_FIELDS}
        if self.popularity == "zipf":  # the original shape: headers as they always were
            skip.add("popularity")
        for key, value in asdict(self).items():
            if key not in skip:
                head[f"synth_{key}"] = list(value) if isinstance(value, tuple) else value
        head["synth_chunk_tokens"] = self.chunk_tokens
        if self.topics:
            for key in TOPIC_FIELDS:
                head[f"synth_{key}"] = getattr(self, key)
            head["synth_topic_overlap"] = [round(float(v), 6)
                                           for v in self.topic_overlap_per_layer()]
        return head


def params_for_model(model: ModelSpec, **overrides: Any) -> SynthParams:
    """SynthParams with a model preset's shape.

    Takes ``moe_layer_ids``, ``num_experts``, ``top_k``, ``num_groups``, ``top_groups``
    and ``name`` from ``model``; keyword ``overrides`` win over them (None: not given).
    """
    base: dict[str, Any] = {
        "layer_ids": tuple(model.moe_layer_ids),
        "num_experts": int(model.num_experts),
        "top_k": int(model.top_k),
        "num_groups": int(model.num_groups or 1),
        "top_groups": int(model.top_groups or 1),
        "model": str(model.name),
    }
    base.update({k: v for k, v in overrides.items() if v is not None})
    return SynthParams(**base)
