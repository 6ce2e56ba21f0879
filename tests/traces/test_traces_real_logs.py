"""Logs as engines and loggers really write them: token ids that repeat within a request
(a second pass with the same ids, decode steps that restart token numbers, datasets that
reuse ids) and an engine's warm-up pass (thousands of identical selections from one dummy
request), read in one piece and in chunks as small as a few rows."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pair_helpers import dense, field
from typer.testing import CliRunner

from placer import constants
from placer.cli.main import app
from placer.errors import TraceError, TraceWarning
from placer.traces import read_routing, write_jsonl_trace, write_npz_trace

runner = CliRunner()


def random_ids(rng: np.random.Generator, tokens: int, layers: int, experts: int,
               k: int) -> np.ndarray:
    """``[tokens, layers, k]`` distinct expert ids per row."""
    return np.argsort(rng.random((tokens, layers, experts)), axis=2)[:, :, :k].astype(np.int64)


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_quietly(path: Path | list[Path], **kwargs: Any) -> Any:
    """``read_routing`` and the warnings it raised, as texts."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = read_routing(path, **kwargs)  # type: ignore[arg-type]
    return data, [str(w.message) for w in caught if issubclass(w.category, TraceWarning)]


def same_stats(a: Any, b: Any) -> None:
    for name in ("load", "tokens", "coact", "layer_affinity", "window_starts", "layer_ids"):
        np.testing.assert_array_equal(field(a, name), field(b, name), err_msg=name)


# -- repeated token ids ---------------------------------------------------------------------


