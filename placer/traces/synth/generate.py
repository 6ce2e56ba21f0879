"""The seeded layout of a synthetic trace, then its tokens chunk by chunk.

Each token gets a distribution index ``(phase, topic, cluster)`` (its step's rotation of
the popularity ranks, its request's topic, its cluster), every layer the expert weights
of each index, and :func:`placer.traces.synth.sampling.route` its experts.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from placer.limits import check_allocation, format_bytes
from placer.traces.synth.params import SynthParams
from placer.traces.synth.sampling import route
from placer.traces.synth.topics import TopicTimeline, topic_profiles

__all__ = ["SynthChunk", "SynthLayout", "synth_layout", "synthesize"]

#: Most distinct drift phases within one chunk (steps in a chunk share these).
MAX_PHASES_PER_CHUNK = 64


@dataclass(frozen=True)
class SynthLayout:
    """The fixed, seeded structure of a synthetic trace.

    Attributes
    ----------
    popularity_rank: ``[layers, experts]`` int64, rank of each expert at step 0
        (0 = hottest), shared by every token without topics.
    cluster_of: ``[layers, experts]`` int64, co-activation cluster of each expert
        (all -1 without clusters).
    topic_rank: ``[topics, layers, experts]`` int64, rank of each expert under each topic
        at step 0, or None without topics.
    topic_share: ``[topics]`` float64, each topic's long-run share of the requests, or None.
    """

    popularity_rank: np.ndarray
    cluster_of: np.ndarray
    topic_rank: np.ndarray | None = None
    topic_share: np.ndarray | None = None


def synth_layout(params: SynthParams) -> SynthLayout:
    """Popularity ranks, clusters and topics of ``params``, drawn from its seed."""
    rng = np.random.default_rng(np.random.SeedSequence(params.seed, spawn_key=(0,)))
    n_layers, e = params.num_layers, params.num_experts
    rank = np.empty((n_layers, e), dtype=np.int64)
    cluster = np.full((n_layers, e), -1, dtype=np.int64)
    for row in range(n_layers):
        rank[row, rng.permutation(e)] = np.arange(e)
        if params.clusters:
            cluster[row, rng.permutation(e)] = np.arange(e) % params.clusters
    if not params.topics:
        return SynthLayout(popularity_rank=rank, cluster_of=cluster)
    topic_rank, share = topic_profiles(params, rank, cluster)
    return SynthLayout(rank, cluster, topic_rank=topic_rank, topic_share=share)


@dataclass(frozen=True)
class SynthChunk:
    """Consecutive synthetic tokens ``start .. start + tokens - 1``.

    Attributes
    ----------
    start: index of the first token.
    topk_ids: ``[tokens, layers, k]`` int16 logical expert ids (distinct per row).
    step: ``[tokens]`` int64 forward step of each token.
    rank: ``[tokens]`` int64 source rank of each token, or None (not recorded).
    topk_weights: ``[tokens, layers, k]`` float32 normalized weights, or None.
    topic: ``[tokens]`` int64 topic of each token's request, or None without topics.
    """

    start: int
    topk_ids: np.ndarray
    step: np.ndarray
    rank: np.ndarray | None
    topk_weights: np.ndarray | None = None
    topic: np.ndarray | None = None


def memory_bytes(params: SynthParams) -> list[tuple[int, str, str]]:
    """What generating ``params`` holds in memory at its peak, by part: ``(bytes, what,
    what to make smaller)`` (the chunk's ids, a layer's weight tables, the topic profiles,
    the requests of one step's slots, the draws of one layer)."""
    n = min(params.chunk_tokens, params.num_tokens)
    layers, e, k = params.num_layers, params.num_experts, params.top_k
    phases = min(MAX_PHASES_PER_CHUNK, -(-n // params.tokens_per_step) + 1) if params.drift else 1
    tables = phases * max(params.topics, 1) * max(params.clusters, 1)
    grouped = 3 * params.top_groups if params.num_groups > 1 else 0
    draws = min(2 * k + 8 + grouped, 64)
    return [
        (n * layers * k * (6 if params.weights else 2), f"a chunk of {n:,} tokens x {layers:,}"
         f" layers x top-{k}", "fewer `layers` or a smaller `top_k`"),
        (100 * tables * e, f"{tables:,} weight tables of {e:,} experts (drift phases x topics"
         " x clusters)", "fewer `clusters` or `topics`"),
        (40 * params.topics * layers * e, f"{params.topics:,} topic profiles of {layers:,}"
         f" layers x {e:,} experts", "fewer `topics`"),
        (16 * params.tokens_per_step if params.topics else 0,
         f"the requests of {params.tokens_per_step:,} slots", "a smaller `tokens_per_step`"),
        (40 * n * draws + 16 * layers * e, f"the draws of {n:,} tokens", "fewer `layers`"),
    ]


def check_memory(params: SynthParams) -> None:
    """Refuse ``params`` before any work when generating it would need more memory than
    is free (:func:`placer.limits.check_allocation`), naming its largest part."""
    parts = memory_bytes(params)
    need, what, smaller = max(parts)
    check_allocation(sum(size for size, _, _ in parts), f"a synthetic trace ({what})",
                     f"{smaller}: that part alone takes {format_bytes(need)}")


def synthesize(params: SynthParams) -> Iterator[SynthChunk]:
    """Generate the trace of ``params`` chunk by chunk (at most ``chunk_tokens`` each);
    refused at once when it would not fit in memory (:func:`check_memory`)."""
    check_memory(params)
    layout = synth_layout(params)
    timeline = None
    if layout.topic_share is not None:
        timeline = TopicTimeline(params, layout.topic_share)
    for index, start in enumerate(range(0, params.num_tokens, params.chunk_tokens)):
        stop = min(start + params.chunk_tokens, params.num_tokens)
        rng = np.random.default_rng(np.random.SeedSequence(params.seed, spawn_key=(1, index)))
        yield _chunk(params, layout, timeline, start, stop, rng)


def _chunk(
    params: SynthParams,
    layout: SynthLayout,
    timeline: TopicTimeline | None,
    start: int,
    stop: int,
    rng: np.random.Generator,
) -> SynthChunk:
    n = stop - start
    token = np.arange(start, stop, dtype=np.int64)
    step = token // params.tokens_per_step
    slot = token % params.tokens_per_step
    rank = slot % params.num_ranks if params.num_ranks else None
    # Step 1: each token's distribution index d = (phase * topics + topic) * clusters + cluster.
    n_clusters = max(params.clusters, 1)
    n_topics = max(params.topics, 1)
    topic = None
    if timeline is not None:
        topic, cluster = timeline.assign(step, slot)
    elif params.clusters:
        cluster = rng.integers(0, n_clusters, size=n)
    else:
        cluster = np.zeros(n, np.int64)
    phases, phase_of = _phases(params, step)
    dist = (phase_of * n_topics + (0 if topic is None else topic)) * n_clusters + cluster
    k = params.top_k
    ids = np.empty((n, params.num_layers, k), dtype=np.int16)
    weights = np.empty((n, params.num_layers, k), dtype=np.float32) if params.weights else None
    zipf = params.zipf_per_layer()
    for row in range(params.num_layers):
        # Step 2: expert weights of every distribution of this layer, [D, E].
        w = _weights(layout, row, zipf[row], phases, params, n_clusters)
        chosen = route(w, dist, params, rng)
        ids[:, row] = chosen
        if weights is not None:
            picked = np.take_along_axis(w[dist], chosen, axis=1)
            weights[:, row] = picked / picked.sum(axis=1, keepdims=True)
    return SynthChunk(start=start, topk_ids=ids, step=step, rank=rank, topk_weights=weights,
                      topic=topic)


def _phases(params: SynthParams, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drift phases (ranks) used in this chunk ``[P]`` and each token's phase index."""
    if params.drift == 0:
        return np.zeros(1), np.zeros(step.size, dtype=np.int64)
    s0, s1 = int(step[0]), int(step[-1])
    n_steps = s1 - s0 + 1
    n_phases = min(n_steps, MAX_PHASES_PER_CHUNK)
    phase_of = (step - s0) * n_phases // n_steps
    first_step = s0 + np.ceil(np.arange(n_phases) * n_steps / n_phases)
    return params.drift * first_step, phase_of


def _weights(
    layout: SynthLayout,
    row: int,
    zipf: float,
    phases: np.ndarray,
    params: SynthParams,
    n_clusters: int,
) -> np.ndarray:
    """``[phases * topics * clusters, experts]`` float64 weights of one layer."""
    e = params.num_experts
    if layout.topic_rank is None:
        base = layout.popularity_rank[row][None, :]  # [1, E]
    else:
        base = layout.topic_rank[:, row, :]  # [T, E]
    r = np.mod(base[None, :, :] + phases[:, None, None], e).reshape(-1, e)  # [P * T, E]
    if params.popularity == "lognormal":  # 0 at rank 0, falling with the normal quantiles
        z = _normal_quantiles(e)
        log_w = zipf * (np.interp(np.minimum(r, e - 1), np.arange(e), z) - z[0])
    else:
        log_w = -zipf * np.log1p(np.minimum(r, e - 1))
    # Between rank E-1 and E the coldest expert ramps up to the hottest's weight.
    ramp = np.clip(r - (e - 1), 0.0, 1.0)
    log_w = log_w * (1.0 - ramp)
    w = np.exp(log_w - log_w.max(axis=1, keepdims=True))
    if params.clusters:
        boost = np.where(
            layout.cluster_of[row][None, :] == np.arange(n_clusters)[:, None],
            params.cluster_boost,
            1.0,
        )  # [C, E]
        w = (w[:, None, :] * boost[None, :, :]).reshape(-1, e)
    return w


@functools.lru_cache(maxsize=16)
def _normal_quantiles(experts: int) -> np.ndarray:
    """``[E]`` standard normal quantiles of ``1 - (r + 0.5) / E`` for ranks ``r``,
    decreasing (the lognormal popularity's log weights per unit of sigma)."""
    normal = statistics.NormalDist()
    return np.array([normal.inv_cdf(1.0 - (r + 0.5) / experts) for r in range(experts)])
