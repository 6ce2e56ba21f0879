"""placer.stats.analysis: each formula by hand on tiny cases, invariants with hypothesis."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placer.errors import UsageError
from placer.stats import ExpertStats, Provenance
from placer.stats.analysis import (
    affinity_lift,
    gini,
    hot_set,
    jaccard,
    max_over_mean,
    normalized_entropy,
    pair_lift,
    summarize,
    top_pairs,
    total_variation,
)


def stats_from_tokens(topk: np.ndarray, window_of: np.ndarray | None = None, **kw) -> ExpertStats:
    """Brute-force ExpertStats of ``topk: [tokens, layers, k]`` (no reader involved)."""
    t, n_layers, k = topk.shape
    e = kw.pop("num_experts", int(topk.max()) + 1)
    window_of = np.zeros(t, dtype=np.int64) if window_of is None else window_of
    n_win = int(window_of.max()) + 1
    load = np.zeros((n_win, n_layers, e), dtype=np.int64)
    coact = np.zeros((n_layers, e, e), dtype=np.int64)
    aff = np.zeros((max(n_layers - 1, 0), e, e), dtype=np.int64)
    for tok in range(t):
        for layer in range(n_layers):
            for a in topk[tok, layer]:
                load[window_of[tok], layer, a] += 1
                for b in topk[tok, layer]:
                    if a != b:
                        coact[layer, a, b] += 1
                if layer + 1 < n_layers:
                    for b in topk[tok, layer + 1]:
                        aff[layer, a, b] += 1
    return ExpertStats(
        load=load,
        tokens=np.bincount(window_of, minlength=n_win).astype(np.int64),
        layer_ids=kw.pop("layer_ids", np.arange(n_layers, dtype=np.int64)),
        top_k=k,
        coact=coact,
        layer_affinity=aff if n_layers > 1 else None,
        **kw,
    )


@pytest.fixture
def four_tokens() -> ExpertStats:
    """4 tokens, 1 layer, 4 experts, top-2: pairs (0,1) (0,1) (0,2) (1,3).

    load = [3, 3, 1, 1]; coact(0,1) = 2; T = 8 / 2 = 4 tokens.
    """
    topk = np.array([[[0, 1]], [[0, 1]], [[0, 2]], [[1, 3]]])
    return stats_from_tokens(topk, num_experts=4)


# -- formulas by hand ---------------------------------------------------------------------


def test_max_over_mean_by_hand():
    assert max_over_mean(np.array([3, 3, 1, 1])) == pytest.approx(3 / 2)
    assert math.isnan(max_over_mean(np.zeros(4)))


def test_gini_by_hand():
    # sum_ij |x_i - x_j| = 8 pairs (ordered) of |3 - 1| = 16; 2 n^2 mean = 2 * 16 * 2 = 64.
    assert gini(np.array([3, 3, 1, 1])) == pytest.approx(16 / 64)
    # One expert takes everything: 1 - 1/n.
    assert gini(np.array([0, 0, 0, 5])) == pytest.approx(0.75)
    assert gini(np.zeros(3)) == 0.0


def test_normalized_entropy_by_hand():
    p = np.array([3, 3, 1, 1]) / 8
    expected = -(p * np.log(p)).sum() / math.log(4)
    assert normalized_entropy(np.array([3, 3, 1, 1])) == pytest.approx(expected)
    assert normalized_entropy(np.array([0, 7, 0])) == 0.0
    assert normalized_entropy(np.array([5])) == 1.0


def test_pair_lift_by_hand(four_tokens):
    # P(0,1) = 2/4, P(0) = 3/4, P(1) = 3/4 -> lift = 0.5 / 0.5625 = 8/9.
    lift = pair_lift(four_tokens.coact_dense(0), four_tokens.load[0, 0], 2)
    assert lift[0, 1] == pytest.approx(8 / 9)
    # P(0,2) = 1/4, P(0) = 3/4, P(2) = 1/4 -> 4/3.
    assert lift[0, 2] == pytest.approx(4 / 3)
    assert lift[2, 3] == 0.0


def test_pair_lift_is_nan_for_an_expert_without_load():
    lift = pair_lift(np.zeros((3, 3)), np.array([2, 2, 0]), 2)
    assert math.isnan(lift[0, 2]) and lift[0, 1] == 0.0


def test_affinity_lift_by_hand():
    """2 tokens, top-1: token 0 uses 0 then 1, token 1 uses 1 then 1."""
    aff = np.array([[0, 1], [0, 1]])
    lift = affinity_lift(aff, np.array([1, 1]), np.array([0, 2]), 1)
    # P(0 in a, 1 in b) = 1/2; P(0) = 1/2; P(1 in b) = 1 -> lift 1.
    assert lift[0, 1] == pytest.approx(1.0)
    assert math.isnan(lift[0, 0])


def test_hot_set_breaks_ties_by_lower_id():
    assert hot_set(np.array([5, 9, 9, 1]), 2).tolist() == [1, 2]
    assert hot_set(np.array([5, 9, 9, 1]), 3).tolist() == [1, 2, 0]


def test_jaccard_and_total_variation_by_hand():
    assert jaccard([1, 2], [2, 3]) == pytest.approx(1 / 3)
    assert jaccard([], []) == 1.0
    assert total_variation([1, 1, 0], [0, 1, 1]) == pytest.approx(0.5)
    assert total_variation([2, 0], [0, 5]) == pytest.approx(1.0)


def test_top_pairs_orders_by_count_then_ids():
    c = np.zeros((4, 4), dtype=np.int64)
    for i, j, n in [(0, 1, 5), (2, 3, 5), (0, 3, 7), (1, 2, 1)]:
        c[i, j] = c[j, i] = n
    assert top_pairs(c, 3) == [(0, 3), (0, 1), (2, 3)]
    assert top_pairs(c, 10) == [(0, 3), (0, 1), (2, 3), (1, 2)]


# -- the summary ----------------------------------------------------------------------------


def test_summary_of_four_tokens(four_tokens):
    s = summarize(four_tokens, top=2)
    layer = s["layers"][0]
    assert s["totals"]["tokens"] == 4 and s["totals"]["selections"] == 8
    assert layer["max_over_mean"] == pytest.approx(1.5)
    assert layer["gini"] == pytest.approx(0.25)
    assert [h["expert"] for h in layer["hottest"]] == [0, 1]
    assert layer["hottest"][0]["share"] == pytest.approx(3 / 8)
    assert layer["pairs"][0] == {"experts": [0, 1], "count": 2, "lift": pytest.approx(8 / 9)}
    assert layer["coact_coverage"] == pytest.approx(1.0)
    assert layer["drift"] is None
    assert any("one window only" in w for w in s["warnings"])


def test_summary_drift_by_hand():
    """2 windows, 1 layer, 4 experts, top-1: window 0 uses 0,0,1; window 1 uses 2,2,1."""
    topk = np.array([[[0]], [[0]], [[1]], [[2]], [[2]], [[1]]])
    st_ = stats_from_tokens(topk, np.array([0, 0, 0, 1, 1, 1]), num_experts=4)
    d = summarize(st_, hot_set_size=1)["layers"][0]["drift"]
    assert d["hot_set_jaccard_mean"] == 0.0  # {0} vs {2}
    # p = [2/3, 1/3, 0, 0], q = [0, 1/3, 2/3, 0]: TV = 2/3.
    assert d["load_tv_mean"] == pytest.approx(2 / 3) and d["load_tv_max"] == pytest.approx(2 / 3)
    d2 = summarize(st_, hot_set_size=2)["layers"][0]["drift"]
    assert d2["hot_set_jaccard_mean"] == pytest.approx(1 / 3)  # {0,1} vs {1,2}


def test_summary_affinity_and_layer_ids():
    """3 tokens through layers 3 and 4 (top-1): 0->1, 0->1, 1->0."""
    topk = np.array([[[0], [1]], [[0], [1]], [[1], [0]]])
    st_ = stats_from_tokens(topk, layer_ids=np.array([3, 4]), num_experts=2)
    s = summarize(st_, top=2)
    assert [x["layer"] for x in s["layers"]] == [3, 4]
    strongest = s["overall"]["affinity"][0]
    assert (strongest["layer"], strongest["next_layer"]) == (3, 4)
    assert strongest["experts"] == [0, 1] and strongest["count"] == 2
    # P(0,1) = 2/3, P(0 in 3) = 2/3, P(1 in 4) = 2/3 -> lift 1.5.
    assert strongest["lift"] == pytest.approx(1.5)
    only = summarize(st_, layers=[4])
    assert [x["layer"] for x in only["layers"]] == [4] and only["affinity"] is None


def test_summary_totals_carry_provenance(four_tokens):
    from dataclasses import replace

    prov = Provenance(sources=("a.jsonl",), format="jsonl", rows_read=4,
                      rows_skipped=(("type=meta", 2),), synthetic=True, model="m")
    s = summarize(replace(four_tokens, provenance=prov))
    assert s["totals"]["rows_read"] == 4
    assert s["totals"]["rows_skipped"] == {"type=meta": 2}
    assert s["totals"]["rows_skipped_total"] == 2
    assert s["totals"]["synthetic"] is True
    assert any("synthetic" in w for w in s["warnings"])


def test_summary_warns_on_partial_coactivation(four_tokens):
    from dataclasses import replace

    partial = four_tokens.coact.to_dense()
    partial[0, 1, 3] = partial[0, 3, 1] = 0
    s = summarize(replace(four_tokens, coact=partial))
    assert s["layers"][0]["coact_coverage"] == pytest.approx(0.75)
    assert any("co-activation is partial" in w for w in s["warnings"])


def test_summary_rejects_unknown_layer_and_bad_top(four_tokens):
    with pytest.raises(UsageError, match="layer 9 is not in the statistics"):
        summarize(four_tokens, layers=[9])
    with pytest.raises(UsageError, match="top must be at least 1"):
        summarize(four_tokens, top=0)


def test_summary_is_json_serializable(four_tokens):
    import json

    from placer.cli.common import to_jsonable

    json.dumps(to_jsonable(summarize(four_tokens)), allow_nan=False)


def test_coact_matches_brute_force_pairs():
    """Every pair of a random trace: summarize's pair count equals counting tokens."""
    rng = np.random.default_rng(3)
    topk = np.stack([rng.choice(6, 3, replace=False) for _ in range(40)])[:, None, :]
    s = summarize(stats_from_tokens(topk, num_experts=6), top=15)
    for p in s["layers"][0]["pairs"]:
        i, j = p["experts"]
        assert p["count"] == sum(1 for row in topk[:, 0] if i in row and j in row)
    counts = [p["count"] for p in s["layers"][0]["pairs"]]
    assert counts == sorted(counts, reverse=True)
    assert len(counts) == len({(i, j) for row in topk[:, 0] for i, j in
                               itertools.combinations(sorted(row), 2)})


