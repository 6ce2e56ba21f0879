"""``placer compare`` end to end: table, JSON and CSV agree; scenario files; the report."""

from __future__ import annotations

import csv
import html
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from placer.cli.main import app
from placer.compare import (
    TABLE_COLUMNS,
    CompareRow,
    format_table,
    recommend,
    row_fields,
    table_cells,
)

runner = CliRunner()

BUNDLED = Path(__file__).resolve().parents[2] / "traces" / "synthetic-small.jsonl.gz"

#: Two presets x two redundancy levels on the bundled trace (gpt-oss-20b's shape); with
#: 71 GB per GPU kept for the KV cache, dgx-h100 holds 4 slots: R=16 (6 slots) does not fit.
FOUR = [str(BUNDLED), "--model", "gpt-oss-20b", "-t", "dgx-h100", "-t", "2x-dgx-h100",
        "--redundant", "0,16", "--kv-reserve-gb", "71"]


def _compare(*args: str):
    return runner.invoke(app, ["compare", *args])


@pytest.fixture(scope="module")
def json_rows() -> list[dict]:
    """The four rows as ``--json`` prints them."""
    result = _compare(*FOUR, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert (doc["format"], doc["version"], doc["model"]) == ("placer-compare", 1, "gpt-oss-20b")
    assert doc["evaluated_on"] == "fitted on windows 0:24, judged on held-out windows 24:32"
    return doc["rows"]


def test_json_rows_are_the_expected_scenarios(json_rows):
    assert [r["scenario"] for r in json_rows] == [
        "dgx-h100 R=0 eplb", "dgx-h100 R=16 eplb", "2x-dgx-h100 R=0 eplb",
        "2x-dgx-h100 R=16 eplb"]
    assert [r["status"].split(":")[0] for r in json_rows] == ["ok", "does not fit", "ok", "ok"]
    assert [r["slots_per_gpu"] for r in json_rows] == [4, None, 2, 3]


def test_csv_parses_and_agrees_with_json(json_rows):
    result = _compare(*FOUR, "--csv")
    assert result.exit_code == 0, result.stderr
    records = list(csv.DictReader(io.StringIO(result.stdout)))
    assert list(records[0]) == row_fields()
    assert len(records) == len(json_rows)
    for rec, row in zip(records, json_rows, strict=True):
        for key, value in row.items():
            if value is None:
                assert rec[key] == ""
            elif isinstance(value, float) and key != "solve_seconds":
                assert float(rec[key]) == pytest.approx(value), key
            elif key != "solve_seconds":
                assert rec[key] == str(value), key


def test_table_agrees_with_json(json_rows):
    result = _compare(*FOUR, "--wide")
    assert result.exit_code == 0, result.stderr
    rows = [CompareRow(**{**r, "solve_seconds": None}) for r in json_rows]
    expected = format_table(rows, wide=True).splitlines()
    got = result.stdout.splitlines()
    assert len(got) == len(expected) + 2
    assert got[len(expected):] == ["", recommend(rows).line]
    # "solve s" differs between runs: compare every other cell
    solve_col = [c.header for c in TABLE_COLUMNS].index("solve s")
    for line_got, row in zip(got[2:6], rows, strict=True):
        cells = table_cells(row)
        parts = re.split(r"\s{2,}", line_got.strip())
        assert parts[0] == row.scenario
        if row.ok:
            assert parts[1:solve_col] == cells[1:solve_col]
            assert parts[-1] == "ok"
        else:
            assert parts[-1] == "does not fit [1]"
    assert got[len(expected) - 1].startswith(
        "[1] 6 slots per GPU need 1.9 GB of expert weights per GPU")
    assert "4 scenario(s), fitted on windows 0:24" in result.stderr
    assert "[2/4] dgx-h100 R=16 eplb: does not fit: 6 slots" in result.stderr


#: The one-node scenario runs on B200s (2.4x the HBM bandwidth of an H100) so that it is
#: clearly the faster one: at calibrated link speeds both fabrics pay a fixed cost per
#: phase, and 16 H100s reading half the expert weights each would beat 8 H100s.
STUDY = """\
trace: {trace}
model: gpt-oss-20b
scenarios:
  - {{name: two nodes, topology: 2x-dgx-h100, redundant: 0, solver: linear}}
  - {{name: one node, topology: hgx-b200, redundant: 0, solver: eplb}}
tokens_per_gpu: 256
"""


def test_scenario_file_runs_and_report_is_self_contained(tmp_path):
    study = tmp_path / "study.yaml"
    study.write_text(STUDY.format(trace=BUNDLED))
    report = tmp_path / "out" / "compare.html"
    report.parent.mkdir()  # placer creates no folder, --png-dir's neither
    pngs = tmp_path / "png"
    pngs.mkdir()
    result = _compare("--scenarios", str(study), "--json", "--report", str(report),
                      "--png-dir", str(pngs), "--tokens-per-gpu", "64", "--dpi", "30")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [r["scenario"] for r in doc["rows"]] == ["two nodes", "one node"]
    assert doc["rows"][1]["moe_layer_p99_us"] < doc["rows"][0]["moe_layer_p99_us"]
    assert [r["status"] for r in doc["rows"]] == ["ok", "ok"]
    assert doc["regime"]["tokens_per_gpu"] == 64  # flags override the file
    page = report.read_text()
    without_images = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page)
    assert not re.search(r"(https?:)?//[a-z0-9]", without_images, re.IGNORECASE)
    for title in ("Scenarios", "Trace summary", "Placements", "Placement maps",
                  "Co-activation and GPU boundaries", "Per-GPU load", "Per-batch hot shard"):
        assert f"<h2>{title}</h2>" in page, title
    assert "<h3>baseline: two nodes</h3>" in page and "<h3>lowest p99: one node</h3>" in page
    # what-if, expert load, 2 maps, 2 co-activation maps, per-GPU load, tail
    assert page.count("data:image/png;base64,") == len(list(pngs.glob("*.png"))) == 8
    assert (pngs / "what-if.png").read_bytes().startswith(b"\x89PNG")
    # the page opens with what the terminal says: the recommendation and the warnings
    said = page.split("<h2>Recommendation</h2>", 1)[1].split("<h2>", 1)[0]
    chosen = doc["recommendation"]
    assert html.escape(f"recommended: {chosen['scenario']} — {chosen['reason']}") in said
    warned = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert warned  # the bundled trace is synthetic: said on both
    for line in warned:
        assert html.escape(line, quote=False) in said or html.escape(line) in said, line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "gpt-oss-20b", "-t", "dgx-h100"],
         "error: TRACE: no trace to compare on"),
        ([str(BUNDLED), "-m", "gpt-oss-20b", "-t", "dgx-h100", "--json", "--csv"],
         "error: --csv: --json and --csv are two answers to one question"),
        ([str(BUNDLED), "-m", "gpt-oss-20b", "-t", "dgx-h100", "-r", "0,x"],
         "error: --redundant: expected integers or ranges A..B separated by commas, got '0,x'"),
        ([str(BUNDLED), "-m", "gpt-oss-20b", "-t", "dgx-h100", "-s", "eplb,nope"],
         "error: --solver: unknown solver 'nope'"),
        ([str(BUNDLED), "-t", "dgx-h100"], "error: --model: no model to plan for"),
        ([str(BUNDLED), "-m", "gpt-oss-20b", "--scenarios", "s.yaml", "-t", "dgx-h100"],
         "error: --scenarios: scenarios come either from --scenarios or from"
         " --topology/--redundant/--slots-per-gpu/--solver"),
        ([str(BUNDLED), "-m", "gpt-oss-20b", "-t", "dgx-h100", "--engine", "sglang",
          "--dispatch", "round_robin_"],
         "error: --dispatch: unknown dispatch policy 'round_robin_'"),
        ([str(BUNDLED), "-m", "gpt-oss-20b", "-t", "dgx-h100", "--workload", "train"],
         "error: --workload: unknown workload 'train'"),
    ],
)
def test_usage_errors_exit_2_with_message(args, message):
    result = _compare(*args)
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == message
    assert result.stdout == ""


