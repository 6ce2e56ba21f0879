"""Where the link model is calibrated, and the note outside it."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from placer.calibrate.deepep import calibrated_tokens
from placer.cli.main import app
from placer.regime import MODES
from placer.topology import DEFAULT_CALIBRATION, load_topology
from placer.topology.calibration import DEFAULT_CALIBRATED_TOKENS, extrapolation_note

runner = CliRunner()


def test_the_ranges_are_deepeps_rows():
    assert calibrated_tokens("normal") == (4096, 4096)
    assert calibrated_tokens("low_latency") == (128, 128)
    assert calibrated_tokens("low_latency_rdma") == (128, 128)
    assert calibrated_tokens("carrier_pigeon") is None


def test_the_cost_model_knows_the_ranges_its_defaults_were_fitted_on():
    """The default calibration's ranges (beside the cost model) are DeepEP's rows'."""
    assert {m: calibrated_tokens(m) for m in MODES} == dict(DEFAULT_CALIBRATED_TOKENS)


@pytest.mark.parametrize(("mode", "tokens", "noted"), [
    ("normal", 4096, False), ("normal", 2048, False), ("normal", 8192, False),
    ("normal", 2047, True), ("normal", 128, True), ("normal", 8193, True),
    ("low_latency", 128, False), ("low_latency", 256, False), ("low_latency", 1024, True),
    ("low_latency_rdma", 32, True),
])
def test_the_note_marks_what_lies_outside(mode, tokens, noted):
    note = extrapolation_note(mode, tokens, DEFAULT_CALIBRATION.source)
    assert bool(note) is noted
    if noted:
        assert f"at {tokens:,} the model extrapolates" in note


def test_a_cluster_calibrated_by_its_user_gets_no_note():
    assert extrapolation_note("normal", 128, "placer calibrate, my cluster, 2026-12-01") == ""


@pytest.mark.slow
def test_plan_says_so_and_compare_warns(tmp_path):
    trace = "traces/synthetic-small.jsonl.gz"
    assert load_topology("dgx-h100").calibration.source == DEFAULT_CALIBRATION.source
    plan = runner.invoke(app, ["plan", trace, "-m", "gpt-oss-20b", "-t", "dgx-h100", "-s",
                               "eplb", "--mode", "normal", "-o", str(tmp_path / "p.json"),
                               "-q"])
    assert plan.exit_code == 0, plan.stderr
    assert "calibration  normal-mode all-to-all is calibrated at 4,096 tokens per GPU" \
        in plan.stdout
    quiet = runner.invoke(app, ["plan", trace, "-m", "gpt-oss-20b", "-t", "dgx-h100", "-s",
                                "eplb", "-o", str(tmp_path / "q.json"), "-q"])
    assert quiet.exit_code == 0 and "calibration  " not in quiet.stdout
    compared = runner.invoke(app, ["compare", trace, "-m", "gpt-oss-20b", "-t", "dgx-h100",
                                   "--mode", "normal", "-q"])
    assert compared.exit_code == 0, compared.stderr
    assert "warning: normal-mode all-to-all is calibrated at 4,096" in compared.stderr