@pytest.fixture
def one_pass() -> dict[str, Any]:
    """60 tokens of 6 requests (10 each), layers 0..2, 8 experts, top-2, steps 0..9."""
    rng = np.random.default_rng(11)
    ids = random_ids(rng, 60, 3, 8, 2)
    return {"ids": ids, "request": np.array([f"r{t % 6}" for t in range(60)]),
            "step": np.arange(60) // 6}


def test_second_pass_with_the_same_ids_is_read_twice(tmp_path: Path, one_pass) -> None:
    """The log written twice (a profiling run, then the real one, same request ids) reads
    as the two passes' tokens: twice the counts, one warning naming the first repeat."""
    single = tmp_path / "one.jsonl"
    write_jsonl_trace(single, one_pass["ids"], layer_ids=[0, 1, 2],
                      request=one_pass["request"])
    lines = single.read_text().splitlines(keepends=True)
    twice = tmp_path / "twice.jsonl"
    twice.write_text("".join(lines + lines[1:]))
    once, _ = read_quietly(single)
    data, messages = read_quietly(twice)
    s = data.stats
    for name in ("coact", "layer_affinity"):
        np.testing.assert_array_equal(field(s, name), 2 * field(once.stats, name))
    np.testing.assert_array_equal(s.load.sum(axis=0), 2 * once.stats.load.sum(axis=0))
    assert s.tokens.sum() == 120
    repeats = [m for m in messages if "repeat" in m]
    assert repeats == [
        f"180 routing rows repeat a (request, token, layer) read before (the first at"
        f" {twice}:{len(lines) + 1}): each repeat starts a new occurrence of the token"
        " (60 tokens more), as in a second pass with the same ids or token numbers that"
        " restart"
    ]


def test_second_pass_in_small_blocks(tmp_path: Path, one_pass, monkeypatch) -> None:
    """Repeats found across 300-byte blocks give the same statistics."""
    single = tmp_path / "one.jsonl"
    write_jsonl_trace(single, one_pass["ids"], layer_ids=[0, 1, 2],
                      request=one_pass["request"], step=one_pass["step"])
    lines = single.read_text().splitlines(keepends=True)
    twice = tmp_path / "twice.jsonl"
    # the second pass runs 10 steps later: its tokens are new tokens of later steps
    later = [json.dumps({**json.loads(x), "step": json.loads(x)["step"] + 10}) + "\n"
             for x in lines[1:]]
    twice.write_text("".join(lines + later))
    whole, _ = read_quietly(twice, keep_tokens=True)
    monkeypatch.setattr("placer.traces.formats.jsonl.read.BLOCK_BYTES", 300)
    small, _ = read_quietly(twice, keep_tokens=True)
    same_stats(whole.stats, small.stats)
    np.testing.assert_array_equal(whole.trace.topk_ids, small.trace.topk_ids)
    assert whole.stats.window_starts.tolist() == list(range(20))
    np.testing.assert_array_equal(whole.trace.topk_ids[:60], one_pass["ids"])
    np.testing.assert_array_equal(whole.trace.topk_ids[60:], one_pass["ids"])


def test_decode_steps_that_restart_token_numbers(tmp_path: Path) -> None:
    """Each decode step logs its token as token 0 of the request: one token a step."""
    rows = []
    for step in range(4):
        for layer in (5, 6):
            rows.append({"req_id": "a", "forward_step": step, "token_idx": 0, "layer": layer,
                         "topk_ids": [step % 3, 3]})
    data, messages = read_quietly(write_rows(tmp_path / "decode.jsonl", rows),
                                  keep_tokens=True)
    assert data.stats.tokens.tolist() == [1, 1, 1, 1]
    assert data.trace.topk_ids[:, 0, 0].tolist() == [0, 1, 2, 0]
    assert data.trace.step.tolist() == [0, 1, 2, 3]
    assert any("6 routing rows repeat" in m and "decode.jsonl:3)" in m for m in messages)


def test_layer_major_second_pass(tmp_path: Path) -> None:
    """A log listing all tokens of layer 0, then of layer 1, written twice (two datasets
    with the same request and token ids): the n-th row of (request, token, layer) is the
    n-th occurrence, so layer 1's rows join the right tokens."""
    rng = np.random.default_rng(2)
    ids = random_ids(rng, 5, 2, 6, 2)
    rows = []
    for dataset, part in (("gsm8k", ids), ("humaneval", ids[::-1])):
        for layer in (0, 1):
            for t in range(5):
                rows.append({"dataset": dataset, "problem_id": 0, "token_pos": t,
                             "layer": layer, "experts": part[t, layer].tolist()})
    data, _ = read_quietly(write_rows(tmp_path / "lm.jsonl", rows), keep_tokens=True)
    np.testing.assert_array_equal(data.trace.topk_ids, np.concatenate([ids, ids[::-1]]))
    token_major = tmp_path / "tm.npz"
    write_npz_trace(token_major, np.concatenate([ids, ids[::-1]]), layer_ids=[0, 1])
    same_stats(data.stats, read_quietly(token_major)[0].stats)


def test_a_repeat_in_some_layers_only(tmp_path: Path) -> None:
    """(r, 7) logged twice for layer 0 but once for layer 1: two tokens, the second with
    a row for layer 0 only (the n-th row of a layer is the n-th occurrence)."""
    rows = [{"request": "r", "token": 7, "layer": 0, "experts": [0, 1]},
            {"request": "r", "token": 7, "layer": 1, "experts": [2, 3]},
            {"request": "r", "token": 7, "layer": 0, "experts": [1, 2]}]
    data, messages = read_quietly(write_rows(tmp_path / "r.jsonl", rows), keep_tokens=True)
    assert data.trace.topk_ids.tolist() == [[[0, 1], [2, 3]], [[1, 2], [-1, -1]]]
    assert any("1 routing rows repeat" in m and "(1 tokens more)" in m for m in messages)


def test_one_occurrence_in_two_steps_is_still_an_error(tmp_path: Path) -> None:
    rows = [{"request": "r", "step": 0, "token": 1, "layer": 0, "experts": [0, 1]},
            {"request": "r", "step": 3, "token": 1, "layer": 1, "experts": [1, 2]}]
    path = write_rows(tmp_path / "s.jsonl", rows)
    with pytest.raises(TraceError) as info:
        read_routing(path)
    assert info.value.message == "token (request r, token 1) has rows from steps 0 and 3"
    assert info.value.where == f"{path}:2"
    assert info.value.hint == (
        "a token runs in one step: when token ids restart, the new token repeats every"
        " layer (a repeated layer starts a new token); or drop the token field to number"
        " tokens by row order")


# -- warm-up passes -------------------------------------------------------------------------


def warm_then_real(rng: np.random.Generator, warm: int, real: int) -> tuple[
        list[dict[str, Any]], np.ndarray]:
    """A warm-up pass of ``warm`` dummy tokens (request "0", tokens 0.., every layer
    selecting [1, 5]) then ``real`` tokens of requests "0".."3" (token ids restart per
    request, so the real pass reuses the dummy request's ids); layers 3, 4; 8 experts."""
    rows = [{"request": "0", "step": 0, "token": t, "layer": layer, "experts": [1, 5]}
            for t in range(warm) for layer in (3, 4)]
    ids = random_ids(rng, real, 2, 8, 2)
    for t in range(real):
        for c, layer in enumerate((3, 4)):
            rows.append({"request": str(t % 4), "step": 1 + t // 8, "token": t // 4,
                         "layer": layer, "experts": ids[t, c].tolist()})
    return rows, ids


def test_warm_up_pass_is_left_out(tmp_path: Path) -> None:
    """3,000 identical dummy tokens, then 40 real ones: the statistics are the real
    tokens' (no repeat of the dummy request's ids either), with one warning."""
    rows, ids = warm_then_real(np.random.default_rng(4), 3000, 40)
    path = write_rows(tmp_path / "warm.jsonl", rows)
    data, messages = read_quietly(path, keep_tokens=True)
    real_only = write_rows(tmp_path / "real.jsonl", rows[6000:])
    same_stats(data.stats, read_quietly(real_only)[0].stats)
    np.testing.assert_array_equal(data.trace.topk_ids, ids)
    assert messages == [
        "left out 6000 routing rows of a profiling or warm-up pass: runs of 64 or more"
        " identical consecutive selections in one layer (the longest: 3000 rows for layer"
        f" 3, ending at {path}:5999); pass `keep_warmup` to count them"
    ]
    assert dict(data.stats.provenance.rows_skipped) == {"warm-up pass": 6000}


def test_keep_warmup_counts_it(tmp_path: Path) -> None:
    rows, _ = warm_then_real(np.random.default_rng(4), 3000, 40)
    path = write_rows(tmp_path / "warm.jsonl", rows)
    data, messages = read_quietly(path, keep_warmup=True)
    assert data.stats.tokens.sum() == 3040
    assert data.stats.load[0, 0, 1] == 3000
    assert messages[0] == (f"3000 identical consecutive routing rows for layer 3 (ending at"
                           f" {path}:5999): this looks like a profiling or warm-up pass")
    assert any("repeat a (request, token, layer)" in m for m in messages)


@pytest.mark.parametrize("block", [90, 300, 4096])
def test_warm_up_found_across_small_blocks(tmp_path: Path, monkeypatch, block: int) -> None:
    """Blocks of a few rows: runs grow over many blocks, rows held back in between."""
    rows, _ = warm_then_real(np.random.default_rng(5), 150, 60)
    rows = [*rows[:20], {"type": "meta"}, *rows[20:]]  # a skipped line inside the run
    path = write_rows(tmp_path / "warm.jsonl", rows + rows[:10])  # and a short tail run
    whole, messages = read_quietly(path, keep_tokens=True)
    monkeypatch.setattr("placer.traces.formats.jsonl.read.BLOCK_BYTES", block)
    small, small_messages = read_quietly(path, keep_tokens=True)
    same_stats(whole.stats, small.stats)
    np.testing.assert_array_equal(whole.trace.topk_ids, small.trace.topk_ids)
    assert messages == small_messages
    assert whole.stats.provenance.rows_skipped == small.stats.provenance.rows_skipped
    assert dict(whole.stats.provenance.rows_skipped)["warm-up pass"] == 300
    assert whole.stats.tokens.sum() == 60 + 5  # the tail's 5 tokens are too few to drop


def test_runs_break_where_the_request_changes(tmp_path: Path) -> None:
    """100 identical rows from 100 requests (one token each) are not one dummy request."""
    rows = [{"request": f"q{t}", "layer": 0, "experts": [0, 1]} for t in range(100)]
    rows += [{"request": "x", "layer": 0, "experts": [2, 3]}]
    data, messages = read_quietly(write_rows(tmp_path / "many.jsonl", rows))
    assert data.stats.tokens.sum() == 101 and messages == []


def test_npz_warm_up_tokens_are_left_out_in_any_chunking(tmp_path: Path, monkeypatch) -> None:
    """1,000 identical tokens (every layer) then 300 random ones, with steps: equal to
    the random part alone, whatever the chunk size; keep_warmup counts them."""
    rng = np.random.default_rng(6)
    real = random_ids(rng, 300, 3, 16, 4)
    ids = np.concatenate([np.tile([[[3, 1, 4, 7]]], (1000, 3, 1)), real])
    steps = np.concatenate([np.zeros(1000, np.int64), 1 + np.arange(300) // 10])
    path, real_path = tmp_path / "w.npz", tmp_path / "r.npz"
    write_npz_trace(path, ids, layer_ids=[1, 2, 3], step=steps)
    write_npz_trace(real_path, real, layer_ids=[1, 2, 3], step=steps[1000:])
    want, _ = read_quietly(real_path)
    for chunk_rows in (7, 64 * 3, 1 << 19):
        monkeypatch.setattr(constants, "CHUNK_ROWS", chunk_rows)
        got, messages = read_quietly(path, keep_tokens=True)
        same_stats(got.stats, want.stats)
        np.testing.assert_array_equal(got.trace.topk_ids, real)
        assert [m for m in messages if "warm-up" in m] == [
            "left out 3000 routing rows of a profiling or warm-up pass: runs of 64 or more"
            " identical consecutive selections in one layer (the longest: 1000 rows for"
            f" layer 1, ending at {path}: topk_ids[999, 0]); pass `keep_warmup`"
            " to count them"]
    kept, _ = read_quietly(path, keep_warmup=True)
    assert kept.stats.tokens.sum() == 1300


def not_warm_up(ids: np.ndarray) -> np.ndarray:
    """``[tokens, layers]`` rows outside runs of WARMUP_RUN_ROWS or more identical
    consecutive rows of one layer, by a plain loop."""
    kept = np.ones(ids.shape[:2], dtype=bool)
    for c in range(ids.shape[1]):
        start = 0
        for i in range(1, ids.shape[0] + 1):
            if i == ids.shape[0] or (ids[i, c] != ids[i - 1, c]).any():
                if i - start >= constants.WARMUP_RUN_ROWS:
                    kept[start:i, c] = False
                start = i
    return kept


def test_npz_and_jsonl_agree_on_warm_up_runs(tmp_path: Path, monkeypatch) -> None:
    """Runs in some layers only, of lengths around the threshold, at chunk edges: the
    NPZ and JSONL readers leave out the same rows (per layer) in any chunking."""
    rng = np.random.default_rng(8)
    ids = random_ids(rng, 400, 3, 6, 2)
    ids[10:90, 0] = [2, 4]  # 80 rows: a warm-up run in layer 0 only
    ids[100:163, 1] = [0, 1]  # 63 rows: one short of the threshold
    ids[99, 1], ids[163, 1] = [4, 5], [5, 4]
    ids[200:264, 2] = [5, 3]  # exactly 64
    ids[336:, 1] = [1, 0]  # 64 at the very end
    kept = not_warm_up(ids)  # random neighbours may lengthen a run: count by the rule
    assert (~kept).sum() >= 80 + 64 + 64 and kept[100:163, 1].all()
    steps = np.arange(400) // 7
    npz, jsonl = tmp_path / "t.npz", tmp_path / "t.jsonl"
    write_npz_trace(npz, ids, layer_ids=[0, 1, 2], step=steps)
    write_jsonl_trace(jsonl, ids, layer_ids=[0, 1, 2], step=steps)
    ref, _ = read_quietly(npz)
    assert dict(ref.stats.provenance.rows_skipped)["warm-up pass"] == (~kept).sum()
    want = np.zeros((3, 6), dtype=np.int64)
    for c in range(3):
        np.add.at(want[c], ids[kept[:, c], c].ravel(), 1)
    np.testing.assert_array_equal(ref.stats.load.sum(axis=0), want)
    for chunk_rows, block in ((5, 120), (64, 700), (1 << 19, 1 << 22)):
        monkeypatch.setattr(constants, "CHUNK_ROWS", chunk_rows)
        monkeypatch.setattr("placer.traces.formats.jsonl.read.BLOCK_BYTES", block)
        for path in (npz, jsonl):
            same_stats(read_quietly(path)[0].stats, ref.stats)


def test_a_trace_of_nothing_but_identical_rows_is_kept(tmp_path: Path) -> None:
    """Every row alike (a degenerate or synthetic trace): no data would be left, so the
    rows are counted, and a warning says why."""
    path = tmp_path / "same.npz"
    write_npz_trace(path, np.tile([[[0, 1]]], (500, 2, 1)), layer_ids=[0, 1])
    data, messages = read_quietly(path)
    assert data.stats.tokens.sum() == 500
    assert any("they were counted since the trace has nothing else" in m for m in messages)


# -- the command line -----------------------------------------------------------------------


def test_stats_leaves_out_the_warm_up_and_keep_warmup_keeps_it(tmp_path: Path) -> None:
    rows, _ = warm_then_real(np.random.default_rng(4), 3000, 40)
    path = write_rows(tmp_path / "warm.jsonl", rows)
    result = runner.invoke(app, ["stats", str(path), "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["totals"]["tokens"] == 40
    assert "warning: left out 6000 routing rows of a profiling or warm-up pass" in result.stderr
    result = runner.invoke(app, ["stats", str(path), "--json", "--keep-warmup"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["totals"]["tokens"] == 3040
    assert "warning: 3000 identical consecutive routing rows for layer 3" in result.stderr


def brute_without_warm_up(ids: np.ndarray, steps: np.ndarray, experts: int) -> dict[str, Any]:
    """Load per step, tokens per step, co-activation and adjacent-layer affinity of the
    rows outside warm-up runs (:func:`not_warm_up`), by plain loops; a token all of whose
    rows are left out is no token."""
    kept = not_warm_up(ids)
    nl = ids.shape[1]
    real = np.flatnonzero(kept.any(axis=1))
    base = int(steps[real].min())
    count = int(steps[real].max()) - base + 1
    load = np.zeros((count, nl, experts), dtype=np.int64)
    tokens = np.zeros(count, dtype=np.int64)
    coact = np.zeros((nl, experts, experts), dtype=np.int64)
    aff = np.zeros((nl - 1, experts, experts), dtype=np.int64)
    for t in real.tolist():
        w = int(steps[t]) - base
        tokens[w] += 1
        for c in range(nl):
            if not kept[t, c]:
                continue
            sel = ids[t, c].tolist()
            for e in sel:
                load[w, c, e] += 1
            for a in sel:
                for b in sel:
                    coact[c, a, b] += a != b
            if c + 1 < nl and kept[t, c + 1]:
                for a in sel:
                    for b in ids[t, c + 1].tolist():
                        aff[c, a, b] += 1
    return {"load": load, "tokens": tokens, "coact": coact, "aff": aff,
            "starts": base + np.arange(count)}


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1), runs=st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 260), st.integers(40, 140)), max_size=4),
    chunk_rows=st.sampled_from([3, 50, 1 << 19]), block=st.sampled_from([150, 2000, 1 << 22]))
def test_warm_up_exclusion_equals_brute_force(tmp_path_factory, monkeypatch, seed, runs,
                                              chunk_rows, block):
    """Random routing with runs of identical rows pasted into some layers (below, at
    and above the threshold): NPZ and JSONL, in any chunking, count exactly the rows a
    plain loop keeps."""
    rng = np.random.default_rng(seed)
    experts = 6
    ids = random_ids(rng, 300, 3, experts, 2)
    for layer, start, length in runs:
        ids[start : start + length, layer] = rng.permutation(experts)[:2]
    steps = np.arange(300) // 16
    if not not_warm_up(ids).any():
        return
    ref = brute_without_warm_up(ids, steps, experts)
    folder = tmp_path_factory.mktemp("w")
    write_npz_trace(folder / "t.npz", ids, layer_ids=[0, 1, 2], step=steps,
                    meta={"num_experts": experts})
    write_jsonl_trace(folder / "t.jsonl", ids, layer_ids=[0, 1, 2], step=steps,
                      meta={"num_experts": experts})
    with monkeypatch.context() as m:
        m.setattr(constants, "CHUNK_ROWS", chunk_rows)
        m.setattr("placer.traces.formats.jsonl.read.BLOCK_BYTES", block)
        for name in ("t.npz", "t.jsonl"):
            s = read_quietly(folder / name)[0].stats
            np.testing.assert_array_equal(s.load, ref["load"], err_msg=name)
            np.testing.assert_array_equal(s.tokens, ref["tokens"], err_msg=name)
            np.testing.assert_array_equal(dense(s.coact), ref["coact"], err_msg=name)
            np.testing.assert_array_equal(dense(s.layer_affinity), ref["aff"], err_msg=name)
            np.testing.assert_array_equal(s.window_starts, ref["starts"], err_msg=name)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 400),
       ids=st.integers(1, 6), block=st.sampled_from([60, 400, 1 << 22]))