def test_installed_command_prints_json(tmp_path):
    placer = Path(sys.executable).parent / "placer"
    proc = subprocess.run(
        [str(placer), "compare", str(BUNDLED), "-m", "gpt-oss-20b", "-t", "dgx-h100",
         "--json", "--no-holdout", "--jobs", "1"],
        capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [r["status"] for r in doc["rows"]] == ["ok"]
    assert doc["evaluated_on"].startswith("fitted and judged on all 32 window(s)")


def test_workload_flags_reach_the_rows_and_the_settings():
    result = _compare(str(BUNDLED), "-m", "gpt-oss-20b", "-t", "dgx-h100", "-t", "2x-dgx-h100",
                      "-s", "eplb,linear", "--engine", "sglang", "--workload", "prefill",
                      "--tokens-per-gpu", "64", "--kv-reserve-gb", "71", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert {k: doc["regime"][k] for k in ("engine", "workload", "tokens_per_gpu")} == {
        "engine": "sglang", "workload": "prefill", "tokens_per_gpu": 64}
    assert ("judged as    sglang prefill, 64 tokens per GPU (sglang dispatch, normal all-to-all)"
            in result.stderr)
    # a step is 64 tokens x G: each topology is its own baseline
    verdicts = [r["verdict"] for r in doc["rows"]]
    assert verdicts[0] == verdicts[2] == "baseline"
    assert verdicts[1].startswith("verdict: dgx-h100 R=0 linear ")
    assert verdicts[3].endswith(" than 2x-dgx-h100 R=0 eplb on held-out step p99")


QWEN3 = Path(__file__).resolve().parents[2] / "traces" / "qwen3-30b-a3b.npz"


def test_qwen3_on_mi300x_vs_nvl72_skips_uneven_values_and_recommends(tmp_path):
    """The user story: how many redundant experts, and on which cluster?  One -r list over
    16 and 72 GPUs: 128 experts + R split evenly over 72 GPUs only for R = 16 of these."""
    result = _compare(str(QWEN3), "-m", "qwen3-30b-a3b", "-t", "2x8-mi300x-roce",
                      "-t", "gb200-nvl72", "-r", "0,16,32,64", "--engine", "sglang", "--json")
    assert result.exit_code == 0, result.stderr
    assert ("note: gb200-nvl72: skipped --redundant 0, 32, 64 (128 experts + R do not split"
            " evenly over 72 GPUs" in result.stderr)
    doc = json.loads(result.stdout)
    rows = doc["rows"]
    assert [(r["topology"], r["redundant"]) for r in rows] == [
        ("2x8-mi300x-roce", 0), ("2x8-mi300x-roce", 16), ("2x8-mi300x-roce", 32),
        ("2x8-mi300x-roce", 64), ("gb200-nvl72", 16)]
    assert {r["status"] for r in rows} == {"ok"}  # no error rows for uneven splits
    assert doc["notes"] == [line[len("note: "):] for line in result.stderr.splitlines()
                            if line.startswith("note: ")]
    assert [(r["num_gpus"], r["num_nodes"]) for r in rows] == [(16, 2)] * 4 + [(72, 1)]
    for r in rows:
        assert r["tokens_per_s_per_gpu"] == pytest.approx(
            r["tokens_per_step"] * 1e6 / r["step_mean_us"] / r["num_gpus"])
    # the recommendation follows its stated rule
    choice = doc["recommendation"]
    lowest = min(r["step_p99_us"] for r in rows)
    near = [r for r in rows if r["step_p99_us"] <= lowest * 1.10]
    assert choice["candidates"] == [r["scenario"] for r in near]
    best = max(near, key=lambda r: r["tokens_per_s_per_gpu"])
    assert choice["scenario"] == best["scenario"]
    assert choice["rule"].startswith("highest throughput per GPU")


def test_slots_per_gpu_sweep_and_a_target_nobody_meets():
    result = _compare(str(BUNDLED), "-m", "gpt-oss-20b", "-t", "dgx-h100", "-t", "2x-dgx-h100",
                      "--slots-per-gpu", "3..4", "--p99-target-us", "1")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.splitlines()[0] == (
        "note: dgx-h100: skipped --slots-per-gpu 3 (below 4: 8 GPUs x 3 slots cannot hold the 32"
        " experts, R would be negative)")
    table = result.stdout.splitlines()
    assert [line.split()[0:2] for line in table[2:5]] == [
        ["dgx-h100", "R=0"], ["2x-dgx-h100", "R=16"], ["2x-dgx-h100", "R=32"]]
    assert table[-1].startswith("recommended: none — no scenario meets step p99 <= 1.0 µs;"
                                " the lowest is ")


def test_redundant_auto_runs_what_fits_in_memory():
    from placer.model import load_model
    from placer.model.capacity import plan_capacity
    from placer.planning.redundancy import slot_candidates
    from placer.topology import load_topology

    result = _compare(str(BUNDLED), "-m", "gpt-oss-20b", "-t", "dgx-h100", "-r", "auto",
                      "--kv-reserve-gb", "70", "--csv", "-q")
    assert result.exit_code == 0, result.stderr
    records = list(csv.DictReader(io.StringIO(result.stdout)))
    bound = plan_capacity(load_model("gpt-oss-20b"), load_topology("dgx-h100"),
                          kv_reserve_gb=70.0).slots_per_gpu
    assert [int(r["slots_per_gpu"]) for r in records] == slot_candidates(32, 8, bound)
    assert {r["status"] for r in records} == {"ok"}
    assert "--redundant auto tries R = 0, 8" in result.stderr
    said = [line for line in result.stderr.splitlines() if line.startswith("recommended: ")]
    assert len(said) == 1 and said[0].startswith("recommended: dgx-h100 R=")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-r", "0", "--slots-per-gpu", "8"],
         "error: --slots-per-gpu: --redundant and --slots-per-gpu exclude each other"),
        (["--slots-per-gpu", "12..8"], "error: --slots-per-gpu: range 12..8 is reversed"),
        (["-t", "gb200-nvl72", "-r", "0"],
         "note: gb200-nvl72: skipped --redundant 0 (32 experts + R do not split evenly over 72"
         " GPUs: engines need equal slots per GPU; valid near them: 40) (every value)"),
        (["--p99-target-us", "-5"], "error: --p99-target-us: expected a value >= 0, got -5"),
        (["--p99-target-us", "0"],
         "error: --p99-target-us: expected a positive step p99 target in µs, got 0.0"),
    ],
)
def test_sweep_usage_errors_exit_2(args, message):
    result = _compare(str(BUNDLED), "-m", "gpt-oss-20b", "-t", "dgx-h100", *args)
    if "gb200-nvl72" in args:  # every value skipped on the only other topology is fine ...
        assert result.exit_code == 0, result.stderr
        assert result.stderr.splitlines()[0] == message
        result = _compare(str(BUNDLED), "-m", "gpt-oss-20b", *args)  # ... alone it is not
        message = ("error: --redundant: no scenario left to compare: "
                   + message[len("note: "):])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == message
    assert result.stdout == ""


