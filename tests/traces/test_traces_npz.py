"""placer.traces NPZ: writer/reader round trips (arrays and chunk iterators), metadata,
column order, -1 entries, and bad arrays with their messages."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from placer import constants
from placer.errors import TraceError, UsageError
from placer.traces import (
    TokenChunk,
    read_npz_header,
    read_routing,
    write_npz_trace,
)


@pytest.fixture
def small_ids() -> np.ndarray:
    """12 tokens x 3 layers, top-2 of 6 experts, every row distinct and valid."""
    rng = np.random.default_rng(2)
    return np.argsort(rng.random((12, 3, 6)), axis=2)[:, :, :2]


def test_round_trip_keeps_everything(tmp_path, small_ids):
    weights = np.random.default_rng(0).random(small_ids.shape).astype(np.float32)
    path = tmp_path / "t.npz"
    n = write_npz_trace(path, small_ids, layer_ids=[3, 5, 9], step=np.arange(12) // 4,
                        rank=np.arange(12) % 2, topk_weights=weights,
                        meta={"model": "m", "num_experts": 6, "synthetic": False})
    assert n == 12
    data = read_routing(path, keep_tokens=True)
    t = data.trace
    np.testing.assert_array_equal(t.topk_ids, small_ids)
    np.testing.assert_array_equal(t.layer_ids, [3, 5, 9])
    np.testing.assert_array_equal(t.step, np.arange(12) // 4)
    np.testing.assert_array_equal(t.rank, np.arange(12) % 2)
    np.testing.assert_array_equal(t.topk_weights, weights)
    s = data.stats
    assert (s.top_k, s.num_experts, s.provenance.model, s.provenance.format) == (2, 6, "m", "npz")
    np.testing.assert_array_equal(s.tokens, [4, 4, 4])
    head = read_npz_header(path)
    assert head["shape"] == (12, 3, 2) and head["dtype"] == "int16" and head["top_k"] == 2


def test_writer_streams_chunks_and_mappings(tmp_path, small_ids):
    chunks = [TokenChunk(topk_ids=small_ids[:5], step=np.zeros(5, int)),
              {"topk_ids": small_ids[5:], "step": np.ones(7, int)}]
    path = tmp_path / "c.npz"
    assert write_npz_trace(path, iter(chunks), layer_ids=[0, 1, 2], meta={}) == 12
    t = read_routing(path, keep_tokens=True).trace
    np.testing.assert_array_equal(t.topk_ids, small_ids)
    np.testing.assert_array_equal(t.step, [0] * 5 + [1] * 7)


def test_writer_refuses_mixed_inputs(tmp_path, small_ids):
    with pytest.raises(UsageError, match="step, rank, topk_weights and request come with"):
        write_npz_trace(tmp_path / "x.npz", iter([small_ids]), layer_ids=[0, 1, 2],
                        step=np.zeros(12))
    with pytest.raises(UsageError, match=r"topk_ids chunk has shape \(12, 3, 2\), expected"
                       r" \[tokens, 2, k\]"):
        write_npz_trace(tmp_path / "x.npz", small_ids, layer_ids=[0, 1])
    assert not (tmp_path / "x.npz").exists()


def test_uncompressed_and_unsorted_columns(tmp_path, small_ids):
    path = tmp_path / "u.npz"
    write_npz_trace(path, small_ids, layer_ids=[9, 3, 5], compress=False)
    t = read_routing(path, keep_tokens=True).trace
    np.testing.assert_array_equal(t.layer_ids, [3, 5, 9])
    np.testing.assert_array_equal(t.topk_ids, small_ids[:, [1, 2, 0]])


def test_minus_one_entries_are_no_selection(tmp_path):
    ids = np.array([[[0, 1], [2, -1]], [[-1, -1], [1, 2]], [[-1, -1], [-1, -1]]])
    path = tmp_path / "m.npz"
    write_npz_trace(path, ids, layer_ids=[0, 1], meta={"num_experts": 3})
    s = read_routing(path).stats
    assert s.total_tokens == 2 and s.provenance.rows_read == 3
    assert dict(s.provenance.rows_skipped) == {"token with no expert in any layer": 1}
    np.testing.assert_array_equal(s.mean_load, [[1, 1, 0], [0, 1, 2]])
    assert s.layer_affinity.dense(0).sum() == 2  # token 0 only: {0, 1} -> {2}


def save_npz(path: Path, **arrays: object) -> Path:
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


@pytest.mark.parametrize(("arrays", "message", "where"), [
    ({"topk_ids": np.zeros((4, 2))}, "topk_ids has shape (4, 2), expected [tokens, layers, k]",
     "topk_ids"),
    ({"topk_ids": np.zeros((4, 2, 2))},
     "topk_ids has dtype float64, expected integers (int16 or int32)", "topk_ids"),
    ({"topk_ids": np.zeros((4, 2, 1), np.int32), "step": np.zeros(3, np.int64)},
     "step has shape (3,) and dtype int64, expected [4] integers", "step"),
    ({"topk_ids": np.zeros((4, 2, 1), np.int32), "layer_ids": np.array([1, 1])},
     "layer_ids [1, 1] must be distinct layer indices >= 0", "layer_ids"),
    ({"topk_ids": np.zeros((4, 2, 1), np.int32), "topk_weights": np.zeros((4, 2, 2))},
     "topk_weights has shape (4, 2, 2), expected (4, 2, 1) like topk_ids", "topk_weights"),
    ({"topk_ids": np.zeros((4, 2, 1), np.int32), "rank": np.array([0, -5, 0, 0])},
     "rank[1] is -5; expected >= 0 (-1 = unknown)", "rank[1]"),
])
def test_bad_arrays(tmp_path, arrays, message, where):
    path = save_npz(tmp_path / "bad.npz", **arrays)
    with pytest.raises(TraceError) as e:
        read_routing(path)
    assert e.value.message == message
    assert e.value.where == f"{path}: {where}"


def test_expert_out_of_range_names_the_array_cell(tmp_path):
    ids = np.zeros((3, 2, 2), np.int32)
    ids[:, :, 1] = 1
    ids[2, 1, 0] = 7
    path = save_npz(tmp_path / "r.npz", topk_ids=ids, num_experts=np.array(4))
    with pytest.raises(TraceError) as e:
        read_routing(path)
    assert str(e.value) == f"{path}: topk_ids[2, 1, 0]: expert id 7 is out of range [0, 4)"


def test_duplicate_expert_in_a_token_names_the_row(tmp_path):
    ids = np.array([[[0, 1]], [[2, 2]]], np.int32)
    path = save_npz(tmp_path / "d.npz", topk_ids=ids)
    with pytest.raises(TraceError) as e:
        read_routing(path)
    assert str(e.value) == (f"{path}: topk_ids[1, 0, 0]: expert 2 appears twice in one"
                            " token's top-k [2, 2]")


def test_truncated_member(tmp_path, small_ids):
    path = tmp_path / "t.npz"
    write_npz_trace(path, small_ids, layer_ids=[0, 1, 2], compress=False)
    cut = tmp_path / "cut.npz"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(cut, "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            dst.writestr(info.filename, data[:-10] if info.filename == "topk_ids.npy" else data)
    with pytest.raises(TraceError) as e:
        read_routing(cut)
    assert e.value.message == "topk_ids ends early: the member is truncated"


def test_npz_without_topk_ids_or_load_is_unknown(tmp_path):
    path = save_npz(tmp_path / "x.npz", other=np.zeros(3))
    with pytest.raises(TraceError) as e:
        read_routing(path)
    assert e.value.message == "cannot tell the trace format from the name and content"
    with pytest.raises(TraceError) as e:
        read_routing(path, format="npz")
    assert e.value.message == "no topk_ids array"


@pytest.mark.parametrize("coact", [True, False])
def test_duplicate_expert_found_with_and_without_pair_counts(tmp_path, coact):
    """With co-activation the duplicate shows as a diagonal count; without, by comparing
    columns; the message names the first such row either way."""
    ids = np.array([[[0, 1, 2], [3, 4, 5]], [[1, 2, 3], [5, 0, 5]], [[4, 4, 0], [1, 2, 3]]])
    path = save_npz(tmp_path / "d.npz", topk_ids=ids)
    with pytest.raises(TraceError) as e:
        read_routing(path, coact=coact)
    assert str(e.value) == (f"{path}: topk_ids[1, 1, 0]: expert 5 appears twice in one"
                            " token's top-k [5, 0, 5]")


@pytest.mark.parametrize("layers", [1, 3])
def test_kept_tokens_survive_chunk_buffers(tmp_path, monkeypatch, layers):
    """The reader reuses its chunk arrays; the per-token trace keeps copies (one layer is
    the case where a transposed chunk is still contiguous)."""
    rng = np.random.default_rng(4)
    ids = np.argsort(rng.random((50, layers, 6)), axis=2)[:, :, :2]
    weights = rng.random(ids.shape).astype(np.float32)
    path = tmp_path / "k.npz"
    write_npz_trace(path, ids, layer_ids=np.arange(layers), topk_weights=weights)
    monkeypatch.setattr(constants, "CHUNK_ROWS", 7)
    trace = read_routing(path, keep_tokens=True).trace
    np.testing.assert_array_equal(trace.topk_ids, ids)
    np.testing.assert_array_equal(trace.topk_weights, weights)
