"""``placer replay`` end to end: tables, JSON, sweeps, the engines' flags, bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from placer.cli.main import app
from placer.placement import Placement
from placer.placement.document import write_placement

runner = CliRunner()

MODEL = "mixtral-8x7b"  # 8 experts, top-2
TOPOLOGY = "dgx-h100"  # 8 GPUs, one node
LAYERS = np.arange(4)
BUNDLED = Path(__file__).resolve().parents[2] / "traces" / "synthetic-dsv3-drift.npz"


@pytest.fixture()
def trace(tmp_path: Path) -> Path:
    """A per-token NPZ trace for Mixtral's layers 0-3: 1,024 tokens from 8 ranks, the hot
    expert moving from 0 to 5 halfway."""
    rng = np.random.default_rng(0)
    ids = np.empty((1024, 4, 2), dtype=np.int32)
    for half, hot in enumerate((0, 5)):
        weights = np.ones(8)
        weights[hot] = 6
        keys = np.log(weights) + rng.gumbel(size=(512, 4, 8))  # Gumbel top-k: no repeats
        ids[half * 512 : (half + 1) * 512] = np.argsort(-keys, axis=2)[:, :, :2]
    path = tmp_path / "trace.npz"
    np.savez(path, topk_ids=ids, step=np.arange(1024) // 32, rank=np.arange(1024) % 8,
             layer_ids=LAYERS, num_experts=8, top_k=2)
    return path


def _replay(*args: str):
    return runner.invoke(app, ["replay", *args, "-m", MODEL, "-t", TOPOLOGY, "-r", "8",
                               "--tokens-per-gpu", "4", "-q"])


def test_the_default_policies_are_the_engines_and_the_tables_are_printed(trace):
    result = _replay(str(trace))
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "replayed     " in out and "32 steps, 1,024 tokens, 4 layers" in out
    assert "judged as    vllm decode, 4 tokens per GPU (vllm_hash dispatch" in out
    for label in ("static:default", "eplb:window=1000,interval=3000,first=2250,async,layers=1",
                  "placer:window=1000,interval=3000", "oracle:interval=3000"):
        assert label in out
    assert "verdict: " in out
    # the verdict names the kind it recommends, and flags only for what it recommends
    (line,) = [x for x in out.splitlines() if x.startswith("recommended: ")]
    kind = line.split("(")[-1].split(":")[0]
    if kind == "static":
        assert "online EPLB off" in out and "--enable-eplb --eplb-config" not in out
    elif kind == "placer":
        assert "PLACER_VLLM_POLICY=" in out
    # the engine's own cadence never rebalances within 32 steps: said, not hidden
    assert "note: eplb:window=1000,interval=3000,first=2250,async,layers=1 first rebalances" \
        " at step 2250: never within these 32 steps" in out
    assert "note: oracle:interval=3000 fits one placement on all 32 steps" in out


def test_json_sweep_and_the_flags_to_paste(trace):
    result = _replay(str(trace), "--engine", "sglang", "-P", "eplb:window=8,interval=8",
                     "-P", "placer:window=8,interval=8", "-P", "oracle:interval=8",
                     "--sweep", "interval=4,8", "--sweep", "window=4,16", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    labels = [p["policy"] for p in doc["policies"]]
    assert labels == ["eplb:window=4,interval=4", "eplb:window=16,interval=4",
                      "eplb:window=4,interval=8", "eplb:window=16,interval=8",
                      "placer:window=8,interval=8", "oracle:interval=8"]
    assert doc["judged_as"].startswith("sglang decode, 4 tokens per GPU (sglang dispatch")
    assert doc["steps"] == 32 and doc["redundant"] == 8 and doc["slots_per_gpu"] == 2
    best = min((p for p in doc["policies"] if p["policy"].startswith("eplb")),
               key=lambda p: p["figures"]["step_mean_us"])
    winner = min((p for p in doc["policies"] if not p["policy"].startswith("oracle")),
                 key=lambda p: p["figures"]["step_mean_us"])
    kind = winner["policy"].split(":")[0]
    assert doc["recommended"] == {"kind": kind, "policy": winner["policy"]}
    if kind == "static":  # served as planned: no engine flags to paste
        assert doc["deploy"] == {}
        return
    (sglang_key,) = [k for k in doc["deploy"] if k.startswith("SGLang")]
    # SGLang runs no policy but its own: the best eplb setting either way
    assert sglang_key.startswith("SGLang (") and sglang_key.endswith(f"{best['policy']})")
    window, interval = (int(part.split("=")[1]) for part in
                        best["policy"].split(":")[1].split(","))
    assert doc["deploy"][sglang_key].startswith(
        f"--enable-eplb --eplb-rebalance-num-iterations {interval}")
    (vllm_key,) = [k for k in doc["deploy"] if k.startswith("vLLM")]
    if kind == "placer":  # vLLM runs placer's own policy through the plugin
        assert vllm_key == f"vLLM ({winner['policy']})"
        assert doc["deploy"][vllm_key].startswith("PLACER_VLLM_POLICY='")
        config = json.loads(doc["deploy"][vllm_key].split("'")[3])
        assert config == {"window_size": 8, "step_interval": 8, "num_redundant_experts": 8,
                          "use_async": False}
        return
    config = json.loads(doc["deploy"][vllm_key].split("'")[1])
    assert config == {"window_size": window, "step_interval": interval,
                      "num_redundant_experts": 8, "use_async": False}
    for policy in doc["policies"]:
        figures = policy["figures"]
        # a step costs its serving time plus its share of the stalls, on average
        assert figures["step_mean_us"] == pytest.approx(
            figures["serving_mean_us"] + figures["stall_s"] * 1e6 / 32, rel=1e-9)
        assert len(policy["segments"]) == 4
        assert sum(s["rebalances"] for s in policy["segments"]) == figures["rebalances"]
    assert doc["verdict"].startswith("verdict: ")
    assert set(doc["versus_oracle"]) == set(labels[:-1])


@pytest.mark.parametrize(("spec", "message", "hint"), [
    ("eplp:window=4,interval=4", "unknown policy 'eplp:window=4,interval=4'",
     "hint: did you mean eplb? policies: static:FILE | static:default; eplb:window=N,"),
    ("eplb:windw=4,interval=4", "unknown key 'windw' in policy",
     "hint: did you mean window? eplb takes: window, interval, redundant, async, first,"),
    ("placer:window=4", "policy 'placer:window=4' needs interval",
     "hint: add interval=N (steps)"),
    ("eplb:window=4,interval=0", "interval must be at least 1", "hint: interval=1 or more"),
    ("static", "static needs a placement", "hint: static:FILE (placement JSON) or"),
])
def test_a_policy_with_a_typo_is_a_usage_error_with_the_policies(trace, spec, message, hint):
    result = _replay(str(trace), "-P", spec)
    assert result.exit_code == 2
    assert f"error: --rebalance: {message}" in result.stderr
    assert hint in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_sweeps_and_redundancy_are_usage_errors(trace):
    result = _replay(str(trace), "--sweep", "intervall=4,8")
    assert result.exit_code == 2
    assert "cannot sweep 'intervall=4,8'" in result.stderr
    assert "did you mean interval?" in result.stderr
    odd = runner.invoke(app, ["replay", str(trace), "-m", MODEL, "-t", TOPOLOGY, "-r", "3",
                              "-q"])
    assert odd.exit_code == 2
    assert "8 experts + 3 redundant do not split evenly over 8 GPUs" in odd.stderr


def test_a_trace_of_another_model_is_a_data_error(trace):
    result = runner.invoke(app, ["replay", str(trace), "-m", "deepseek-v3", "-t",
                                 "4x-dgx-h100", "-q"])
    assert result.exit_code == 1
    assert "error: " in result.stderr and "hint: replay with the" in result.stderr


def test_a_static_placement_of_another_cluster_is_a_data_error(trace, tmp_path):
    path = tmp_path / "four.json"
    write_placement(path, Placement(np.tile(np.arange(8), (4, 1)), LAYERS, 8, 4),
                    model_name=MODEL)
    result = _replay(str(trace), "-P", f"static:{path}")
    assert result.exit_code == 1
    assert "the placement is for 4 GPUs, the topology has 8" in result.stderr


def test_trace_steps_are_said_in_the_judged_as_line(trace):
    result = _replay(str(trace), "--trace-steps", "-P", "static:default")
    assert result.exit_code == 0, result.stderr
    assert "32 steps" in result.stdout
    assert "judged as    vllm decode, the trace's own steps (vllm_hash" in result.stdout


@pytest.mark.slow
def test_a_static_replay_is_placer_evaluate_on_the_same_batches(tmp_path):
    plan = tmp_path / "eplb.json"
    made = runner.invoke(app, ["plan", str(BUNDLED), "-m", "deepseek-v3", "-t", "4x-dgx-h100",
                               "-r", "32", "-s", "eplb", "-o", str(plan), "-q"])
    assert made.exit_code == 0, made.stderr
    evaluated = runner.invoke(app, ["evaluate", str(BUNDLED), "-p", str(plan), "-m",
                                    "deepseek-v3", "-t", "4x-dgx-h100", "--engine", "sglang",
                                    "--json"])
    assert evaluated.exit_code == 0, evaluated.stderr
    parts = {p["name"]: p for p in json.loads(evaluated.stdout)["parts"]}
    replayed = runner.invoke(app, ["replay", str(BUNDLED), "-m", "deepseek-v3", "-t",
                                   "4x-dgx-h100", "-r", "32", "--engine", "sglang", "-P",
                                   f"static:{plan}", "--segments", "4", "--json", "-q"])
    assert replayed.exit_code == 0, replayed.stderr
    (policy,) = json.loads(replayed.stdout)["policies"]
    # evaluate's held-out part is windows 48:64 = the last 4 of 16 steps of 4,096 tokens
    held = parts["held-out"]
    assert held["params"]["batch_tokens"] == 4096 and held["windows"] == [48, 64]
    metrics = held["placements"][0]["metrics"]
    segment = policy["segments"][3]
    assert segment["steps"] == [12, 16]
    for key in ("step_mean_us", "step_p50_us", "step_p99_us"):
        assert segment[key] == pytest.approx(metrics[key], rel=1e-9), key
    fit = parts["fit"]["placements"][0]["metrics"]["step_mean_us"]
    assert policy["figures"]["step_mean_us"] == pytest.approx(
        (12 * fit + 4 * metrics["step_mean_us"]) / 16, rel=1e-9)


@pytest.mark.slow
def test_report_and_pictures(trace, tmp_path):
    report = tmp_path / "replay.html"
    (tmp_path / "png").mkdir()  # placer creates no folder
    result = _replay(str(trace), "-P", "static:default", "-P", "eplb:window=8,interval=8",
                     "-P", "oracle:interval=8", "--report", str(report), "--png-dir",
                     str(tmp_path / "png"))
    assert result.exit_code == 0, result.stderr
    html = report.read_text()
    assert "eplb:window=8,interval=8" in html and "<img" in html
    assert list((tmp_path / "png").glob("*.png"))


def test_a_replay_too_short_to_pay_back_says_so_with_the_break_even(trace):
    args = (str(trace), "--engine", "sglang", "-P", "static:default",
            "-P", "eplb:window=4,interval=4", "-P", "placer:window=4,interval=4")
    result = _replay(*args, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    rows = {row["policy"]: row for row in doc["payback"]}
    for policy in doc["policies"]:
        if policy["policy"].startswith("static") or not policy["rebalances"]:
            assert policy["policy"] not in rows
            continue
        row = rows[policy["policy"]]
        assert row["static"] == "static:default"
        figures = policy["figures"]
        # the cost a rebalance: its stalls over the replay, per rebalance (sync on SGLang)
        assert row["cost_s"] == pytest.approx(figures["stall_s"] / figures["rebalances"])
        if row["gain_us_per_step"] > 0:
            assert row["break_even_steps"] == pytest.approx(
                row["cost_s"] * 1e6 / row["gain_us_per_step"])
    fits = [r for r in rows.values() if r["break_even_steps"] is not None
            and r["first_rebalance_step"] + r["break_even_steps"] <= doc["steps"]]
    said = [n for n in doc["notes"] if n.startswith("this replay (32 steps")]
    # SGLang's synchronous copies stall far longer than 32 steps' gain: said, not hidden
    assert rows and not fits and len(said) == 1
    text = _replay(*args)
    assert f"note: {said[0]}" in text.stdout
