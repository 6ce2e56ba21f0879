"""``placer stats`` and ``placer synth`` end to end (CliRunner and the installed command)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from placer.cli.main import app

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]
PLACER = REPO / ".venv" / "bin" / "placer"


def run(*args: str):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def small_trace(tmp_path: Path) -> Path:
    """3,000 tokens, layers 0-3, 16 experts, top-2, clusters and drift, steps of 250 tokens."""
    path = tmp_path / "small.jsonl"
    result = run("synth", path, "--tokens", "3000", "--layers", "4", "--experts", "16",
                 "--top-k", "2", "--clusters", "4", "--drift", "0.3", "--tokens-per-step",
                 "250", "--ranks", "2", "--seed", "5")
    assert result.exit_code == 0, result.stderr
    return path


def test_synth_then_stats_json_totals(small_trace: Path):
    result = run("stats", small_trace, "--json", "--top", "3")
    assert result.exit_code == 0, result.stderr
    s = json.loads(result.stdout)
    t = s["totals"]
    assert (t["tokens"], t["selections"], t["rows_read"]) == (3000, 3000 * 4 * 2, 3000 * 4)
    assert t["rows_skipped_total"] == 0 and t["synthetic"] is True
    assert (t["layers"], t["experts"], t["top_k"], t["windows"]) == (4, 16, 2, 12)
    assert [x["layer"] for x in s["layers"]] == [0, 1, 2, 3]
    assert len(s["layers"][0]["hottest"]) == 3 and len(s["layers"][0]["pairs"]) == 3
    assert s["layers"][0]["drift"]["windows_compared"] == 12
    assert s["layers"][0]["coact_coverage"] == pytest.approx(1.0)
    assert len(s["affinity"]) == 3
    assert "synthetic" in result.stderr


def test_stats_table_and_layer_filter(small_trace: Path):
    result = run("stats", small_trace, "--layer", "2", "--window-tokens", "1000")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "per layer (load summed over windows)" in out
    assert "3 window(s)" in out and "tokens 3,000  selections 24,000  rows read 12,000" in out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("2 ")]
    assert rows and rows[0][1] == "3,000"
    assert "\x1b[" not in out  # no colour codes when not a terminal


def test_synth_same_seed_same_file(tmp_path: Path):
    args = ["--tokens", "500", "--layers", "2", "--experts", "8", "--top-k", "2", "--seed", "3"]
    for name in ("a.jsonl", "b.jsonl"):
        assert run("synth", tmp_path / name, *args).exit_code == 0
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    for name in ("a.npz", "b.npz"):
        assert run("synth", tmp_path / name, *args).exit_code == 0
    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    assert sorted(a.files) == sorted(b.files)
    for key in a.files:
        np.testing.assert_array_equal(a[key], b[key])
    assert bool(a["synthetic"]) is True


def test_synth_model_preset_and_json(tmp_path: Path):
    path = tmp_path / "ds.npz"
    result = run("synth", path, "--model", "deepseek-v3", "--tokens", "300", "--layers",
                 "3-5", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["layers"], report["experts"], report["top_k"]) == (3, 256, 8)
    z = np.load(path)
    assert z["topk_ids"].shape == (300, 3, 8)
    assert z["layer_ids"].tolist() == [3, 4, 5]
    assert str(z["model"]) == "deepseek-v3" and int(z["synth_num_groups"]) == 8
    groups = np.sort(z["topk_ids"] // 32, axis=2)
    assert (1 + (groups[:, :, 1:] != groups[:, :, :-1]).sum(axis=2)).max() <= 4


def test_stats_of_bundled_qwen3_statistics():
    """The bundled Qwen3-30B-A3B file: lifts agree with the source's published values."""
    result = run("stats", REPO / "traces" / "qwen3-30b-a3b.npz", "--json", "--layer", "0")
    assert result.exit_code == 0, result.stderr
    s = json.loads(result.stdout)
    assert s["totals"]["tokens"] == 75773 and s["totals"]["model"] == "qwen3-30b-a3b"
    top = s["layers"][0]["pairs"][0]
    assert top["experts"] == [65, 73] and top["count"] == 7806
    assert top["lift"] == pytest.approx(6.54, abs=0.005)  # the source lists 6.54
    assert "co-activation is partial" in result.stderr


def test_installed_command_prints_json_for_bundled_trace():
    proc = subprocess.run(
        [str(PLACER), "stats", "traces/synthetic-small.jsonl.gz", "--json", "--top", "2"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    assert s["totals"]["synthetic"] is True and s["totals"]["tokens"] == 8192
    assert s["overall"]["drift"] is not None


# -- bad input ---------------------------------------------------------------------------------


def test_missing_trace_is_a_data_error(tmp_path: Path):
    result = run("stats", tmp_path / "nope.jsonl")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: {tmp_path / 'nope.jsonl'}: file not found\n")
    assert "hint: " in result.stderr and "Traceback" not in result.stderr


def test_malformed_trace_is_a_data_error(tmp_path: Path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"layer": 0, "experts": [1, 2]}\n{"layer": 0, "experts": oops}\n')
    result = run("stats", bad)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: {bad}:2: ")
    assert "hint: " in result.stderr and "Traceback" not in result.stderr


def test_unknown_layer_is_a_usage_error(small_trace: Path):
    result = run("stats", small_trace, "--layer", "9")
    assert result.exit_code == 2
    assert result.stderr == (
        "error: --layer: layer 9 is not in the trace\nhint: layers present: 0-3\n"
    )


def test_bad_synth_options_name_the_option(tmp_path: Path):
    result = run("synth", tmp_path / "x.npz", "--experts", "10", "--groups", "4")
    assert result.exit_code == 2
    assert result.stderr == (
        "error: --groups: groups must divide the 10 experts, got 4\n"
        "hint: DeepSeek-V3 uses 8 groups of 32 experts\n"
    )
    result = run("synth", tmp_path / "x.csv", "--tokens", "10")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: OUTPUT: cannot tell the trace format of ")
    result = run("synth", tmp_path / "x.npz", "--layers", "5-2")
    assert result.exit_code == 2
    assert result.stderr == (
        "error: --layers: cannot read layers '5-2'\n"
        "hint: give a count (58), a range (3-60) or a list (0,2,5-7)\n"
    )
    assert not (tmp_path / "x.npz").exists()
