"""``placer plan`` end to end: a trace written here, the real command, the file it writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from typer.testing import CliRunner

from placer.cli.main import app
from placer.placement.document import read_placement, schema
from placer.traces import write_npz_trace

runner = CliRunner()


@pytest.fixture
def skewed_trace(tmp_path: Path) -> Path:
    """400 tokens x layers 0-3 x top-2 of 8 experts, Mixtral's shape, 8 steps; seeded.

    Expert 0 is picked about 4x as often as expert 3; experts 6, 7 rarely.
    """
    rng = np.random.default_rng(0)
    weights = np.array([8, 4, 2, 1, 1, 1, 0.5, 0.5])
    weights /= weights.sum()
    topk = np.array(
        [[rng.choice(8, 2, replace=False, p=weights) for _ in range(4)] for _ in range(400)]
    )
    path = tmp_path / "trace.npz"
    write_npz_trace(
        path, topk, layer_ids=[0, 1, 2, 3], step=np.arange(400) // 50,
        meta={"model": "mixtral-8x7b", "num_experts": 8, "top_k": 2},
    )
    return path


def _plan(*args: str):
    return runner.invoke(app, ["plan", *args])


def test_plan_eplb_writes_a_valid_placement_and_summary(skewed_trace, tmp_path):
    out = tmp_path / "plan.json"
    result = _plan(
        str(skewed_trace), "-t", "dgx-h100", "-m", "mixtral-8x7b", "--solver", "eplb",
        "--redundant", "8", "-o", str(out),
    )
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"placement    {out}"
    assert lines[1] == "model        mixtral-8x7b: 8 experts, layers 0-3, 8 windows fitted"
    assert lines[2] == (
        "cluster      dgx-h100: 8 GPUs on 1 node, 2 slots per GPU (16 physical, 8 redundant)"
    )
    assert lines[3].startswith("solver       eplb (HEURISTIC, ")
    assert lines[4].startswith("hot shard    max/mean GPU load: median 1.0")

    doc = json.loads(out.read_text())
    jsonschema.validate(doc, schema())
    placement = read_placement(out)
    assert placement.layer_ids.tolist() == [0, 1, 2, 3]
    assert placement.slots_per_gpu == 2
    assert doc["model"] == {"name": "mixtral-8x7b", "num_experts": 8, "top_k": 2}
    assert doc["topology"] == {"name": "dgx-h100", "num_gpus": 8, "num_nodes": 1}
    assert doc["solver"]["name"] == "eplb"
    assert doc["solver"]["policy"] == "global"
    assert set(doc["metrics"]) == {
        "hot_shard_ratio_median", "hot_shard_ratio_worst", "hottest_gpu_load"
    }
    # the hot expert 0 is replicated in every layer
    assert (placement.replica_counts[:, 0] >= 2).all()


def test_plan_json_summary(skewed_trace, tmp_path):
    out = tmp_path / "plan.json"
    result = _plan(str(skewed_trace), "-g", "4", "-s", "round_robin", "-o", str(out), "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["output"] == str(out)
    assert summary["problem"]["num_physical_experts"] == 8
    assert summary["solver"]["name"] == "round_robin"
    assert summary["solver"]["status"] == "HEURISTIC"
    metrics = json.loads(out.read_text())["metrics"]
    assert summary["metrics"] == metrics
    assert metrics["hot_shard_ratio_worst"] >= metrics["hot_shard_ratio_median"] >= 1.0
    # where the time went: reading, planning (to the last layer), after it (the summary)
    assert set(summary["timings"]) == {"read_s", "planning_s", "after_planning_s"}
    assert all(value >= 0 for value in summary["timings"].values())


def test_plan_baselines_write_their_layouts(skewed_trace, tmp_path):
    for solver, row in [
        ("linear", [0, 1, 2, 3, 4, 5, 6, 7]),
        ("round_robin", [0, 4, 1, 5, 2, 6, 3, 7]),
    ]:
        out = tmp_path / f"{solver}.json"
        result = _plan(str(skewed_trace), "-g", "4", "-s", solver, "-o", str(out))
        assert result.exit_code == 0, result.stderr
        assert read_placement(out).physical_to_logical.tolist() == [row] * 4


def test_eplb_beats_linear_on_the_skewed_trace(skewed_trace, tmp_path):
    ratios = {}
    for solver in ("linear", "eplb"):
        out = tmp_path / f"{solver}.json"
        result = _plan(str(skewed_trace), "-g", "4", "-r", "4", "-s", solver, "-o", str(out))
        assert result.exit_code == 0, result.stderr
        ratios[solver] = json.loads(out.read_text())["metrics"]["hot_shard_ratio_worst"]
    assert ratios["eplb"] < 1.1 < 1.4 < ratios["linear"]


def test_plan_fit_uses_the_chosen_windows(skewed_trace, tmp_path):
    out = tmp_path / "plan.json"
    result = _plan(str(skewed_trace), "-g", "4", "--fit", "2:4", "-o", str(out), "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["problem"]["num_windows"] == 2


def test_plan_is_deterministic(skewed_trace, tmp_path):
    docs = []
    for name in ("a.json", "b.json"):
        out = tmp_path / name
        assert _plan(str(skewed_trace), "-g", "4", "-r", "4", "-o", str(out)).exit_code == 0
        docs.append(json.loads(out.read_text())["layers"])
    assert docs[0] == docs[1]


@pytest.mark.parametrize(
    "args,code,stderr",
    [
        (["-g", "4", "-r", "3"], 2,
         "error: --redundant: 8 experts + 3 redundant = 11 slots do not split evenly over 4"
         " GPUs\nhint: engines need equal slots per GPU: try --redundant 0 or 4\n"),
        (["-g", "4", "-s", "nope"], 2, "error: --solver: unknown solver 'nope'\n"),
        (["-g", "4", "--fit", "x"], 2,
         "error: --fit: expected a window range START:STOP, got 'x'\n"),
        (["-t", "dgx-h100", "-m", "deepseek-v3"], 1,
         "error: {trace}: num_experts is 8 here but 256 in the declared num_experts\n"
         "hint: check --model and --num-experts against the trace\n"),
        (["-t", "dgx-h100", "-m", "deepseek-v3", "--top-k", "2"], 2,
         "error: --top-k: --top-k 2 contradicts the model deepseek-v3 (top_k = 8)\n"
         "hint: drop --top-k, or name the model the trace came from\n"),
    ],
)
def test_plan_errors(skewed_trace, tmp_path, args, code, stderr):
    out = tmp_path / "plan.json"
    result = _plan(str(skewed_trace), *args, "-o", str(out))
    assert result.exit_code == code
    assert result.stderr.startswith(stderr.format(trace=skewed_trace))
    assert not out.exists()


def test_plan_beyond_the_memory_budget(skewed_trace, tmp_path):
    result = _plan(
        str(skewed_trace), "-t", "dgx-h100", "-m", "mixtral-8x7b", "-S", "5",
        "-o", str(tmp_path / "plan.json"),
    )
    assert result.exit_code == 1
    assert result.stderr.startswith(
        "error: --slots-per-gpu: 5 slots per GPU need 56.4 GB of expert weights per GPU"
    )
    assert "hint: use at most --slots-per-gpu 4 (--redundant 24)" in result.stderr


def test_installed_placer_plans(skewed_trace, tmp_path):
    out = tmp_path / "plan.json"
    placer = Path(sys.executable).parent / "placer"
    proc = subprocess.run(
        [str(placer), "plan", str(skewed_trace), "-g", "2", "-r", "2", "-o", str(out)],
        capture_output=True, text=True, env={"NO_COLOR": "1", "PATH": ""},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"placement    {out}\n")
    assert read_placement(out).num_physical == 10


# -- the summary: workload, judged windows, verdict (placer.summary) -----------------------


@pytest.fixture
def full_mixtral(tmp_path: Path) -> Path:
    """200 tokens of Mixtral 8x7B routing over all 32 MoE layers (engine files need every
    layer), top-2 of 8 skewed to expert 0, 4 steps of 50 tokens; seeded."""
    rng = np.random.default_rng(7)
    p = np.array([0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05])
    topk = np.array([[rng.choice(8, 2, replace=False, p=p) for _ in range(32)]
                     for _ in range(200)], dtype=np.int32)
    path = tmp_path / "mixtral.npz"
    write_npz_trace(path, topk, layer_ids=list(range(32)), step=np.arange(200) // 50,
                    meta={"model": "mixtral-8x7b", "num_experts": 8, "top_k": 2})
    return path


H100 = ["-t", "dgx-h100", "-m", "mixtral-8x7b", "-r", "8"]


def test_plan_summary_judges_held_out_windows_under_the_default_workload(skewed_trace,
                                                                         tmp_path):
    out = tmp_path / "plan.json"
    result = _plan(str(skewed_trace), *H100, "-s", "round_robin", "--fit", "0:6",
                   "-o", str(out), "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["regime"] == {
        "engine": "vllm", "workload": "decode", "tokens_per_gpu": 128, "policy": "vllm_hash",
        "mode": "low_latency", "seed": 0, "batch_tokens": 1024,
        "note": "set with --engine/--workload"}
    judged = doc["judged"]
    assert (judged["part"], judged["windows"], judged["fitted"], judged["source"]) == (
        "held-out", [6, 8], [0, 6], "trace")
    assert judged["num_tokens"] == 100 and judged["num_batches"] == 1
    assert list(doc["times"]) == ["round_robin", "eplb"]
    for figures in doc["times"].values():
        assert set(figures) == {"moe_layer_p50_us", "moe_layer_p99_us", "layer_p99_us_median",
                                "layer_p99_us_worst", "step_p50_us", "step_p99_us",
                                "step_mean_us", "all_to_all_us", "compute_us"}
        assert 0 < figures["moe_layer_p50_us"] <= figures["moe_layer_p99_us"]
    # the floor: below both plans on every figure it bounds, and the gaps say by how much
    floor = doc["floor"]
    for key, value in floor.items():
        if key.startswith("remote_copies"):  # the traffic it counts, not a time
            assert value >= 0
            continue
        for figures in doc["times"].values():
            assert 0 < value <= figures[key] + 1e-9, key
    for name, gap in doc["gap_to_floor"].items():
        assert gap == pytest.approx(1 - floor["step_mean_us"] / doc["times"][name]["step_mean_us"])
    assert sum(doc["layers_faster"].values()) == 4
    assert doc["verdict"]["text"].startswith("verdict: round_robin ")
    assert doc["verdict"]["text"].endswith(" on held-out step p99 (vllm decode)")
    assert doc["versus"]["columns"] == ["round_robin", "eplb"]

    text = _plan(str(skewed_trace), *H100, "-s", "round_robin", "--fit", "0:6",
                 "-o", str(out)).stdout.splitlines()
    assert text[5] == ("judged as    vllm decode, 128 tokens per GPU (vllm_hash dispatch,"
                       " low_latency all-to-all); set with --engine/--workload")
    assert text[6] == ("judged on    held-out windows 6:8 (fitted 0:6), per-token replay:"
                       " 1 batch of up to 1024 tokens, 100 tokens")
    assert doc["verdict"]["text"] in text
    assert any(line.startswith("floor: no placement with ") for line in text)


def test_plan_judges_a_large_trace_on_a_stated_sample(skewed_trace, tmp_path, monkeypatch):
    """A trace over the size kept whole is read as a sample of whole batches (one per
    window); the command replays that sample and says what it judged: N of the held-out
    windows' M tokens, K batches, in the text and in the JSON."""
    import placer.summary

    monkeypatch.setattr(placer.summary, "JUDGE_WHOLE_SELECTIONS", 0)
    out = tmp_path / "plan.json"
    # 2 tokens per GPU x 8 GPUs: batches of 16 tokens, 3 or 4 starting in each 50-token window
    args = [str(skewed_trace), *H100, "-s", "eplb", "--fit", "0:6", "--tokens-per-gpu", "2",
            "-o", str(out)]
    doc = json.loads(_plan(*args, "--json").stdout)
    judged = doc["judged"]
    assert judged["source"] == "trace" and judged["windows"] == [6, 8]
    assert (judged["num_batches"], judged["batch_tokens"]) == (2, 16)
    assert (judged["num_tokens"], judged["of_tokens"]) == (32, 100)
    assert judged["sample"] == {"trace_tokens": 400, "batches_held": 2, "per_window": 1,
                                "seed": 0, "batches_judged": 2}
    assert "read as a sample of whole batches, 1 per window (seed 0)" in judged["why"]
    text = _plan(*args).stdout.splitlines()
    assert text[6].startswith("judged on    held-out windows 6:8 (fitted 0:6), per-token"
                              " replay: 2 batches of up to 16 tokens, 32 of 100 tokens (")
    assert text[6].endswith(f"({judged['why']})")
    again = json.loads(_plan(*args, "--json").stdout)  # the same sample, the same figures
    assert again["judged"] == judged and again["times"] == doc["times"]


