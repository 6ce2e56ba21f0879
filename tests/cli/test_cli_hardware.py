"""`placer topology`, `placer model` and `placer capacity` end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from placer.cli.main import app
from placer.topology import preset_names

runner = CliRunner()

PLACER = Path(sys.executable).parent / "placer"

SMALL = """\
name: lab
gpu_types:
  a100: {memory_gb: 40, hbm_gbps: 1555, bf16_tflops: 312, fp8_tflops: 312}
nodes:
  - name: box
    count: 2
    gpus: 4
    gpu_type: a100
    fabric: {kind: nvswitch, gbps: 300}
    nic_gbps: 25
network: {kind: infiniband, latency_us: 2.5}
"""


def _run(*args: str):
    return runner.invoke(app, list(args))


def test_topology_list_names_every_preset():
    result = _run("topology", "list")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "name",
        "GPUs",
        "nodes",
        "GPU",
        "type",
        "intra",
        "GB/s",
        "inter",
        "GB/s",
        "description",
    ]
    assert [line.split()[0] for line in lines[1:]] == preset_names()
    row = next(line for line in lines if line.startswith("4x-dgx-h100 "))
    assert row.split()[1:6] == ["32", "4", "h100-sxm", "450", "50"]


def test_topology_list_json():
    result = _run("topology", "list", "--json")
    data = json.loads(result.stdout)
    assert [d["name"] for d in data] == preset_names()
    assert "bandwidth_gbps" not in data[0]


def test_topology_show_table():
    result = _run("topology", "show", "2x-dgx-h100")
    assert result.exit_code == 0
    out = result.stdout
    assert out.startswith("2x-dgx-h100: 16 GPUs in 2 nodes (preset 2x-dgx-h100)\n")
    assert "node1     8  8-15   h100-sxm  nvswitch              450            50" in out
    assert "intra-node   450           1         56" in out
    assert "inter-node    50           2         64" in out


def test_topology_show_file_json_and_matrix(tmp_path):
    path = tmp_path / "lab.yaml"
    path.write_text(SMALL)
    data = json.loads(_run("topology", "show", str(path), "--json").stdout)
    assert data["num_gpus"] == 8 and data["num_nodes"] == 2
    assert data["bandwidth_gbps"][0][:2] == [None, 300.0]  # inf diagonal -> null
    assert data["bandwidth_gbps"][0][4] == 25.0 and data["latency_us"][0][4] == 2.5
    assert data["link_class"][0] == [0, 1, 1, 1, 2, 2, 2, 2]
    assert data["gpus"][5] == {"rank": 5, "name": "box1/gpu1", "node": "box1", "gpu_type": "a100"}
    matrix = _run("topology", "show", str(path), "--matrix").stdout
    assert "   0  -    300  300  300  25   25   25   25" in matrix


def test_topology_validate_ok_and_error(tmp_path):
    good = tmp_path / "lab.yaml"
    good.write_text(SMALL)
    result = _run("topology", "validate", str(good))
    assert result.exit_code == 0
    assert result.stdout == (
        f"ok: {good}: 'lab', 8 GPUs in 2 nodes, intra-node 300 GB/s, inter-node 25 GB/s\n"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text(SMALL.replace("gbps: 300", "gbps: 0"))
    result = _run("topology", "validate", str(bad))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (
        f"error: {bad}:9: nodes[0].fabric.gbps: gbps must be positive, got 0\n"
        "hint: a link without bandwidth carries nothing; remove it or give its GB/s\n"
    )


def test_validate_refuses_a_preset_name():
    result = _run("topology", "validate", "dgx-h100")
    assert result.exit_code == 1
    assert "error: dgx-h100: 'dgx-h100' is a preset name, not a file" in result.stderr


def test_model_list_and_show():
    result = _run("model", "list")
    assert result.exit_code == 0
    row = next(line for line in result.stdout.splitlines() if line.startswith("deepseek-v3 "))
    assert row.split() == [
        "deepseek-v3",
        "58/61",
        "256",
        "8",
        "1",
        "7168/2048",
        "88.1",
        "44.1",
        "fp8",
        "671.0",
    ]
    show = _run("model", "show", "deepseek-r1")
    assert show.exit_code == 0
    assert "MoE layers             58 (ids 3..60)" in show.stdout
    assert "fp8    44.05      0.011               2.555" in show.stdout
    data = json.loads(_run("model", "show", "gpt-oss-20b", "--json").stdout)
    assert data["bytes"]["mxfp4"]["expert"] == 13_236_480
    assert data["moe_layer_ids"] == list(range(24))


def test_model_show_unknown():
    result = _run("model", "show", "mixtral")
    assert result.exit_code == 1
    assert result.stderr.startswith(
        "error: model: unknown model 'mixtral': not a preset and no such file\nhint: "
    )


def test_capacity_table_and_json():
    result = _run("capacity", "--model", "deepseek-v3", "--topology", "4x-dgx-h100")
    assert result.exit_code == 0
    out = result.stdout
    assert out.startswith(
        "deepseek-v3 (fp8) on 4x-dgx-h100: 32 GPUs, 256 experts x 58 MoE layers\n"
    )
    assert "slots per GPU (memory bound)          14" in out
    assert "max redundant experts per layer       192" in out
    assert "KV cache left per GPU at usable       21.15 GB" in out
    data = json.loads(
        _run(
            "capacity", "-m", "mixtral-8x7b", "-t", "dgx-h100", "--kv-reserve-gb", "0", "--json"
        ).stdout
    )
    assert data["slots_per_gpu"] == 6 and data["max_redundant"] == 40
    assert data["kv_reserve_gb"] == 0.0


def test_capacity_errors():
    result = _run("capacity", "-m", "deepseek-v3", "-t", "dgx-h100")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: deepseek-v3 (fp8) does not fit on dgx-h100: ")
    assert "hint: would fit: at least 19 GPUs" in result.stderr
    both = _run(
        "capacity",
        "-m",
        "mixtral-8x7b",
        "-t",
        "dgx-h100",
        "--kv-reserve-gb",
        "1",
        "--kv-reserve-fraction",
        "0.1",
    )
    assert both.exit_code == 2
    assert both.stderr == (
        "error: --kv-reserve-gb: give the KV-cache reserve once\n"
        "hint: use either --kv-reserve-gb or --kv-reserve-fraction\n"
    )


def test_installed_placer_runs_capacity():
    proc = subprocess.run(
        [str(PLACER), "capacity", "-m", "mixtral-8x7b", "-t", "dgx-h100", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["slots_per_gpu"] == 4


def test_model_list_json_and_unknown_topology():
    data = json.loads(_run("model", "list", "--json").stdout)
    assert [d["name"] for d in data][:2] == ["deepseek-v3", "kimi-k2"]
    assert data[0]["bytes"]["fp8"]["slot"] == 58 * 44_050_944
    result = _run("topology", "show", "dgx-h1OO")
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == (
        "error: topology: unknown topology 'dgx-h1OO': not a preset and no such file"
    )
