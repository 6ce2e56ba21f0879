"""placer.calibrate: the timings CSV, predictions equal to the evaluator's, the fit."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from placer.calibrate import AllToAllCase, Predictor, fit_calibration
from placer.calibrate.fit import gemm_model, gemm_time_us
from placer.calibrate.timings import (
    COLUMNS,
    DEEPEP_COMMENTS,
    AllToAllTiming,
    GemmTiming,
    deepep_timings,
    format_timings,
    parse_timings,
    read_timings,
)
from placer.errors import DataError, UsageError
from placer.topology import load_topology
from placer.topology.calibration import Calibration, ComputeCalibration, LinkCalibration

ROOT = Path(__file__).resolve().parents[2]
HEADER = ",".join(COLUMNS)

#: The efficiencies the round trip must find again.
TRUE = Calibration(
    links={"nvlink": LinkCalibration(0.7, 15.0), "infiniband": LinkCalibration(0.8, 30.0)},
    compute=ComputeCalibration(0.6, 0.5),
)


@pytest.fixture(scope="module")
def h800():
    return load_topology("dgx-h800")


def deepep_like_rows() -> list:
    """Rows shaped like DeepEP's tables (fewer normal tokens, to stay quick) and GEMMs."""
    rows: list = []
    for ep in (8, 16, 32):
        nodes = ep // 8
        case = AllToAllCase(ep, 8, 1024, top_groups=min(nodes, 4) if nodes > 1 else 0)
        rows += [AllToAllTiming(case, "dispatch", 1.0), AllToAllTiming(case, "combine", 1.0)]
    for ep in (8, 16, 32, 64):
        case = AllToAllCase(ep, 8, 128, mode="low_latency")
        rows += [AllToAllTiming(case, "dispatch", 1.0), AllToAllTiming(case, "combine", 1.0)]
    for tokens in (8, 64, 512, 2048):
        rows.append(GemmTiming(32, tokens, 7168, 2048, "bf16", 1.0))
    rows.append(GemmTiming(32, 1024, 7168, 2048, "fp8", 1.0))
    return rows


def measured_with(rows: list, topology, calibration: Calibration) -> list:
    """``rows`` with the times placer predicts under ``calibration``."""
    times = Predictor(rows, topology).predict(calibration)
    return [replace(r, measured_us=float(t)) for r, t in zip(rows, times, strict=True)]


# -- the CSV --------------------------------------------------------------------------


def test_format_and_parse_round_trip():
    rows = [
        AllToAllTiming(AllToAllCase(16, 8, 256, top_groups=2), "dispatch", 123.456789,
                       note="a, quoted note"),
        AllToAllTiming(AllToAllCase(8, 8, 128, mode="low_latency", dtype="bf16"), "combine", 99.0),
        GemmTiming(32, 64, 7168, 2048, "fp8", 1e3 / 3),
    ]
    text = format_timings(rows, ["made by a test"])
    assert text.splitlines()[0] == "# made by a test"
    assert text.splitlines()[1] == HEADER
    back = parse_timings(text, "t.csv")
    assert [replace(r, where="") for r in back] == rows  # times read back bit for bit
    assert [r.where for r in back] == ["t.csv:3", "t.csv:4", "t.csv:5"]


def test_gemm_row_format():
    row = GemmTiming(32, 64, 7168, 2048, "bf16", 812.5, note="bmm")
    line = format_timings([row]).splitlines()[1]
    assert line == "expert_gemm,,,,,,7168,,32,,64,2048,bf16,812.5,bmm"


def test_columns_in_any_order_comments_blank_lines_and_no_note():
    text = ("\ufeff# comment\n\n"
            "measured_us,benchmark,num_experts,tokens_per_expert,hidden,ffn,dtype\n"
            "# another\n"
            "10.5,expert_gemm,4,16,1024,512,bf16\n")
    (row,) = parse_timings(text, "x.csv")
    assert row == GemmTiming(4, 16, 1024, 512, "bf16", 10.5, where="x.csv:5")