def test_occurrences_equal_a_plain_model(tmp_path_factory, monkeypatch, seed, rows, ids,
                                         block):
    """Rows of few (request, token) ids in random order, layers repeating many times:
    the n-th row of (request, token, layer) is the n-th occurrence of the token, and
    tokens come in order of their first row."""
    rng = np.random.default_rng(seed)
    req = rng.integers(0, 2, rows)
    tok = rng.integers(0, ids, rows)
    layer = rng.integers(0, 3, rows)
    experts = np.argsort(rng.random((rows, 5)), axis=1)[:, :2]
    count: dict[tuple[int, int, int], int] = {}
    order: dict[tuple[int, int, int], int] = {}  # (request, token, occurrence) -> token
    want: dict[int, dict[int, list[int]]] = {}
    for i in range(rows):
        key = (int(req[i]), int(tok[i]), int(layer[i]))
        occ = count.get(key, 0)
        count[key] = occ + 1
        t = order.setdefault((key[0], key[1], occ), len(order))
        want.setdefault(t, {})[key[2]] = experts[i].tolist()
    path = tmp_path_factory.mktemp("o") / "o.jsonl"
    write_rows(path, [{"request": f"q{req[i]}", "token": int(tok[i]), "layer": int(layer[i]),
                       "experts": experts[i].tolist()} for i in range(rows)])
    with monkeypatch.context() as m:
        m.setattr("placer.traces.formats.jsonl.read.BLOCK_BYTES", block)
        data, messages = read_quietly(path, keep_tokens=True, keep_warmup=True)
    trace = data.trace
    layers = trace.layer_ids.tolist()
    assert trace.topk_ids.shape[0] == len(order)
    for t, by_layer in want.items():
        for c, lay in enumerate(layers):
            assert trace.topk_ids[t, c].tolist() == by_layer.get(lay, [-1, -1])
    repeats = rows - len(count)
    assert any(f"{repeats} routing rows repeat" in m for m in messages) == (repeats > 0)
