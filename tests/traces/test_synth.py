"""placer.traces.synth: determinism, shapes, group limits, skew, clusters, drift, sampling."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from placer.errors import UsageError
from placer.stats.analysis import hot_set, jaccard, max_over_mean
from placer.traces.synth import SynthParams, params_for_model, synth_layout, synthesize


def generate(params: SynthParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All chunks of ``params`` joined: ``topk_ids [N, L, k]``, ``step [N]``, ``rank [N]``
    (-1 where no ranks are recorded)."""
    chunks = list(synthesize(params))
    return (
        np.concatenate([c.topk_ids for c in chunks]),
        np.concatenate([c.step for c in chunks]),
        np.concatenate([c.rank if c.rank is not None else np.full(c.step.size, -1)
                        for c in chunks]),
    )


def loads(ids: np.ndarray, num_experts: int) -> np.ndarray:
    """``[layers, experts]`` selections of ``ids: [N, L, k]``."""
    return np.stack([np.bincount(ids[:, row].ravel(), minlength=num_experts)
                     for row in range(ids.shape[1])])


@pytest.fixture
def small() -> SynthParams:
    """2,000 tokens, 3 layers x 16 experts, top-2, chunks of 512 tokens (4 chunks)."""
    return SynthParams(num_tokens=2000, layer_ids=(3, 4, 5), num_experts=16, top_k=2,
                       chunk_tokens=512, seed=7)


def test_same_seed_same_trace_other_seed_other_trace(small):
    a, b = generate(small), generate(small)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    from dataclasses import replace

    c = generate(replace(small, seed=8))
    assert not np.array_equal(a[0], c[0])


def test_chunks_cover_every_token_once(small):
    chunks = list(synthesize(small))
    assert [c.start for c in chunks] == [0, 512, 1024, 1536]
    assert sum(c.topk_ids.shape[0] for c in chunks) == 2000


@pytest.mark.parametrize(
    ("experts", "top_k", "groups", "top_groups"),
    [(8, 1, 1, 1), (8, 2, 1, 1), (32, 4, 1, 1), (64, 6, 4, 2), (128, 8, 1, 1),
     (256, 8, 8, 4), (384, 8, 1, 1), (512, 10, 16, 4)],
)
def test_every_shape_gives_distinct_in_range_ids(experts, top_k, groups, top_groups):
    p = SynthParams(num_tokens=600, layer_ids=(0, 1), num_experts=experts, top_k=top_k,
                    num_groups=groups, top_groups=top_groups, zipf=1.2, clusters=4, drift=0.5,
                    tokens_per_step=64, seed=1)
    ids, _, _ = generate(p)
    assert ids.shape == (600, 2, top_k) and ids.dtype == np.int16
    assert ids.min() >= 0 and ids.max() < experts
    srt = np.sort(ids, axis=2)
    assert not (srt[:, :, 1:] == srt[:, :, :-1]).any(), "an expert twice in one token"


