"""Engine dump variants: SGLang ``per_pass`` dumps, per-token dumps whose keys sit far into
``data.pkl``, torch archives told by their members, TensorRT-LLM's inline load balancer
and the error when its slots are counted without one.

The ``.pt`` files are written with :func:`placer.io.ptfile.save_pt` (no torch needed); the
first test checks that it writes what the committed ``torch.save`` fixtures hold.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors_fixture import write_safetensors
from typer.testing import CliRunner

from placer.cli.main import app
from placer.errors import TraceError, UsageError
from placer.io.ptfile import is_torch_archive, load_pt, save_pt
from placer.traces import detect_format, read_routing
from placer.traces.registry import SNIFF_BYTES

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
STAT = FIXTURES / "sglang_stat" / "expert_distribution_recorder_1700000000.5.pt"
PER_TOKEN = sorted((FIXTURES / "sglang_per_token").glob("*.pt"))

runner = CliRunner()


def same(a: object, b: object) -> None:
    """Equal containers, arrays equal with the same dtype."""
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b)
        for key in a:
            same(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    else:
        assert a == b


# -- the torch-free writer and archive detection --------------------------------------------


@pytest.mark.parametrize("fixture", [STAT, *PER_TOKEN, FIXTURES / "dtypes.pt"])
def test_save_pt_round_trips_the_torch_fixtures(tmp_path: Path, fixture: Path) -> None:
    """What torch.save wrote, loaded and written again by save_pt, loads the same."""
    original = load_pt(fixture)
    if fixture.name == "dtypes.pt":  # bfloat16 has no numpy dtype to write back
        del original["tensors"]["bf16"]
    path = tmp_path / "again.pt"
    save_pt(original, path)
    same(original, load_pt(path))
    assert is_torch_archive(path)


def test_torch_archives_are_told_by_their_members(tmp_path: Path) -> None:
    npz = tmp_path / "a.npz"
    np.savez(npz, load=np.ones((2, 2)))
    plain_zip = tmp_path / "b.pt"
    with zipfile.ZipFile(plain_zip, "w") as z:
        z.writestr("notes.txt", "hello")
    text = tmp_path / "c.pt"
    text.write_text("not a zip")
    assert all(is_torch_archive(p) for p in [STAT, *PER_TOKEN])
    assert not any(is_torch_archive(p) for p in (npz, plain_zip, text))


# -- SGLang per_token with keys far into data.pkl --------------------------------------------


def big_per_token_dump(path: Path) -> np.ndarray:
    """A per_token dump shaped like a real one: each record lists its 20,000 input ids
    and positions before ``topk_ids_of_layer``, so the keys sit past the first 64 KB.

    2 hidden layers (0 dense, 1 MoE), 3 experts on 4 slots, top-2; returns the logical
    ids ``[tokens, 1, 2]`` of the MoE layer.
    """
    p2l = np.array([[0, 1, 2, 0], [2, 0, 1, 1]], dtype=np.int64)
    topk = np.full((2, 3, 8), -1, dtype=np.int32)
    topk[1, :, :2] = [[0, 1], [2, 0], [1, 3]]
    record = {
        "forward_pass_id": 7, "rank": 0, "gatherer_key": "primary",
        "input_ids": list(range(20_000)), "positions": list(range(20_000)),
        "extend_seq_lens": [3], "forward_mode": 1, "topk_ids_of_layer": topk,
        "misc_objects": [], "global_physical_count": np.zeros((2, 4), dtype=np.int32),
    }
    save_pt({"records": [record], "last_physical_to_logical_map": p2l}, path)
    return p2l[1][topk[1, :, :2]][:, None, :]


@pytest.mark.parametrize("name", ["expert_distribution_recorder_1.5_0.pt", "dump.bin"])
def test_per_token_dump_with_keys_past_the_sniffed_head(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    logical = big_per_token_dump(path)
    head = path.read_bytes()[:SNIFF_BYTES]
    assert b"topk_ids_of_layer" not in head and b"last_physical_to_logical_map" not in head
    assert detect_format(path).name == "sglang"
    data = read_routing(path, keep_tokens=True)
    assert data.trace is not None
    np.testing.assert_array_equal(data.trace.topk_ids, logical)
    assert data.stats.layer_ids.tolist() == [1]
    assert data.stats.window_starts.tolist() == [7]


def test_a_torch_archive_of_something_else_says_what_it_holds(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    save_pt({"weight": np.zeros((2, 2), dtype=np.float32)}, path)
    with pytest.raises(TraceError) as info:
        read_routing(path)
    assert info.value.message == "not an SGLang expert-distribution dump (keys: weight)"
    assert "per_pass" in (info.value.hint or "")


# -- SGLang per_pass ------------------------------------------------------------------------


def per_pass_from_per_token(folder: Path) -> list[Path]:
    """The committed per_token fixtures as per_pass dumps: each record keeps its
    forward_pass_id, rank and global_physical_count [4 layers, 6 slots] only."""
    folder.mkdir()
    out = []
    for path in PER_TOKEN:
        dump = load_pt(path)
        records = [
            {key: r[key] for key in ("forward_pass_id", "rank", "gatherer_key",
                                     "global_physical_count")}
            for r in dump["records"]
        ]
        target = folder / path.name
        save_pt({"records": records,
                 "last_physical_to_logical_map": dump["last_physical_to_logical_map"]}, target)
        out.append(target)
    return out


def test_per_pass_counts_map_back_through_the_replicas(tmp_path: Path) -> None:
    """Two rank files, passes 0 and 1: each slot's count goes to its logical expert (two
    replicas of one expert add up), one window per pass, equal to the per-token load."""
    paths = per_pass_from_per_token(tmp_path / "pp")
    stats = read_routing(paths, top_k=2).stats
    want = read_routing(PER_TOKEN).stats
    assert stats.layer_ids.tolist() == [1, 2, 3]  # the dense layer counts nothing
    assert stats.window_starts.tolist() == [0, 1]
    np.testing.assert_array_equal(stats.load, want.load)
    np.testing.assert_array_equal(stats.tokens, want.tokens)
    assert stats.coact is None and stats.provenance.format == "sglang"


def test_per_pass_sums_replicas_by_hand(tmp_path: Path) -> None:
    """One layer, experts 0..2 on 4 slots (expert 0 twice); passes 5 and 9 on rank 0,
    pass 9 on rank 1: windows are steps 5..9 (as a per-token trace's, empty steps
    included), rank files add up pass by pass."""
    p2l = np.array([[0, 1, 2, 0]])
    rank0 = [{"forward_pass_id": 5, "rank": 0, "gatherer_key": "primary",
              "global_physical_count": np.array([[1, 2, 3, 4]], dtype=np.int32)},
             {"forward_pass_id": 9, "rank": 0, "gatherer_key": "primary",
              "global_physical_count": np.array([[0, 1, 0, 1]], dtype=np.int32)}]
    rank1 = [{"forward_pass_id": 9, "rank": 1, "gatherer_key": "primary",
              "global_physical_count": np.array([[2, 0, 0, 0]], dtype=np.int32)}]
    paths = [tmp_path / "d_0.pt", tmp_path / "d_1.pt"]
    for path, records in zip(paths, (rank0, rank1), strict=True):
        save_pt({"records": records, "last_physical_to_logical_map": p2l}, path)
    stats = read_routing(paths, top_k=1).stats
    assert stats.window_starts.tolist() == [5, 6, 7, 8, 9]
    assert stats.load[:, 0].tolist() == [[5, 2, 3], [0, 0, 0], [0, 0, 0], [0, 0, 0],
                                         [3, 1, 0]]
    assert stats.tokens.tolist() == [10, 0, 0, 0, 4]


def test_many_passes_merge_into_windows_and_layers_select(tmp_path: Path) -> None:
    """100 passes give 50 windows of 2 passes (as 100 steps of a per-token trace do);
    ``layers`` keeps the chosen layer and a missing one is a usage error."""
    p2l = np.array([[0, 1], [1, 0]])
    records = [{"forward_pass_id": i, "rank": 0,
                "global_physical_count": np.array([[i, 1], [1, 1]], dtype=np.int32)}
               for i in range(100)]
    path = tmp_path / "many.pt"
    save_pt({"records": records, "last_physical_to_logical_map": p2l}, path)
    stats = read_routing(path, top_k=1, layers=[1]).stats
    assert stats.layer_ids.tolist() == [1]
    assert stats.window_starts.tolist() == list(range(0, 100, 2))
    assert stats.load[:, 0].tolist() == [[2, 2]] * 50
    assert read_routing(path, top_k=1).stats.load[:, 0, 0].sum() == sum(range(100))
    with pytest.raises(UsageError, match="layer 5 has no rows in the trace"):
        read_routing(path, top_k=1, layers=[5])


def test_per_pass_needs_top_k_and_says_so_on_the_command_line(tmp_path: Path) -> None:
    paths = per_pass_from_per_token(tmp_path / "pp")
    result = runner.invoke(app, ["stats", *map(str, paths)])
    assert result.exit_code == 1
    assert "top_k is unknown" in result.stderr
    assert "hint: pass --top-k, or add a top_k entry" in result.stderr
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["stats", *map(str, paths), "--top-k", "2", "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["totals"]["tokens"] == 11


def test_per_pass_bad_counts_name_the_record(tmp_path: Path) -> None:
    p2l = np.array([[0, 1, 2, 0]])
    good = {"forward_pass_id": 0, "rank": 0,
            "global_physical_count": np.ones((1, 4), dtype=np.int32)}
    bad = {"forward_pass_id": 1, "rank": 0,
           "global_physical_count": np.ones((1, 3), dtype=np.int32)}
    path = tmp_path / "bad.pt"
    save_pt({"records": [good, bad], "last_physical_to_logical_map": p2l}, path)
    with pytest.raises(TraceError) as info:
        read_routing(path, top_k=1)
    assert info.value.message == (
        "global_physical_count has shape (1, 3), expected [1, 4] (layers and physical"
        " experts of last_physical_to_logical_map)")
    assert info.value.where == f"{path}: records[1]"


def test_a_record_of_neither_mode(tmp_path: Path) -> None:
    path = tmp_path / "odd.pt"
    save_pt({"records": [{"forward_pass_id": 0, "rank": 0}],
             "last_physical_to_logical_map": np.array([[0, 1]])}, path)
    with pytest.raises(TraceError) as info:
        read_routing(path)
    assert info.value.message == ("the record has neither topk_ids_of_layer (per_token mode)"
                                  " nor global_physical_count (per_pass mode)")
    assert info.value.where == f"{path}: records[0]"


# -- TensorRT-LLM ---------------------------------------------------------------------------


#: Slots of layers 3 and 4 (6 slots, experts 0..3, two replicas each of two experts).
ASSIGNMENTS = {3: [0, 1, 2, 3, 0, 1], 4: [3, 2, 1, 0, 3, 3]}


@pytest.fixture
def slot_stats(tmp_path: Path) -> Path:
    """TensorRT-LLM statistics with the load balancer on: 6 slots counted, 2 ranks,
    iterations 10 and 11, layers 3 and 4."""
    folder = tmp_path / "stats"
    folder.mkdir()
    (folder / "meta_info.json").write_text('{"num_experts": 6, "num_experts_per_token": 2}')
    for rank in (0, 1):
        write_safetensors(folder / f"rank{rank}.safetensors", {
            f"{it}_{layer}": np.arange(6) + rank + it + layer
            for it in (10, 11) for layer in (3, 4)
        })
    return folder


def expected_experts() -> np.ndarray:
    """``[iterations, layers, experts]`` of :func:`slot_stats` through ASSIGNMENTS."""
    out = np.zeros((2, 2, 4), dtype=np.int64)
    for i, it in enumerate((10, 11)):
        for j, layer in enumerate((3, 4)):
            slots = sum(np.arange(6) + rank + it + layer for rank in (0, 1))
            for slot, expert in enumerate(ASSIGNMENTS[layer]):
                out[i, j, expert] += slots[slot]
    return out


def test_inline_load_balancer_in_the_options_yaml(slot_stats: Path) -> None:
    """``moe_config.load_balancer`` given inline in the extra LLM API options YAML."""
    options = {"enable_attention_dp": True,
               "moe_config": {"backend": "WIDEEP", "load_balancer": {
                   "num_slots": 6, "initial_global_assignments": ASSIGNMENTS,
                   "layer_updates_per_iter": 0}}}
    (slot_stats / "extra_llm_api_options.yaml").write_text(yaml.safe_dump(options))
    stats = read_routing(slot_stats, num_experts=4).stats
    np.testing.assert_array_equal(stats.load, expected_experts())
    assert stats.window_starts.tolist() == [10, 11] and stats.top_k == 2


def test_options_yaml_naming_the_load_balancer_file(slot_stats: Path) -> None:
    """The options YAML names lb.yaml (both in the folder: one load balancer, not two)."""
    (slot_stats / "lb.yaml").write_text(yaml.safe_dump(
        {"num_slots": 6, "initial_global_assignments": ASSIGNMENTS,
         "layer_updates_per_iter": 0}))
    (slot_stats / "options.yaml").write_text(
        yaml.safe_dump({"moe_config": {"load_balancer": "lb.yaml"}}))
    stats = read_routing(slot_stats).stats
    np.testing.assert_array_equal(stats.load, expected_experts())


def test_options_yaml_naming_a_missing_file(slot_stats: Path) -> None:
    (slot_stats / "options.yaml").write_text(
        yaml.safe_dump({"moe_config": {"load_balancer": "/elsewhere/lb.yaml"}}))
    with pytest.raises(TraceError) as info:
        read_routing(slot_stats)
    assert info.value.message == "the load-balancer file /elsewhere/lb.yaml is not there"
    assert info.value.where == f"{slot_stats / 'options.yaml'}: moe_config.load_balancer"
    assert "copy it next to meta_info.json" in (info.value.hint or "")


def test_inline_load_balancer_without_assignments(slot_stats: Path) -> None:
    (slot_stats / "options.yaml").write_text(
        yaml.safe_dump({"moe_config": {"load_balancer": {"num_slots": 6}}}))
    with pytest.raises(TraceError) as info:
        read_routing(slot_stats)
    assert info.value.message == "no initial_global_assignments mapping"
    assert info.value.where == (
        f"{slot_stats / 'options.yaml'}: moe_config.load_balancer.initial_global_assignments")


def test_slot_counts_without_a_yaml_say_the_load_balancer_was_on(slot_stats: Path) -> None:
    with pytest.raises(TraceError) as info:
        read_routing(slot_stats, num_experts=4)
    assert info.value.message == (
        "meta_info.json counts 6 experts but the model has 4: TensorRT-LLM's MoE load"
        " balancer was on, so these are its slots")
    assert info.value.where == f"{slot_stats / 'meta_info.json'}: num_experts"
    result = runner.invoke(app, ["stats", str(slot_stats), "--num-experts", "4"])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: {info.value}",
        "hint: copy the YAML that moe_config.load_balancer named (or the extra LLM API"
        " options YAML that holds it inline) next to meta_info.json, so slots map back to"
        " experts",
    ]


def test_options_yaml_without_a_load_balancer_is_not_one(slot_stats: Path) -> None:
    """An options YAML with other moe_config keys: counts stay per slot (6 'experts')."""
    (slot_stats / "options.yaml").write_text(
        yaml.safe_dump({"moe_config": {"backend": "CUTLASS", "load_balancer": None}}))
    assert read_routing(slot_stats).stats.num_experts == 6
