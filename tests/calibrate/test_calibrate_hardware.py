"""``placer calibrate`` says when the timings are not of the topology's hardware.

Calibrating an H100 topology on H800 timings used to fit ``nvlink.efficiency 0.2963`` in
silence: the H800's ~160 GB/s NVLink measured against the H100's 450 GB/s.  A timings CSV
declares its GPU in a ``# gpu: NAME`` line (``bench/gpu_microbench.py`` writes it;
``bench/data/deepep_v1.csv`` declares ``h800-sxm``), and the fit warns when that is not the
topology's GPU, and when a fitted link efficiency is far below what links give.  The README
calibrates the CSV the repository ships, on the preset of its GPUs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from placer.calibrate import FitResult, FittedParameter, format_timings, read_timings
from placer.calibrate.hardware import MIN_PLAUSIBLE_EFFICIENCY, declared_gpu, hardware_warnings
from placer.cli.main import app
from placer.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]


def _fit(efficiency: float) -> FitResult:
    """A fit that found ``efficiency`` for NVLink (phase cost and compute kept)."""
    base = load_topology("dgx-h100").calibration
    params = (FittedParameter("nvlink.efficiency", 0.833, efficiency, True, 0.01),
              FittedParameter("nvlink.phase_us", 21.2, 21.2, True, 2.7),
              FittedParameter("compute.hbm_efficiency", 1.0, 0.2, True))
    return FitResult(base, base, params, ())


def test_the_declared_gpu_is_read_from_a_comment_line() -> None:
    assert declared_gpu("# lab run\n#gpu:  H800-SXM \nbenchmark,phase\n") == "h800-sxm"
    assert declared_gpu("benchmark,phase\nall_to_all,dispatch\n") is None
    shipped = (ROOT / "bench" / "data" / "deepep_v1.csv").read_text(encoding="utf-8")
    assert declared_gpu(shipped) == "h800-sxm"


def test_another_gpu_and_an_implausible_efficiency_are_said() -> None:
    h100 = load_topology("dgx-h100")
    said = hardware_warnings(_fit(0.2963), h100, "h800-sxm", source="t.csv")
    assert len(said) == 2
    assert said[0].startswith("t.csv declares gpu h800-sxm, but dgx-h100's GPUs are h100-sxm")
    assert said[1].startswith("nvlink.efficiency 0.2963: the timings run nvlink at 30% of its"
                              " nominal speed of 450 GB/s per GPU on dgx-h100")
    # the right GPU and a plausible fit: nothing (compute efficiencies are not links)
    assert hardware_warnings(_fit(0.833), h100, "h100-sxm") == []
    assert hardware_warnings(_fit(0.833), h100, None) == []
    assert len(hardware_warnings(_fit(MIN_PLAUSIBLE_EFFICIENCY - 0.01), h100)) == 1


@pytest.fixture
def h800_csv(tmp_path: Path) -> Path:
    """DeepEP's EP8 rows (one node: NVLink only), declared as measured on H800s."""
    shipped = read_timings(ROOT / "bench" / "data" / "deepep_v1.csv")
    rows = [r for r in shipped if r.case.num_gpus == 8 and r.case.mode != "low_latency_rdma"]
    path = tmp_path / "h800.csv"
    path.write_text(format_timings(rows, ["DeepEP EP8 rows", "gpu: h800-sxm"]))
    return path


def test_calibrating_an_h100_topology_on_h800_timings_warns(h800_csv: Path) -> None:
    result = CliRunner().invoke(app, ["calibrate", str(h800_csv), "--topology", "dgx-h100"])
    assert result.exit_code == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings[0].startswith(f"warning: {h800_csv} declares gpu h800-sxm, but dgx-h100's"
                                  " GPUs are h100-sxm")
    assert re.match(r"warning: nvlink\.efficiency 0\.3\d+: the timings run nvlink at 3\d% of its"
                    r" nominal speed of 450 GB/s per GPU on dgx-h100", warnings[1])


def test_calibrating_the_h800_preset_on_them_is_quiet(h800_csv: Path) -> None:
    result = CliRunner().invoke(app, ["calibrate", str(h800_csv), "--topology", "dgx-h800"])
    assert result.exit_code == 0, result.stderr
    assert "warning:" not in result.stderr


def test_the_readme_calibrates_a_file_the_repository_ships() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = re.findall(r"^\$ placer calibrate (\S+) --topology (\S+)", readme, flags=re.M)
    assert commands, "the README shows placer calibrate"
    for csv_path, topology in commands:
        assert (ROOT / csv_path).is_file(), csv_path
        gpu = declared_gpu((ROOT / csv_path).read_text(encoding="utf-8"))
        assert gpu in {t.name for t in load_topology(topology).gpu_type_of_gpu}