def test_plan_samples_from_the_statistics_when_no_sampled_batch_is_held_out(
        skewed_trace, tmp_path, monkeypatch):
    """Batches of 1,024 tokens on a 400-token trace: the one batch starts in window 0, none
    in the held-out windows; the judge samples batches from the statistics and says why."""
    import placer.summary

    monkeypatch.setattr(placer.summary, "JUDGE_WHOLE_SELECTIONS", 0)
    out = tmp_path / "plan.json"
    args = [str(skewed_trace), *H100, "-s", "eplb", "--fit", "0:6", "-o", str(out)]
    doc = json.loads(_plan(*args, "--json").stdout)
    assert doc["judged"]["source"] == "sampled"
    assert doc["judged"]["why"].endswith(
        "the per-token sample holds no batch that starts in windows 6:8; sampled batches"
        " instead")
    assert next(iter(doc)) == "output" and doc["output"] == str(out)
    text = _plan(*args).stdout.splitlines()
    assert text[6].startswith("judged on    held-out windows 6:8 (fitted 0:6), sampled batches")
    assert text[6].endswith(f"({doc['judged']['why']})")


def test_plan_workload_prefill_changes_mode_and_batch(skewed_trace, tmp_path):
    result = _plan(str(skewed_trace), *H100, "-s", "eplb", "--workload", "prefill",
                   "--tokens-per-gpu", "16", "--engine", "sglang",
                   "-o", str(tmp_path / "plan.json"), "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["regime"]["mode"] == "normal" and doc["regime"]["policy"] == "sglang"
    assert doc["regime"]["batch_tokens"] == 16 * 8 == doc["judged"]["batch_tokens"]
    assert doc["regime"]["note"] == "engine from --engine; set with --engine/--workload"
    # eplb alone: its times, no side-by-side and no verdict; every window judged
    assert list(doc["times"]) == ["eplb"] and doc["verdict"] is None and "versus" not in doc
    assert doc["judged"]["part"] == "fitted" and doc["judged"]["num_batches"] == 4


@pytest.mark.parametrize("exports,engine,note", [
    (["sglang"], "sglang", "engine from --export sglang"),
    (["vllm-ascend"], "vllm", "engine from --export vllm-ascend"),
    (["trtllm", "eplb"], "trtllm", "engine from --export trtllm"),
    (["sglang", "trtllm"], "vllm",
     "default engine (exports for sglang, trtllm: choose with --engine)"),
])
def test_plan_engine_implied_by_export(full_mixtral, tmp_path, exports, engine, note):
    names = {"sglang": "s.json", "vllm-ascend": "v.json", "trtllm": "t.yaml", "eplb": "e.json"}
    args = [a for fmt in exports for a in ("--export", f"{fmt}:{tmp_path / names[fmt]}")]
    # vLLM-Ascend's map cannot hold an expert twice on a GPU, which the reference EPLB does
    solver = "eplb-valid" if "vllm-ascend" in exports else "eplb"
    result = _plan(str(full_mixtral), *H100, "-s", solver, "-o", str(tmp_path / "p.json"),
                   "--json", *args)
    assert result.exit_code == 0, result.stderr
    workload = json.loads(result.stdout)["regime"]
    assert workload["engine"] == engine
    assert workload["note"] == f"{note}; set with --engine/--workload"


def test_plan_engine_that_contradicts_the_export(full_mixtral, tmp_path):
    out = tmp_path / "plan.json"
    result = _plan(str(full_mixtral), *H100, "-o", str(out), "--engine", "trtllm",
                   "--export", f"sglang:{tmp_path / 's.json'}")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[:2] == [
        "error: --engine: --engine trtllm contradicts --export sglang (an engine file for"
        " sglang)",
        "hint: drop --engine (the export implies sglang), or export for trtllm",
    ]
    assert not out.exists()
    # one of several exported engines is a choice, not a contradiction
    result = _plan(str(full_mixtral), *H100, "-s", "eplb", "-o", str(out), "--json",
                   "--engine", "sglang", "--export", f"sglang:{tmp_path / 's.json'}",
                   "--export", f"trtllm:{tmp_path / 't.yaml'}")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["regime"]["policy"] == "sglang"


@pytest.mark.parametrize("args,stderr", [
    (["--engine", "deepspeed"], "error: --engine: unknown engine 'deepspeed'\n"),
    (["--workload", "train"], "error: --workload: unknown workload 'train'\n"),
])
def test_plan_unknown_engine_or_workload(skewed_trace, tmp_path, args, stderr):
    result = _plan(str(skewed_trace), *H100, *args, "-o", str(tmp_path / "plan.json"))
    assert result.exit_code == 2
    assert result.stderr.startswith(stderr)


def test_plan_redundant_auto_times_the_candidates_and_says_why(skewed_trace, tmp_path):
    """Mixtral on 8 GPUs: 1 slot per GPU up to what memory holds; the JSON lists every
    candidate, and the placement has the chosen redundancy."""
    out = tmp_path / "auto.json"
    result = _plan(
        str(skewed_trace), "-t", "dgx-h100", "-m", "mixtral-8x7b", "--solver", "eplb",
        "--redundant", "auto", "--json", "-o", str(out),
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    auto = doc["redundant_auto"]
    steps = [o["step_us"] for o in auto["options"]]
    assert auto["options"][0]["slots_per_gpu"] == 1
    chosen = next(o for o in auto["options"] if o["redundant"] == auto["redundant"])
    assert chosen["step_us"] <= min(steps) * 1.005
    assert read_placement(out).num_physical == 8 + auto["redundant"]
    assert auto["reason"].startswith(f"--redundant auto: {auto['redundant']} redundant")
    text = _plan(str(skewed_trace), "-t", "dgx-h100", "-m", "mixtral-8x7b", "--solver",
                 "eplb", "--redundant", "auto", "-o", str(out))
    assert "candidates (redundant: EPLB's µs per step, as above): 0: " in text.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--redundant", "lots"], "error: --redundant: expected a number of redundant experts or"
     " auto, got 'lots'"),
    (["--redundant", "auto", "--slots-per-gpu", "2"],
     "error: --slots-per-gpu: --redundant auto chooses the slots per GPU itself"),
])
def test_plan_redundant_usage_errors(skewed_trace, tmp_path, args, message):
    result = _plan(str(skewed_trace), "-t", "dgx-h100", "-m", "mixtral-8x7b",
                   "-o", str(tmp_path / "p.json"), *args)
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == message


def test_plan_redundant_auto_needs_model_and_topology(skewed_trace, tmp_path):
    result = _plan(str(skewed_trace), "-g", "8", "--redundant", "auto",
                   "-o", str(tmp_path / "p.json"))
    assert result.exit_code == 2
    assert "needs the model and the cluster" in result.stderr
