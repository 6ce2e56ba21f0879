"""Batches sampled from aggregated statistics: target marginals, exactness, seeding, shapes.

Co-activation and windows are in ``test_evaluate_sampling_coact.py``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from evaluate_fixtures import cluster, placement, random_routing, routing_of, tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st

from placer.evaluate import EvalParams, evaluate
from placer.evaluate.sampling import (
    _enumerate,
    _lookup,
    _points,
    build_sampler,
    sample_topk,
    sampled_batch_windows,
    target_inclusion,
)
from placer.stats import RoutingData


def zipf_load(num_experts: int, exponent: float, total: int = 1_000_000) -> np.ndarray:
    """Selections of a Zipf-skewed layer: expert e gets a share ``(e + 1) ** -exponent``."""
    share = (np.arange(num_experts) + 1.0) ** -exponent
    return np.round(total * share / share.sum())


def selection_frequency(ids: np.ndarray, num_experts: int) -> np.ndarray:
    """``[experts]`` share of tokens that picked each expert."""
    return np.bincount(ids[ids >= 0], minlength=num_experts) / ids.shape[0]


def naive_picks(sampler, row: int, u: float) -> list[int]:
    """Systematic sampling of one token by its definition, with Python loops."""
    picks = sampler.picks
    start = sampler.start[row]
    end = np.append(start[1:], picks)
    out = []
    for c in range(picks):
        x = u + c
        [j] = [j for j in range(start.size) if start[j] <= x < end[j]]
        out.append(int(sampler.order[row, j]))
    return out


# -- target inclusion probabilities -----------------------------------------------------


def test_target_is_top_k_times_the_load_share():
    load = np.array([30, 25, 20, 15, 10, 0])
    np.testing.assert_allclose(target_inclusion(load, 2), 2 * load / 100)


def test_target_caps_at_one_and_spreads_the_excess_by_load():
    """Expert 0 holds 60% of 2 picks per token (1.2 > 1): it is in every token, and the
    other picks split the remaining 1.0 in proportion to load."""
    pi = target_inclusion(np.array([60, 10, 10, 10, 10]), 2)
    np.testing.assert_allclose(pi, [1.0, 0.25, 0.25, 0.25, 0.25])


def test_target_caps_repeatedly():
    """Capping expert 0 pushes expert 1 over 1 too: both end at 1."""
    pi = target_inclusion(np.array([50, 30, 10, 5, 5]), 3)
    np.testing.assert_allclose(pi, [1.0, 1.0, 0.5, 0.25, 0.25])
    assert pi.sum() == pytest.approx(3.0)


# -- exactness --------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    load=st.lists(st.integers(0, 1000), min_size=1, max_size=24),
    top_k=st.integers(1, 8),
    seed=st.integers(0, 2**16),
)
def test_mixture_marginals_equal_the_target_exactly(load, top_k, seed):
    """Systematic sampling hits every expert with probability pi, in any order."""
    load = np.array(load, dtype=float)
    sampler = build_sampler(load, top_k, np.random.default_rng(seed))
    np.testing.assert_allclose(sampler.marginals, target_inclusion(load, top_k), atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(
    load=st.lists(st.integers(0, 200), min_size=2, max_size=16),
    top_k=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_table_and_direct_lookups_match_the_definition(load, top_k, seed):
    """Both lookups (enumerated table, per-token search) give the picks of the definition,
    in the order of the points (``sample`` then ranks them)."""
    load = np.array(load, dtype=float)
    sampler = build_sampler(load, top_k, np.random.default_rng(seed))
    if sampler.picks == 0:
        return
    rng = np.random.default_rng(seed + 1)
    rows = rng.integers(0, sampler.weight.size, 30)
    us = rng.random(30)
    direct = _points(sampler, rows, us)
    sets, cdf = _enumerate(sampler)
    before = np.concatenate([[0.0], np.cumsum(sampler.weight)])
    cells = _lookup(cdf, (before[rows] + sampler.weight[rows] * us) / before[-1])
    for t in range(30):
        expected = naive_picks(sampler, int(rows[t]), float(us[t]))
        assert direct[t].tolist() == expected
        assert sets[cells[t]].tolist() == expected


def test_samples_are_distinct_experts_with_the_right_shares():
    """Mild skew, top-2 of 8: each expert's share of selections is close to its load share."""
    load = np.array([30, 25, 20, 15, 10, 10, 5, 5], dtype=float)
    ids = sample_topk(load, 20000, 2, np.random.default_rng(0))
    assert (ids[:, 0] != ids[:, 1]).all()
    share = np.bincount(ids.ravel(), minlength=8) / ids.size
    np.testing.assert_allclose(share, load / load.sum(), atol=0.01)


