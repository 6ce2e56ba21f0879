"""placer.traces writers are deterministic: the same trace gives the same bytes, whatever
the clock, the folder or the file's name (no timestamps, no temporary names)."""

from __future__ import annotations

import gzip
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from placer.traces import write_jsonl_trace, write_npz_trace


@pytest.fixture
def trace() -> dict[str, np.ndarray]:
    """40 tokens x 3 layers, top-2 of 8 experts, with weights, steps and ranks."""
    rng = np.random.default_rng(5)
    ids = np.argsort(rng.random((40, 3, 8)), axis=2)[:, :, :2]
    return {"topk_ids": ids, "topk_weights": rng.random(ids.shape).astype(np.float32),
            "step": np.arange(40) // 4, "rank": np.arange(40) % 2}


def write(path: Path, trace: dict[str, np.ndarray]) -> bytes:
    kwargs = dict(layer_ids=[3, 4, 5], step=trace["step"], rank=trace["rank"],
                  topk_weights=trace["topk_weights"], meta={"model": "m", "num_experts": 8})
    if path.suffix == ".npz":
        write_npz_trace(path, trace["topk_ids"], **kwargs)  # type: ignore[arg-type]
    else:
        write_jsonl_trace(path, trace["topk_ids"], **kwargs)  # type: ignore[arg-type]
    return path.read_bytes()


@pytest.mark.parametrize("name", ["t.npz", "t.jsonl", "t.jsonl.gz"])
def test_same_trace_same_bytes(tmp_path, monkeypatch, trace, name):
    """Written twice, the second time a day later (as the clock says), in another folder
    and under another name: identical bytes."""
    first = write(tmp_path / name, trace)
    real_time, real_localtime = time.time, time.localtime
    monkeypatch.setattr(time, "time", lambda: real_time() + 86_400.5)
    monkeypatch.setattr(time, "localtime",
                        lambda secs=None: real_localtime(time.time() if secs is None else secs))
    (tmp_path / "later").mkdir()
    second = write(tmp_path / "later" / name.replace("t.", "other."), trace)
    assert first == second


def test_gzip_header_has_no_name_and_no_time(tmp_path, trace):
    data = write(tmp_path / "t.jsonl.gz", trace)
    flags, mtime = data[3], int.from_bytes(data[4:8], "little")
    assert (flags & 0x08, mtime) == (0, 0)  # FNAME unset, MTIME 0
    assert gzip.decompress(data).startswith(b'{"format": "placer-trace"')


def test_npz_members_have_a_fixed_date(tmp_path, trace):
    path = tmp_path / "t.npz"
    write(path, trace)
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
    assert {i.compress_type for i in infos} == {zipfile.ZIP_DEFLATED}
