"""``placer evaluate`` end to end: tables, JSON, held-out parts, bad inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from placer.cli.main import app
from placer.placement import Placement
from placer.placement.document import write_placement

runner = CliRunner()

MODEL = "mixtral-8x7b"  # 32 MoE layers (0..31) x 8 experts, top-2
TOPOLOGY = "dgx-h100"  # 8 GPUs, one node
LAYERS = np.arange(32)


@pytest.fixture()
def trace(tmp_path: Path) -> Path:
    """A per-token NPZ trace for Mixtral: 8 steps of 32 tokens, expert 0 hot, ranks known."""
    rng = np.random.default_rng(0)
    weights = np.array([6, 2, 1, 1, 1, 1, 1, 1], dtype=float)
    keys = np.log(weights) + rng.gumbel(size=(256, 32, 8))  # Gumbel top-k: no repeats
    ids = np.argsort(-keys, axis=2)[:, :, :2].astype(np.int32)
    path = tmp_path / "trace.npz"
    np.savez(path, topk_ids=ids, step=np.arange(256) // 32, rank=np.arange(256) % 8,
             layer_ids=LAYERS, num_experts=8, top_k=2)
    return path


def _placement(tmp_path: Path, name: str, rows: np.ndarray, layers=LAYERS, experts=8) -> Path:
    path = tmp_path / f"{name}.json"
    write_placement(path, Placement(rows, layers, experts, 8), model_name=MODEL)
    return path


@pytest.fixture()
def linear(tmp_path: Path) -> Path:
    """Expert e on GPU e: no replicas."""
    return _placement(tmp_path, "linear", np.tile(np.arange(8), (32, 1)))


@pytest.fixture()
def replicated(tmp_path: Path) -> Path:
    """Two slots per GPU: GPU g holds experts g and 0 (g > 0) or 0 and 1 (g = 0)."""
    row = [0, 1] + [x for g in range(1, 8) for x in (g, 0)]
    return _placement(tmp_path, "replicated", np.tile(row, (32, 1)))


def _table_values(text: str, columns: int) -> dict[str, dict[str, list[str]]]:
    """{part title: {metric: [cells]}} parsed from the rendered tables (``columns``
    placement columns between the unit and the description)."""
    parts: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith(("fit:", "held-out:", "all:")):
            current = parts.setdefault(line.split(":")[0], {})
            continue
        cells = line.split()
        if len(cells) >= 3 and cells[0].replace("_", "").isalnum() and cells[0] != "metric":
            current[cells[0]] = cells[2 : 2 + columns]
    return parts


def test_json_parses_and_matches_the_table(trace, linear, replicated):
    args = ["evaluate", str(trace), "-p", str(linear), "-p", str(replicated),
            "-m", MODEL, "-t", TOPOLOGY, "--tokens-per-gpu", "4"]  # steps of 32 tokens
    table = runner.invoke(app, args)
    as_json = runner.invoke(app, [*args, "--json"])
    assert table.exit_code == 0, table.output
    assert as_json.exit_code == 0, as_json.output
    report = json.loads(as_json.stdout)
    parsed = _table_values(table.stdout, 2)
    # 8 steps = 8 windows: default split holds out the last quarter
    assert [(p["name"], p["windows"]) for p in report["parts"]] == [
        ("fit", [0, 6]), ("held-out", [6, 8])
    ]
    from placer.metrics import cell

    for part in report["parts"]:
        rows = parsed[part["name"]]
        assert [c["name"] for c in part["placements"]] == ["linear", "replicated"]
        for i, column in enumerate(part["placements"]):
            for key, value in column["metrics"].items():
                assert rows[key][i] == cell(key, value), key
    fit_linear = report["parts"][0]["placements"][0]["metrics"]
    fit_replicated = report["parts"][0]["placements"][1]["metrics"]
    assert fit_linear["num_tokens"] == 192 and fit_linear["num_batches"] == 6
    assert fit_replicated["hot_shard_ratio_median"] < fit_linear["hot_shard_ratio_median"]
    assert fit_linear["remote_copies_per_token_node"] == 0.0  # one node


def test_explicit_fit_and_eval_ranges(trace, linear):
    result = runner.invoke(app, ["evaluate", str(trace), "-p", str(linear), "-m", MODEL,
                                 "-t", TOPOLOGY, "--fit", "0:2", "--eval", "4:", "--json",
                                 "--mode", "low_latency", "--dispatch", "local_first"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [(p["name"], p["windows"]) for p in report["parts"]] == [
        ("fit", [0, 2]), ("held-out", [4, 8])
    ]
    assert report["regime"]["mode"] == "low_latency"
    assert report["regime"]["policy"] == "local_first"
    assert report["parts"][1]["placements"][0]["metrics"]["num_tokens"] == 128


def test_placement_for_another_model_is_refused(tmp_path, trace):
    other = _placement(tmp_path, "other", np.tile(np.arange(16), (32, 1)), experts=16)
    result = runner.invoke(app, ["evaluate", str(trace), "-p", str(other), "-m", MODEL,
                                 "-t", TOPOLOGY])
    assert result.exit_code == 1
    assert (f"error: {other}: the placement has 16 experts per layer but {MODEL} has 8"
            in result.stderr)
    assert "hint: plan with the model you deploy (--model)" in result.stderr


def test_placement_missing_layers_is_refused(tmp_path, trace):
    half = _placement(tmp_path, "half", np.tile(np.arange(8), (16, 1)), layers=np.arange(16))
    result = runner.invoke(app, ["evaluate", str(trace), "-p", str(half), "-m", MODEL,
                                 "-t", TOPOLOGY])
    assert result.exit_code == 1
    assert f"error: {half}: the placement has no layer 16-31 of the routing data" in result.stderr
    assert "hint: placement layers: 0-15" in result.stderr


def test_bad_window_range_is_a_usage_error(trace, linear):
    result = runner.invoke(app, ["evaluate", str(trace), "-p", str(linear), "-m", MODEL,
                                 "-t", TOPOLOGY, "--eval", "6:20"])
    assert result.exit_code == 2
    assert "error: --eval: window range 6:20 is outside the trace's 8 windows" in result.stderr


def test_unknown_policy_names_the_option(trace, linear):
    result = runner.invoke(app, ["evaluate", str(trace), "-p", str(linear), "-m", MODEL,
                                 "-t", TOPOLOGY, "--dispatch", "fastest"])
    assert result.exit_code == 2
    assert "error: --dispatch: unknown dispatch policy 'fastest'" in result.stderr
    assert ("hint: choose one of: vllm_hash, trtllm_block, round_robin, sglang, local_first,"
            " random") in result.stderr


def test_model_and_topology_default_to_the_placements(trace, linear):
    result = runner.invoke(app, ["evaluate", str(trace), "-p", str(linear), "-t", TOPOLOGY,
                                 "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["model"] == MODEL


def test_installed_command_prints_json(trace, linear):
    exe = Path(sys.executable).parent / "placer"
    proc = subprocess.run(
        [str(exe), "evaluate", str(trace), "-p", str(linear), "-m", MODEL, "-t", TOPOLOGY,
         "--eval", "0:8", "--json"],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["parts"][0]["name"] == "held-out"
    assert report["parts"][0]["placements"][0]["metrics"]["num_tokens"] == 256
    assert "evaluating" in proc.stderr
