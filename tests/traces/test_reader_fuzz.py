"""Readers against random and damaged files: a PlacerError or a sound result, nothing else.

Random bytes, and valid files with bytes flipped, inserted, cut or repeated, go through
the JSONL, NPZ, load (JSON, CSV, NPY) and SGLang ``.pt`` readers and the YAML parser.  Any
exception that is not a :class:`~placer.errors.PlacerError` (an ``IndexError`` deep in
numpy, a ``UnicodeDecodeError``, a ``RecursionError``) is a bug: the CLI would show it as
an internal error.  A damaged file that still reads must yield what a trace is (expert ids
in range, each layer's load equal to the trace's selections of that layer:
:func:`check_routing`).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placer.errors import PlacerError, TopologyError
from placer.io.ptfile import load_pt, save_pt
from placer.io.yaml_schema import parse_yaml
from placer.stats.routing import RoutingData
from placer.traces import read_routing, write_jsonl_trace, write_npz_trace

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def reads_cleanly(call: Callable[[], Any]) -> Any:
    """``call()``'s result, or None when it raised a PlacerError; warnings are fine."""
    with warnings.catch_warnings(), contextlib.suppress(PlacerError):
        warnings.simplefilter("ignore")
        return call()
    return None


def check_routing(data: RoutingData) -> None:
    """What a damaged file that still reads must yield: counts that are counts, expert
    ids in range, and statistics that are the trace's own (each layer's load the
    trace's selections of that layer)."""
    stats = data.stats
    load = stats.load
    assert load.ndim == 3 and np.issubdtype(load.dtype, np.integer)
    assert (load >= 0).all() and (stats.tokens >= 0).all()
    assert stats.top_k >= 1 and stats.layer_ids.shape == (load.shape[1],)
    trace = data.trace
    if trace is None:
        return
    ids = trace.topk_ids
    assert ids.shape[1:] == (load.shape[1], stats.top_k)
    assert ((ids >= -1) & (ids < load.shape[2])).all()
    assert np.array_equal(trace.layer_ids, stats.layer_ids)
    per_layer = (ids >= 0).sum(axis=(0, 2))
    assert np.array_equal(load.sum(axis=(0, 2)), per_layer), (load.sum(axis=(0, 2)), per_layer)
    assert int(stats.tokens.sum()) <= trace.num_tokens


def read_bytes(data: bytes, name: str, fmt: str | None) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes(data)
        result = reads_cleanly(lambda: read_routing(path, fmt, keep_tokens=True))
    if result is not None:
        check_routing(result)


def _valid_jsonl() -> bytes:
    """A small trace with a header, steps, requests and weights (3 layers, top-2 of 6)."""
    rng = np.random.default_rng(0)
    ids = np.stack([rng.permutation(6)[:2] for _ in range(24 * 3)]).reshape(24, 3, 2)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.jsonl"
        write_jsonl_trace(path, ids, layer_ids=[1, 2, 3], step=np.arange(24) // 4,
                          topk_weights=np.full(ids.shape, 0.5),
                          request=np.array(["a", "b"] * 12),
                          meta={"num_experts": 6, "model": "m"})
        return path.read_bytes()


def _valid_npz() -> bytes:
    rng = np.random.default_rng(1)
    ids = np.stack([rng.permutation(6)[:2] for _ in range(16 * 2)]).reshape(16, 2, 2)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.npz"
        write_npz_trace(path, ids, layer_ids=[0, 5], step=np.arange(16) // 2,
                        meta={"num_experts": 6}, compress=False)
        return path.read_bytes()


def _valid_pt() -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "d.pt"
        save_pt({"rank": 0, "logical_count": np.arange(24, dtype=np.int32).reshape(2, 3, 4)},
                path)
        return path.read_bytes()


VALID_JSONL = _valid_jsonl()
VALID_NPZ = _valid_npz()
VALID_PT = _valid_pt()
VALID_CSV = b"window,layer,expert,load\n0,0,0,5\n0,0,1,3\n1,0,0,2\n1,0,1,7\n"
VALID_JSON = json.dumps({"load": [[[5, 3], [1, 1]], [[2, 7], [0, 4]]], "top_k": 1,
                         "layer_ids": [3, 4]}).encode()
VALID_YAML = b"""name: t
gpu_types:
  h100: {memory_gb: 80, hbm_gbps: 3350, bf16_tflops: 989, fp8_tflops: 1979}
nodes:
  - {name: node0, gpus: 8, gpu_type: h100, fabric: {kind: nvswitch, gbps: 450}}
"""


