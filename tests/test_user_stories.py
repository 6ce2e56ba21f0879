"""The three questions users bring, asked through the CLI as they would ask them, each
checked for its printed answer:

1. DeepSeek-V3 on 4 x DGX H100 with SGLang: ``stats`` of SGLang's recorder dumps, then
   ``plan --engine sglang --export sglang:FILE``, which prints the launch flags to add;
2. Qwen3 on MI300X or on GB200 NVL72, and how many redundant experts: ``compare`` over
   both clusters with a sweep valid on each, closing with a ``recommended:`` line and why;
3. re-planning what is deployed: ``import`` of an SGLang placement file, then
   ``plan --current``, which prints the moves, the GB to copy, the copy time and the gain
   against keeping the deployed placement.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from readme_fixtures import sglang_dumps
from typer.testing import CliRunner

from placer.cli.main import app

runner = CliRunner()
REPO = Path(__file__).resolve().parent.parent
QWEN3 = REPO / "traces" / "qwen3-30b-a3b.npz"


@pytest.fixture(autouse=True)
def _no_user_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from an empty folder with no ``PLACER_*`` variables: no defaults leak in."""
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith("PLACER_")]:
        monkeypatch.delenv(name)


def _placer(*args: str):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def test_deepseek_v3_on_four_dgx_h100_with_sglang(tmp_path: Path) -> None:
    """Story 1: the dumps SGLang's recorder writes (DeepSeek-V3's shape: 61 hidden layers,
    MoE layers 3-60, 256 experts, top-8; 4 ranks) -> stats -> plan -> export -> flags."""
    sglang_dumps(tmp_path / "dumps", ranks=4, passes=2, tokens=32)
    dumps = sorted(str(p) for p in (tmp_path / "dumps").glob("*.pt"))
    assert len(dumps) == 4

    stats = _placer("stats", *dumps, "--top", "2")
    head = stats.stdout.splitlines()[0]
    assert "(sglang)" in head and "58 layers x 256 experts, top-8" in head
    assert "hottest experts" in stats.stdout and "max/mean load" in stats.stdout

    out = tmp_path / "init_expert_location.json"
    plan = _placer("plan", *dumps, "-m", "deepseek-v3", "-t", "4x-dgx-h100", "-r", "32",
                   "-s", "eplb", "--engine", "sglang", "--export", f"sglang:{out}",
                   "-o", tmp_path / "plan.json", "-j", "1")
    text = plan.stdout
    assert "cluster      4x-dgx-h100: 32 GPUs on 4 nodes, 9 slots per GPU (288 physical," \
           " 32 redundant)" in text
    assert "judged as    sglang decode" in text
    # the answer: the flags to add to `python -m sglang.launch_server`
    lines = text.splitlines()
    at = lines.index(f"# SGLang: {out}")
    assert lines[at + 1] == (f"--tp-size 32 --ep-size 32 --moe-a2a-backend deepep"
                             f" --init-expert-location {out} --ep-num-redundant-experts 32")
    assert "static" in lines[at + 3]
    # the file those flags name is the one SGLang reads: one row per hidden layer
    doc = json.loads(out.read_text())
    assert list(doc) == ["physical_to_logical_map"]
    rows = np.array(doc["physical_to_logical_map"])
    assert rows.shape == (61, 288)
    assert (rows[0] == np.arange(288) % 256).all()  # dense layers: SGLang's trivial row
    assert all(set(row) == set(range(256)) for row in rows[3:])


def test_qwen3_on_mi300x_vs_gb200_nvl72_recommends_a_redundancy() -> None:
    """Story 2: which cluster, and how many redundant experts?  One slots-per-GPU sweep is
    valid on 16 and on 72 GPUs (an -r list is not; tests/cli/test_cli_compare.py checks the
    skipped values and the recommendation's rule on --json); the table closes with the
    recommendation and its reason."""
    result = _placer("compare", QWEN3, "-m", "qwen3-30b-a3b", "-t", "2x8-mi300x-roce",
                     "-t", "gb200-nvl72", "--slots-per-gpu", "8..9", "--engine", "sglang",
                     "-q")
    lines = result.stdout.splitlines()
    header = lines[0].split()
    assert "tok/s/GPU" in header and "GPUs" in header
    scenarios = [line.split()[0:2] for line in lines[2:6]]
    assert scenarios == [["2x8-mi300x-roce", "R=0"], ["2x8-mi300x-roce", "R=16"],
                         ["gb200-nvl72", "R=448"], ["gb200-nvl72", "R=520"]]
    assert not any(line.split()[-1] != "ok" for line in lines[2:6])
    last = lines[-1]
    match = re.fullmatch(r"recommended: (\S+) R=(\d+) eplb — (.+)", last)
    assert match, last
    assert match.group(1) in {"2x8-mi300x-roce", "gb200-nvl72"}
    assert "tokens/s per GPU" in match.group(3) and "step p99" in match.group(3)