def test_group_limited_routing_stays_in_top_groups():
    """DeepSeek-V3 shape: 8 groups of 32, top-4 groups, top-8 experts, strong skew."""
    p = SynthParams(num_tokens=3000, layer_ids=(3, 4), num_experts=256, top_k=8, num_groups=8,
                    top_groups=4, zipf=1.5, clusters=8, seed=2)
    ids, _, _ = generate(p)
    groups = np.sort(ids // 32, axis=2)
    distinct = 1 + (groups[:, :, 1:] != groups[:, :, :-1]).sum(axis=2)
    assert distinct.max() <= 4
    assert (distinct == 4).any()  # the limit binds, it is not trivially met


def test_higher_zipf_exponent_means_more_skew():
    ratios = []
    for s in (0.0, 0.6, 1.2, 2.0):
        p = SynthParams(num_tokens=4000, layer_ids=(0,), num_experts=64, top_k=4, zipf=s, seed=3)
        ratios.append(max_over_mean(loads(generate(p)[0], 64)[0]))
    assert ratios == sorted(ratios)
    assert ratios[0] < 1.3 and ratios[-1] > 3


def test_zipf_per_layer():
    p = SynthParams(num_tokens=3000, layer_ids=(0, 1), num_experts=32, top_k=2,
                    zipf=(0.0, 2.0), seed=4)
    load = loads(generate(p)[0], 32)
    assert max_over_mean(load[0]) < 1.4 < max_over_mean(load[1])


def test_clusters_raise_within_cluster_coactivation():
    p = SynthParams(num_tokens=4000, layer_ids=(0, 1), num_experts=32, top_k=4, zipf=0.5,
                    clusters=4, cluster_boost=6.0, seed=5)
    ids, _, _ = generate(p)
    cluster_of = synth_layout(p).cluster_of[0]
    same = other = 0
    for row in ids[:, 0]:
        for i, j in itertools.combinations(row.tolist(), 2):
            if cluster_of[i] == cluster_of[j]:
                same += 1
            else:
                other += 1
    # Without clusters a random pair is in the same cluster with probability 7/31.
    assert same / (same + other) > 1.5 * 7 / 31


def test_drift_rotates_the_hot_set():
    def first_last_jaccard(drift: float) -> float:
        p = SynthParams(num_tokens=8192, layer_ids=(0,), num_experts=64, top_k=4, zipf=1.2,
                        drift=drift, tokens_per_step=64, seed=6)
        ids, step, _ = generate(p)
        first = loads(ids[step < 16], 64)[0]
        last = loads(ids[step >= 112], 64)[0]
        return jaccard(hot_set(first, 8), hot_set(last, 8))

    assert first_last_jaccard(0.0) >= 0.6
    assert first_last_jaccard(0.3) <= 0.2


def test_steps_and_ranks_round_robin():
    p = SynthParams(num_tokens=50, num_experts=8, top_k=2, tokens_per_step=8, num_ranks=3,
                    chunk_tokens=16)
    _, step, rank = generate(p)
    t = np.arange(50)
    np.testing.assert_array_equal(step, t // 8)
    np.testing.assert_array_equal(rank, (t % 8) % 3)


def test_sampling_follows_plackett_luce_exactly():
    """4 experts with weights 8:4:2:1 (zipf on ranks is replaced by checking the law).

    P(ordered pick a then b) = w_a / W * w_b / (W - w_a); the chosen *set* probability
    sums both orders.  20,000 tokens: each set frequency within 4 standard errors.
    """
    p = SynthParams(num_tokens=20000, layer_ids=(0,), num_experts=4, top_k=2,
                    zipf=1.0, seed=9)
    rank = synth_layout(p).popularity_rank[0]
    w = (1.0 + rank) ** -1.0
    total = w.sum()
    ids, _, _ = generate(p)
    sets = np.sort(ids[:, 0], axis=1)
    for a, b in itertools.combinations(range(4), 2):
        prob = w[a] / total * w[b] / (total - w[a]) + w[b] / total * w[a] / (total - w[b])
        freq = np.mean((sets[:, 0] == a) & (sets[:, 1] == b))
        assert abs(freq - prob) < 4 * np.sqrt(prob * (1 - prob) / 20000)


def test_group_stage_follows_plackett_luce_on_group_weights():
    """8 experts in 4 groups of 2, top-1 group, top-1 expert: P(group g) = W_g / W."""
    p = SynthParams(num_tokens=20000, layer_ids=(0,), num_experts=8, top_k=1, num_groups=4,
                    top_groups=1, zipf=1.0, seed=10)
    w = (1.0 + synth_layout(p).popularity_rank[0]) ** -1.0
    ids, _, _ = generate(p)
    for e in range(8):
        prob = w[e] / w.sum()
        freq = np.mean(ids[:, 0, 0] == e)
        assert abs(freq - prob) < 4 * np.sqrt(prob * (1 - prob) / 20000)


def test_weights_are_normalized_per_token_layer():
    p = SynthParams(num_tokens=300, num_experts=16, top_k=3, weights=True, seed=11)
    chunk = next(iter(synthesize(p)))
    assert chunk.topk_weights is not None
    np.testing.assert_allclose(chunk.topk_weights.sum(axis=2), 1.0, rtol=1e-5)


def test_header_declares_synthetic():
    h = SynthParams(model="toy").header()
    assert h["synthetic"] is True and h["model"] == "toy"
    assert (h["num_layers"], h["num_experts"], h["top_k"]) == (4, 64, 4)
    assert h["generator"] == "placer.traces.synth" and h["synth_seed"] == 0


def test_params_for_model_takes_the_preset_shape():
    from placer.model import load_model

    p = params_for_model(load_model("deepseek-v3"), num_tokens=10, top_k=None)
    assert p.layer_ids[0] == 3 and p.num_layers == 58
    assert (p.num_experts, p.top_k, p.num_groups, p.top_groups) == (256, 8, 8, 4)
    assert p.model == "deepseek-v3"
    assert params_for_model(load_model("deepseek-v3"), layer_ids=(3, 4)).num_layers == 2


@pytest.mark.parametrize(
    ("kwargs", "where", "message"),
    [
        ({"num_experts": 1}, "experts", "expected 2 to 4096 experts, got 1"),
        ({"top_k": 0}, "top_k", "expected top-k in [1, 63] for 64 experts, got 0"),
        ({"num_groups": 5}, "groups", "groups must divide the 64 experts, got 5"),
        ({"num_groups": 8, "top_groups": 1, "top_k": 9}, "top_groups",
         "1 groups of 8 experts cannot hold top-9"),
        ({"zipf": (1.0, 2.0)}, "zipf", "expected one Zipf exponent or 4 (one per layer), got 2"),
        ({"zipf": -1.0}, "zipf",
         "Zipf exponents must be finite and >= 0, got [-1.0, -1.0, -1.0, -1.0]"),
        ({"num_tokens": 0}, "tokens", "expected at least 1 token, got 0"),
        ({"layer_ids": (1, 1)}, "layers", "layer ids must be distinct and >= 0, got [1, 1]"),
        ({"drift": -0.1}, "drift", "drift must be >= 0 ranks per step, got -0.1"),
    ],
)
def test_bad_params_name_the_option(kwargs, where, message):
    with pytest.raises(UsageError) as info:
        SynthParams(**kwargs)
    assert info.value.where == where
    assert info.value.message == message
