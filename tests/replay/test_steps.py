"""The steps of a replay: chunks of whole steps, read the same way from a stored NPZ
member (plain file reads), a compressed one (the zip stream) and a trace in memory, and
the step loads counted from them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from placer.errors import TraceError
from placer.replay import steps as steps_mod
from placer.replay.steps import open_steps, step_loads

E, K = 12, 3


def _ids(tokens: int, layers: int, seed: int = 0, missing: float = 0.05) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ids = rng.random((tokens, layers, E)).argsort(axis=2)[:, :, :K].astype(np.int16)
    ids[rng.random((tokens, layers, K)) < missing] = -1  # some selections missing
    return ids


def _write(path: Path, ids: np.ndarray, *, compressed: bool = False,
           layer_ids: list[int] | None = None) -> Path:
    save = np.savez_compressed if compressed else np.savez
    save(path, topk_ids=ids, layer_ids=np.asarray(layer_ids or range(ids.shape[1])),
         num_experts=np.int64(E), top_k=np.int64(K))
    return path


def _expected_loads(ids: np.ndarray, step_tokens: int) -> np.ndarray:
    steps = -(-ids.shape[0] // step_tokens)
    out = np.zeros((steps, ids.shape[1], E), dtype=np.int32)
    for t in range(ids.shape[0]):
        for layer in range(ids.shape[1]):
            for e in ids[t, layer]:
                if e >= 0:
                    out[t // step_tokens, layer, e] += 1
    return out


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(steps_mod, "CHUNK_TOKENS", 50)  # many chunks, uneven ends


@pytest.mark.parametrize("compressed", [False, True])
def test_step_loads_count_every_selection(tmp_path: Path, compressed: bool,
                                          small_chunks: None) -> None:
    ids = _ids(333, 3)
    source = open_steps(_write(tmp_path / "t.npz", ids, compressed=compressed),
                        num_gpus=2, batch_tokens=16)
    assert source.num_steps == 21
    assert (step_loads(source, E) == _expected_loads(ids, 16)).all()
    some = step_loads(source, E, [2, 0])
    assert (some[:, [0, 2]] == _expected_loads(ids, 16)[:, [0, 2]]).all()
    assert not some[:, 1].any()  # columns not asked stay 0


@pytest.mark.parametrize("compressed", [False, True])
def test_chunks_are_whole_steps_with_the_columns_asked(tmp_path: Path, compressed: bool,
                                                       small_chunks: None) -> None:
    # columns given out of order in the file: the source sorts them by layer id
    ids = _ids(200, 4, seed=1)
    path = _write(tmp_path / "t.npz", ids, compressed=compressed, layer_ids=[7, 3, 9, 5])
    source = open_steps(path, num_gpus=2, batch_tokens=8)
    assert source.layer_ids.tolist() == [3, 5, 7, 9]
    in_order = ids[:, [1, 3, 0, 2]]
    got = [(c.lo, c.hi, c.first_step, c.num_steps, c.topk_ids.copy())
           for c in source.chunks(columns=[3, 1])]
    assert got[0][0] == 0 and got[-1][1] == 200
    for (lo, hi, first, num, part), nxt in zip(got, [*got[1:], None], strict=True):
        assert lo == first * 8 and num >= 1 and hi == min(200, (first + num) * 8)
        assert (part == in_order[lo:hi][:, [3, 1]]).all()
        if nxt is not None:
            assert nxt[0] == hi


def test_in_memory_source_gives_the_same_loads(tmp_path: Path, small_chunks: None) -> None:
    ids = _ids(120, 2, seed=2, missing=0)
    npz = open_steps(_write(tmp_path / "t.npz", ids), num_gpus=2, batch_tokens=10)
    lines = tmp_path / "t.jsonl"
    lines.write_text("".join(
        json.dumps({"token": t, "layer": layer, "experts": ids[t, layer].tolist()}) + "\n"
        for t in range(ids.shape[0]) for layer in range(ids.shape[1])))
    memory = open_steps(lines, num_gpus=2, batch_tokens=10, num_experts=E)
    assert memory.npz is None and memory.trace is not None
    assert (step_loads(npz, E) == step_loads(memory, E)).all()
    assert (step_loads(memory, E) == _expected_loads(ids, 10)).all()


def test_a_flipped_byte_fails_the_crc(tmp_path: Path) -> None:
    # large enough that the zip reader does not reach the member's end opening it
    path = _write(tmp_path / "t.npz", _ids(20_000, 2, seed=3))
    data = bytearray(path.read_bytes())
    magic = data.index(b"\x93NUMPY")
    start = magic + 10 + int.from_bytes(data[magic + 8 : magic + 10], "little")
    i = start + 2 * 400  # the low byte of an int16 id
    data[i] = (data[i] + 1) % E  # still a valid expert id: only the CRC can tell
    path.write_bytes(bytes(data))
    source = open_steps(path, num_gpus=2, batch_tokens=10)
    with pytest.raises(TraceError, match="CRC"):
        step_loads(source, E)


def test_an_out_of_range_id_is_named(tmp_path: Path) -> None:
    ids = _ids(60, 2, seed=4)
    ids[37, 1, 2] = E + 3
    source = open_steps(_write(tmp_path / "t.npz", ids), num_gpus=2, batch_tokens=10)
    with pytest.raises(TraceError, match=r"token 37, layer 1: expert id 15"):
        step_loads(source, E)
