"""placer.traces.synth topics: profiles by layer, requests that keep their topic, bursts,
the slow mix, and the old knobs' traces left as they were."""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from placer.errors import UsageError
from placer.stats.analysis import hot_set, jaccard, total_variation
from placer.traces.synth import SynthParams, TopicTimeline, synth_layout, synthesize

REPO = Path(__file__).resolve().parents[2]


def generate(params: SynthParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All chunks joined: ``topk_ids [N, L, k]``, ``step [N]``, ``topic [N]``."""
    chunks = list(synthesize(params))
    topic = [c.topic if c.topic is not None else np.zeros(c.step.size, np.int64)
             for c in chunks]
    return (np.concatenate([c.topk_ids for c in chunks]),
            np.concatenate([c.step for c in chunks]), np.concatenate(topic))


def walk(params: SynthParams, steps: int) -> tuple[np.ndarray, np.ndarray, TopicTimeline]:
    """The timeline of ``params`` over ``steps`` steps: ``topic [steps, slots]``, the
    dominant topic ``[steps]``, and the timeline itself."""
    timeline = TopicTimeline(params, synth_layout(params).topic_share)
    topics, dominant = [], []
    for _ in range(steps):
        timeline.advance()
        topics.append(timeline.topic.copy())
        dominant.append(timeline.dominant)
    return np.array(topics), np.array(dominant), timeline


@pytest.fixture
def topical() -> SynthParams:
    """4 topics over 2 layers of 32 experts, top-4, 64 tokens a step, bursts every 20 steps."""
    return SynthParams(num_tokens=64 * 60, layer_ids=(0, 1), num_experts=32, top_k=4,
                       tokens_per_step=64, topics=4, burst_every=20, clusters=4,
                       chunk_tokens=1000, seed=3)


# -- old knobs, old traces -------------------------------------------------------------


def test_the_bundled_small_trace_is_what_its_documented_command_makes_today():
    """traces/synthetic-small.jsonl.gz (made before topics existed) has the rows the
    generator makes now from the command in traces/README.md."""
    p = SynthParams(num_tokens=8192, layer_ids=(0, 1, 2, 3), num_experts=32, top_k=4,
                    num_groups=4, top_groups=2, zipf=1.1, clusters=4, drift=0.05,
                    tokens_per_step=256, num_ranks=4, seed=0)
    chunks = list(synthesize(p))
    ids = np.concatenate([c.topk_ids for c in chunks])
    rank = np.concatenate([c.rank for c in chunks if c.rank is not None])
    with gzip.open(REPO / "traces" / "synthetic-small.jsonl.gz", "rt") as f:
        header = json.loads(f.readline())
        rows = [json.loads(line) for line in f]
    assert len(rows) == 8192 * 4
    assert [r["experts"] for r in rows[:4]] == ids[0].tolist()
    file_ids = np.array([r["experts"] for r in rows]).reshape(8192, 4, 4)
    np.testing.assert_array_equal(file_ids, ids)
    np.testing.assert_array_equal([r["rank"] for r in rows[::4]], rank)
    assert not any(key.startswith("synth_topic") for key in header)


def test_without_topics_the_header_has_no_topic_settings():
    head = SynthParams(num_ranks=4).header()
    assert "synth_topics" not in head and "synth_burst_every" not in head
    assert head["synth_num_ranks"] == 4


def test_no_ranks_by_default_and_ranks_round_robin_when_given():
    chunk = next(iter(synthesize(SynthParams(num_tokens=10, tokens_per_step=4))))
    assert chunk.rank is None
    chunk = next(iter(synthesize(SynthParams(num_tokens=10, tokens_per_step=4, num_ranks=3))))
    assert chunk.rank.tolist() == [0, 1, 2, 0, 0, 1, 2, 0, 0, 1]


# -- topic profiles ----------------------------------------------------------------------


def test_default_overlap_falls_linearly_with_the_layer_id():
    p = SynthParams(layer_ids=(3, 4, 59, 60), topics=2)
    np.testing.assert_allclose(p.topic_overlap_per_layer(),
                               [0.7, 0.7 - 0.4 / 57, 0.3 + 0.4 / 57, 0.3])
    assert SynthParams(layer_ids=(5,), topics=2).topic_overlap_per_layer().tolist() == [0.5]
    assert SynthParams(topics=2, topic_overlap=0.2).topic_overlap_per_layer().tolist() == [0.2] * 4


def test_full_overlap_gives_every_topic_the_global_order():
    """Overlap 1: the score is the shared part alone, ordered as the global ranks."""
    p = SynthParams(num_experts=16, top_k=2, topics=3, topic_overlap=1.0, clusters=4, seed=4)
    layout = synth_layout(p)
    for t in range(3):
        np.testing.assert_array_equal(layout.topic_rank[t], layout.popularity_rank)
    assert layout.topic_share.shape == (3,) and layout.topic_share.sum() == pytest.approx(1.0)


def test_topics_part_more_in_deep_layers():
    """Two topics' expected loads (top-1 law) differ more where the overlap is lower."""
    p = SynthParams(layer_ids=(3, 60), num_experts=256, top_k=8, topics=8, zipf=0.8, seed=5)
    rank = synth_layout(p).topic_rank
    law = (1.0 + rank) ** -0.8
    law /= law.sum(axis=2, keepdims=True)
    tv = [np.mean([total_variation(law[a, row], law[b, row])
                   for a in range(8) for b in range(a + 1, 8)]) for row in (0, 1)]
    assert tv[0] < tv[1]


def test_experts_of_one_cluster_rise_and_fall_together():
    """Without overlap, a topic's ranks of two experts of one cluster are closer than of
    two experts of different clusters (they share half of their own score)."""
    p = SynthParams(layer_ids=(0,), num_experts=64, top_k=2, topics=16, topic_overlap=0.0,
                    clusters=4, seed=6)
    layout = synth_layout(p)
    same, other = [], []
    cluster = layout.cluster_of[0]
    for t in range(16):
        r = layout.topic_rank[t, 0]
        gap = np.abs(r[:, None] - r[None, :])
        together = cluster[:, None] == cluster[None, :]
        off = ~np.eye(64, dtype=bool)
        same.append(gap[together & off].mean())
        other.append(gap[~together].mean())
    assert np.mean(same) < 0.85 * np.mean(other)


# -- requests and the mix over steps ----------------------------------------------------


def test_requests_keep_their_topic_while_they_last():
    p = SynthParams(tokens_per_step=32, topics=5, request_steps=1e9, burst_every=3, seed=7)
    topics, dominant, _ = walk(p, 50)
    assert (topics == topics[0]).all()  # nobody ended: the first topics stay
    assert len(set(dominant.tolist())) > 1  # though the dominant topic moved


def test_requests_end_at_the_rate_their_length_says():
    """Mean length L, constant mix: a slot changes topic between two steps with
    probability (1 / L) (1 - sum of squared shares)."""
    p = SynthParams(tokens_per_step=200, topics=3, request_steps=10, seed=8)
    topics, _, timeline = walk(p, 400)
    changed = (topics[1:] != topics[:-1]).mean()
    expected = 0.1 * (1 - (timeline.share ** 2).sum())
    n = topics[1:].size
    assert abs(changed - expected) < 4 * math.sqrt(expected * (1 - expected) / n)


def test_dominant_topic_switches_as_a_poisson_process():
    """One slot, 20,000 steps, a switch each step with probability 1 - exp(-1/50)."""
    p = SynthParams(tokens_per_step=1, topics=4, burst_every=50, seed=9)
    _, dominant, _ = walk(p, 20_000)
    switches = int((dominant[1:] != dominant[:-1]).sum())
    expected = 19_999 * -math.expm1(-1 / 50)
    assert abs(switches - expected) < 4 * math.sqrt(expected)


def test_new_requests_follow_the_burst_mix():
    """Requests of one step, 0.7 of them on the dominant topic plus its background share."""
    p = SynthParams(tokens_per_step=500, topics=4, burst_every=30, burst_share=0.7,
                    request_steps=1, seed=10)
    topics, dominant, timeline = walk(p, 200)
    on_dominant = (topics == dominant[:, None]).mean()
    expected = np.mean(0.7 + 0.3 * timeline.share[dominant])
    assert on_dominant == pytest.approx(expected, abs=0.01)


def test_background_mix_cycles_with_its_period():
    """Two topics, period 40: at step 10 topic 0 is e^1 above its share, topic 1 e^-1."""
    p = SynthParams(topics=2, mix_period=40, seed=11)
    timeline = TopicTimeline(p, np.array([0.25, 0.75]))
    b = timeline.background(10)
    assert b[0] / b[1] == pytest.approx(0.25 / 0.75 * math.exp(2))
    np.testing.assert_allclose(timeline.background(40), timeline.background(0))
    np.testing.assert_allclose(timeline.background(0), [0.25, 0.75])
    assert timeline.mixture(10).sum() == pytest.approx(1.0)


def test_topics_do_not_depend_on_the_chunks(topical):
    a = generate(topical)
    b = generate(replace(topical, chunk_tokens=333))
    np.testing.assert_array_equal(a[2], b[2])
    c = generate(topical)
    for x, y in zip(a, c, strict=True):
        np.testing.assert_array_equal(x, y)


def test_a_request_routes_alike_from_step_to_step(topical):
    """The same slot in consecutive steps (mostly the same request: its topic and cluster)
    shares more experts than two slots of one step."""
    ids, _, _ = generate(replace(topical, request_steps=50, topic_overlap=0.0))
    per_step = ids[:, 0].reshape(-1, 64, 4)  # [steps, slots, k]

    def shared(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.mean([len(set(x) & set(y)) for x, y in zip(a, b, strict=True)]))

    same_slot = np.mean([shared(per_step[s], per_step[s + 1]) for s in range(59)])
    other_slot = np.mean([shared(per_step[s], np.roll(per_step[s], 1, axis=0))
                          for s in range(60)])
    assert same_slot > 1.3 * other_slot


def test_bursts_move_the_hot_set_more_than_a_stationary_trace():
    base = SynthParams(num_tokens=256 * 200, layer_ids=(0,), num_experts=64, top_k=4,
                       zipf=0.8, tokens_per_step=256, seed=12)
    drifting = replace(base, topics=6, burst_every=40, request_steps=20, topic_overlap=0.2)

    def first_last(p: SynthParams) -> float:
        ids, step, _ = generate(p)
        first = np.bincount(ids[step < 20, 0].ravel(), minlength=64)
        last = np.bincount(ids[step >= 180, 0].ravel(), minlength=64)
        return jaccard(hot_set(first, 8), hot_set(last, 8))

    assert first_last(base) >= 0.6
    assert first_last(drifting) < first_last(base)


def test_topic_header_records_every_setting():
    h = SynthParams(layer_ids=(3, 60), topics=8, burst_every=64, mix_period=512).header()
    assert h["synth_topics"] == 8 and h["synth_burst_every"] == 64
    assert h["synth_burst_share"] == 0.5 and h["synth_request_steps"] == 64
    assert h["synth_mix_period"] == 512 and h["synth_topic_overlap"] == [0.7, 0.3]


@pytest.mark.parametrize(
    ("kwargs", "where", "message"),
    [
        ({"topics": -1}, "topics", "expected 0 (none) or more topics, got -1"),
        ({"burst_every": 5.0}, "burst_every", "shapes request topics, but `topics` is 0"),
        ({"topics": 2, "topic_overlap": (0.5, 0.5)}, "topic_overlap",
         "expected one topic overlap or 4 (one per layer), got 2"),
        ({"topics": 2, "topic_overlap": 1.5}, "topic_overlap",
         "topic overlaps must be in [0, 1], got [1.5, 1.5, 1.5, 1.5]"),
        ({"topics": 2, "burst_every": -1.0}, "burst_every",
         "expected 0 (no bursts) or more steps between bursts, got -1.0"),
        ({"topics": 2, "burst_share": 2.0}, "burst_share",
         "burst share must be in [0, 1], got 2.0"),
        ({"topics": 2, "mix_period": math.inf}, "mix_period",
         "expected 0 (constant mix) or more steps per cycle, got inf"),
        ({"topics": 2, "request_steps": 0.5}, "request_steps",
         "requests last at least 1 step on average, got 0.5"),
        ({"num_ranks": -1}, "ranks", "expected 0 (not recorded) or more ranks, got -1"),
    ],
)
def test_bad_topic_params_name_the_option(kwargs, where, message):
    with pytest.raises(UsageError) as info:
        SynthParams(**kwargs)
    assert info.value.where == where
    assert info.value.message == message
