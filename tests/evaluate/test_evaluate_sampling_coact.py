"""Sampling with co-activation: pairs, partial counts, drifting windows, calibration."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placer.evaluate.sampling import (
    build_sampler,
    companion_rows,
    sample_topk,
    target_inclusion,
)


def clustered_tokens(num_tokens: int = 6000, num_experts: int = 32, top_k: int = 4,
                     topics: int = 4, boost: float = 6.0, seed: int = 0) -> np.ndarray:
    """``[tokens, top_k]`` routing of one layer: each token has one of 4 topics, and the 8
    experts of its topic (``e % topics == topic``) are 6x likelier (Gumbel top-k over a
    3:1 load slope)."""
    rng = np.random.default_rng(seed)
    topic = rng.integers(0, topics, num_tokens)
    member = (np.arange(num_experts) % topics)[None, :] == topic[:, None]
    keys = (np.log(np.linspace(3.0, 1.0, num_experts)) + np.log(boost) * member
            + rng.gumbel(size=(num_tokens, num_experts)))
    return np.argsort(-keys, axis=1)[:, :top_k]


def counts(ids: np.ndarray, num_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """``load [experts]`` and ``coact [experts, experts]`` (zero diagonal) of ``ids``."""
    onehot = np.zeros((ids.shape[0], num_experts))
    onehot[np.arange(ids.shape[0])[:, None], ids] = 1.0
    coact = onehot.T @ onehot
    np.fill_diagonal(coact, 0.0)
    return onehot.sum(axis=0), coact


@pytest.fixture(scope="module")
def clustered():
    """Load and complete co-activation of ``clustered_tokens()`` (32 experts, top-4)."""
    return counts(clustered_tokens(), 32)


def upper(matrix: np.ndarray) -> np.ndarray:
    return matrix[np.triu_indices(matrix.shape[0], 1)]


def test_complete_coactivation_reproduces_the_pairs(clustered):
    """Sampled pair frequencies follow the measured ones (correlation 0.9 against 0.5
    without co-activation); pairs within a topic and the 20 strongest pairs are
    over-represented against sampling without co-activation."""
    load, coact = clustered
    measured = upper(coact) / 6000
    with_pairs = upper(counts(sample_topk(load, 20000, 4, np.random.default_rng(0),
                                          coact=coact), 32)[1]) / 20000
    without = upper(counts(sample_topk(load, 20000, 4, np.random.default_rng(0)), 32)[1]) / 20000
    assert np.corrcoef(measured, with_pairs)[0, 1] > 0.88
    assert np.corrcoef(measured, without)[0, 1] < 0.65
    same_topic = upper(np.arange(32)[:, None] % 4 == np.arange(32)[None, :] % 4)
    assert with_pairs[same_topic].sum() > 1.4 * without[same_topic].sum()
    assert with_pairs[same_topic].sum() > 0.75 * measured[same_topic].sum()
    strongest = np.argsort(-measured)[:20]
    assert with_pairs[strongest].mean() > 1.4 * without[strongest].mean()


def test_coactivation_keeps_the_marginals(clustered):
    load, coact = clustered
    sampler = build_sampler(load, 4, np.random.default_rng(1), coact=coact)
    assert sampler.correction == 0.0
    np.testing.assert_allclose(sampler.marginals, target_inclusion(load, 4), atol=1e-6)
    ids = sampler.sample(20000, np.random.default_rng(2))
    freq = np.bincount(ids.ravel(), minlength=32) / 20000
    np.testing.assert_allclose(freq, target_inclusion(load, 4), atol=0.015)


def test_top_2_pairs_are_exact():
    """Experts pair as {0,1} and {2,3} only: with top-2 every pair is the anchor's."""
    load = np.array([50, 50, 50, 50], dtype=float)
    coact = np.zeros((4, 4))
    coact[0, 1] = coact[1, 0] = 50
    coact[2, 3] = coact[3, 2] = 50
    ids = sample_topk(load, 2000, 2, np.random.default_rng(3), coact=coact)
    assert {tuple(sorted(row)) for row in ids.tolist()} == {(0, 1), (2, 3)}
    without = sample_topk(load, 2000, 2, np.random.default_rng(3))
    assert len({tuple(sorted(row)) for row in without.tolist()}) == 6


def test_companion_rows_are_conditional_probabilities(clustered):
    """With complete counts of the same window, row a is P(e picked | a picked), each row
    sums to top_k - 1, and the calibration leaves it as it is."""
    load, coact = clustered
    rows, error = companion_rows(coact, load, target_inclusion(load, 4), 4)
    np.testing.assert_allclose(rows, coact / load[:, None], atol=1e-6)
    np.testing.assert_allclose(rows.sum(axis=1), 3.0)
    assert error < 1e-4