@pytest.mark.parametrize(("text", "where", "message"), [
    ("benchmark,measured_us,colour\n", "t.csv:1:3", "unknown column 'colour'"),
    ("benchmark,measured_us,benchmark\n", "t.csv:1:3", "appears twice"),
    ("benchmark,phase\n", "t.csv:1", "no 'measured_us' column"),
    ("all_to_all,dispatch,normal\n", "t.csv:1:1", "first row must be the header"),
    (f"{HEADER}\n", "t.csv:1", "no timing rows"),
    ("", "t.csv", "empty"),
    (f"{HEADER}\nall_to_all,dispatch,normal,x,8,128,7168,8,256,0,,,fp8,10,\n",
     "t.csv:2:4", "num_gpus: expected an integer >= 1, got 'x'"),
    (f"{HEADER}\nall_to_all,dispatch,fast,8,8,128,7168,8,256,0,,,fp8,10,\n",
     "t.csv:2:3", "mode: expected one of normal, low_latency, low_latency_rdma"),
    (f"{HEADER}\nall_to_all,dispatch,normal,8,8,128,7168,8,256,0,,,fp8,-1,\n",
     "t.csv:2:14", "measured_us: expected a time > 0"),
    (f"{HEADER}\nall_to_all,dispatch,normal,8,8,128,7168,8,256,0,,,int4,10,\n",
     "t.csv:2:13", "dtype: expected one of fp8, bf16"),
    (f"{HEADER}\nall_to_all,send,normal,8,8,128,7168,8,256,0,,,fp8,10,\n",
     "t.csv:2:2", "phase: expected one of dispatch, combine"),
    (f"{HEADER}\nall_to_all,dispatch,normal,8,8,128,7168,8,256,,,,fp8,10,\n",
     "t.csv:2:10", "top_groups: empty cell"),
    (f"{HEADER}\nall_to_all,dispatch,normal,8,8,128,7168,8,256,0,16,,fp8,10,\n",
     "t.csv:2:11", "tokens_per_expert: all_to_all rows do not use this column"),
    (f"{HEADER}\nexpert_gemm,dispatch,,,,,7168,,32,,64,2048,bf16,10,\n",
     "t.csv:2:2", "phase: expert_gemm rows do not use this column"),
    (f"{HEADER}\nall_to_all,dispatch,normal,12,8,128,7168,8,256,0,,,fp8,10,,extra\n",
     "t.csv:2:16", "the row has 16 cells, the header 15"),
    (f"{HEADER}\nall_to_all,dispatch,normal,12,8,128,7168,8,256,0,,,fp8,10,\n",
     "t.csv:2", "12 GPUs do not fill nodes of 8"),
    (f"{HEADER}\ngemm,,,,,,7168,,32,,64,2048,bf16,10,\n", "t.csv:2:1", "unknown benchmark"),
    ("benchmark,measured_us,num_experts,tokens_per_expert,hidden,dtype\n"
     "expert_gemm,10,32,64,7168,bf16\n", "t.csv:2", "need a 'ffn' column"),
])
def test_csv_errors_name_file_line_column(text, where, message):
    with pytest.raises(DataError) as info:
        parse_timings(text, "t.csv")
    assert info.value.where == where
    assert message in info.value.message
    assert info.value.hint


def test_unknown_column_hint_suggests_the_spelling():
    with pytest.raises(DataError) as info:
        parse_timings("benchmark,measuredUs\n", "t.csv")
    assert "did you mean 'measured_us'" in info.value.hint