@st.composite
def mutated(draw: st.DrawFn, valid: bytes) -> bytes:
    """``valid`` with a few bytes flipped, inserted, deleted, or a piece cut or repeated."""
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "insert", "delete", "cut", "repeat", "digits"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 16))]
        elif kind == "cut":
            del data[at:]
        elif kind == "repeat":
            data[at:at] = data[at : at + draw(st.integers(1, 64))] * draw(st.integers(2, 50))
        else:  # a long run of digits: numbers past int64
            data[at:at] = b"9" * draw(st.integers(15, 40))
    return bytes(data)


@FUZZ
@given(st.binary(max_size=2000))
def test_jsonl_random_bytes(data):
    read_bytes(data, "t.jsonl", "jsonl")


@FUZZ
@given(mutated(VALID_JSONL))
def test_jsonl_mutated(data):
    read_bytes(data, "t.jsonl", None)


@FUZZ
@given(mutated(gzip.compress(VALID_JSONL, mtime=0)))
def test_jsonl_gzip_mutated(data):
    read_bytes(data, "t.jsonl.gz", "jsonl")


@FUZZ
@given(st.lists(st.one_of(
    st.fixed_dictionaries({"layer": st.integers(-5, 2**70), "experts": st.lists(
        st.integers(-3, 2**65), max_size=5)}),
    st.dictionaries(st.sampled_from(["layer", "experts", "token", "step", "rank", "request",
                                     "weights", "format", "num_experts", "top_k", "type"]),
                    st.recursive(st.none() | st.booleans() | st.integers() | st.floats()
                                 | st.text(max_size=5),
                                 lambda c: st.lists(c, max_size=3), max_leaves=6)),
), min_size=1, max_size=12))
def test_jsonl_random_objects(rows):
    """Lines that are JSON objects with the trace's field names and any values."""
    read_bytes("".join(json.dumps(r) + "\n" for r in rows).encode(), "t.jsonl", "jsonl")


@FUZZ
@given(st.binary(max_size=2000))
def test_npz_random_bytes(data):
    read_bytes(b"PK\x03\x04" + data, "t.npz", "npz")


@FUZZ
@given(mutated(VALID_NPZ))
def test_npz_mutated(data):
    read_bytes(data, "t.npz", "npz")


@FUZZ
@given(st.tuples(st.integers(-2, 5), st.integers(-2, 5), st.integers(-2, 300)),
       st.sampled_from(["<i2", "<i4", "<i8", "<u8", "<f4", "|b1", "<U3"]),
       st.binary(max_size=200))
def test_npz_any_header(shape, descr, body):
    """A topk_ids member whose header says anything, over any bytes."""
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}".encode()
    header += b" " * (64 - (11 + len(header)) % 64) + b"\n"
    member = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + body
    buf = io.BytesIO()
    import zipfile

    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("topk_ids.npy", member)
    read_bytes(buf.getvalue(), "t.npz", "npz")


@FUZZ
@given(mutated(VALID_CSV))
def test_load_csv_mutated(data):
    read_bytes(data, "l.csv", "load-csv")


@FUZZ
@given(mutated(VALID_JSON))
def test_load_json_mutated(data):
    read_bytes(data, "l.json", "load-json")


@FUZZ
@given(mutated(VALID_PT))
def test_sglang_pt_mutated(data):
    read_bytes(data, "d.pt", "sglang")


@FUZZ
@given(mutated(VALID_PT))
def test_load_pt_mutated(data):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "d.pt"
        path.write_bytes(data)
        reads_cleanly(lambda: load_pt(path))


@FUZZ
@given(mutated(VALID_YAML))
def test_yaml_mutated(data):
    reads_cleanly(lambda: parse_yaml(data.decode("utf-8", "replace"), "t.yaml", TopologyError))


@FUZZ
@given(st.text(alphabet="[]{}&*ab:, -\n!?<>|'\"0123456789", max_size=300))
def test_yaml_random_text(text):
    """Anchors, aliases, merge keys, tags and brackets in any order."""
    reads_cleanly(lambda: parse_yaml(text, "t.yaml", TopologyError))


@pytest.mark.parametrize("valid", [VALID_JSONL, VALID_NPZ, VALID_CSV, VALID_JSON, VALID_PT],
                         ids=["jsonl", "npz", "csv", "json", "pt"])
def test_the_seeds_are_valid(valid, tmp_path):
    """The files the fuzzers mutate read cleanly, so mutations start from real inputs."""
    suffix = {VALID_JSONL: "t.jsonl", VALID_NPZ: "t.npz", VALID_CSV: "l.csv",
              VALID_JSON: "l.json", VALID_PT: "d.pt"}[valid]
    path = tmp_path / suffix
    path.write_bytes(valid)
    fmt = "sglang" if suffix == "d.pt" else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = read_routing(path, fmt, top_k=1 if suffix in ("l.csv", "d.pt") else None)
    assert data.stats.load.sum() > 0
    check_routing(data)
