"""Batches sampled from aggregated statistics: distribution, co-activation, seeding."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from evaluate_fixtures import cluster, placement, random_routing, tiny_model

from placer.evaluate import EvalParams, evaluate
from placer.evaluate.sampling import conditional_matrix, sample_topk, sampled_batch_windows
from placer.stats import RoutingData


def test_samples_are_distinct_experts_with_the_right_shares():
    """Mild skew, top-2 of 8: each expert's share of selections is close to its load share."""
    load = np.array([30, 25, 20, 15, 10, 10, 5, 5], dtype=float)
    ids = sample_topk(load, None, 20000, 2, np.random.default_rng(0))
    assert (ids[:, 0] != ids[:, 1]).all()
    share = np.bincount(ids.ravel(), minlength=8) / ids.size
    np.testing.assert_allclose(share, load / load.sum(), atol=0.03)


def test_same_seed_same_samples():
    load = np.arange(1, 9, dtype=float)
    a = sample_topk(load, None, 500, 3, np.random.default_rng(11))
    b = sample_topk(load, None, 500, 3, np.random.default_rng(11))
    c = sample_topk(load, None, 500, 3, np.random.default_rng(12))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_coactivation_pairs_are_reproduced():
    """Experts pair as {0,1} and {2,3} only: sampling with co-activation keeps the pairs."""
    load = np.array([50, 50, 50, 50], dtype=float)
    coact = np.zeros((4, 4))
    coact[0, 1] = coact[1, 0] = 50
    coact[2, 3] = coact[3, 2] = 50
    q = conditional_matrix(coact, load, load / load.sum(), top_k=2)
    ids = sample_topk(load, q, 2000, 2, np.random.default_rng(3))
    pairs = {tuple(sorted(row)) for row in ids.tolist()}
    assert pairs == {(0, 1), (2, 3)}
    without = sample_topk(load, None, 2000, 2, np.random.default_rng(3))
    assert len({tuple(sorted(row)) for row in without.tolist()}) == 6


def test_fewer_loaded_experts_than_top_k_pad_with_minus_one():
    ids = sample_topk(np.array([5.0, 0, 0, 3.0]), None, 10, 3, np.random.default_rng(0))
    assert (ids[:, 2] == -1).all()
    assert {tuple(sorted(r[:2])) for r in ids.tolist()} == {(0, 3)}


def test_dominant_expert_still_yields_distinct_picks():
    """One expert with almost all the load: the exact fallback ends every rejection run."""
    load = np.array([1e6, 1, 1, 1, 1, 1, 1, 1], dtype=float)
    ids = sample_topk(load, None, 300, 4, np.random.default_rng(0))
    assert all(len(set(row)) == 4 for row in ids.tolist())
    assert (ids == 0).any(axis=1).all()


def test_batches_spread_over_the_windows_in_order():
    assert sampled_batch_windows((2, 5), 6).tolist() == [2, 2, 3, 3, 4, 4]


def test_evaluate_samples_when_there_is_no_trace():
    routing = random_routing(400, batch=50, seed=1, holes=False)
    aggregated = RoutingData(routing.stats, None)
    pl = placement([[0, 1, 2, 3], [0, 2, 1, 3]], 2)
    params = EvalParams(batch_tokens=64, num_batches=20, seed=3)
    ev = evaluate(pl, aggregated, cluster((2,)), tiny_model(), params)
    again = evaluate(pl, aggregated, cluster((2,)), tiny_model(), params)
    assert ev.source == "sampled"
    assert ev.metrics["num_tokens"] == 64 * 20 and ev.batch_hot_shard.shape == (20, 2)
    np.testing.assert_array_equal(ev.gpu_load, again.gpu_load)
    # sampled loads follow the trace's: GPU shares within a few percent
    replay = evaluate(pl, routing, cluster((2,)), tiny_model(), EvalParams())
    share = ev.gpu_load / ev.gpu_load.sum(axis=1, keepdims=True)
    ref = replay.gpu_load / replay.gpu_load.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(share, ref, atol=0.04)
    forced = evaluate(pl, routing, cluster((2,)), tiny_model(), replace(params, sample=True))
    np.testing.assert_array_equal(forced.gpu_load, ev.gpu_load)
