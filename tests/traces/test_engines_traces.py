"""Engine statistics as traces: SGLang recorder dumps, TensorRT-LLM statistics, vLLM logs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors_fixture import write_safetensors

from placer.errors import TraceError
from placer.traces import detect_format, read_routing
from placer.traces.formats.sglang import fold_windows
from placer.traces.formats.trtllm import read_safetensors

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
STAT = FIXTURES / "sglang_stat" / "expert_distribution_recorder_1700000000.5.pt"
PER_TOKEN = sorted((FIXTURES / "sglang_per_token").glob("*.pt"))


# -- SGLang --------------------------------------------------------------------------


def test_sglang_formats_are_detected() -> None:
    assert detect_format(STAT).name == "sglang"
    assert detect_format(PER_TOKEN[0]).name == "sglang"


def test_sglang_stat_steps_become_windows() -> None:
    """Empty buffer steps and the dense layer are dropped; counts are kept exactly."""
    data = read_routing(STAT, top_k=2)
    with np.load(FIXTURES / "sglang_stat.expected.npz") as expected:
        count = expected["logical_count"]
    stats = data.stats
    assert stats.layer_ids.tolist() == [1, 2, 3]
    assert stats.window_starts.tolist() == [0, 1, 2, 3]
    np.testing.assert_array_equal(stats.load, count[:4, 1:])
    assert stats.provenance.format == "sglang"
    assert dict(stats.provenance.rows_skipped) == {"empty recorder step": 2}


def test_sglang_stat_needs_top_k() -> None:
    with pytest.raises(TraceError, match="top_k is unknown"):
        read_routing(STAT)


def test_sglang_per_token_maps_physical_ids_to_logical() -> None:
    """Both rank files: tokens, steps and source ranks as the fixture script made them."""
    data = read_routing(PER_TOKEN, keep_tokens=True)
    with np.load(FIXTURES / "sglang_per_token.expected.npz") as expected:
        topk, step, rank = expected["topk_ids"], expected["step"], expected["rank"]
    trace = data.trace
    assert trace is not None
    assert trace.layer_ids.tolist() == [1, 2, 3]
    np.testing.assert_array_equal(trace.topk_ids, topk)
    np.testing.assert_array_equal(trace.step, step)
    np.testing.assert_array_equal(trace.rank, rank)
    # load = brute-force count of the expected logical ids, windows by forward pass
    want = np.zeros((2, 3, 4), dtype=np.int64)
    for t in range(topk.shape[0]):
        for layer in range(3):
            for e in topk[t, layer]:
                want[step[t], layer, e] += 1
    np.testing.assert_array_equal(data.stats.load, want)
    assert data.stats.top_k == 2


def test_sglang_bad_physical_id() -> None:
    """A physical id beyond the map is reported with its record and index."""
    path = FIXTURES / "sglang_bad_physical_id.pt"
    with pytest.raises(TraceError, match=r"physical expert id 9 is outside \[0, 3\)") as info:
        read_routing(path)
    assert info.value.where == f"{path}: records[0].topk_ids_of_layer[1, 0, 1]"


def test_sglang_refuses_unsafe_dump() -> None:
    with pytest.raises(TraceError, match=r"refusing to load global 'posix\.system'"):
        read_routing(FIXTURES / "evil_os_system.pt", format="sglang")


def test_fold_windows_keeps_totals() -> None:
    load = np.arange(130 * 2 * 3).reshape(130, 2, 3)
    folded, starts = fold_windows(load, np.arange(130) * 10)
    assert folded.shape == (33, 2, 3)  # 130 -> 65 -> 33 (the last window single)
    assert starts[:3].tolist() == [0, 40, 80]
    np.testing.assert_array_equal(folded.sum(axis=0), load.sum(axis=0))


# -- TensorRT-LLM --------------------------------------------------------------------


@pytest.fixture
def trtllm_dir(tmp_path: Path) -> Path:
    """Two ranks, iterations 100-102, MoE layers 3 and 5 of a 4-expert top-2 model.

    Rank r counts expert e of layer l at iteration i as ``(r + 1) * (e + 1) + i - 100 + l``.
    """
    folder = tmp_path / "expert_statistic"
    folder.mkdir()
    (folder / "meta_info.json").write_text(
        json.dumps({"num_experts": 4, "num_experts_per_token": 2})
    )
    for rank in range(2):
        write_safetensors(folder / f"rank{rank}.safetensors", {
            f"{it}_{layer}": (rank + 1) * (np.arange(4) + 1) + it - 100 + layer
            for it in (100, 101, 102) for layer in (3, 5)
        })
    return folder


def _expected_trtllm() -> np.ndarray:
    want = np.zeros((3, 2, 4), dtype=np.int64)
    for w, it in enumerate((100, 101, 102)):
        for row, layer in enumerate((3, 5)):
            for e in range(4):
                want[w, row, e] = sum((r + 1) * (e + 1) + it - 100 + layer for r in range(2))
    return want


def test_trtllm_statistics_sum_ranks_and_window_by_iteration(trtllm_dir: Path) -> None:
    meta = trtllm_dir / "meta_info.json"
    assert detect_format(meta).name == "trtllm"
    stats = read_routing(meta).stats
    assert stats.layer_ids.tolist() == [3, 5]  # absolute MoE layer ids from the keys
    assert stats.window_starts.tolist() == [100, 101, 102]
    assert stats.top_k == 2
    np.testing.assert_array_equal(stats.load, _expected_trtllm())
    assert detect_format(trtllm_dir).name == "trtllm"
    folder = read_routing(trtllm_dir).stats
    np.testing.assert_array_equal(folder.load, stats.load)


def test_safetensors_reader_matches_the_package(tmp_path: Path) -> None:
    """Files written by the safetensors package read back identically."""
    numpy_st = pytest.importorskip("safetensors.numpy", reason="safetensors is not installed")
    tensors = {"100_3": np.arange(4, dtype=np.int64), "100_5": np.array([7, 0, 1, 2])}
    path = tmp_path / "rank0.safetensors"
    numpy_st.save_file(tensors, str(path))
    got = read_safetensors(path)
    assert sorted(got) == sorted(tensors)
    for name, array in tensors.items():
        np.testing.assert_array_equal(got[name], array)


def test_trtllm_slot_counts_map_back_to_experts(trtllm_dir: Path) -> None:
    """With the load balancer on, counts are per slot; the YAML maps slots to experts."""
    (trtllm_dir / "meta_info.json").write_text(
        json.dumps({"num_experts": 6, "num_experts_per_token": 2})
    )
    for rank in range(2):
        write_safetensors(trtllm_dir / f"rank{rank}.safetensors", {
            f"{it}_{layer}": np.array([1, 2, 3, 4, 5, 6]) * (rank + 1)
            for it in (100, 101) for layer in (3, 5)
        })
    (trtllm_dir / "moe_load_balancer.yaml").write_text(yaml.safe_dump({
        "num_slots": 6,
        "initial_global_assignments": {3: [0, 1, 3, 2, 3, 0], 5: [1, 0, 2, 3, 2, 1]},
        "layer_updates_per_iter": 0,
    }))
    stats = read_routing(trtllm_dir / "meta_info.json").stats
    # layer 3: expert 0 <- slots 0, 5; 1 <- 1; 2 <- 3; 3 <- 2, 4   (x3 for the two ranks)
    np.testing.assert_array_equal(stats.load[0, 0], np.array([1 + 6, 2, 4, 3 + 5]) * 3)
    np.testing.assert_array_equal(stats.load[0, 1], np.array([2, 1 + 6, 3 + 5, 4]) * 3)


def test_trtllm_wrong_count_length(trtllm_dir: Path) -> None:
    write_safetensors(trtllm_dir / "rank1.safetensors", {"100_3": np.arange(5)})
    with pytest.raises(TraceError, match=r"100_3 has shape \(5,\), expected \[4\]"):
        read_routing(trtllm_dir / "meta_info.json")


def test_trtllm_truncated_safetensors(trtllm_dir: Path) -> None:
    rank0 = trtllm_dir / "rank0.safetensors"
    rank0.write_bytes(rank0.read_bytes()[:-9])
    with pytest.raises(TraceError, match=r"data_offsets \[\d+, \d+\) do not hold \(4,\) I64"):
        read_routing(trtllm_dir / "meta_info.json")


def test_trtllm_folder_without_rank_files(tmp_path: Path) -> None:
    (tmp_path / "meta_info.json").write_text('{"num_experts": 4, "num_experts_per_token": 2}')
    with pytest.raises(TraceError, match=r"no rank\{r\}.safetensors beside meta_info.json"):
        read_routing(tmp_path / "meta_info.json")


# -- vLLM route logs -----------------------------------------------------------------


def test_vllm_route_logs_read_through_jsonl_aliases(tmp_path: Path) -> None:
    """Patched-vLLM rows (``type: route``, req_id, token_idx, topk_ids) are routing rows."""
    rows = [
        {"type": "meta", "model": "toy"},
        {"type": "route", "req_id": "a", "token_idx": 0, "layer": 1, "topk_ids": [0, 2],
         "topk_weights": [0.6, 0.4]},
        {"type": "route", "req_id": "a", "token_idx": 1, "layer": 1, "topk_ids": [1, 2],
         "topk_weights": [0.5, 0.5]},
        {"type": "route", "req_id": "b", "token_idx": 0, "layer": 1, "topk_ids": [2, 3],
         "topk_weights": [0.9, 0.1]},
    ]
    path = tmp_path / "routes.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stats = read_routing(path).stats
    assert stats.mean_load.tolist() == [[1, 1, 3, 1]]
    assert stats.total_tokens == 3
