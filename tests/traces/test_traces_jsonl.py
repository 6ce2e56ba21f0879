"""placer.traces JSONL: canonical rows, aliases, real-log shapes, skipped rows, gzip, the
fast path against json.loads, warnings, and every bad input with its message."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pair_helpers import dense, field

from placer.errors import TraceError, TraceWarning, UsageError
from placer.traces import read_routing, write_jsonl_trace
from placer.traces.formats.jsonl import ALIASES
from placer.traces.formats.jsonl.scan import Template, scan_block


def write_lines(path: Path, rows: list[object]) -> Path:
    """One JSON value per line (strings are written as they are)."""
    text = "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n"
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


@pytest.fixture
def canonical(tmp_path: Path) -> Path:
    """The JSONL format (docs/traces.md) in small: a header, 2 requests x 2 tokens x
    layers 5 and 6, top-2 of 4."""
    rows: list[object] = [{"format": "placer-trace", "version": 1, "model": "tiny",
                           "num_layers": 2, "num_experts": 4, "top_k": 2, "synthetic": False}]
    experts = {("r1", 0): ([0, 1], [2, 3]), ("r1", 1): ([0, 2], [1, 3]),
               ("r2", 0): ([3, 1], [0, 1]), ("r2", 1): ([2, 1], [3, 2])}
    for (req, tok), (a, b) in experts.items():
        for layer, ex in ((5, a), (6, b)):
            rows.append({"request": req, "step": tok, "token": tok, "layer": layer,
                         "experts": ex, "weights": [0.7, 0.3], "rank": 1})
    return write_lines(tmp_path / "t.jsonl", rows)


def test_canonical_rows(canonical):
    data = read_routing(canonical, keep_tokens=True)
    s = data.stats
    np.testing.assert_array_equal(s.layer_ids, [5, 6])
    assert (s.top_k, s.num_experts, s.total_tokens) == (2, 4, 4)
    np.testing.assert_array_equal(s.mean_load, [[2, 3, 2, 1], [1, 2, 2, 3]])
    np.testing.assert_array_equal(s.tokens, [2, 2])  # steps 0 and 1
    coact, aff = s.coact.to_dense(), s.layer_affinity.to_dense()
    assert coact[0, 0, 1] == 1 and coact[0, 1, 0] == 1 and coact[0, 1, 2] == 1
    # affinity: token (r1, 0) picked {0, 1} at layer 5 and {2, 3} at layer 6
    assert aff[0, 0, 2] == 1 and aff[0, 1, 3] == 2  # + (r2, 1)
    assert aff.sum() == 4 * 2 * 2
    assert s.provenance.model == "tiny" and s.provenance.rows_read == 8
    t = data.trace
    assert t is not None and t.topk_ids.shape == (4, 2, 2)
    np.testing.assert_array_equal(t.topk_ids[0], [[0, 1], [2, 3]])
    np.testing.assert_array_equal(t.step, [0, 1, 0, 1])
    np.testing.assert_array_equal(t.rank, [1, 1, 1, 1])
    np.testing.assert_allclose(t.topk_weights[0, 0], [0.7, 0.3])


ALIAS_CASES = [
    ("experts", "topk_ids"),
    ("weights", "topk_weights"),
    ("weights", "gating_probs"),
    ("token", "token_idx"),
    ("token", "token_pos"),
    ("request", "req_id"),
    ("request", "problem_id"),
    ("step", "forward_step"),
    ("step", "iteration"),
    ("rank", "source_rank"),
    ("rank", "dp_rank"),
]


@pytest.mark.parametrize(("canonical_name", "alias"), ALIAS_CASES)
def test_aliases_read_like_canonical_names(canonical, tmp_path, canonical_name, alias):
    rows = [json.loads(x) for x in canonical.read_text().splitlines()]
    renamed = [{(alias if k == canonical_name else k): v for k, v in r.items()} for r in rows]
    other = write_lines(tmp_path / "alias.jsonl", renamed)
    a = read_routing(canonical, keep_tokens=True)
    b = read_routing(other, keep_tokens=True)
    np.testing.assert_array_equal(a.stats.load, b.stats.load)
    np.testing.assert_array_equal(dense(a.stats.layer_affinity), dense(b.stats.layer_affinity))
    np.testing.assert_array_equal(a.trace.topk_ids, b.trace.topk_ids)
    np.testing.assert_array_equal(a.trace.rank, b.trace.rank)
    np.testing.assert_array_equal(a.trace.topk_weights, b.trace.topk_weights)


@pytest.fixture
def mixtral_like(tmp_path: Path) -> Path:
    """Shaped like the real Mixtral-8x7B vLLM logs: per problem, all tokens of layer 0,
    then layer 1 (layer-major), keys dataset, problem_id, layer, experts, gating_probs,
    token_idx; problem 0 has 3 tokens, problem 1 has 2; token 1 of problem 0 has no row
    at layer 1 (the logger dropped rows with weights [0.5, 0.5])."""
    rows = []
    for pid, ntok in ((0, 3), (1, 2)):
        for layer in (0, 1):
            for tok in range(ntok):
                if (pid, tok, layer) == (0, 1, 1):
                    continue
                ex = [(tok + layer + pid) % 8, (tok + 2 * layer + pid + 3) % 8]
                rows.append({"dataset": "gsm8k", "problem_id": pid, "layer": layer,
                             "experts": ex, "gating_probs": [0.8003801107406616,
                                                             0.19961987435817719],
                             "token_idx": tok})
    return write_lines(tmp_path / "gsm8k_2_routing.jsonl", rows)


def test_mixtral_shaped_log_groups_tokens_across_layers(mixtral_like):
    data = read_routing(mixtral_like, keep_tokens=True)
    s = data.stats
    assert s.total_tokens == 5 and s.top_k == 2 and s.num_experts == 8
    assert s.provenance.rows_read == 9 and s.provenance.rows_skipped == ()
    # affinity pairs only for the 4 tokens with rows in both layers: 4 x 2 x 2
    assert s.layer_affinity.counts.sum() == 16
    t = data.trace
    np.testing.assert_array_equal(t.topk_ids[1, 1], [-1, -1])
    np.testing.assert_array_equal(t.topk_ids[3, 0], [1, 4])  # problem 1, token 0


def test_rows_without_token_ids_are_numbered_per_layer(tmp_path):
    """Layer-major and token-major orders give the same tokens: the n-th row of a layer
    is token n."""
    tok_major = [{"layer": layer, "experts": [t, t + 1]} for t in range(3) for layer in (0, 1)]
    layer_major = [{"layer": layer, "experts": [t, t + 1]} for layer in (0, 1) for t in range(3)]
    a = read_routing(write_lines(tmp_path / "a.jsonl", tok_major), keep_tokens=True)
    b = read_routing(write_lines(tmp_path / "b.jsonl", layer_major), keep_tokens=True)
    np.testing.assert_array_equal(a.trace.topk_ids, b.trace.topk_ids)
    assert a.stats.total_tokens == 3
    np.testing.assert_array_equal(dense(a.stats.layer_affinity), dense(b.stats.layer_affinity))
    assert a.stats.layer_affinity.dense(0)[0, 0] == 1  # token 0: {0, 1} -> {0, 1}


def test_meta_blank_and_late_header_rows_are_skipped_and_counted(tmp_path):
    rows = [
        {"format": "placer-trace", "version": 1, "num_experts": 4},
        {"type": "meta", "note": "start"},
        "",
        {"type": "route", "req_id": "a", "token_idx": 0, "layer": 0, "topk_ids": [1, 2],
         "topk_weights": [0.5, 0.5]},
        {"type": "meta", "note": "end"},
        {"type": "stats"},
        {"format": "placer-trace", "version": 1, "num_experts": 4},
    ]
    s = read_routing(write_lines(tmp_path / "v.jsonl", rows)).stats
    assert s.provenance.rows_read == 1
    assert dict(s.provenance.rows_skipped) == {
        "blank line": 1, "header": 1, "type=meta": 2, "type=stats": 1}
    assert s.provenance.skipped_total == 5


def test_gzip_reads_like_plain(canonical, tmp_path):
    gz = tmp_path / "t.jsonl.gz"
    gz.write_bytes(gzip.compress(canonical.read_bytes()))
    np.testing.assert_array_equal(read_routing(gz).stats.load, read_routing(canonical).stats.load)


def test_writer_round_trip_with_requests_and_weights(tmp_path):
    rng = np.random.default_rng(5)
    ids = np.argsort(rng.random((40, 3, 6)), axis=2)[:, :, :2]
    weights = rng.random((40, 3, 2)).astype(np.float32)
    request = np.array(["a", "b"] * 20)
    path = tmp_path / "w.jsonl.gz"
    n = write_jsonl_trace(path, ids, layer_ids=[1, 2, 3], topk_weights=weights,
                          rank=np.arange(40) % 4, request=request,
                          meta={"model": "m", "num_experts": 6})
    assert n == 40
    data = read_routing(path, keep_tokens=True)
    np.testing.assert_array_equal(data.trace.topk_ids, ids)
    np.testing.assert_allclose(data.trace.topk_weights, weights, atol=1e-6)
    np.testing.assert_array_equal(data.trace.rank, np.arange(40) % 4)
    head = json.loads(gzip.decompress(path.read_bytes()).split(b"\n", 1)[0])
    assert head == {"format": "placer-trace", "version": 1, "model": "m", "num_layers": 3,
                    "num_experts": 6, "top_k": 2, "synthetic": False}


def test_writer_takes_chunks(tmp_path):
    ids = np.arange(24).reshape(4, 3, 2) % 7
    chunks = [{"topk_ids": ids[:3], "step": np.zeros(3, int)},
              {"topk_ids": ids[3:], "step": np.ones(1, int)}]
    path = tmp_path / "c.jsonl"
    assert write_jsonl_trace(path, iter(chunks), layer_ids=[0, 1, 2], meta={}) == 4
    data = read_routing(path, keep_tokens=True)
    np.testing.assert_array_equal(data.trace.topk_ids, ids)
    np.testing.assert_array_equal(data.trace.step, [0, 0, 0, 1])


def test_fast_path_equals_json_loads(tmp_path, monkeypatch):
    """Random canonical rows with odd lines mixed in read the same with the fast path
    off (every line through json.loads)."""
    rng = np.random.default_rng(11)
    rows: list[object] = []
    for t in range(300):
        for layer in (2, 3, 4):
            ex = rng.choice(16, 3, replace=False).tolist()
            row = {"request": f"r{t % 7}", "step": t // 10, "token": t, "layer": layer,
                   "experts": ex, "weights": np.round(rng.random(3), 4).tolist(), "rank": t % 2}
            if rng.random() < 0.05:  # other key order: a json.loads line
                row = dict(reversed(list(row.items())))
            rows.append(row)
            if rng.random() < 0.02:
                rows.append({"type": "meta", "t": t})
    path = write_lines(tmp_path / "mix.jsonl", rows)
    fast = read_routing(path, keep_tokens=True)
    monkeypatch.setattr(Template, "from_line", classmethod(lambda cls, *a: None))
    slow = read_routing(path, keep_tokens=True)
    for name in ("load", "tokens", "coact", "layer_affinity", "window_starts"):
        np.testing.assert_array_equal(field(fast.stats, name), field(slow.stats, name))
    assert fast.stats.provenance == slow.stats.provenance
    np.testing.assert_array_equal(fast.trace.topk_ids, slow.trace.topk_ids)
    np.testing.assert_array_equal(fast.trace.topk_weights, slow.trace.topk_weights)


def test_synthetic_header_warns(tmp_path):
    rows = [{"format": "placer-trace", "version": 1, "synthetic": True},
            {"layer": 0, "experts": [0, 1]}, {"layer": 0, "experts": [1, 0]}]
    with pytest.warns(TraceWarning, match="the trace declares itself synthetic"):
        s = read_routing(write_lines(tmp_path / "s.jsonl", rows)).stats
    assert s.provenance.synthetic
    assert any("synthetic" in w for w in s.warnings)


def test_warm_up_pass_warns(tmp_path):
    """100 dummy tokens routed alike (a profiling pass), then varied routing: left out by
    default, counted with keep_warmup (and a warning either way)."""
    rows = [{"layer": 0, "experts": [0, 1]} for _ in range(100)]
    rows += [{"layer": 0, "experts": [i % 4, (i + 1) % 4]} for i in range(1, 21)]
    path = write_lines(tmp_path / "warm.jsonl", rows)
    with pytest.warns(TraceWarning, match=r"left out 100 routing rows of a profiling or"
                      r" warm-up pass: .* \(the longest: 100 rows for layer 0, ending at"
                      r" .*warm.jsonl:100\)"):
        s = read_routing(path).stats
    assert s.provenance.rows_read == 20
    with pytest.warns(TraceWarning, match=r"100 identical consecutive routing rows for layer 0"
                      r" \(ending at .*warm.jsonl:100\): this looks like a profiling or"
                      r" warm-up pass"):
        s = read_routing(path, keep_warmup=True).stats
    assert s.provenance.rows_read == 120


def test_never_routed_experts_warn(tmp_path):
    rows = [{"layer": 0, "experts": [0, 1]}, {"layer": 0, "experts": [1, 2]}]
    with pytest.warns(TraceWarning, match=r"2 of 5 \(layer, expert\) pairs were never routed"
                      r" to: layer 0 expert 3, layer 0 expert 4"):
        read_routing(write_lines(tmp_path / "n.jsonl", rows), num_experts=5)


# -- bad input ----------------------------------------------------------------------------
def bad(tmp_path: Path, rows: list[object], **kwargs: object) -> TraceError:
    path = write_lines(tmp_path / "bad.jsonl", rows)
    with pytest.raises(TraceError) as e:
        read_routing(path, **kwargs)  # type: ignore[arg-type]
    return e.value


GOOD = {"layer": 0, "experts": [0, 1]}


def test_malformed_json(tmp_path):
    e = bad(tmp_path, [GOOD, '{"layer": 0, "experts": [0, 1]'])
    assert str(e).endswith("bad.jsonl:2: malformed JSON (Expecting ',' delimiter at column 31)")
    assert e.hint == "each line must be one JSON object"


def test_not_an_object(tmp_path):
    e = bad(tmp_path, [GOOD, "[1, 2]"])
    assert e.message == "expected a JSON object, got list" and e.where.endswith(":2")


def test_expert_out_of_range(tmp_path):
    rows = [{"format": "placer-trace", "version": 1, "num_experts": 4}, GOOD,
            {"layer": 1, "experts": [4, 1]}]
    e = bad(tmp_path, rows)
    assert e.message == "expert id 4 is out of range [0, 4)"
    assert e.where.endswith("bad.jsonl:3")
    assert "num_experts is 4" in e.hint


def test_expert_out_of_range_of_argument(tmp_path):
    e = bad(tmp_path, [GOOD, {"layer": 0, "experts": [9, 1]}], num_experts=8)
    assert e.message == "expert id 9 is out of range [0, 8)"
    assert e.hint.startswith("num_experts is 8 (the declared num_experts)")


def test_negative_expert(tmp_path):
    e = bad(tmp_path, [GOOD, {"layer": 0, "experts": [-3, 1]}])
    assert e.message == "expert id -3 is negative" and e.where.endswith(":2")
    assert e.hint == "expert ids are 0..num_experts-1; -1 marks no expert"


@pytest.mark.parametrize(("row", "message"), [
    ({"experts": [0, 1]}, "missing field 'layer'"),
    ({"layer": 0, "weights": [1.0]}, "missing field 'experts' (or 'topk_ids')"),
])
def test_missing_field(tmp_path, row, message):
    e = bad(tmp_path, [GOOD, row])
    assert e.message == message and e.where.endswith("bad.jsonl:2")
    assert e.hint == "a routing row needs 'layer' and 'experts' (or 'topk_ids')"


def test_mixed_top_k(tmp_path):
    e = bad(tmp_path, [GOOD, GOOD, {"layer": 0, "experts": [0, 1, 2]}])
    assert e.message == "row has 3 experts but earlier rows have 2"
    assert e.where.endswith(":3")
    assert e.hint == "all rows must select the same number of experts (top_k); pad with -1"


def test_top_k_larger_than_declared(tmp_path):
    e = bad(tmp_path, [{"layer": 0, "experts": [0, 1, 2]}], top_k=2)
    assert e.message == "row selects 3 experts but top_k is 2 (the declared top_k)"


def test_duplicate_expert_in_a_row(tmp_path):
    e = bad(tmp_path, [GOOD, {"layer": 3, "experts": [5, 5]}])
    assert e.message == "expert 5 appears twice in one token's top-k [5, 5]"
    assert e.where.endswith(":2")


def test_duplicate_token_row_is_a_new_occurrence(tmp_path):
    """A second row for (request, token, layer) is read as a second token, with a warning."""
    rows = [{"request": "r", "token": 7, "layer": 0, "experts": [0, 1]},
            {"request": "r", "token": 7, "layer": 0, "experts": [1, 2]}]
    path = write_lines(tmp_path / "dup.jsonl", rows)
    with pytest.warns(TraceWarning, match=r"1 routing rows repeat a \(request, token, layer\)"
                      r" read before \(the first at .*dup.jsonl:2\)"):
        s = read_routing(path).stats
    assert s.tokens.sum() == 2


def test_bad_field_types(tmp_path):
    assert bad(tmp_path, [{"layer": "a", "experts": [0]}]).message == (
        "layer must be an integer, got 'a'")
    assert bad(tmp_path, [{"layer": 0, "experts": [0.5]}]).message == (
        "experts must be a list of integer expert ids, got [0.5]")
    assert bad(tmp_path, [{"layer": 0, "experts": [0], "step": -2}]).message == (
        "step must be an integer >= 0, got -2")


def test_header_disagrees_with_argument(tmp_path):
    rows = [{"format": "placer-trace", "version": 1, "num_experts": 8}, GOOD]
    e = bad(tmp_path, rows, num_experts=16)
    assert e.message == (
        "num_experts is 8 here but 16 in the declared num_experts"
    )


def test_unsupported_header_version(tmp_path):
    e = bad(tmp_path, [{"format": "placer-trace", "version": 2}, GOOD])
    assert e.message == "unsupported placer-trace version 2"
    assert e.hint == "this placer reads version 1"


def test_empty_file(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(TraceError) as e:
        read_routing(path)
    assert str(e.value) == f"{path}: the file is empty"


def test_only_meta_rows(tmp_path):
    e = bad(tmp_path, [{"type": "meta"}])
    assert e.message == "no routing rows (skipped: 1 type=meta)"


def test_unknown_format_name(canonical):
    with pytest.raises(UsageError) as e:
        read_routing(canonical, format="parquet")
    assert e.value.message == "unknown trace format 'parquet'" and e.value.where == "format"
    assert e.value.hint.startswith("formats: jsonl, npz, load-npz")


def test_unknown_content_is_a_trace_error(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello\n")
    with pytest.raises(TraceError) as e:
        read_routing(path)
    assert e.value.message == "cannot tell the trace format from the name and content"
    assert "pass `format` one of: jsonl (.jsonl" in e.value.hint


def test_missing_file(tmp_path):
    with pytest.raises(TraceError) as e:
        read_routing(tmp_path / "nope.jsonl")
    assert e.value.message == "file not found"


def test_truncated_gzip(canonical, tmp_path):
    gz = tmp_path / "cut.jsonl.gz"
    gz.write_bytes(gzip.compress(canonical.read_bytes() * 50)[:-30])
    with pytest.raises(TraceError) as e:
        read_routing(gz)
    assert e.value.where == str(gz)
    assert e.value.message.startswith("cannot read the file (")
    assert e.value.hint == "is the gzip file complete?"


def test_progress_counts_the_bytes_and_reads_the_same(canonical, monkeypatch, capsys):
    from placer import constants

    monkeypatch.setattr(constants, "PROGRESS_MIN_BYTES", 0)
    said: list[tuple[int, int]] = []
    with_bar = read_routing(canonical, progress=lambda done, total: said.append((done, total)))
    np.testing.assert_array_equal(with_bar.stats.load, read_routing(canonical).stats.load)
    size = canonical.stat().st_size
    assert said and all(total == size for _, total in said)
    assert [done for done, _ in said] == sorted(done for done, _ in said)
    assert said[-1][0] == size
    assert capsys.readouterr() == ("", "")  # the library draws nothing: the caller does


def test_progress_is_quiet_below_the_size_worth_a_bar(canonical):
    said: list[tuple[int, int]] = []
    read_routing(canonical, progress=lambda done, total: said.append((done, total)))
    assert said == []


def test_non_number_weight_is_reported_like_json_loads(tmp_path):
    rows = [{"layer": 0, "experts": [0, 1], "weights": [0.5, 0.5]}] * 3
    rows.append({"layer": 0, "experts": [1, 2], "weights": [0.5, None]})
    e = bad(tmp_path, rows)
    assert e.message == "weights must be a list of 2 numbers, got [0.5, None]"
    assert e.where.endswith("bad.jsonl:4")


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(
    st.one_of(st.integers(0, 99), st.integers(0, 10**20)),
    st.one_of(st.integers(-1, 300), st.integers(-10**19, 10**19)),
    st.sampled_from(["", "0", "00", "-", "+"]),
), min_size=1, max_size=40))
def test_fast_integers_equal_json_loads(values):
    """The word-at-a-time integer reader against json.loads: numbers of 1 to 20 digits,
    negative expert ids, and texts JSON refuses (leading zeros, '+', a lone minus).  A
    line the fast path takes has json.loads's values; a line JSON refuses is not taken."""
    lines = [b'{"token": 1, "layer": 2, "experts": [3, 4]}']
    for token, expert, prefix in values:
        lines.append(f'{{"token": {prefix}{token}, "layer": 2, "experts": [{expert}, 5]}}'
                     .encode())
    data = b"\n".join(lines) + b"\n"
    scan = scan_block(data)
    tpl = Template.from_line(json.loads(lines[0]), scan, 0, ALIASES)
    assert tpl is not None
    good, values = tpl.parse(scan, weights=False)
    taken = np.flatnonzero(good)
    for row, line in enumerate(taken.tolist()):
        obj = json.loads(lines[line])
        assert values["token"][row] == obj["token"]
        assert values["experts"][row].tolist() == obj["experts"]
    for line, text in enumerate(lines):
        try:
            obj = json.loads(text)
        except ValueError:
            assert not good[line]
            continue
        plain = b": -" not in text and obj["token"] < 10**18 and abs(obj["experts"][0]) < 10**18
        assert good[line] == plain, text


def test_number_characters_that_are_no_number_are_a_trace_error(tmp_path):
    """Found by the fuzz test: "0.0.0.5" is made of number characters but is not a number."""
    path = tmp_path / "bad.jsonl"
    rows = ['{"format": "placer-trace", "version": 1, "num_experts": 4, "top_k": 2}']
    rows += [f'{{"token": {t}, "layer": 0, "experts": [0, 1], "weights": [0.5, 0.5]}}'
             for t in range(3)]
    rows.append('{"token": 3, "layer": 0, "experts": [0, 1], "weights": [0.0.0.5, 0.5]}')
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(TraceError) as e:
        read_routing(path, keep_tokens=True)  # weights are read with the tokens
    assert f"{path}:5" in str(e.value)