#: DeepSeek-V3's MoE layer (256 experts, top-8, 8 groups of which 4, FP8 weights) four
#: layers deep: CP-SAT, which reports the gain against the deployed placement, re-plans
#: DeepSeek-V3's 58 layers in ~25 s on two cores, these in a few.
DSV3_SHAPED = """\
name: dsv3-4-layers
num_hidden_layers: 5
moe_layer_ids: [1, 2, 3, 4]
num_experts: 256
top_k: 8
num_groups: 8
top_groups: 4
num_shared_experts: 1
hidden_size: 7168
moe_intermediate_size: 2048
non_expert_params: 1000000000
default_dtype: fp8
"""


def test_replan_from_an_imported_sglang_file(tmp_path: Path) -> None:
    """Story 3: SGLang serves with its default placement (physical slot p holds expert
    p % 256, 9 slots on each of 32 GPUs) written as its ``--init-expert-location`` file;
    import it, then re-plan on new routing from it."""
    model = tmp_path / "model.yaml"
    model.write_text(DSV3_SHAPED)
    deployed = tmp_path / "deployed.sglang.json"
    row = (np.arange(288) % 256).tolist()
    deployed.write_text(json.dumps({"physical_to_logical_map": [row] * 5}))

    imported = _placer("import", deployed, "-m", model, "-t", "4x-dgx-h100",
                       "-o", tmp_path / "deployed.json")
    assert "from         SGLang file" in imported.stdout
    assert "32 GPUs x 9 slots (288 physical, 32 redundant)" in imported.stdout

    _placer("synth", tmp_path / "new.npz", "-m", model, "-n", "2000",
            "--tokens-per-step", "500", "--zipf", "1.2", "--seed", "1", "-q")
    plan = _placer("plan", tmp_path / "new.npz", "-m", model, "-t", "4x-dgx-h100",
                   "-r", "32", "--engine", "sglang", "--current", tmp_path / "deployed.json",
                   "-o", tmp_path / "next.json", "--time-limit", "2", "-j", "2", "-q")
    text = plan.stdout
    moves = re.search(r"^re-plan      ([\d,]+) weight moves of 1,152 slots \([\d.]+%\),"
                      r" ([\d.]+) GB, ~(\S+) (m?s) to copy$", text, re.M)
    assert moves, text
    assert int(moves.group(1).replace(",", "")) > 0 and float(moves.group(2)) > 0
    gain = re.search(r"estimated p99 layer time, µs, summed over layers on the fitted"
                     r" windows: current ([\d,.]+), re-planned ([\d,.]+) \(([-+][\d.]+)%\)",
                     text)
    assert gain, text
    before, after = (float(g.replace(",", "")) for g in gain.group(1, 2))
    assert after < before and float(gain.group(3)) < 0


def test_capacity_bounds_redundancy_by_what_a_placement_can_use() -> None:
    """Qwen3-30B-A3B on GB200 NVL72: memory holds 292 slots per GPU (20,896 redundant
    experts), but at 128 slots every GPU already holds all 128 experts: the table prints
    72 x 128 - 128 = 9,088 and says why; --json keeps both figures."""
    result = _placer("capacity", "-m", "qwen3-30b-a3b", "-t", "gb200-nvl72")
    lines = result.stdout.splitlines()
    assert "max redundant experts per layer       9088" in lines
    assert not any("20896" in line for line in lines)
    assert lines[-1] == (
        "max redundant experts per layer: 9,088 = 72 GPUs x 128 slots - 128 experts, not the"
        " 20,896 the memory holds: with 128 slots every GPU holds every expert, and a second"
        " replica on one GPU takes memory but adds no dispatch bandwidth")
    doc = json.loads(_placer("capacity", "-m", "qwen3-30b-a3b", "-t", "gb200-nvl72",
                             "--json").stdout)
    assert (doc["max_redundant"], doc["usable_max_redundant"]) == (20896, 9088)
    # where memory is the bound, the two agree and no note is printed
    small = _placer("capacity", "-m", "deepseek-v3", "-t", "4x-dgx-h100").stdout
    assert "max redundant experts per layer       192" in small
    assert "the memory holds" not in small
