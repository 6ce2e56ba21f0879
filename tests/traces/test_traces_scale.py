"""Reading at scale: statistics streamed chunk by chunk, per-token routing kept as a
bounded sample of whole batches (``TokenSample``), pairs counted on a sample past a bound
(``pair_tokens``), layer affinity skipped on request, and reading memory that does not
grow with the trace."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from placer import constants
from placer.errors import TraceError, UsageError
from placer.stats import ExpertStats
from placer.stats.windows import token_windows
from placer.traces import TokenSample, read_routing, write_jsonl_trace, write_npz_trace
from placer.traces.accumulate import sample as sample_module
from placer.traces.accumulate.counting import pair_weights

LAYERS = [3, 4, 5, 6]


def _topk(tokens: int, experts: int = 16, k: int = 2, seed: int = 0) -> np.ndarray:
    """``[tokens, 4, k]`` distinct expert ids per row, skewed towards low ids; seeded."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, experts + 1)
    keys = rng.random((tokens, len(LAYERS), experts)) ** (1.0 / weights)
    return np.argsort(-keys, axis=2)[:, :, :k].astype(np.int64)


@pytest.fixture
def stepped(tmp_path: Path) -> Path:
    """600 tokens over 4 layers, top-2 of 16 experts, in 12 steps of 50 tokens, 4 ranks."""
    topk = _topk(600)
    path = tmp_path / "stepped.npz"
    write_npz_trace(path, topk, layer_ids=LAYERS, step=np.arange(600) // 50,
                    rank=np.arange(600) % 4, meta={"num_experts": 16, "top_k": 2})
    return path