# -- invariants -----------------------------------------------------------------------------

loads = st.lists(st.integers(0, 1000), min_size=1, max_size=64).map(np.array)


@settings(max_examples=60, deadline=None)
@given(loads)
def test_gini_and_entropy_are_in_unit_interval(x):
    assert 0.0 <= gini(x) <= 1.0
    h = normalized_entropy(x)
    assert math.isnan(h) if x.sum() == 0 else 0.0 <= h <= 1.0


@settings(max_examples=60, deadline=None)
@given(loads)
def test_gini_matches_pairwise_definition(x):
    n = x.size
    if x.sum() == 0:
        return
    pairwise = np.abs(x[:, None] - x[None, :]).sum() / (2 * n * n * x.mean())
    assert gini(x) == pytest.approx(pairwise, abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 50), st.integers(1, 100))
def test_uniform_load_has_ratio_one_gini_zero_entropy_one(n, value):
    x = np.full(n, value)
    assert max_over_mean(x) == pytest.approx(1.0)
    assert gini(x) == pytest.approx(0.0, abs=1e-12)
    assert normalized_entropy(x) == pytest.approx(1.0)


@settings(max_examples=40, deadline=None)
@given(loads, loads)
def test_total_variation_is_a_bounded_symmetric_distance(a, b):
    if a.size != b.size or a.sum() == 0 or b.sum() == 0:
        return
    assert 0.0 <= total_variation(a, b) <= 1.0 + 1e-12
    assert total_variation(a, b) == pytest.approx(total_variation(b, a))
    assert total_variation(a, a) == pytest.approx(0.0)
