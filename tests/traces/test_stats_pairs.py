"""Sparse pair counts (placer.stats.PairCounts): the dense and the sparse way of counting
give the brute-force figures, the memory of a read follows the pairs seen (not the
square of the largest expert id), and figures that need a dense matrix say so."""

from __future__ import annotations

import json
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pair_helpers import dense
from test_traces_stats import brute, padded_ids, random_ids

from placer import constants
from placer.errors import DataError, TraceError
from placer.stats import ExpertStats, PairCounts
from placer.stats.analysis import pair_lift, summarize, top_pairs
from placer.traces import read_routing, write_jsonl_trace, write_npz_trace

# -- PairCounts ------------------------------------------------------------------------


def symmetric_counts(rng: np.random.Generator, rows: int, experts: int) -> np.ndarray:
    """``[rows, E, E]`` symmetric counts with a zero diagonal, about half the pairs zero."""
    upper = np.triu(rng.integers(0, 5, size=(rows, experts, experts)), k=1)
    upper[rng.random(upper.shape) < 0.5] = 0
    return upper + upper.transpose(0, 2, 1)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(0, 4), experts=st.integers(1, 12))
def test_pair_counts_round_trip_and_row_figures(seed, rows, experts):
    rng = np.random.default_rng(seed)
    sym = symmetric_counts(rng, rows, experts)
    directed = rng.integers(0, 3, size=(rows, experts, experts))
    for full, symmetric in ((sym, True), (directed, False)):
        pc = PairCounts.from_dense(full, symmetric=symmetric)
        assert pc.shape == full.shape
        np.testing.assert_array_equal(pc.to_dense(), full)
        np.testing.assert_array_equal(pc.partner_sums(), full.sum(axis=2))
        cells = np.triu(full, k=1) if symmetric else full
        np.testing.assert_array_equal(pc.totals(), cells.sum(axis=(1, 2)))
        assert pc.num_pairs == int((cells > 0).sum())
        assert (pc.counts > 0).all()
        for r in range(rows):
            i, j, c = pc.pairs(r)
            np.testing.assert_array_equal(cells[r][i, j], c)
            keys = i * experts + j
            assert (np.diff(keys) > 0).all()
            if symmetric:
                assert (i < j).all()
        order = list(rng.permutation(rows))
        np.testing.assert_array_equal(pc.take(order).to_dense(), full[order])


def test_pair_counts_memory_is_the_pairs_held():
    """Two pairs among 32,768 experts: a few hundred bytes, not 8 GiB."""
    pc = PairCounts(32768, np.array([0, 2]), np.array([5, 32768 * 7 + 9]), np.array([3, 1]))
    assert pc.nbytes < 100
    i, j, c = pc.pairs(0)
    assert (i.tolist(), j.tolist(), c.tolist()) == ([0, 7], [5, 9], [3, 1])
    np.testing.assert_array_equal(pc.partner_sums()[0, [0, 5, 7, 9]], [3, 3, 1, 1])


def test_dense_form_past_the_limit_is_a_clear_error():
    pc = PairCounts(32768, np.array([0, 1]), np.array([5]), np.array([1]))
    with pytest.raises(DataError, match="dense pair counts of 1 layer x 32,768 experts") as e:
        pc.dense(0)
    assert e.value.where == "co-activation"
    assert "`num_experts`" in (e.value.hint or "")


def test_pair_counts_check_their_arrays():
    with pytest.raises(ValueError, match="indptr"):
        PairCounts(4, np.array([1, 2]), np.zeros(1, np.int64), np.ones(1, np.int64))
    with pytest.raises(ValueError, match="keys and counts"):
        PairCounts(4, np.array([0, 2]), np.zeros(1, np.int64), np.ones(1, np.int64))
    with pytest.raises(ValueError, match="equal their transpose"):
        PairCounts.from_dense(np.triu(np.ones((1, 3, 3), np.int64), k=1))


def test_expert_stats_converts_a_dense_coact_and_checks_it():
    rng = np.random.default_rng(0)
    coact = symmetric_counts(rng, 2, 6)
    load = rng.integers(1, 9, size=(1, 2, 6))
    s = ExpertStats(load=load, tokens=np.array([10]), layer_ids=np.array([3, 4]), top_k=2,
                    coact=coact)
    assert isinstance(s.coact, PairCounts)
    np.testing.assert_array_equal(s.coact_dense(1), coact[1])
    np.testing.assert_array_equal(s.select_layers([4]).coact.to_dense(), coact[[1]])
    with pytest.raises(ValueError, match="coact must be"):
        ExpertStats(load=load, tokens=np.array([10]), layer_ids=np.array([3, 4]), top_k=2,
                    coact=coact[:, :5, :5])
    with pytest.raises(ValueError, match="2 layer rows"):
        ExpertStats(load=load, tokens=np.array([10]), layer_ids=np.array([3, 4]), top_k=2,
                    coact=PairCounts.from_dense(coact[:1]))


