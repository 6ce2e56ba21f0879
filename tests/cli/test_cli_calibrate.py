"""``placer calibrate`` end to end, and ``bench/gpu_microbench.py`` without a GPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from placer.calibrate import AllToAllCase, AllToAllTiming, GemmTiming, Predictor
from placer.calibrate.fit import case_copies
from placer.calibrate.timings import format_timings, parse_timings, write_timings
from placer.cli.main import app
from placer.placement import Placement
from placer.placement.document import write_placement
from placer.topology import load_topology, preset_text
from placer.topology.calibration import Calibration, ComputeCalibration, LinkCalibration

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_microbench",
                                               ROOT / "bench" / "gpu_microbench.py")
assert _spec is not None and _spec.loader is not None
microbench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(microbench)
TRUE = Calibration(
    links={"nvlink": LinkCalibration(0.7, 15.0), "infiniband": LinkCalibration(0.8, 30.0)},
    compute=ComputeCalibration(0.6, 0.5),
)


def _rows() -> list:
    rows: list = []
    for ep in (8, 16):
        case = AllToAllCase(ep, 8, 256, top_groups=2 if ep == 16 else 0)
        rows += [AllToAllTiming(case, "dispatch", 1.0), AllToAllTiming(case, "combine", 1.0)]
    for ep in (8, 16, 32):
        case = AllToAllCase(ep, 8, 64, mode="low_latency")
        rows += [AllToAllTiming(case, "dispatch", 1.0), AllToAllTiming(case, "combine", 1.0)]
    rows += [GemmTiming(32, t, 7168, 2048, "bf16", 1.0, note="bmm") for t in (4, 1024, 4096)]
    return rows


@pytest.fixture(scope="module")
def timings(tmp_path_factory) -> Path:
    """Timings placer predicts on dgx-h800 under TRUE."""
    base = load_topology("dgx-h800")
    rows = _rows()
    times = Predictor(rows, base).predict(TRUE)
    path = tmp_path_factory.mktemp("timings") / "timings.csv"
    write_timings(path, [replace(r, measured_us=float(t)) for r, t in zip(rows, times,
                                                                          strict=True)])
    return path


@pytest.fixture(scope="module")
def fitted(timings, tmp_path_factory):
    """(result of `placer calibrate ... -o overlay.yaml`, the overlay path)."""
    overlay = tmp_path_factory.mktemp("out") / "h800-cal.yaml"
    result = runner.invoke(app, ["calibrate", str(timings), "--topology", "dgx-h800",
                                 "-o", str(overlay)])
    return result, overlay


def test_round_trip_through_the_command(fitted):
    result, overlay = fitted
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load(overlay.read_text())
    assert doc["extends"] == "dgx-h800"
    assert doc["name"] == "dgx-h800-calibrated"
    links, compute = doc["calibration"]["links"], doc["calibration"]["compute"]
    assert links["nvlink"]["efficiency"] == pytest.approx(0.7, rel=0.02)
    assert links["nvlink"]["phase_us"] == pytest.approx(15.0, rel=0.02)
    assert links["infiniband"]["efficiency"] == pytest.approx(0.8, rel=0.02)
    assert links["infiniband"]["phase_us"] == pytest.approx(30.0, rel=0.02)
    assert compute["hbm_efficiency"] == pytest.approx(0.6, rel=0.02)
    assert compute["flops_efficiency"] == pytest.approx(0.5, rel=0.02)
    assert doc["calibration"]["source"].startswith("placer calibrate on ")
    assert doc["calibration"]["source"].endswith("(13 rows)")


def test_text_report(fitted):
    result, overlay = fitted
    lines = result.stdout.splitlines()
    assert lines[0].endswith("on dgx-h800 (10 all-to-all, 3 expert GEMM)")
    header = next(line for line in lines if line.startswith("line"))
    assert header.split() == ["line", "row", "measured", "µs", "before", "µs", "after", "µs",
                              "before/meas", "after/meas"]
    row = next(line for line in lines if "normal EP16/8 dispatch" in line)
    assert row.split()[-1] == "1.000"
    assert any(line.startswith("nvlink.efficiency") and " 0.7000 " in line for line in lines)
    assert lines[-1] == f"wrote {overlay} (extends dgx-h800): use it as --topology {overlay}"


def test_overlay_loads_and_shows(fitted):
    _, overlay = fitted
    topology = load_topology(overlay)
    assert topology.calibration.link("nvlink").efficiency == pytest.approx(0.7, rel=0.02)
    shown = runner.invoke(app, ["topology", "show", str(overlay)])
    assert shown.exit_code == 0, shown.output
    assert "dgx-h800-calibrated" in shown.stdout


def test_overlay_works_as_topology_of_evaluate(fitted, tmp_path):
    _, overlay = fitted
    rng = np.random.default_rng(0)
    keys = rng.gumbel(size=(256, 32, 8))
    ids = np.argsort(-keys, axis=2)[:, :, :2].astype(np.int32)
    trace = tmp_path / "trace.npz"
    np.savez(trace, topk_ids=ids, step=np.arange(256) // 32, rank=np.arange(256) % 8,
             layer_ids=np.arange(32), num_experts=8, top_k=2)
    placement = tmp_path / "linear.json"
    write_placement(placement, Placement(np.tile(np.arange(8), (32, 1)), np.arange(32), 8, 8),
                    model_name="mixtral-8x7b")

    def all_to_all_us(topology: str) -> float:
        result = runner.invoke(app, ["evaluate", str(trace), "-p", str(placement),
                                     "-m", "mixtral-8x7b", "-t", topology, "--json"])
        assert result.exit_code == 0, result.output
        part = json.loads(result.stdout)["parts"][-1]
        return float(part["placements"][0]["metrics"]["all_to_all_us"])

    # the overlay is the base with the fitted calibration: the same as a full topology
    # file carrying that calibration section, and not the base's defaults
    full = tmp_path / "full.yaml"
    section = yaml.safe_load(overlay.read_text())["calibration"]
    full.write_text(preset_text("dgx-h800") + yaml.safe_dump({"calibration": section}))
    assert all_to_all_us(str(overlay)) == all_to_all_us(str(full))
    assert all_to_all_us(str(overlay)) != all_to_all_us("dgx-h800")


def test_json_output_and_no_overlay(timings):
    result = runner.invoke(app, ["calibrate", str(timings), "-t", "dgx-h800", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["overlay"] is None and report["topology"] == "dgx-h800"
    assert len(report["rows"]) == 13
    names = [p["name"] for p in report["parameters"]]
    assert names == ["infiniband.efficiency", "infiniband.phase_us", "nvlink.efficiency",
                     "nvlink.phase_us", "compute.hbm_efficiency", "compute.flops_efficiency"]
    assert report["rms_log_after"] < 1e-3


def test_base_topology_file_is_extended_by_relative_path(timings, tmp_path):
    base = tmp_path / "machines" / "h800.yaml"
    base.parent.mkdir()
    base.write_text(preset_text("dgx-h800").replace("name: dgx-h800", "name: my-h800"))
    overlay = tmp_path / "out" / "cal.yaml"
    overlay.parent.mkdir()  # placer creates no folders
    result = runner.invoke(app, ["calibrate", str(timings), "-t", str(base), "-o", str(overlay),
                                 "--name", "mine"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(overlay.read_text())["extends"] == "../machines/h800.yaml"
    topology = load_topology(overlay)
    assert topology.name == "mine" and topology.num_gpus == 8
    assert topology.calibration.compute.flops_efficiency == pytest.approx(0.5, rel=0.02)


def test_refuses_to_overwrite_the_timings(timings, tmp_path):
    csv_named_yaml = tmp_path / "t.yaml"
    csv_named_yaml.write_text(timings.read_text())
    result = runner.invoke(app, ["calibrate", str(csv_named_yaml), "-t", "dgx-h800",
                                 "-o", str(csv_named_yaml)])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --output: the overlay would overwrite the timings CSV")
    assert csv_named_yaml.read_text() == timings.read_text()
    result = runner.invoke(app, ["calibrate", str(timings), "-t", "dgx-h800", "-o", str(timings)])
    assert result.exit_code == 2
    assert "error: --output: the overlay must be a .yaml file" in result.stderr
    assert "hint: " in result.stderr


def test_bad_csv_is_an_error_with_location_and_hint(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("benchmark,measured_us,num_gpus,speed\n")
    result = runner.invoke(app, ["calibrate", str(path), "-t", "dgx-h800"])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == f"error: {path}:1:4: unknown column 'speed'"
    assert result.stderr.splitlines()[1].startswith("hint: known columns: benchmark,")
    assert "Traceback" not in result.output


def test_rows_that_do_not_fit_the_topology(tmp_path):
    path = tmp_path / "t.csv"
    write_timings(path, [AllToAllTiming(AllToAllCase(8, 4, 64), "dispatch", 50.0)])
    result = runner.invoke(app, ["calibrate", str(path), "-t", "dgx-h800"])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {path}:2: the case has 4 GPUs per node")
    assert "hint: give a topology whose nodes have as many GPUs" in result.stderr


def test_help_has_an_example():
    result = runner.invoke(app, ["calibrate", "--help"])
    assert result.exit_code == 0
    assert "placer calibrate bench/data/deepep_v1.csv --topology dgx-h800 -o" in result.stdout


# -- bench/gpu_microbench.py ------------------------------------------------------------


def _run_bench(tmp_path: Path, preamble: str) -> subprocess.CompletedProcess[str]:
    script = ROOT / "bench" / "gpu_microbench.py"
    code = (f"import runpy, sys\n{preamble}\n"
            f"sys.argv = [{str(script)!r}, '-o', {str(tmp_path / 'out.csv')!r}]\n"
            f"runpy.run_path({str(script)!r}, run_name='__main__')\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)


def test_microbench_without_torch_says_so_and_exits_0(tmp_path):
    proc = _run_bench(tmp_path, "sys.modules['torch'] = None  # import torch fails")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == microbench.skip_message("torch is not installed")
    assert "pip install -e '.[torch]'" in proc.stdout
    assert not (tmp_path / "out.csv").exists()


def test_microbench_without_a_gpu_says_so_and_exits_0(tmp_path):
    stub = tmp_path / "stub" / "torch"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(
        "__version__ = '9.9-stub'\n"
        "class cuda:\n    @staticmethod\n    def is_available():\n        return False\n")
    proc = _run_bench(tmp_path, f"sys.path.insert(0, {str(stub.parent)!r})")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == microbench.skip_message("torch 9.9-stub sees no CUDA GPU")


def test_microbench_csv_rows_read_back():
    row = microbench.gemm_timing(32, 128, 7168, 2048, "fp8", 1234.56789, "_scaled_mm per expert")
    line = format_timings([row]).splitlines()[1]
    assert line == ("expert_gemm,,,,,,7168,,32,,128,2048,fp8,1234.568,"
                    "gpu_microbench _scaled_mm per expert")
    (back,) = parse_timings(format_timings([row]))
    assert replace(back, where="") == row


def test_microbench_all_to_all_counts_are_the_low_latency_copies():
    case = AllToAllCase(16, 8, 32, mode="low_latency")
    cluster = case.cluster(load_topology("dgx-h800"))
    np.testing.assert_array_equal(microbench.selection_counts(case), case_copies(case, cluster)[0])