def test_scenario_file_sweeps_slots_per_gpu_and_sets_the_target(tmp_path):
    study = tmp_path / "sweep.yaml"
    study.write_text(f"trace: {BUNDLED}\nmodel: gpt-oss-20b\ntopologies: [dgx-h100, 2x-dgx-h100]\n"
                     "slots_per_gpu: '3..4'\np99_target_us: 1000000\n")
    result = _compare("--scenarios", str(study), "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["notes"] == ["dgx-h100: skipped --slots-per-gpu 3 (below 4: 8 GPUs x 3 slots"
                            " cannot hold the 32 experts, R would be negative)"]
    assert [(r["scenario"], r["slots_per_gpu"]) for r in doc["rows"]] == [
        ("dgx-h100 R=0 eplb", 4), ("2x-dgx-h100 R=16 eplb", 3), ("2x-dgx-h100 R=32 eplb", 4)]
    assert doc["settings"]["p99_target_us"] == 1e6
    # every row meets so loose a target: the fewest GPUs win
    assert doc["recommendation"]["scenario"] == "dgx-h100 R=0 eplb"
    assert doc["recommendation"]["candidates"] == [r["scenario"] for r in doc["rows"]]
    clash = _compare("--scenarios", str(study), "--slots-per-gpu", "4")
    assert clash.exit_code == 2
    assert clash.stderr.startswith("error: --scenarios: scenarios come either from --scenarios")
