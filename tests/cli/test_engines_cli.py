"""``placer export`` and ``placer import`` end to end (CliRunner and one real subprocess)."""

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
from placer.placement.document import read_placement, write_placement

runner = CliRunner()


@pytest.fixture
def maverick_plan(tmp_path: Path) -> Path:
    """Llama 4 Maverick (MoE on the 24 odd layers of 48, 128 experts) on 8 GPUs x 17 slots.

    Layer row l holds experts rolled by l, then one redundant copy per GPU of the
    expert that the next GPU holds first.
    """
    rows = []
    for row in range(24):
        experts = np.roll(np.arange(128), row).reshape(8, 16)
        rows.append(np.concatenate([np.append(experts[g], experts[(g + 1) % 8, 0])
                                    for g in range(8)]))
    placement = Placement(np.array(rows), np.arange(1, 48, 2), 128, 8)
    path = tmp_path / "plan.json"
    write_placement(path, placement, model_name="llama4-maverick", top_k=1)
    return path


def test_export_sglang_prints_the_server_flags(maverick_plan: Path, tmp_path: Path) -> None:
    out = tmp_path / "sglang.json"
    result = runner.invoke(
        app, ["export", str(maverick_plan), "--format", "sglang", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[:2] == [
        f"# SGLang: {out}",
        f"--tp-size 8 --ep-size 8 --moe-a2a-backend deepep --init-expert-location {out}"
        " --ep-num-redundant-experts 8",
    ]
    rows = json.loads(out.read_text())["physical_to_logical_map"]
    assert len(rows) == 48  # every hidden layer, the dense even layers included
    assert rows[0] == [i % 128 for i in range(136)]


def test_export_trtllm_and_vllm_json(maverick_plan: Path, tmp_path: Path) -> None:
    out = tmp_path / "lb.yaml"
    result = runner.invoke(
        app, ["export", str(maverick_plan), "-f", "trtllm", "-o", str(out), "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["engine"] == "TensorRT-LLM" and doc["experimental"] is False
    assert f"  load_balancer: {out}" in doc["hints"]
    assert out.read_text().splitlines()[2].startswith("  1: [0, 1, 2,")  # key = layer id 1
    vllm = runner.invoke(app, ["export", str(maverick_plan), "-f", "vllm", "-o",
                               str(tmp_path / "v.json")])
    assert vllm.stdout.startswith(f"# vLLM (experimental): {tmp_path / 'v.json'}\n# experimental:")


@pytest.mark.parametrize(
    ("fmt", "name"),
    [("sglang", "s.json"), ("trtllm", "t.yaml"), ("vllm", "v.json"),
     ("vllm-ascend", "a.json"), ("eplb", "e.npz")],
)
def test_import_round_trip(maverick_plan: Path, tmp_path: Path, fmt: str, name: str) -> None:
    engine_file = tmp_path / name
    assert runner.invoke(app, ["export", str(maverick_plan), "-f", fmt, "-o",
                               str(engine_file)]).exit_code == 0
    back = tmp_path / f"back-{fmt}.json"
    result = runner.invoke(app, ["import", str(engine_file), "--model", "llama4-maverick",
                                 "--num-gpus", "8", "-o", str(back)])
    assert result.exit_code == 0, result.output
    assert "cluster      8 GPUs x 17 slots (136 physical, 8 redundant)" in result.stdout
    assert read_placement(back) == read_placement(maverick_plan)


def test_import_needs_the_gpu_count(maverick_plan: Path, tmp_path: Path) -> None:
    engine_file = tmp_path / "s.json"
    runner.invoke(app, ["export", str(maverick_plan), "-f", "sglang", "-o", str(engine_file)])
    result = runner.invoke(app, ["import", str(engine_file), "-m", "llama4-maverick",
                                 "-o", str(tmp_path / "x.json")])
    assert result.exit_code == 2
    assert result.stderr == (
        "error: --ep-size: SGLang placement files do not record the number of GPUs\n"
        "hint: pass --ep-size with the EP size the engine serves with, or --topology with the"
        " cluster it serves on\n"
    )


def test_import_for_the_wrong_model(maverick_plan: Path, tmp_path: Path) -> None:
    engine_file = tmp_path / "t.yaml"
    runner.invoke(app, ["export", str(maverick_plan), "-f", "trtllm", "-o", str(engine_file)])
    result = runner.invoke(app, ["import", str(engine_file), "-m", "mixtral-8x7b", "-g", "8",
                                 "-o", str(tmp_path / "x.json")])
    assert result.exit_code == 1
    assert result.stderr == (
        f"error: {engine_file}: initial_global_assignments: layer 33 is not a MoE layer of"
        " mixtral-8x7b; TensorRT-LLM keys are absolute MoE layer ids (0..31)\n"
        "hint: is --model the model TensorRT-LLM serves with this file?\n"
    )


def test_export_for_the_wrong_model(maverick_plan: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["export", str(maverick_plan), "-f", "sglang", "-m",
                                 "mixtral-8x7b", "-o", str(tmp_path / "x.json")])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == (  # names the placement's file
        f"error: {maverick_plan}: the placement has 128 experts per layer but mixtral-8x7b has 8"
    )
    assert not (tmp_path / "x.json").exists()


def test_unknown_format(maverick_plan: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["export", str(maverick_plan), "-f", "deepspeed", "-o",
                                 str(tmp_path / "x")])
    assert result.exit_code == 2
    assert result.stderr == (
        "error: --format: unknown engine format 'deepspeed'\n"
        "hint: choose one of: eplb, sglang, trtllm, vllm, vllm-ascend\n"
    )


def test_import_detects_the_format(maverick_plan: Path, tmp_path: Path) -> None:
    engine_file = tmp_path / "ascend.json"
    runner.invoke(app, ["export", str(maverick_plan), "-f", "vllm-ascend", "-o",
                        str(engine_file)])
    result = runner.invoke(app, ["import", str(engine_file), "-m", "llama4-maverick", "--json",
                                 "-o", str(tmp_path / "x.json")])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["format"] == "vllm-ascend" and summary["num_gpus"] == 8


def test_parse_export_spec() -> None:
    from placer.cli.exports import parse_export_spec
    from placer.errors import UsageError

    assert parse_export_spec("trtllm:out/lb.yaml") == ("trtllm", Path("out/lb.yaml"))
    with pytest.raises(UsageError, match="expected FORMAT:FILE, got 'sglang'"):
        parse_export_spec("sglang")


def test_installed_command_exports(maverick_plan: Path, tmp_path: Path) -> None:
    """The real ``placer`` script, as a user runs it."""
    exe = Path(sys.executable).parent / "placer"
    out = tmp_path / "lb.yaml"
    proc = subprocess.run(
        [str(exe), "export", str(maverick_plan), "--format", "trtllm", "-o", str(out)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == f"wrote {out}\n"
    assert out.read_text().startswith("num_slots: 136\ninitial_global_assignments:\n")


@pytest.fixture
def mixtral_trace(tmp_path: Path) -> Path:
    """200 tokens of Mixtral 8x7B routing (32 MoE layers, 8 experts, top-2), skewed to expert 0."""
    rng = np.random.default_rng(7)
    p = np.array([0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05])
    topk = np.array([[rng.choice(8, 2, replace=False, p=p) for _ in range(32)]
                     for _ in range(200)], dtype=np.int32)
    path = tmp_path / "mixtral.npz"
    np.savez(path, topk_ids=topk, layer_ids=np.arange(32))
    return path


def test_plan_exports_engine_files(mixtral_trace: Path, tmp_path: Path) -> None:
    sglang_file, trtllm_file = tmp_path / "s.json", tmp_path / "t.yaml"
    result = runner.invoke(app, [
        "plan", str(mixtral_trace), "-m", "mixtral-8x7b", "-g", "4", "-r", "4", "-s", "eplb",
        "-o", str(tmp_path / "plan.json"),
        "--export", f"sglang:{sglang_file}", "-x", f"trtllm:{trtllm_file}",
    ])
    assert result.exit_code == 0, result.output
    assert (f"--tp-size 4 --ep-size 4 --moe-a2a-backend deepep --init-expert-location"
            f" {sglang_file} --ep-num-redundant-experts 4") in result.stdout.splitlines()
    assert f"  load_balancer: {trtllm_file}" in result.stdout.splitlines()
    planned = read_placement(tmp_path / "plan.json", warn_duplicates=False)
    # the reference EPLB puts some expert twice on a GPU here: imported, with a warning
    assert planned.duplicate_gpus.any()
    back = runner.invoke(app, ["import", str(trtllm_file), "-m", "mixtral-8x7b", "-g", "4",
                               "-o", str(tmp_path / "back.json")])
    assert back.exit_code == 0, back.output
    assert f"{trtllm_file}: GPU " in back.stderr
    assert "vLLM-Ascend's expert map cannot express them" in back.stderr
    assert read_placement(tmp_path / "back.json", warn_duplicates=False) == planned


def test_plan_export_needs_a_model_and_a_valid_spec(mixtral_trace: Path, tmp_path: Path) -> None:
    base = ["plan", str(mixtral_trace), "-g", "4", "-o", str(tmp_path / "plan.json")]
    result = runner.invoke(app, [*base, "--export", "sglang:s.json"])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == (
        "error: --export: engine files need the model's layer layout"
    )
    result = runner.invoke(app, [*base, "-m", "mixtral-8x7b", "--export", "s.json"])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == "error: --export: expected FORMAT:FILE, got 's.json'"
    assert not (tmp_path / "plan.json").exists()


@pytest.mark.parametrize("fmt,name", [("sglang", "plan.map"), ("vllm-ascend", "map.txt"),
                                      ("vllm", "map")])
def test_export_refuses_a_name_the_engine_would_not_load(maverick_plan: Path, tmp_path: Path,
                                                         fmt: str, name: str) -> None:
    out = tmp_path / name
    result = runner.invoke(app, ["export", str(maverick_plan), "--format", fmt, "-o", str(out)])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --output: ") and "would not load" in result.stderr
    assert "hint: name the file with .json" in result.stderr
    assert not out.exists()


def test_import_takes_the_ep_size_from_the_topology(maverick_plan: Path, tmp_path: Path) -> None:
    engine_file = tmp_path / "sglang.json"
    assert runner.invoke(app, ["export", str(maverick_plan), "--format", "sglang", "-o",
                               str(engine_file)]).exit_code == 0
    out = tmp_path / "back.json"
    result = runner.invoke(app, ["import", str(engine_file), "--model", "llama4-maverick",
                                 "--topology", "dgx-h100", "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    assert "8 GPUs x 17 slots" in result.stdout
    for flag in (["--ep-size", "8"], ["--num-gpus", "8"]):
        again = runner.invoke(app, ["import", str(engine_file), "--model", "llama4-maverick",
                                    *flag, "-o", str(out)])
        assert again.exit_code == 0, again.stderr
    clash = runner.invoke(app, ["import", str(engine_file), "--model", "llama4-maverick",
                                "--topology", "dgx-h100", "--ep-size", "16", "-o", str(out)])
    assert clash.exit_code == 2 and "disagrees with --topology" in clash.stderr
    bare = runner.invoke(app, ["import", str(engine_file), "--model", "llama4-maverick",
                               "-o", str(out)])
    assert bare.exit_code == 2
    assert "hint: pass --ep-size with the EP size" in bare.stderr
