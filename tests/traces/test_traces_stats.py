"""placer.traces statistics against a brute-force count: load, co-activation, affinity,
tokens, windows (steps, window_tokens, pairwise merging), layer selection, streaming."""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pair_helpers import dense

from placer import constants
from placer.errors import UsageError
from placer.traces import read_routing, write_jsonl_trace, write_npz_trace
from placer.traces.accumulate.grid import WindowGrid, window_count_for


def random_ids(rng: np.random.Generator, tokens: int, layers: int, experts: int, k: int,
               missing: float = 0.0) -> np.ndarray:
    """``[tokens, layers, k]`` distinct expert ids per row; a ``missing`` share of rows -1."""
    keys = rng.random((tokens, layers, experts))
    ids = np.argsort(keys, axis=2)[:, :, :k].astype(np.int64)
    if missing:
        ids[rng.random((tokens, layers)) < missing] = -1
    return ids


def brute(ids: np.ndarray, steps: np.ndarray | None, window_tokens: int | None,
          experts: int) -> dict[str, np.ndarray]:
    """Load per window, tokens per window, co-activation and affinity by plain loops.

    Tokens with no expert anywhere are not tokens.  Windows: keys are steps (or token
    order); width = window_tokens (or 1) doubled until at most MAX_WINDOWS windows span
    the keys from the first one.
    """
    present = (ids >= 0).any(axis=2)
    real = np.flatnonzero(present.any(axis=1))
    _t, nl, _ = ids.shape
    if steps is not None and window_tokens is None:
        keys = steps[real]
        base = int(keys[0])
    else:
        keys = np.arange(real.size)
        base = 0
    span = int(keys.max()) - base + 1
    count, width = window_count_for(span, window_tokens or 1)
    win = (keys - base) // width
    load = np.zeros((count, nl, experts), dtype=np.int64)
    tokens = np.zeros(count, dtype=np.int64)
    coact = np.zeros((nl, experts, experts), dtype=np.int64)
    aff = np.zeros((max(nl - 1, 0), experts, experts), dtype=np.int64)
    for w, tok in zip(win.tolist(), real.tolist(), strict=True):
        tokens[w] += 1
        for layer in range(nl):
            sel = [int(e) for e in ids[tok, layer] if e >= 0]
            for e in sel:
                load[w, layer, e] += 1
            for a, b in itertools.permutations(sel, 2):
                coact[layer, a, b] += 1
            if layer + 1 < nl:
                nxt = [int(e) for e in ids[tok, layer + 1] if e >= 0]
                for a in sel:
                    for b in nxt:
                        aff[layer, a, b] += 1
    return {"load": load, "tokens": tokens, "coact": coact, "aff": aff,
            "starts": base + np.arange(count) * width}