def _same_stats(a: ExpertStats, b: ExpertStats) -> None:
    np.testing.assert_array_equal(a.load, b.load)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.window_starts, b.window_starts)
    for name in ("coact", "layer_affinity"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            np.testing.assert_array_equal(x.to_dense(), y.to_dense(), err_msg=name)


# -- chunked reading ---------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_rows", [4, 37, 400])
def test_reading_in_chunks_gives_the_statistics_of_reading_whole(stepped, monkeypatch,
                                                                 chunk_rows):
    """Statistics, the sample of batches and sampled pair counts are the same whatever the
    chunks the reader streams (CHUNK_ROWS 4: one token a chunk)."""
    options = {"sample": TokenSample(16, whole_selections=0, seed=2), "pair_tokens": 100}
    whole = read_routing(stepped, **options)
    monkeypatch.setattr(constants, "CHUNK_ROWS", chunk_rows)
    chunked = read_routing(stepped, **options)
    _same_stats(whole.stats, chunked.stats)
    assert whole.stats.provenance == chunked.stats.provenance
    np.testing.assert_array_equal(whole.trace.topk_ids, chunked.trace.topk_ids)
    np.testing.assert_array_equal(whole.trace.sample.token_index,
                                  chunked.trace.sample.token_index)
    np.testing.assert_array_equal(whole.trace.sample.window, chunked.trace.sample.window)


def test_jsonl_rows_read_to_the_npz_figures(stepped, tmp_path):
    """The same tokens as JSONL rows (one per token and layer): the same statistics, the
    same sample of batches, the same sampled pair counts."""
    kept = read_routing(stepped, keep_tokens=True).trace
    path = tmp_path / "stepped.jsonl"
    write_jsonl_trace(path, kept.topk_ids, layer_ids=LAYERS, step=kept.step, rank=kept.rank,
                      meta={"num_experts": 16, "top_k": 2})
    options = {"sample": TokenSample(16, whole_selections=0, seed=2), "pair_tokens": 100}
    a, b = read_routing(stepped, **options), read_routing(path, **options)
    _same_stats(a.stats, b.stats)
    np.testing.assert_array_equal(a.trace.topk_ids, b.trace.topk_ids)
    np.testing.assert_array_equal(a.trace.sample.token_index, b.trace.sample.token_index)


def test_affinity_off_keeps_load_and_coactivation(stepped):
    full, lean = read_routing(stepped), read_routing(stepped, affinity=False)
    assert lean.stats.layer_affinity is None and full.stats.layer_affinity is not None
    np.testing.assert_array_equal(full.stats.load, lean.stats.load)
    np.testing.assert_array_equal(full.stats.coact.to_dense(), lean.stats.coact.to_dense())


# -- the sample of whole batches ------------------------------------------------------------


def test_a_small_trace_is_kept_whole(stepped):
    """Within ``whole_selections`` the sample is the whole trace, as keep_tokens keeps it."""
    whole = read_routing(stepped, keep_tokens=True).trace
    kept = read_routing(stepped, sample=TokenSample(16)).trace
    assert kept.sample is None
    np.testing.assert_array_equal(kept.topk_ids, whole.topk_ids)
    np.testing.assert_array_equal(kept.step, whole.step)
    np.testing.assert_array_equal(kept.rank, whole.rank)


def test_a_sample_holds_whole_batches_one_per_window(stepped):
    """Batches of 16 consecutive tokens; each of the 12 windows (50 tokens) keeps the one
    of lowest priority among the batches that start in it; the tokens are the trace's."""
    whole = read_routing(stepped, keep_tokens=True)
    data = read_routing(stepped, sample=TokenSample(16, whole_selections=0, seed=5))
    sample = data.trace.sample
    assert (sample.num_windows, sample.batch_tokens, sample.per_window, sample.num_tokens) \
        == (12, 16, 1, 600)
    batches = np.unique(sample.batch)
    starts = np.arange(0, 600, 16)  # first token of every batch of the trace
    start_window = token_windows(whole.trace, whole.stats)[starts]
    priority = sample_module.batch_priority(5, np.arange(starts.size))
    expected = [int(np.flatnonzero(start_window == w)[np.argmin(priority[start_window == w])])
                for w in range(12)]
    assert batches.tolist() == expected
    for b in batches.tolist():  # whole batches, judged in the window they start in
        at = sample.batch == b
        assert sample.token_index[at].tolist() == list(range(16 * b, min(16 * b + 16, 600)))
        assert (sample.window[at] == start_window[b]).all()
    np.testing.assert_array_equal(data.trace.topk_ids, whole.trace.topk_ids[sample.token_index])
    np.testing.assert_array_equal(data.trace.step, whole.trace.step[sample.token_index])
    np.testing.assert_array_equal(token_windows(data.trace, data.stats), sample.window)
    _same_stats(data.stats, whole.stats)  # the statistics count every token


def test_the_sample_follows_the_seed(stepped):
    def held(seed: int) -> list[int]:
        data = read_routing(stepped, sample=TokenSample(16, 2, seed, whole_selections=0))
        return np.unique(data.trace.sample.batch).tolist()

    assert held(1) == held(1)
    assert held(1) != held(2)
    assert len(held(1)) == 24  # two of the 3 or 4 batches that start in each window


def test_windows_that_merge_keep_the_lowest_batches_of_the_union(tmp_path):
    """130 steps of 8 tokens merge into 65 -> 33 windows of 4 steps as they are read; each
    final window holds the batch of lowest priority among all that start in it."""
    topk = _topk(1040)
    path = tmp_path / "long.npz"
    write_npz_trace(path, topk, layer_ids=LAYERS, step=np.arange(1040) // 8,
                    meta={"num_experts": 16, "top_k": 2})
    data = read_routing(path, sample=TokenSample(8, whole_selections=0, seed=3))
    sample = data.trace.sample
    assert sample.num_windows == data.stats.num_windows == 33
    first_step = np.arange(130)  # batch b starts step b
    window = np.searchsorted(data.stats.window_starts, first_step, side="right") - 1
    priority = sample_module.batch_priority(3, np.arange(130))
    expected = sorted(int(np.flatnonzero(window == w)[np.argmin(priority[window == w])])
                      for w in range(33))
    assert np.unique(sample.batch).tolist() == expected


def test_sample_and_keep_tokens_do_not_mix(stepped):
    with pytest.raises(UsageError, match="keep_tokens"):
        read_routing(stepped, keep_tokens=True, sample=TokenSample(16))


# -- pairs counted on a sample -----------------------------------------------------------------


def test_pair_weights_count_every_token_below_the_bound_then_halve():
    assert pair_weights(np.arange(100), 100) is None
    weight = pair_weights(np.arange(1 << 16), 1 << 12)
    assert (weight[: 1 << 12] == 1).all()
    for j in range(1, 5):  # [bound x 2^(j-1), bound x 2^j): weight 2^j, a 2^-j share counted
        part = weight[(1 << 12) << (j - 1):(1 << 12) << j]
        assert set(np.unique(part).tolist()) == {0, 1 << j}
        assert abs(np.count_nonzero(part) / part.size - 2.0 ** -j) < 0.02
    np.testing.assert_array_equal(weight, pair_weights(np.arange(1 << 16), 1 << 12))


def test_pairs_on_a_sample_estimate_the_counts(tmp_path):
    """Past ``pair_tokens`` pairs are counted on a hashed share of the tokens, weighted:
    the totals stay within a few percent; every token's load is still counted."""
    topk = _topk(8000, seed=1)
    path = tmp_path / "t.npz"
    write_npz_trace(path, topk, layer_ids=LAYERS, meta={"num_experts": 16, "top_k": 2})
    exact, estimated = read_routing(path), read_routing(path, pair_tokens=1000)
    np.testing.assert_array_equal(exact.stats.load, estimated.stats.load)
    assert exact.stats.provenance.pair_tokens == 0  # every token's pairs
    assert 1000 < estimated.stats.provenance.pair_tokens < 4000
    assert estimated.stats.provenance.tokens_read == 8000
    for name in ("coact", "layer_affinity"):
        a = getattr(exact.stats, name).to_dense().sum()
        b = getattr(estimated.stats, name).to_dense().sum()
        assert abs(b / a - 1) < 0.05, name
    same = read_routing(path, pair_tokens=8000)  # the bound past the trace: exact
    np.testing.assert_array_equal(same.stats.coact.to_dense(), exact.stats.coact.to_dense())


def test_a_repeated_expert_is_found_in_tokens_whose_pairs_are_not_counted(tmp_path):
    topk = _topk(300)
    topk[250, 1] = [3, 3]
    path = tmp_path / "dup.npz"
    write_npz_trace(path, topk, layer_ids=LAYERS, meta={"num_experts": 16, "top_k": 2})
    assert pair_weights(np.array([250]), 100)[0] == 0  # not counted
    with pytest.raises(TraceError, match="twice"):
        read_routing(path, pair_tokens=100)


# -- the reader's thread and memory --------------------------------------------------------


def test_an_error_in_a_later_chunk_stops_the_reader(tmp_path, monkeypatch):
    """An expert id past the model's in the 5th chunk: the error names it; the reader's
    thread, a chunk ahead, stops."""
    import threading

    topk = _topk(200)
    topk[170, 2, 1] = 40
    path = tmp_path / "bad.npz"
    write_npz_trace(path, topk, layer_ids=LAYERS)
    monkeypatch.setattr(constants, "CHUNK_ROWS", 4 * 40)
    before = threading.active_count()
    with pytest.raises(TraceError, match=r"topk_ids\[170, 2, 1\]"):
        read_routing(path, num_experts=16)
    assert threading.active_count() == before


def _read_peak(path: Path) -> int:
    tracemalloc.start()
    try:
        read_routing(path, sample=TokenSample(64, whole_selections=0), pair_tokens=2048,
                     affinity=False)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_reading_memory_grows_sublinearly(tmp_path, monkeypatch):
    """4x the tokens (past 64 windows, so windows merge): less than 2x the peak memory of
    reading, statistics and sample included (tracemalloc)."""
    monkeypatch.setattr(constants, "CHUNK_ROWS", 4 * 512)
    peaks = []
    for tokens in (16_384, 65_536):
        path = tmp_path / f"t{tokens}.npz"
        write_npz_trace(path, _topk(tokens, experts=64, k=4), layer_ids=LAYERS,
                        step=np.arange(tokens) // 64, meta={"num_experts": 64, "top_k": 4})
        peaks.append(_read_peak(path))
    assert peaks[1] < 2 * peaks[0], peaks


@pytest.mark.parametrize("chunk_rows", [4, 24, 4000])
def test_warmup_detection_is_the_same_with_its_quick_path(tmp_path, monkeypatch, chunk_rows):
    """Chunks without a repeated token take a quick path; it finds what the general path
    finds: a 70-token warm-up pass (identical routing) cut out, short repeats counted."""
    from placer.traces.accumulate.warmup import WarmupDetector

    topk = _topk(900)
    topk[300:370] = topk[300]  # a warm-up pass: 70 identical tokens, every layer
    topk[500:503] = topk[500]  # a short repeat
    path = tmp_path / "warm.npz"
    write_npz_trace(path, topk, layer_ids=LAYERS, step=np.arange(900) // 100,
                    meta={"num_experts": 16, "top_k": 2})
    monkeypatch.setattr(constants, "CHUNK_ROWS", chunk_rows)
    with pytest.warns(Warning, match="warm-up"):
        quick = read_routing(path, keep_tokens=True)
    monkeypatch.setattr(WarmupDetector, "_no_repeats", lambda *a, **k: None)
    with pytest.warns(Warning, match="warm-up"):
        general = read_routing(path, keep_tokens=True)
    _same_stats(quick.stats, general.stats)
    assert quick.stats.provenance == general.stats.provenance
    assert dict(quick.stats.provenance.rows_skipped) == {"warm-up pass": 70 * 4}
    np.testing.assert_array_equal(quick.trace.topk_ids, general.trace.topk_ids)
    assert quick.stats.warnings == general.stats.warnings


def test_pairs_on_a_sample_fit_the_loads(tmp_path):
    """Sampled pair counts are fitted to the exact loads: no pair counted more often than
    either expert is selected, no expert with more than k - 1 partners a token (k in the
    next layer), and, as every token selects k experts, partner sums close to (k - 1) x
    the load (rounded down)."""
    topk = _topk(8000, experts=16, k=4, seed=3)
    path = tmp_path / "t.npz"
    write_npz_trace(path, topk, layer_ids=LAYERS, meta={"num_experts": 16, "top_k": 4})
    stats = read_routing(path, pair_tokens=500).stats
    load = stats.load.sum(axis=0).astype(np.int64)  # [layers, E]
    coact = stats.coact.to_dense()
    assert (coact <= np.minimum(load[:, :, None], load[:, None, :])).all()
    partners = coact.sum(axis=2)
    assert (partners <= 3 * load).all()
    assert (partners >= 3 * load - 16).all()  # each of 15 partners rounded down
    aff = stats.layer_affinity.to_dense()
    assert (aff.sum(axis=2) <= 4 * load[:-1]).all() and (aff.sum(axis=1) <= 4 * load[1:]).all()
