"""bench/planning.py reads its inputs the way ``placer plan`` does (tiny stand-ins for the
real data in ../shared/data, which tests must not depend on)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from placer.planning.solvers import solve

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the bench package
import bench.planning as planning


@pytest.fixture
def real(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for ``../shared/data/real`` with the three inputs, shaped as the real ones."""
    folder = tmp_path / "shared" / "data" / "real"
    rng = np.random.default_rng(0)
    # gpt-oss-20b: 24 layers x 32 experts, top-4, complete symmetric pair counts
    topk = np.stack([np.argsort(rng.random((500, 32)), axis=1)[:, :4] for _ in range(24)])
    load = np.zeros((24, 32), dtype=np.int64)
    coact = np.zeros((24, 32, 32), dtype=np.int64)
    for layer in range(24):
        np.add.at(load[layer], topk[layer].ravel(), 1)
        for i in range(4):
            for j in range(4):
                if i != j:
                    np.add.at(coact[layer], (topk[layer][:, i], topk[layer][:, j]), 1)
    (folder / "gpt-oss-20b").mkdir(parents=True)
    np.savez(folder / "gpt-oss-20b" / "load_coact.npz", load=load, coact=coact)
    # Qwen3: the source JSON's fields (2 layers x 128 experts, top-8)
    heat = [rng.multinomial(100 * 8, np.ones(128) / 128).tolist() for _ in range(2)]
    doc = {"n_layers": 2, "n_expert_per_layer": 128, "k": 8, "n_decode_tokens": 100,
           "layers": [{"layer": i, "heat": heat[i], "pairs": [[0, 1, 5, 2.0]]} for i in range(2)]}
    (folder / "qwen3-30b-a3b").mkdir()
    (folder / "qwen3-30b-a3b" / "coactivation_qwen3-30b-a3b.json").write_text(json.dumps(doc))
    # Mixtral: one row per (token, layer), as the vLLM logger wrote them
    (folder / "mixtral-8x7b").mkdir()
    for dataset, tokens in (("gsm8k", 40), ("humaneval", 24)):
        rows = []
        for layer in range(32):
            for token in range(tokens):
                experts = rng.choice(8, size=2, replace=False).tolist()
                rows.append({"dataset": dataset, "problem_id": token // 20, "layer": layer,
                             "experts": experts, "gating_probs": [0.6, 0.4],
                             "token_idx": token % 20})
        path = folder / "mixtral-8x7b" / f"{dataset}_2_routing.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(planning, "REAL", folder)
    return folder


def test_without_the_data_runs_on_the_bundled_qwen3_statistics(tmp_path, monkeypatch):
    """No ../shared: the Qwen3 rows come from traces/qwen3-30b-a3b.npz, the rows that need
    the real data are left out, and the page says so (the planning itself is not run here)."""
    monkeypatch.setattr(planning, "SHARED_DATA", tmp_path / "absent")
    monkeypatch.setattr(planning, "REAL", tmp_path / "absent" / "real")
    assert planning.gpt_oss() is None
    assert planning.mixtral_files("gsm8k", "humaneval") is None
    qwen = planning.qwen3(tmp_path)
    assert qwen is not None and qwen.stats.load.shape[1:] == (48, 128)
    monkeypatch.setattr(planning, "_run", lambda out, folder: "\n".join(out))
    text = planning.run()
    assert f"({tmp_path / 'absent'} is absent: the Qwen3-30B-A3B rows come from the bundled" \
        in text


def test_gpt_oss_read_and_planned_as_placer_plan_does(real):
    routing = planning.gpt_oss()
    assert routing is not None
    assert routing.stats.top_k == 4 and routing.stats.load.shape == (1, 24, 32)
    assert routing.stats.provenance.format == "load-npz"
    problem = planning.problem_for(routing, "gpt-oss-20b", 8, 5)
    assert problem.model.name == "gpt-oss-20b" and problem.topology is None
    assert (problem.num_gpus, problem.slots_per_gpu, problem.num_groups) == (8, 5, 1)
    # the baseline is the reference EPLB
    assert solve(problem, "eplb").solver == "eplb"


def test_qwen3_converted_by_the_bundled_script(real, tmp_path):
    routing = planning.qwen3(tmp_path)
    assert routing is not None
    assert (tmp_path / "qwen3-30b-a3b.npz").exists()
    assert routing.stats.top_k == 8 and routing.stats.num_experts == 128
    assert routing.stats.coact_dense(0)[0, 1] == 5


def test_mixtral_logs_read_in_windows_of_16_tokens(real):
    both = planning.mixtral("gsm8k", "humaneval")
    assert both.stats.total_tokens == 64
    assert both.stats.tokens.tolist() == [16, 16, 16, 16]
    problem = planning.problem_for(both, "mixtral-8x7b", 4, 3, fit=(0, 2))
    assert problem.stats.num_windows == 2 and problem.model.name == "mixtral-8x7b"
    assert planning.mixtral_files("gsm8k", "nope") is None