@pytest.mark.parametrize("num_tokens", [1000, 40000])  # direct lookups, enumerated table
def test_skewed_layer_keeps_hot_experts_at_their_load(num_tokens):
    """Zipf 0.73 over 64 experts, top-8: the hottest expert is in 97% of tokens.  Sampled
    selection frequencies match load / tokens within 3 standard errors (successive draws
    in proportion to load, the former sampler, gave it 68%)."""
    load = zipf_load(64, 0.73)
    pi = target_inclusion(load, 8)
    assert pi[0] == pytest.approx(0.97, abs=0.01)
    ids = sample_topk(load, num_tokens, 8, np.random.default_rng(5))
    sorted_ids = np.sort(ids, axis=1)
    assert (sorted_ids[:, 1:] != sorted_ids[:, :-1]).all()
    freq = selection_frequency(ids, 64)
    stderr = np.sqrt(pi * (1 - pi) / num_tokens)
    assert (np.abs(freq - pi) <= 3 * stderr + 1e-3).all()


def test_capped_expert_is_in_every_token():
    """Zipf 1.5 over 64 experts, top-8: the two hottest experts exceed one selection per
    token; they are capped at 1 and in every sampled token, the others keep their share."""
    load = zipf_load(64, 1.5)
    raw = 8 * load / load.sum()
    assert raw[0] > 1 and raw[1] > 1
    pi = target_inclusion(load, 8)
    ids = sample_topk(load, 5000, 8, np.random.default_rng(2))
    assert (ids == 0).any(axis=1).all() and (ids == 1).any(axis=1).all()
    freq = selection_frequency(ids, 64)
    assert np.abs(freq - pi).max() < 0.03


@pytest.mark.parametrize("num_tokens", [1000, 40000])  # direct lookups, enumerated table
def test_list_order_is_plackett_luce_by_load(num_tokens):
    """Gate order is unknown; hot experts come first as in score-sorted lists: among
    tokens holding experts 0 and 3, 0 is listed first with odds pi[0] : pi[3]."""
    load = zipf_load(32, 1.0)
    pi = target_inclusion(load, 4)
    ids = sample_topk(load, num_tokens, 4, np.random.default_rng(0))
    both = (ids == 0).any(axis=1) & (ids == 3).any(axis=1)
    first = np.argmax(ids[both] == 0, axis=1) < np.argmax(ids[both] == 3, axis=1)
    expected = pi[0] / (pi[0] + pi[3])
    assert first.mean() == pytest.approx(expected, abs=4 * np.sqrt(0.25 / both.sum()))
    column_share = (ids == 0).sum(axis=0) / (ids == 0).sum()
    assert column_share[0] > 0.4 and (np.diff(column_share) < 0).all()


# -- seeding and edge cases -------------------------------------------------------------


def test_same_seed_same_samples():
    load = np.arange(1, 9, dtype=float)
    a = sample_topk(load, 500, 3, np.random.default_rng(11))
    b = sample_topk(load, 500, 3, np.random.default_rng(11))
    c = sample_topk(load, 500, 3, np.random.default_rng(12))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_fewer_loaded_experts_than_top_k_pad_with_minus_one():
    ids = sample_topk(np.array([5.0, 0, 0, 3.0]), 10, 3, np.random.default_rng(0))
    assert (ids[:, 2] == -1).all()
    assert {tuple(sorted(r[:2])) for r in ids.tolist()} == {(0, 3)}