def test_partial_coactivation_is_filled_and_calibrated(clustered):
    """Only pairs with lift >= 1.5 kept (as in thresholded dumps): rows are short of
    top_k - 1; the fill and the calibration still give exact marginals, and the kept
    pairs stay over-represented."""
    load, coact = clustered
    pi = target_inclusion(load, 4)
    expected = np.outer(load, load) / 6000  # pair count if experts were independent
    partial = np.where(coact >= 1.5 * expected, coact, 0.0)
    coverage = partial.sum() / coact.sum()
    assert 0.1 < coverage < 0.5  # the bundled Qwen3 file keeps 0.40 to 0.68
    sampler = build_sampler(load, 4, np.random.default_rng(0), coact=partial)
    assert sampler.correction < 0.01
    np.testing.assert_allclose(sampler.marginals, pi, atol=1e-9)
    ids = sampler.sample(20000, np.random.default_rng(1))
    pairs = counts(ids, 32)[1] / 20000
    kept = partial > 0
    without = counts(sample_topk(load, 20000, 4, np.random.default_rng(1)), 32)[1] / 20000
    assert pairs[kept].sum() > 1.3 * without[kept].sum()


def test_drifting_window_is_calibrated_to_its_own_load():
    """Co-activation counted over two windows whose popularity is reversed; the sampler
    of window 0 meets window 0's load, not the mean, and keeps the topics together."""
    first = clustered_tokens(seed=1)
    second = 31 - clustered_tokens(seed=2)  # the same topics (31 - e keeps e % 4 classes
    load0, coact0 = counts(first, 32)      # apart), popularity reversed
    load1, coact1 = counts(second, 32)
    sampler = build_sampler(load0, 4, np.random.default_rng(0), coact=coact0 + coact1,
                            load_all=load0 + load1)
    pi = target_inclusion(load0, 4)
    assert sampler.correction < 0.01
    np.testing.assert_allclose(sampler.marginals, pi, atol=1e-9)
    ids = sampler.sample(20000, np.random.default_rng(1))
    freq = np.bincount(ids.ravel(), minlength=32) / 20000
    np.testing.assert_allclose(freq, pi, atol=0.015)
    same_topic = (ids[:, :, None] % 4 == ids[:, None, :] % 4).sum(axis=(1, 2)) - 4
    without = sample_topk(load0, 20000, 4, np.random.default_rng(1))
    same_without = (without[:, :, None] % 4 == without[:, None, :] % 4).sum(axis=(1, 2)) - 4
    assert same_topic.mean() > 1.4 * same_without.mean()


def test_certain_expert_is_a_companion_of_every_anchor():
    """Expert 0 capped at 1 (in every token) while co-activation says otherwise: it is in
    every sampled token, and the rest keep their marginals."""
    load = np.array([900, 100, 100, 100, 100, 100], dtype=float)
    coact = np.ones((6, 6)) * 10
    np.fill_diagonal(coact, 0)
    pi = target_inclusion(load, 3)
    assert pi[0] == 1.0
    sampler = build_sampler(load, 3, np.random.default_rng(0), coact=coact)
    np.testing.assert_allclose(sampler.marginals, pi, atol=1e-9)
    ids = sampler.sample(3000, np.random.default_rng(1))
    assert (ids == 0).any(axis=1).all()


@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    num_experts=st.integers(2, 12),
    top_k=st.integers(1, 5),
    windows=st.integers(1, 3),
)
def test_marginals_are_exact_whatever_the_counts(data, num_experts, top_k, windows):
    """Any loads (zeros included) and any symmetric pair counts, even ones that do not fit
    the loads: calibration plus the plain share still give every expert exactly pi."""
    counts_strategy = st.lists(st.integers(0, 50), min_size=num_experts, max_size=num_experts)
    loads = np.array([data.draw(counts_strategy) for _ in range(windows)], dtype=float)
    upper_counts = data.draw(st.lists(st.integers(0, 40), min_size=num_experts ** 2,
                                      max_size=num_experts ** 2))
    pairs = np.triu(np.array(upper_counts, dtype=float).reshape(num_experts, num_experts), 1)
    coact = pairs + pairs.T
    sampler = build_sampler(loads[0], top_k, np.random.default_rng(0), coact=coact,
                            load_all=loads.sum(axis=0))
    pi = target_inclusion(loads[0], top_k)
    np.testing.assert_allclose(sampler.marginals, pi, atol=1e-9)
    assert 0.0 <= sampler.correction <= 1.0
    ids = sampler.sample(50, np.random.default_rng(1))
    picked = np.sort(ids, axis=1)
    assert ((picked[:, 1:] != picked[:, :-1]) | (picked[:, 1:] < 0)).all()
    assert set(np.unique(ids[ids >= 0])) <= set(np.flatnonzero(pi > 0))
