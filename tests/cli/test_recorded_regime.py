"""A placement's recorded regime (what ``placer plan`` judged under) is the default of the
commands that read it: ``evaluate`` and ``report`` judge as the plan did, say so in their
``judged as`` line, and let flags override."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from placer.cli.main import app
from placer.cli.regime import placements_record, recorded, resolve_regime
from placer.errors import PlacementError
from placer.placement import Placement
from placer.placement.document import read_placement, write_placement
from placer.regime import Regime

runner = CliRunner()

MODEL = "mixtral-8x7b"  # 32 MoE layers x 8 experts, top-2
TOPOLOGY = "dgx-h100"  # 8 GPUs
LAYERS = np.arange(32)
SGLANG_32 = {"engine": "sglang", "workload": "decode", "tokens_per_gpu": 32}


@pytest.fixture()
def trace(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    keys = np.log([6, 2, 1, 1, 1, 1, 1, 1]) + rng.gumbel(size=(256, 32, 8))
    ids = np.argsort(-keys, axis=2)[:, :, :2].astype(np.int32)
    path = tmp_path / "trace.npz"
    np.savez(path, topk_ids=ids, step=np.arange(256) // 32, rank=np.arange(256) % 8,
             layer_ids=LAYERS, num_experts=8, top_k=2)
    return path


def _placement(tmp_path: Path, name: str, regime: dict | None) -> Path:
    path = tmp_path / f"{name}.json"
    write_placement(path, Placement(np.tile(np.arange(8), (32, 1)), LAYERS, 8, 8),
                    model_name=MODEL, topology={"name": TOPOLOGY, "num_gpus": 8},
                    regime=regime)
    return path


def test_the_record_round_trips_and_a_bad_one_is_refused(tmp_path):
    path = _placement(tmp_path, "plan", recorded(Regime("sglang", "decode", 32)))
    assert json.loads(path.read_text())["regime"] == SGLANG_32  # no unset overrides
    assert read_placement(path).meta["regime"] == SGLANG_32
    doc = json.loads(path.read_text())
    doc["regime"]["engine"] = "vlm"
    path.write_text(json.dumps(doc))
    with pytest.raises(PlacementError, match="regime"):
        read_placement(path)


def test_evaluate_judges_as_the_plan_did_unless_a_flag_says_otherwise(tmp_path, trace):
    plan = _placement(tmp_path, "plan", SGLANG_32)
    args = ["evaluate", str(trace), "-p", str(plan), "--json"]
    doc = json.loads(runner.invoke(app, args).stdout)
    assert doc["regime"]["engine"] == "sglang" and doc["regime"]["tokens_per_gpu"] == 32
    text = runner.invoke(app, args[:-1]).stdout
    assert (f"judged as    sglang decode, 32 tokens per GPU (sglang dispatch, low_latency"
            f" all-to-all); engine, workload, tokens per GPU as {plan} records") in text
    over = runner.invoke(app, [*args[:-1], "--engine", "vllm"]).stdout
    assert (f"judged as    vllm decode, 32 tokens per GPU (vllm_hash dispatch, low_latency"
            f" all-to-all); workload, tokens per GPU as {plan} records; --engine vllm over"
            " its sglang") in over
    expert = runner.invoke(app, [*args[:-1], "--dispatch", "random"]).stdout
    assert f"as {plan} records; --dispatch random; set with" in expert
    # the same figures as the flags would give: the record is the flags' default, no more
    flagged = json.loads(runner.invoke(app, [*args, "--engine", "sglang", "--tokens-per-gpu",
                                             "32"]).stdout)
    drop = {"note"}
    assert {k: v for k, v in flagged["regime"].items() if k not in drop} == \
        {k: v for k, v in doc["regime"].items() if k not in drop}
    assert flagged["parts"] == doc["parts"]


def test_a_placement_without_a_record_keeps_the_default(tmp_path, trace):
    plain = _placement(tmp_path, "plain", None)
    text = runner.invoke(app, ["evaluate", str(trace), "-p", str(plain)]).stdout
    assert "judged as    vllm decode, 128 tokens per GPU" in text and "records" not in text


def test_placements_that_disagree_are_judged_under_the_flags_and_said(tmp_path):
    a = _placement(tmp_path, "a", SGLANG_32)
    b = _placement(tmp_path, "b", {"engine": "vllm", "workload": "decode"})
    same = _placement(tmp_path, "same", SGLANG_32)
    paths = [a, b]
    record, note = placements_record([read_placement(p) for p in paths], paths)
    assert record is None and note.startswith(f"{a} and {b} record different regimes")
    both = [a, same]
    record, note = placements_record([read_placement(p) for p in both], both)
    assert record == ("the 2 placements", SGLANG_32) and note == ""
    regime, words = resolve_regime(None, None, record=record)
    assert (regime.engine, regime.tokens) == ("sglang", 32)
    assert words.startswith("engine, workload, tokens per GPU as the 2 placements record")


def test_report_says_the_regime_it_took(tmp_path, trace):
    pytest.importorskip("matplotlib")
    plan = _placement(tmp_path, "plan", SGLANG_32)
    result = runner.invoke(app, ["report", str(trace), "-p", str(plan), "-o",
                                 str(tmp_path / "r.html"), "-q"])
    assert result.exit_code == 0, result.output
    assert (f"judged as    sglang decode, 32 tokens per GPU (sglang dispatch, low_latency"
            f" all-to-all); engine, workload, tokens per GPU as {plan} records") in result.stdout
    assert "sglang decode, 32 tokens per GPU" in (tmp_path / "r.html").read_text()
