"""Tails that mean something: per-layer tails over batches, the step tail, and sampled
windows merged until they hold the tokens of the batches drawn from them."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest
from evaluate_fixtures import cluster, placement, random_routing, routing_of, tiny_model

from placer.errors import PlacerWarning
from placer.evaluate import METRIC_KEYS, EvalParams, evaluate
from placer.evaluate.sampling import plan_sampled_batches
from placer.stats import ExpertStats, RoutingData

# -- per-layer tails -----------------------------------------------------------------------


def test_tail_metrics_are_their_documented_reductions():
    topo = cluster((2,))
    pl = placement([[0, 1, 2, 3], [0, 2, 1, 3]], 2)
    ev = evaluate(pl, random_routing(160, batch=8, seed=4), topo, tiny_model(), EvalParams())
    m, t = ev.metrics, ev.layer_time_us
    p50 = np.array([np.percentile(t[:, i], 50) for i in range(t.shape[1])])
    p99 = np.array([np.percentile(t[:, i], 99) for i in range(t.shape[1])])
    np.testing.assert_allclose(ev.per_layer["layer_time_p99_us"], p99)
    assert m["layer_p50_us_median"] == pytest.approx(np.median(p50))
    assert m["layer_p99_us_median"] == pytest.approx(np.median(p99))
    assert m["layer_p99_us_worst"] == pytest.approx(p99.max())
    assert m["layer_p99_over_p50_median"] == pytest.approx(np.median(p99 / p50))
    step = t.sum(axis=1)
    assert m["step_p99_over_p50"] == pytest.approx(
        np.percentile(step, 99) / np.percentile(step, 50))
    for key in ("layer_p50_us_median", "layer_p99_us_median", "layer_p99_us_worst",
                "layer_p99_over_p50_median", "step_p99_over_p50"):
        assert key in METRIC_KEYS
    # shown next to the pooled figures
    at = METRIC_KEYS.index("p99_over_p50")
    assert METRIC_KEYS[at + 1 : at + 5] == ("layer_p50_us_median", "layer_p99_us_median",
                                            "layer_p99_us_worst", "layer_p99_over_p50_median")


def test_pooled_tail_measures_the_spread_between_layers():
    """Every batch routes the same way: layer 0 sends every token to expert 0 (one GPU
    does all the work), layer 1 spreads them.  Each layer's time is the same in every
    batch, so each layer's p99 over batches equals its p50 (ratio 1) and the step never
    varies; the pooled (batch, layer) p99 / p50 is well above 1: it only sees that layer
    0 is slower than layer 1."""
    model = replace(tiny_model(top_k=1), hidden_size=4096, moe_intermediate_size=2048)
    pl = placement([[0, 1, 2, 3], [0, 1, 2, 3]], 2)
    per_batch = 512
    batches = 8
    hot = np.zeros(per_batch, dtype=np.int32)
    spread = np.arange(per_batch, dtype=np.int32) % 4
    one = np.stack([hot, spread], axis=1)[:, :, None]  # [tokens, layers, 1]
    ids = np.tile(one, (batches, 1, 1))
    n = ids.shape[0]
    routing = routing_of(ids, np.array([0, 1]), np.arange(n) // per_batch,
                         np.tile(np.arange(per_batch) % 2, batches), 4)
    ev = evaluate(pl, routing, cluster((2,)), model, EvalParams())
    m = ev.metrics
    assert m["layer_p99_over_p50_median"] == pytest.approx(1.0)
    assert m["step_p99_over_p50"] == pytest.approx(1.0)
    assert m["layer_p99_us_worst"] == pytest.approx(ev.layer_time_us[0, 0])
    # 16 pooled values, 8 per layer: p99 is layer 0's time, p50 halfway to layer 1's
    slow, fast = ev.layer_time_us[0]
    assert m["p99_over_p50"] == pytest.approx(2 * slow / (slow + fast), rel=1e-3)
    assert m["p99_over_p50"] > 1.2


# -- sampled windows that hold enough tokens -------------------------------------------------


def test_plan_leaves_large_windows_alone():
    plan = plan_sampled_batches(np.full(4, 10_000), (0, 4), 8, 1000)
    assert plan.groups == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert plan.group_batches == [2, 2, 2, 2] and plan.num_batches == 8
    assert plan.batch_tokens == 1000 and plan.message == ""


def test_plan_merges_small_windows_with_the_next():
    """128 windows of 2,048 tokens, 16 batches of 4,096: batch b starts at window 8 b,
    which holds half a batch, so it is merged with the next window."""
    plan = plan_sampled_batches(np.full(128, 2048), (0, 128), 16, 4096)
    assert plan.groups == [(8 * b, 8 * b + 2) for b in range(16)]
    assert plan.group_batches == [1] * 16 and plan.num_batches == 16
    assert "merged windows 0:2, 8:10, 16:18, 24:26 and 12 more" in plan.message
    assert "4,096 tokens per batch drawn from it" in plan.message


def test_plan_needs_a_batch_of_tokens_per_group_when_the_range_is_short():
    """8 windows of 2,048 tokens, 8 batches of 4,096: the 16,384 tokens cannot give each
    batch its own 4,096, so groups need one batch of tokens each: windows merged in
    pairs, 2 batches drawn from each pair, all 8 batches kept."""
    plan = plan_sampled_batches(np.full(8, 2048), (0, 8), 8, 4096)
    assert plan.groups == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert plan.group_batches == [2, 2, 2, 2] and plan.num_batches == 8
    assert "at least one batch of 4,096 tokens" in plan.message


def test_plan_keeps_one_large_window_whatever_the_batches():
    """One window of 75,773 tokens (the bundled Qwen3 statistics), 32 batches of 4,096:
    more tokens drawn than it holds, but nothing to merge and each batch is well within
    the window: unchanged, no message."""
    plan = plan_sampled_batches(np.array([75_773]), (0, 1), 32, 4096)
    assert plan.groups == [(0, 1)] and plan.group_batches == [32] and plan.message == ""


def test_plan_folds_a_short_tail_into_the_group_before():
    """Windows of 5,000, 5,000 and 1,000 tokens, 2 batches of 4,000 (batches start at
    windows 0 and 1): windows 0 and 1 hold enough; window 2 draws none and stays out."""
    plan = plan_sampled_batches(np.array([5000, 5000, 1000]), (0, 3), 2, 4000)
    assert plan.groups == [(0, 1), (1, 2)] and plan.message == ""
    # 3 batches: window 2 draws one with 1,000 tokens: folded into window 1's group
    plan = plan_sampled_batches(np.array([5000, 5000, 1000]), (0, 3), 3, 3000)
    assert plan.groups == [(0, 1), (1, 3)] and plan.group_batches == [1, 2]
    assert "merged windows 1:3" in plan.message


def test_plan_shrinks_the_batch_below_one_batch_of_tokens():
    plan = plan_sampled_batches(np.array([300, 200]), (0, 2), 16, 4096)
    assert plan.batch_tokens == 500 and plan.num_batches == 1
    assert plan.groups == [(0, 2)]
    assert "drew 1 batch of 500 tokens" in plan.message


def test_plan_respects_the_window_range():
    """Windows 1:3 hold 4,096 tokens for 2 batches of 4,096 (short): one group of both
    windows, with both batches."""
    plan = plan_sampled_batches(np.array([10, 2048, 2048, 10]), (1, 3), 2, 4096)
    assert plan.groups == [(1, 3)] and plan.group_batches == [2]
    assert plan.batch_tokens == 4096


def test_evaluate_merges_small_windows_and_says_why():
    """Aggregated statistics of 8 windows x 512 tokens, 4 batches of 1,024 asked: the
    windows are merged in pairs (each pair holds one batch), with a PlacerWarning."""
    routing = random_routing(4096, batch=64, seed=5, holes=False)
    ids = routing.trace.topk_ids
    windowed = routing_of(ids, routing.trace.layer_ids, routing.trace.step,
                          routing.trace.rank, 4, windows=8)
    stats: ExpertStats = windowed.stats
    assert stats.tokens.tolist() == [512] * 8
    aggregated = RoutingData(stats, None)
    pl = placement([[0, 1, 2, 3], [0, 2, 1, 3]], 2)
    params = EvalParams(batch_tokens=1024, num_batches=4)
    with pytest.warns(PlacerWarning, match="merged windows 0:2, 2:4, 4:6, 6:8") as rec:
        ev = evaluate(pl, aggregated, cluster((2,)), tiny_model(), params)
    assert "inflates the per-batch imbalance" in str(rec[0].message)
    assert ev.metrics["num_batches"] == 4 and ev.metrics["num_tokens"] == 4096
    # windows that hold enough are sampled on their own, silently, as before
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlacerWarning)
        ok = evaluate(pl, aggregated, cluster((2,)), tiny_model(),
                      EvalParams(batch_tokens=256, num_batches=8))
    assert ok.metrics["num_batches"] == 8