def check(stats, ref) -> None:
    np.testing.assert_array_equal(stats.load, ref["load"])
    np.testing.assert_array_equal(stats.tokens, ref["tokens"])
    np.testing.assert_array_equal(dense(stats.coact), ref["coact"])
    np.testing.assert_array_equal(dense(stats.layer_affinity), ref["aff"])
    np.testing.assert_array_equal(stats.window_starts, ref["starts"])


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**31 - 1),
    tokens=st.integers(1, 150),
    layers=st.integers(1, 4),
    experts=st.integers(2, 9),
    data=st.data(),
)
def test_npz_and_jsonl_statistics_equal_brute_force(tmp_path_factory, seed, tokens, layers,
                                                   experts, data):
    k = data.draw(st.integers(1, experts))
    with_steps = data.draw(st.booleans())
    missing = data.draw(st.sampled_from([0.0, 0.2]))
    rng = np.random.default_rng(seed)
    ids = random_ids(rng, tokens, layers, experts, k, missing)
    ids[0, :, :] = np.arange(k)  # every layer has a row (JSONL has no empty layers)
    steps = np.sort(rng.integers(0, 400, tokens)) if with_steps else None
    folder = tmp_path_factory.mktemp("h")
    layer_ids = np.arange(layers) + 3
    write_npz_trace(folder / "t.npz", ids, layer_ids=layer_ids, step=steps,
                    meta={"num_experts": experts})
    write_jsonl_trace(folder / "t.jsonl", ids, layer_ids=layer_ids, step=steps,
                      meta={"num_experts": experts})
    ref = brute(ids, steps, None, experts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # small random traces leave experts unrouted
        for name in ("t.npz", "t.jsonl"):
            stats = read_routing(folder / name, num_experts=experts).stats
            np.testing.assert_array_equal(stats.layer_ids, layer_ids)
            assert stats.top_k == k
            if layers > 1:
                check(stats, ref)
            else:
                np.testing.assert_array_equal(stats.load, ref["load"])
                assert stats.layer_affinity is None


@pytest.fixture
def trace_3x8(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    """500 tokens, layers 5..7 x 8 experts, top-2, steps 0..99 (5 tokens a step)."""
    rng = np.random.default_rng(3)
    ids = random_ids(rng, 500, 3, 8, 2)
    steps = np.arange(500) // 5
    path = tmp_path / "t.npz"
    write_npz_trace(path, ids, layer_ids=[5, 6, 7], step=steps, meta={"num_experts": 8})
    return path, ids, steps


def test_streaming_in_small_chunks_equals_all_at_once(trace_3x8, tmp_path, monkeypatch):
    path, ids, steps = trace_3x8
    jl = tmp_path / "t.jsonl"
    write_jsonl_trace(jl, ids, layer_ids=[5, 6, 7], step=steps)
    whole = read_routing(path).stats
    whole_jl = read_routing(jl).stats
    monkeypatch.setattr(constants, "CHUNK_ROWS", 7)
    monkeypatch.setattr("placer.traces.formats.jsonl.read.BLOCK_BYTES", 300)
    for small in (read_routing(path).stats, read_routing(jl).stats):
        for ref in (whole, whole_jl):
            np.testing.assert_array_equal(small.load, ref.load)
            np.testing.assert_array_equal(small.tokens, ref.tokens)
            np.testing.assert_array_equal(dense(small.coact), dense(ref.coact))
            np.testing.assert_array_equal(dense(small.layer_affinity),
                                          dense(ref.layer_affinity))
            np.testing.assert_array_equal(small.window_starts, ref.window_starts)


def test_steps_give_windows_merged_pairwise(trace_3x8):
    """100 steps > 64 windows: merged pairwise into 50 windows of 2 steps."""
    path, ids, steps = trace_3x8
    stats = read_routing(path).stats
    assert stats.num_windows == 50
    np.testing.assert_array_equal(stats.window_starts, np.arange(0, 100, 2))
    np.testing.assert_array_equal(stats.tokens, np.full(50, 10))
    check(stats, brute(ids, steps, None, 8))


def test_window_tokens(trace_3x8):
    path, ids, _ = trace_3x8
    stats = read_routing(path, window_tokens=100).stats
    np.testing.assert_array_equal(stats.tokens, [100] * 5)
    np.testing.assert_array_equal(stats.window_starts, [0, 100, 200, 300, 400])
    check(stats, brute(ids, None, 100, 8))


def test_window_tokens_beyond_max_windows_merges_and_says_so(trace_3x8):
    path, ids, _ = trace_3x8
    with pytest.warns(Warning, match=r"window_tokens=5 gave more than 64 windows; merged"
                      r" pairwise into windows of 10 tokens"):
        stats = read_routing(path, window_tokens=5).stats
    assert stats.num_windows == 50
    check(stats, brute(ids, None, 5, 8))


def test_pairwise_merge_keeps_totals_and_alignment():
    """Keys 0..999 one at a time: widths double 1 -> 16, 63 windows, starts 0, 16, ..."""
    from placer.traces.accumulate import Accumulator, TokenChunk

    acc = Accumulator()
    acc.begin_source("mem", "test")
    for start in range(0, 1000, 37):
        n = min(37, 1000 - start)
        ids = (np.arange(start, start + n) % 3).reshape(n, 1, 1)
        acc.add_tokens(TokenChunk(topk_ids=ids, step=np.arange(start, start + n)), [0],
                       token_offset=start)
    stats = acc.result().stats
    assert window_count_for(1000) == (63, 16)
    assert stats.num_windows == 63
    np.testing.assert_array_equal(stats.window_starts, np.arange(63) * 16)
    assert stats.tokens.sum() == 1000
    np.testing.assert_array_equal(stats.tokens[:-1], 16)
    assert stats.tokens[-1] == 1000 - 62 * 16


def test_layers_selects_and_counts_skipped_rows(trace_3x8):
    path, _ids, _steps = trace_3x8
    stats = read_routing(path, layers=[5, 7]).stats
    np.testing.assert_array_equal(stats.layer_ids, [5, 7])
    assert dict(stats.provenance.rows_skipped) == {"layer not selected": 500}
    full = read_routing(path).stats
    np.testing.assert_array_equal(stats.load, full.load[:, [0, 2]])


def test_layers_not_in_trace_is_a_usage_error(trace_3x8):
    path, _, _ = trace_3x8
    with pytest.raises(UsageError, match="layer 9 has no rows in the trace") as e:
        read_routing(path, layers=[5, 9])
    assert e.value.where == "layers"
    assert e.value.hint == "layers present: 5-7"


def test_coact_false_skips_pair_counts(trace_3x8):
    path, _, _ = trace_3x8
    stats = read_routing(path, coact=False).stats
    assert stats.coact is None and stats.layer_affinity is None
    assert stats.load.sum() == 500 * 3 * 2


def test_coact_symmetric_with_zero_diagonal_and_row_sums(trace_3x8):
    """Complete pair counts: each row sums to (k - 1) x load."""
    path, _, _ = trace_3x8
    stats = read_routing(path).stats
    c = stats.coact.to_dense()
    np.testing.assert_array_equal(c, c.transpose(0, 2, 1))
    assert not np.einsum("lii->li", c).any()
    np.testing.assert_array_equal(c.sum(axis=2), (stats.top_k - 1) * stats.mean_load)


def test_several_files_are_one_trace(trace_3x8, tmp_path):
    path, _ids, _steps = trace_3x8
    both = read_routing([path, path]).stats
    one = read_routing(path).stats
    np.testing.assert_array_equal(both.load, 2 * one.load)
    np.testing.assert_array_equal(both.tokens, 2 * one.tokens)
    assert both.provenance.sources == (str(path), str(path))


def test_window_grid_merges_pairwise_and_extends_down():
    """Keys 10..13 then 2: windows of 1 grow to the left; 70 keys merge to width 2."""
    grid = WindowGrid()
    (counts,) = grid.fit(10, 13, [np.zeros(0, np.int64)], align=True)
    counts[grid.index(np.arange(10, 14))] += 1
    (counts,) = grid.fit(2, 2, [counts], align=True)
    assert (grid.base, grid.width, grid.count) == (2, 1, 12)
    np.testing.assert_array_equal(counts, [0] * 8 + [1] * 4)
    (counts,) = grid.fit(2, 71, [counts], align=True)
    assert (grid.base, grid.width, grid.count, grid.merged_from) == (2, 2, 35, 1)
    np.testing.assert_array_equal(counts[:6], [0, 0, 0, 0, 2, 2])
    np.testing.assert_array_equal(grid.starts()[:3], [2, 4, 6])


def padded_ids(rng: np.random.Generator, tokens: int, layers: int, experts: int,
               k: int) -> np.ndarray:
    """Like :func:`random_ids`, with single -1 entries (padding inside a row), some rows
    all -1, and expert ids that grow along the trace (the first tokens use only the
    lowest experts), so the accumulators widen between chunks."""
    early = tokens // 3
    ids = np.concatenate([random_ids(rng, early, layers, max(k, experts // 2), k),
                          random_ids(rng, tokens - early, layers, experts, k)])
    ids[rng.random(ids.shape) < 0.15] = -1
    ids[0, :, :] = np.arange(k)
    return ids


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1), tokens=st.integers(2, 60), layers=st.integers(2, 4),
       experts=st.integers(3, 9), data=st.data())
def test_padding_and_growing_experts_in_small_chunks_equal_brute_force(
        tmp_path_factory, monkeypatch, seed, tokens, layers, experts, data):
    """-1 entries inside rows and experts first seen late, read in chunks of a few rows
    (the pair counts keep an extra column for -1 and widen as experts appear)."""
    k = data.draw(st.integers(2, experts))
    rng = np.random.default_rng(seed)
    ids = padded_ids(rng, tokens, layers, experts, k)
    folder = tmp_path_factory.mktemp("p")
    write_npz_trace(folder / "t.npz", ids, layer_ids=np.arange(layers))
    write_jsonl_trace(folder / "t.jsonl", ids, layer_ids=np.arange(layers))
    ref = brute(ids, None, None, experts)
    used = int(ids.max()) + 1
    with monkeypatch.context() as m, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m.setattr(constants, "CHUNK_ROWS", data.draw(st.sampled_from([3, 8, 1000])))
        m.setattr("placer.traces.formats.jsonl.read.BLOCK_BYTES", 200)
        for name in ("t.npz", "t.jsonl"):
            s = read_routing(folder / name).stats
            np.testing.assert_array_equal(s.load, ref["load"][:, :, :used])
            np.testing.assert_array_equal(dense(s.coact), ref["coact"][:, :used, :used])
            np.testing.assert_array_equal(dense(s.layer_affinity), ref["aff"][:, :used, :used])


@pytest.mark.parametrize("coact", [True, False])
@pytest.mark.parametrize("chunk_rows", [5, 1 << 18])
def test_warm_up_run_in_npz_is_found_across_chunks(tmp_path, monkeypatch, coact, chunk_rows):
    """70 identical tokens (layer 1 only), starting at token 3, whatever the chunking."""
    rng = np.random.default_rng(0)
    ids = random_ids(rng, 100, 2, 16, 2)
    ids[3:73, 1] = [4, 9]
    ids[73, 1] = [9, 5]
    path = tmp_path / "w.npz"
    write_npz_trace(path, ids, layer_ids=[0, 1])
    monkeypatch.setattr(constants, "CHUNK_ROWS", chunk_rows)
    with pytest.warns(Warning) as record:
        read_routing(path, coact=coact, keep_warmup=True)
    runs = [str(w.message) for w in record if "identical consecutive" in str(w.message)]
    assert runs == [f"70 identical consecutive routing rows for layer 1 (ending at {path}:"
                    " topk_ids[72, 1]): this looks like a profiling or warm-up pass"]
    with pytest.warns(Warning) as record:
        s = read_routing(path, coact=coact).stats
    runs = [str(w.message) for w in record if "warm-up" in str(w.message)]
    assert runs == [f"left out 70 routing rows of a profiling or warm-up pass: runs of 64 or"
                    " more identical consecutive selections in one layer (the longest: 70"
                    f" rows for layer 1, ending at {path}: topk_ids[72, 1]); pass"
                    " `keep_warmup` to count them"]
    kept = np.ones((100, 2), dtype=bool)
    kept[3:73, 1] = False
    want = np.zeros((2, 16), dtype=np.int64)
    for layer in range(2):
        np.add.at(want[layer], ids[kept[:, layer], layer].ravel(), 1)
    np.testing.assert_array_equal(s.load.sum(axis=0), want)
    assert s.tokens.sum() == 100
