"""``placer synth`` skew: measured routing's by default, presets, a warning far from it,
tokens fitted to a measured file (``--from``), and progress lines in a batch job's log."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from placer.cli import stats_cmd
from placer.cli.main import app
from placer.stats.skew import classify, skew_of

pytestmark = pytest.mark.filterwarnings("ignore::placer.errors.TraceWarning")

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]
QWEN3 = REPO / "traces" / "qwen3-30b-a3b.npz"
SHAPE = ["--experts", "64", "--top-k", "4", "--layers", "6", "--tokens", "8192"]


def run(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def _gini(path: Path) -> float:
    ids = np.load(path)["topk_ids"].astype(np.int64)
    load = np.stack([np.bincount(ids[:, r].ravel(), minlength=64) for r in range(6)])
    return skew_of(load).median()["gini"]


def test_the_default_is_measured_routings_skew(tmp_path: Path) -> None:
    path = tmp_path / "t.npz"
    result = run("synth", path, *SHAPE, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["skew"]["class"] == "real"
    assert str(np.load(path)["synth_popularity"]) == "lognormal"
    assert doc["skew"]["median"]["gini"] == pytest.approx(_gini(path))
    assert "warning:" not in result.stderr


@pytest.mark.parametrize("preset", ["mild", "heavy"])
def test_presets_land_in_their_class_and_are_not_warned_about(tmp_path: Path,
                                                              preset: str) -> None:
    result = run("synth", tmp_path / "t.npz", *SHAPE, "--skew", preset)
    assert result.exit_code == 0, result.stderr
    assert f"skew: preset {preset}, median layer Gini" in result.stdout
    assert result.stdout.rstrip().endswith(")") and f": {preset} (" in result.stdout
    assert "warning:" not in result.stderr


def test_a_trace_far_from_measured_routing_is_warned_about(tmp_path: Path) -> None:
    path = tmp_path / "t.npz"
    result = run("synth", path, *SHAPE, "--zipf", "1.8")
    assert result.exit_code == 0, result.stderr
    assert "warning: the trace's median-layer Gini" in result.stderr
    assert "far from measured routing's" in result.stderr
    assert classify(skew_of(np.stack([np.bincount(
        np.load(path)["topk_ids"][:, r].ravel().astype(np.int64), minlength=64)
        for r in range(6)]))).name == "heavy"


@pytest.mark.parametrize(("args", "where"), [
    (["--skew", "huge"], "--skew"), (["--skew", "real", "--zipf", "1"], "--zipf"),
    (["--from", str(QWEN3), "--zipf", "1"], "--zipf"),
    (["--from", str(QWEN3), "--experts", "8"], "--experts")])
def test_conflicting_or_unknown_skew_settings_are_usage_errors(tmp_path: Path, args: list[str],
                                                               where: str) -> None:
    result = run("synth", tmp_path / "t.npz", *args)
    assert result.exit_code == 2
    assert f"error: {where}:" in result.stderr and "hint:" in result.stderr


def test_from_a_measured_file(tmp_path: Path) -> None:
    path = tmp_path / "fitted.npz"
    result = run("synth", path, "--from", QWEN3, "--tokens", "1024", "--ranks", "16", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["layers"] == 48 and doc["experts"] == 128 and doc["top_k"] == 8
    assert doc["fit_error"] < 0.01
    z = np.load(path)
    assert str(z["synth_from"]) == str(QWEN3) and str(z["model"]) == "qwen3-30b-a3b"
    assert z["topk_ids"].shape == (1024, 48, 8)


def test_progress_lines_in_a_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """stderr not a terminal: a line per update (every PROGRESS_LINE_S seconds)."""
    monkeypatch.setattr(stats_cmd, "PROGRESS_LINE_S", 0.0)
    result = run("synth", tmp_path / "t.npz", "--experts", "16", "--top-k", "2", "--layers",
                 "2", "--tokens", "300000")
    assert result.exit_code == 0, result.stderr
    lines = [x for x in result.stderr.splitlines() if x.startswith("synth: ")]
    assert len(lines) >= 2 and lines[-1].endswith("(100%)") and "\r" not in result.stderr