def test_read_timings_missing_file(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        read_timings(tmp_path / "nope.csv")


@pytest.mark.slow
def test_shipped_deepep_csv_is_generated_from_the_published_tables():
    shipped = (ROOT / "bench" / "data" / "deepep_v1.csv").read_text(encoding="utf-8")
    assert shipped == format_timings(deepep_timings(), DEEPEP_COMMENTS)
    assert len(read_timings(ROOT / "bench" / "data" / "deepep_v1.csv")) == 32


# -- predictions agree with the evaluator -------------------------------------------------


@pytest.mark.parametrize("case", [
    AllToAllCase(16, 8, 256, top_groups=2),
    AllToAllCase(8, 8, 256, hidden=1024, top_k=4, num_experts=64, dtype="bf16"),
    AllToAllCase(16, 8, 64, mode="low_latency"),
    AllToAllCase(16, 8, 64, mode="low_latency_rdma", top_k=6, num_experts=128),
], ids=["normal-ep16", "normal-ep8-bf16", "low-latency-ep16", "rdma-ep16"])
def test_prediction_equals_all_to_all_case_evaluate(h800, case):
    calibration = Calibration(
        links={"nvlink": LinkCalibration(0.66, 11.0), "infiniband": LinkCalibration(0.93, 37.0)},
    )
    rows = [AllToAllTiming(case, "dispatch", 1.0), AllToAllTiming(case, "combine", 1.0)]
    predicted = Predictor(rows, h800).predict(calibration)
    expected = case.evaluate(h800.with_calibration(calibration))
    np.testing.assert_allclose(predicted, expected, rtol=1e-9, atol=0)


def test_gemm_prediction_is_the_compute_formula(h800):
    row = GemmTiming(32, 300, 7168, 2048, "fp8", 1.0)
    topology = h800.with_calibration(Calibration(compute=ComputeCalibration(0.7, 0.4)))
    weight_bytes = gemm_model(row).expert_bytes("fp8")
    assert weight_bytes == 3 * 7168 * 2048 + 3 * 4 * 56 * 16  # FP8 + one scale per 128^2
    expected = 32 * max(weight_bytes / (3350 * 0.7 * 1e3),
                        6 * 7168 * 2048 * 300 / (1979 * 0.4 * 1e6))
    assert gemm_time_us(row, topology) == pytest.approx(expected, rel=1e-12)


def test_predictor_names_the_row_that_does_not_fit(h800):
    row = AllToAllTiming(AllToAllCase(8, 4, 64), "dispatch", 1.0, where="t.csv:7")
    with pytest.raises(UsageError) as info:
        Predictor([row], h800)
    assert info.value.where == "t.csv:7"
    assert "4 GPUs per node" in info.value.message


# -- the fit ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def round_trip(h800):
    rows = measured_with(deepep_like_rows(), h800, TRUE)
    return fit_calibration(rows, h800, source="test")


@pytest.mark.parametrize(("name", "value"), [
    ("nvlink.efficiency", 0.7), ("nvlink.phase_us", 15.0),
    ("infiniband.efficiency", 0.8), ("infiniband.phase_us", 30.0),
    ("compute.hbm_efficiency", 0.6), ("compute.flops_efficiency", 0.5),
])
def test_round_trip_finds_known_efficiencies_within_2_percent(round_trip, name, value):
    p = round_trip.parameter(name)
    assert p.fitted
    assert p.value == pytest.approx(value, rel=0.02)


def test_round_trip_rows_and_calibration(round_trip):
    assert round_trip.rms_log_after < 1e-3 < round_trip.rms_log_before
    assert all(abs(r.ratio_after - 1) < 1e-3 for r in round_trip.rows)
    cal = round_trip.calibration
    assert set(cal.links) == {"nvlink", "infiniband"}
    assert cal.source == "test"
    assert cal.link("nvlink").efficiency == pytest.approx(0.7, rel=0.02)
    assert cal.compute.flops_efficiency == pytest.approx(0.5, rel=0.02)
    assert round_trip.to_dict()["calibration"]["links"]["infiniband"]["phase_us"] == \
        pytest.approx(30.0, rel=0.02)


def test_fit_is_deterministic(h800):
    case = AllToAllCase(8, 8, 128, mode="low_latency")
    rows = measured_with([AllToAllTiming(case, "dispatch", 1.0),
                          AllToAllTiming(case, "combine", 1.0)], h800, TRUE)
    rows = [replace(r, measured_us=r.measured_us * f) for r, f in zip(rows, (1.03, 0.98),
                                                                        strict=True)]
    a = fit_calibration(rows, h800).to_dict()
    b = fit_calibration(rows, h800).to_dict()
    assert a == b


def test_uninformed_parameters_keep_their_base_values(h800):
    """One NVLink row: its efficiency is fitted, its phase cost cannot be told apart;
    InfiniBand is on the machine but no row uses it; no GEMM rows."""
    case = AllToAllCase(8, 8, 128, mode="low_latency")
    (row,) = measured_with([AllToAllTiming(case, "dispatch", 1.0)], h800, TRUE)
    result = fit_calibration([row], h800)
    base = h800.calibration
    eff, phase = result.parameter("nvlink.efficiency"), result.parameter("nvlink.phase_us")
    assert eff.fitted and not phase.fitted
    assert phase.value == base.link("nvlink").phase_us
    assert "cannot tell it apart from nvlink.efficiency" in phase.note
    ib = result.parameter("infiniband.efficiency")
    assert not ib.fitted and ib.value == base.link("infiniband").efficiency
    assert "no row's time depends on it" in ib.note
    assert "no expert_gemm rows" in result.parameter("compute.hbm_efficiency").note
    assert result.rows[0].ratio_after == pytest.approx(1.0, rel=1e-6)
    assert set(result.calibration.links) == {"nvlink"}
    assert result.calibration.compute == base.compute


def test_gemm_rows_only(h800):
    rows = measured_with([GemmTiming(8, t, 4096, 1024, "bf16", 1.0) for t in (4, 2048, 4096)],
                         h800, TRUE)
    result = fit_calibration(rows, h800)
    assert result.calibration.links == {}
    assert result.parameter("compute.hbm_efficiency").value == pytest.approx(0.6, rel=1e-3)
    assert result.parameter("compute.flops_efficiency").value == pytest.approx(0.5, rel=1e-3)
    assert [p.name for p in result.parameters if p.name.startswith("compute")] == [
        "compute.hbm_efficiency", "compute.flops_efficiency"]


def test_weight_bound_gemms_leave_flops_efficiency(h800):
    rows = measured_with([GemmTiming(8, t, 4096, 1024, "bf16", 1.0) for t in (1, 2, 4)],
                         h800, TRUE)
    result = fit_calibration(rows, h800)
    assert result.parameter("compute.hbm_efficiency").fitted
    flops = result.parameter("compute.flops_efficiency")
    assert not flops.fitted and flops.value == 1.0


def test_noisy_rows_report_standard_errors(h800):
    rows = measured_with(deepep_like_rows()[:14], h800, TRUE)
    noise = np.exp(np.random.default_rng(1).normal(0, 0.03, len(rows)))
    rows = [replace(r, measured_us=r.measured_us * float(f))
            for r, f in zip(rows, noise, strict=True)]
    result = fit_calibration(rows, h800)
    eff = result.parameter("nvlink.efficiency")
    assert eff.stderr is not None and 0 < eff.stderr < 0.1
    assert result.rms_log_after <= result.rms_log_before
    assert abs(eff.value - 0.7) < 4 * eff.stderr + 0.02
    assert math.isfinite(result.parameter("infiniband.phase_us").value)
