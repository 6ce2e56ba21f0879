"""placer.traces aggregated loads (.npz, .npy, .csv, .json), top_k inference, the format
registry and detection."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from placer.errors import TraceError, UsageError
from placer.traces import format_names, read_routing, register_format
from placer.traces.registry import _FORMATS, detect_format


@pytest.fixture
def load_2x4() -> np.ndarray:
    """A complete top-2 load of 2 layers x 4 experts: 5 tokens a layer (10 selections)."""
    return np.array([[4, 3, 2, 1], [1, 2, 3, 4]])


def coact_of(tokens: list[list[tuple[int, int]]], experts: int) -> np.ndarray:
    """Co-activation of top-2 tokens given per layer as expert pairs."""
    c = np.zeros((len(tokens), experts, experts), dtype=np.int64)
    for layer, pairs in enumerate(tokens):
        for a, b in pairs:
            c[layer, a, b] += 1
            c[layer, b, a] += 1
    return c


@pytest.fixture
def pairs_2x4() -> list[list[tuple[int, int]]]:
    """Five top-2 tokens per layer whose loads are ``load_2x4``."""
    return [[(0, 1), (0, 1), (0, 2), (0, 3), (1, 2)], [(3, 2), (3, 2), (3, 1), (3, 0), (2, 1)]]


def test_npz_with_coact_infers_top_k(tmp_path, load_2x4, pairs_2x4):
    path = tmp_path / "load.npz"
    np.savez(path, load=load_2x4, coact=coact_of(pairs_2x4, 4), layer_ids=np.array([3, 4]))
    with pytest.warns(Warning, match="top_k 2 inferred from complete co-activation counts"):
        s = read_routing(path).stats
    assert s.top_k == 2 and s.provenance.format == "load-npz"
    np.testing.assert_array_equal(s.load[0], load_2x4)
    np.testing.assert_array_equal(s.layer_ids, [3, 4])
    np.testing.assert_array_equal(s.tokens, [5])
    assert s.layer_affinity is None


def test_npy_windows_need_top_k(tmp_path, load_2x4):
    path = tmp_path / "load.npy"
    np.save(path, np.stack([load_2x4, 2 * load_2x4]))
    with pytest.raises(TraceError) as e:
        read_routing(path)
    assert e.value.message == ("top_k is unknown: the file does not give it and co-activation"
                               " cannot tell it")
    assert e.value.hint == "pass `top_k`, or add a top_k entry to the file"
    s = read_routing(path, top_k=2).stats
    np.testing.assert_array_equal(s.tokens, [5, 10])
    np.testing.assert_array_equal(s.window_starts, [0, 1])


def test_json(tmp_path, load_2x4):
    path = tmp_path / "load.json"
    path.write_text(json.dumps({"load": load_2x4.tolist(), "layer_ids": [1, 2], "top_k": 2}))
    s = read_routing(path).stats
    assert s.provenance.format == "load-json"
    np.testing.assert_array_equal(s.mean_load, load_2x4)


def test_json_unknown_entry(tmp_path):
    path = tmp_path / "load.json"
    path.write_text(json.dumps({"load": [[1, 2]], "weight": 3}))
    with pytest.raises(TraceError) as e:
        read_routing(path)
    assert e.value.message == "unknown entries ['weight']"


def test_csv_with_windows(tmp_path):
    """Columns in any order; cells not listed are 0; layers are absolute ids."""
    path = tmp_path / "load.csv"
    path.write_text("window,expert,layer,load\n0,0,7,5\n0,2,7,1\n1,1,7,3\n1,2,9,2\n")
    s = read_routing(path, top_k=1).stats
    assert s.provenance.format == "load-csv"
    np.testing.assert_array_equal(s.layer_ids, [7, 9])
    np.testing.assert_array_equal(s.load, [[[5, 0, 1], [0, 0, 0]], [[0, 3, 0], [0, 0, 2]]])


@pytest.mark.parametrize(("text", "message", "line"), [
    ("layer,expert\n0,1\n", "missing column 'load'", 1),
    ("layer,expert,load,kind\n0,1,2,x\n", "unknown column 'kind'", 1),
    ("layer,expert,load\n0,1,2\n0,1,3\n", "cell (window 0, layer 0, expert 1) is listed twice"
     " (first at line 2)", 3),
    ("layer,expert,load\n0,1,-2\n", "load is -2; expected >= 0", 2),
    ("layer,expert,load\n0,1,2.5\n", "load is '2.5'; expected a whole number", 2),
    ("layer,expert,load\n0,1\n", "row has 2 fields, the header 3", 2),
])
def test_bad_csv(tmp_path, text, message, line):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(TraceError) as e:
        read_routing(path, format="load-csv", top_k=1)
    assert e.value.message == message
    assert e.value.where == f"{path}:{line}"


def test_negative_load_names_the_cell(tmp_path):
    path = tmp_path / "neg.npz"
    np.savez(path, load=np.array([[1, 2], [3, -4]]))
    with pytest.raises(TraceError) as e:
        read_routing(path, top_k=1)
    assert e.value.message == "load[1, 1] is -4; counts are >= 0"
    assert e.value.where == f"{path}: load[1, 1]"


def test_wrong_shapes(tmp_path):
    path = tmp_path / "s.npz"
    np.savez(path, load=np.ones(4))
    with pytest.raises(TraceError, match=r"load has shape \(4,\), expected \[layers, experts\]"):
        read_routing(path, top_k=1)
    np.savez(path, load=np.ones((2, 3)), coact=np.ones((2, 3, 2)))
    with pytest.raises(TraceError, match=r"coact has shape \(2, 3, 2\), expected \[2, 3, 3\]"):
        read_routing(path, top_k=1)


def test_asymmetric_coact(tmp_path):
    path = tmp_path / "a.npz"
    c = np.zeros((1, 2, 2), int)
    c[0, 0, 1] = 1
    np.savez(path, load=np.ones((1, 2), int), coact=c)
    with pytest.raises(TraceError) as e:
        read_routing(path, top_k=2)
    assert e.value.message == ("coact is not symmetric: coact[0, 0, 1] = 1 but"
                               " coact[0, 1, 0] = 0")


def test_files_add_up_and_must_match(tmp_path, load_2x4):
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    np.save(a, load_2x4)
    np.save(b, load_2x4[:, :3])
    s = read_routing([a, a], top_k=2).stats
    np.testing.assert_array_equal(s.mean_load, 2 * load_2x4)
    with pytest.raises(TraceError, match="does not match the first input"):
        read_routing([a, b], top_k=2)


def test_per_token_and_aggregated_together_is_a_usage_error(tmp_path, load_2x4):
    a = tmp_path / "a.npy"
    np.save(a, load_2x4)
    t = tmp_path / "t.jsonl"
    t.write_text('{"layer": 0, "experts": [1, 2]}\n')
    with pytest.raises(UsageError, match="per-token traces and aggregated load files cannot be"):
        read_routing([t, a], top_k=2)


def test_registry_names_and_detection(tmp_path):
    names = format_names()
    assert names[:6] == ["jsonl", "npz", "load-npz", "load-npy", "load-json", "load-csv"]
    odd = tmp_path / "trace.log"  # no known extension: detected from content
    odd.write_text('{"layer": 0, "experts": [1, 2]}\n')
    assert detect_format(odd).name == "jsonl"


def test_register_a_format(tmp_path):
    """A format module registers itself and read_routing uses it (the sglang/trtllm way)."""
    path = tmp_path / "x.toy"
    path.write_text("3 1\n")

    def read(p: Path, acc) -> None:
        e, n = (int(x) for x in p.read_text().split())
        acc.declare(where=str(p), top_k=1)
        acc.add_aggregate(np.full((1, 1, e), n), where=str(p))

    register_format("toy", extensions=(".toy",), sniff=lambda p, h: h[:1].isdigit(), read=read)
    try:
        s = read_routing(path).stats
        assert s.provenance.format == "toy"
        np.testing.assert_array_equal(s.load, [[[1, 1, 1]]])
    finally:
        _FORMATS.pop("toy")
