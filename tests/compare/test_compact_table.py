"""``placer compare``'s default table fits a terminal of 120 columns; ``--wide`` shows all.

The default view is scenario, GPUs, step p99 and mean, tok/s/GPU, the changes against the
baseline, the verdict and the status (:data:`placer.compare.rows.COMPACT_COLUMNS`); the
wide view (:data:`placer.compare.TABLE_COLUMNS`) is what the table was before, about 220
characters wide.
"""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from placer.cli.main import app
from placer.compare import TABLE_COLUMNS, CompareRow, format_table, with_verdicts
from placer.compare.rows import COMPACT_COLUMNS, COMPACT_WIDTH

BUNDLED = Path(__file__).resolve().parents[2] / "traces" / "synthetic-small.jsonl.gz"


def _rows() -> list[CompareRow]:
    """Four scenarios with the widest figures a study shows: a 27-character label, a
    scenario that did not fit, five-digit step times and a six-digit throughput."""
    full = dict(status="ok", num_gpus=16, num_nodes=2, slots_per_gpu=72, kv_left_gb=152.3,
                hot_shard_ratio=1.5549, hot_shard_ratio_worst=2.1, batch_hot_shard_p99=1.9892,
                remote_copies_per_token_gpu=1.95, remote_copies_per_token_node=0.143,
                bytes_per_token_intra=14_805.0, bytes_per_token_inter=1_169.0,
                all_to_all_us=66.3, moe_layer_p50_us=164.2, moe_layer_p99_us=191.8,
                step_p99_us=37_275.8, step_p50_us=37_275.8, step_mean_us=37_275.8,
                tokens_per_s_per_gpu=331_447.0, solver_status="HEURISTIC", solve_seconds=0.05)
    rows = [
        CompareRow("2x8-mi300x-roce R=1024 eplb", "2x8-mi300x-roce", 1024, "eplb", **full),
        CompareRow("2x8-mi300x-roce R=1024 cpsat", "2x8-mi300x-roce", 1024, "cpsat",
                   **{**full, "step_p99_us": 27_001.2, "step_mean_us": 26_999.0}),
        CompareRow("2x8-mi300x-roce R=2048 eplb", "2x8-mi300x-roce", 2048, "eplb",
                   status="does not fit: 200 slots per GPU need more than 192 GB"),
        CompareRow("gb200-nvl72 R=4624 eplb", "gb200-nvl72", 4624, "eplb",
                   **{**full, "num_gpus": 72, "num_nodes": 1}),
    ]
    return with_verdicts(rows)


def test_the_default_table_fits_120_columns_and_keeps_what_a_choice_needs():
    lines = format_table(_rows()).splitlines()
    table = lines[:6]  # header, rule, four rows (then the notes, which a terminal wraps)
    assert max(len(line) for line in table) <= COMPACT_WIDTH
    assert [c.header for c in COMPACT_COLUMNS] == [
        "scenario", "GPUs", "step p99 µs", "step mean µs", "tok/s/GPU", "Δ p99", "Δ mean",
        "verdict", "status"]
    assert lines[2].split() == ["2x8-mi300x-roce", "R=1024", "eplb", "16", "37275.8",
                                "37275.8", "331,447", "base", "base", "base", "ok"]
    assert lines[3].split()[-4:] == ["-27.6%", "-27.6%", "faster", "ok"]
    assert lines[4].endswith("does not fit [1]")
    assert "[1] 200 slots per GPU need more than 192 GB" in lines


def test_the_wide_table_has_every_column():
    wide = format_table(_rows(), wide=True).splitlines()
    assert wide[0].split("  ")[0] == "scenario"
    for col in TABLE_COLUMNS:
        assert col.header in wide[0]
    assert len(wide[0]) > 200  # what the default table was, and why it is not the default


def test_compare_prints_the_compact_table_unless_wide():
    args = ["compare", str(BUNDLED), "-m", "gpt-oss-20b", "-t", "dgx-h100", "-t",
            "2x-dgx-h100", "-r", "0,16", "--kv-reserve-gb", "71"]
    compact = CliRunner().invoke(app, args)
    assert compact.exit_code == 0, compact.stderr
    table = compact.stdout.split("\n\n")[0].splitlines()
    assert table[0].startswith("scenario")
    assert "hot shard" not in table[0] and "step p99 µs" in table[0]
    assert max(len(line) for line in table) <= COMPACT_WIDTH
    wide = CliRunner().invoke(app, [*args, "--wide"])
    assert wide.exit_code == 0, wide.stderr
    header = wide.stdout.splitlines()[0]
    assert "hot shard" in header and "KV left GB" in header and "solve s" in header