def test_no_load_gives_no_selections():
    ids = sample_topk(np.zeros(6), 7, 2, np.random.default_rng(0))
    assert ids.shape == (7, 2) and (ids == -1).all()


def test_dominant_expert_still_yields_distinct_picks():
    """One expert with almost all the load: it is in every token, with 3 distinct others."""
    load = np.array([1e6, 1, 1, 1, 1, 1, 1, 1], dtype=float)
    ids = sample_topk(load, 300, 4, np.random.default_rng(0))
    assert all(len(set(row)) == 4 for row in ids.tolist())
    assert (ids == 0).any(axis=1).all()


def test_batches_spread_over_the_windows_in_order():
    assert sampled_batch_windows((2, 5), 6).tolist() == [2, 2, 3, 3, 4, 4]


# -- through evaluate -------------------------------------------------------------------


def test_evaluate_samples_when_there_is_no_trace():
    routing = random_routing(400, batch=50, seed=1, holes=False)
    aggregated = RoutingData(routing.stats, None)
    pl = placement([[0, 1, 2, 3], [0, 2, 1, 3]], 2)
    params = EvalParams(batch_tokens=64, num_batches=20, seed=3)
    ev = evaluate(pl, aggregated, cluster((2,)), tiny_model(), params)
    again = evaluate(pl, aggregated, cluster((2,)), tiny_model(), params)
    other = evaluate(pl, aggregated, cluster((2,)), tiny_model(), replace(params, seed=4))
    assert ev.source == "sampled"
    assert ev.metrics["num_tokens"] == 64 * 20 and ev.batch_hot_shard.shape == (20, 2)
    np.testing.assert_array_equal(ev.gpu_load, again.gpu_load)
    assert not np.array_equal(ev.batch_hot_shard, other.batch_hot_shard)
    # sampled loads follow the trace's: GPU shares within a few percent
    replay = evaluate(pl, routing, cluster((2,)), tiny_model(), EvalParams())
    share = ev.gpu_load / ev.gpu_load.sum(axis=1, keepdims=True)
    ref = replay.gpu_load / replay.gpu_load.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(share, ref, atol=0.04)
    forced = evaluate(pl, routing, cluster((2,)), tiny_model(), replace(params, sample=True))
    np.testing.assert_array_equal(forced.gpu_load, ev.gpu_load)


def test_sampled_hot_shard_matches_replay_with_a_very_hot_expert():
    """8 experts, top-4, expert 0 in 95% of tokens and alone on GPU 0 of 4 (2 experts a
    GPU): the sampled hot-shard ratio equals the replayed one within 2%."""
    rng = np.random.default_rng(0)
    num_tokens = 4000
    keys = np.log([40.0, 3, 3, 2, 2, 1, 1, 1]) + rng.gumbel(size=(num_tokens, 8))
    ids = np.argsort(-keys, axis=1)[:, :4].astype(np.int32)[:, None, :]
    routing = routing_of(ids, np.array([0]), np.arange(num_tokens) // 200,
                         np.full(num_tokens, -1), 8)
    assert (ids == 0).any(axis=2).mean() > 0.9
    pl = placement([[0, 1, 2, 3, 4, 5, 6, 7]], 4, num_experts=8, layer_ids=(0,))
    model = tiny_model(num_experts=8, top_k=4, layers=(0,))
    replay = evaluate(pl, routing, cluster((4,)), model, EvalParams(batch_tokens=200))
    sampled = evaluate(pl, routing, cluster((4,)), model,
                       EvalParams(batch_tokens=200, num_batches=40, sample=True))
    assert sampled.metrics["hot_shard_ratio_median"] == pytest.approx(
        replay.metrics["hot_shard_ratio_median"], rel=0.02)