# -- counting: dense, sparse, and the switch between them --------------------------------


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1), tokens=st.integers(2, 60), layers=st.integers(1, 4),
       experts=st.integers(3, 9), data=st.data())
def test_sparse_counting_equals_dense_and_brute_force(
        tmp_path_factory, monkeypatch, seed, tokens, layers, experts, data):
    """The same trace read with dense counts, sparse ones from the start, and dense ones
    that turn sparse while the experts widen, in chunks of a few rows and with merges of
    a few keys: the same pair counts as a plain count."""
    k = data.draw(st.integers(2, experts))
    ids = padded_ids(np.random.default_rng(seed), tokens, layers, experts, k)
    folder = tmp_path_factory.mktemp("s")
    write_npz_trace(folder / "t.npz", ids, layer_ids=np.arange(layers))
    write_jsonl_trace(folder / "t.jsonl", ids, layer_ids=np.arange(layers))
    ref = brute(ids, None, None, experts)
    used = int(ids.max()) + 1
    full = (2 * layers + 1) * (experts + 1) ** 2 * 8
    budget = data.draw(st.sampled_from([1, full // 3, full // 2, 1 << 30]))
    with monkeypatch.context() as m, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m.setattr(constants, "MAX_COACT_BYTES", budget)
        m.setattr(constants, "CHUNK_ROWS", data.draw(st.sampled_from([3, 8, 1000])))
        m.setattr("placer.traces.accumulate.pairs._MERGE_MIN",
                  data.draw(st.sampled_from([1, 4, 1 << 20])))
        m.setattr("placer.traces.formats.jsonl.read.BLOCK_BYTES", 200)
        read = [read_routing(folder / name).stats for name in ("t.npz", "t.jsonl")]
    for s in read:  # dense forms outside the small MAX_COACT_BYTES
        np.testing.assert_array_equal(dense(s.coact), ref["coact"][:, :used, :used])
        if layers > 1:
            np.testing.assert_array_equal(dense(s.layer_affinity), ref["aff"][:, :used, :used])
        assert (s.coact.counts > 0).all()


def test_sparse_counts_still_refuse_an_expert_twice_in_a_row(tmp_path, monkeypatch):
    ids = random_ids(np.random.default_rng(1), 20, 2, 8, 3)
    ids[7, 1] = [4, 2, 4]
    write_npz_trace(tmp_path / "t.npz", ids, layer_ids=[0, 1])
    monkeypatch.setattr(constants, "MAX_COACT_BYTES", 1)
    with pytest.raises(TraceError, match="expert 4 appears twice"):
        read_routing(tmp_path / "t.npz")


def test_too_many_distinct_pairs_leave_co_activation_out(tmp_path, monkeypatch):
    ids = random_ids(np.random.default_rng(2), 200, 2, 16, 4)
    write_npz_trace(tmp_path / "t.npz", ids, layer_ids=[0, 1])
    monkeypatch.setattr(constants, "MAX_COACT_BYTES", 1)
    monkeypatch.setattr(constants, "MAX_COACT_PAIRS", 20)
    with pytest.warns(Warning, match="co-activation was left out: counting it holds"):
        s = read_routing(tmp_path / "t.npz").stats
    assert s.coact is None and s.layer_affinity is None
    assert s.load.sum() == 200 * 2 * 4


def test_the_pair_limit_holds_exactly_at_the_end(tmp_path, monkeypatch):
    """One chunk's distinct pairs stay under twice the limit while counting; the limit
    itself is checked when the statistics are made."""
    ids = random_ids(np.random.default_rng(3), 50, 3, 12, 3)
    write_npz_trace(tmp_path / "t.npz", ids, layer_ids=[0, 1, 2])
    monkeypatch.setattr(constants, "MAX_COACT_BYTES", 1)
    s = read_routing(tmp_path / "t.npz").stats
    held = s.coact.num_pairs + s.layer_affinity.num_pairs
    monkeypatch.setattr(constants, "MAX_COACT_PAIRS", held)
    assert read_routing(tmp_path / "t.npz").stats.coact is not None
    monkeypatch.setattr(constants, "MAX_COACT_PAIRS", held - 1)
    with pytest.warns(Warning, match=f"holds {held:,} distinct expert pairs"):
        assert read_routing(tmp_path / "t.npz").stats.coact is None


# -- the largest expert ids: memory follows the data ---------------------------------------


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_ids_at_the_limit_keep_their_pairs_in_little_memory(tmp_path):
    """Expert 32,767 (the largest placer takes): a dense [E, E] co-activation would be
    8 GiB a layer; the sparse counts hold three pairs and the whole read and its summary
    stay under 64 MiB."""
    top = constants.MAX_EXPERTS - 1
    rows = [{"layer": 0, "experts": [top, 1]}, {"layer": 0, "experts": [1, top]},
            {"layer": 1, "experts": [0, top - 1]}, {"layer": 1, "experts": [2, 5]}]
    path = _jsonl(tmp_path / "t.jsonl", rows)
    tracemalloc.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stats = read_routing(path).stats
            summary = summarize(stats)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20
    assert stats.num_experts == constants.MAX_EXPERTS
    assert stats.coact is not None and stats.coact.num_pairs == 3
    i, j, c = stats.coact.pairs(0)
    assert (i.tolist(), j.tolist(), c.tolist()) == ([1], [top], [2])
    assert summary["layers"][0]["pairs"][0] == {"experts": [1, top], "count": 2,
                                                "lift": pytest.approx(1.0)}
    assert summary["layers"][0]["coact_coverage"] == pytest.approx(1.0)
    assert not any("left out" in w for w in stats.warnings)


def test_id_past_the_limit_is_refused(tmp_path):
    path = _jsonl(tmp_path / "t.jsonl", [{"layer": 0, "experts": [constants.MAX_EXPERTS, 1]}])
    with pytest.raises(TraceError, match=str(constants.MAX_EXPERTS)):
        read_routing(path)


# -- figures from the sparse pairs equal those of the dense matrix -----------------------


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), experts=st.integers(2, 10), top=st.integers(1, 6))
def test_summary_pairs_equal_the_dense_figures(seed, experts, top):
    rng = np.random.default_rng(seed)
    coact = symmetric_counts(rng, 2, experts)
    aff = rng.integers(0, 3, size=(1, experts, experts))
    load = rng.integers(0, 9, size=(1, 2, experts))
    stats = ExpertStats(load=load, tokens=np.array([20]), layer_ids=np.array([0, 1]),
                        top_k=2, coact=coact, layer_affinity=aff)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary = summarize(stats, top=top)
    for row in range(2):
        lift = pair_lift(coact[row], load[0, row], 2)
        want = [(list(p), int(coact[row][p])) for p in top_pairs(coact[row], top)]
        got = summary["layers"][row]["pairs"]
        assert [(p["experts"], p["count"]) for p in got] == want
        for p in got:
            value = lift[tuple(p["experts"])]
            assert p["lift"] == (None if np.isnan(value) else value)
    got = summary["affinity"][0]["pairs"]
    assert [(p["experts"], p["count"]) for p in got] == [
        (list(p), int(aff[0][p])) for p in top_pairs(aff[0], top, symmetric=False)]


# -- consumers of the dense form ----------------------------------------------------------


def test_sampler_past_the_dense_limit_samples_from_the_loads_with_a_warning(monkeypatch):
    """Too many experts for the anchor mixture's dense matrices: the evaluation runs
    without co-activation (the same draws as without it) and says so."""
    from evaluate_fixtures import cluster, placement, random_routing, tiny_model

    from placer.errors import PlacerWarning
    from placer.evaluate import EvalParams, evaluate

    stats = random_routing(64, batch=16, seed=2).stats
    assert stats.coact is not None
    pl = placement([[0, 1, 2, 3], [0, 2, 1, 3]], 2)
    args = (pl, cluster((2,)), tiny_model(), EvalParams(sample=True, seed=1, batch_tokens=16))
    plain = evaluate(args[0], replace_coact(stats), *args[1:])
    paired = evaluate(args[0], stats, *args[1:])
    assert not np.array_equal(paired.gpu_load, plain.gpu_load)  # the pairs change the draws
    monkeypatch.setattr(constants, "MAX_COACT_BYTES", 8 * 4 * 4 - 1)
    with pytest.warns(PlacerWarning, match="co-activation of 4 experts is too large"):
        capped = evaluate(args[0], stats, *args[1:])
    np.testing.assert_array_equal(capped.gpu_load, plain.gpu_load)


def replace_coact(stats: ExpertStats) -> ExpertStats:
    from dataclasses import replace

    return replace(stats, coact=None, layer_affinity=None)
