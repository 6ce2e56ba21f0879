"""``placer synth`` source ranks (``--ranks``, ``--topology``, the default) and the bundled
drifting DeepSeek-V3-shaped trace, remade by the command its README gives."""

from __future__ import annotations

import re
import shlex
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from placer.cli.main import app
from placer.stats.analysis import total_variation
from placer.traces import read_routing

pytestmark = pytest.mark.filterwarnings("ignore::placer.errors.TraceWarning")

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]
DRIFT = REPO / "traces" / "synthetic-dsv3-drift.npz"
SMALL = ["--model", "deepseek-v3", "--layers", "3-4", "--tokens", "512"]


def run(*args: object, env: dict[str, str] | None = None):
    return runner.invoke(app, [str(a) for a in args], env=env)


def test_topology_records_one_source_rank_per_gpu(tmp_path: Path):
    """A trace for 4 x DGX H100 comes from its 32 GPUs."""
    path = tmp_path / "ds.npz"
    result = run("synth", path, *SMALL, "--topology", "4x-dgx-h100")
    assert result.exit_code == 0, result.stderr
    z = np.load(path)
    assert np.unique(z["rank"]).tolist() == list(range(32))
    assert z["rank"][:34].tolist() == [*range(32), 0, 1]  # round-robin over a step
    assert int(z["synth_num_ranks"]) == 32
    assert "note:" not in result.stderr


def test_without_ranks_none_are_recorded_and_a_plan_spreads_the_tokens(tmp_path: Path):
    """Neither --ranks nor --topology: no source ranks (not all tokens from rank 0), a note
    says so, and judging on 32 GPUs deals the tokens over all of them."""
    path = tmp_path / "ds.npz"
    result = run("synth", path, *SMALL)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == (
        "note: no --ranks or --topology: the trace records no source ranks; placer deals"
        " each step's tokens round-robin over the GPUs of the cluster it plans or judges"
        " for\n")
    assert "rank" not in np.load(path).files
    assert int(np.load(path)["synth_num_ranks"]) == 0
    trace = read_routing(path, keep_tokens=True).trace
    assert trace is not None and (trace.rank == -1).all()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = run("plan", path, "-m", "deepseek-v3", "-t", "4x-dgx-h100", "--solver", "eplb",
                   "-o", tmp_path / "p.json")
    assert plan.exit_code == 0, plan.stderr
    assert "source rank" not in plan.stderr + "".join(str(w.message) for w in caught)
    assert run("synth", path, *SMALL, "-q").stderr == ""


def test_ranks_that_contradict_the_topology_are_a_usage_error(tmp_path: Path):
    result = run("synth", tmp_path / "x.npz", *SMALL, "--topology", "4x-dgx-h100",
                 "--ranks", "8")
    assert result.exit_code == 2
    assert result.stderr == (
        "error: --ranks: 8 source ranks contradict --topology 4x-dgx-h100, which has 32 GPUs\n"
        "hint: give one of them: --topology records one source rank per GPU\n")
    assert not (tmp_path / "x.npz").exists()


def test_a_configured_topology_sets_the_ranks_unless_ranks_are_given(tmp_path: Path):
    env = {"PLACER_TOPOLOGY": "dgx-h100"}
    assert run("synth", tmp_path / "a.npz", *SMALL, env=env).exit_code == 0
    assert np.unique(np.load(tmp_path / "a.npz")["rank"]).tolist() == list(range(8))
    result = run("synth", tmp_path / "b.npz", *SMALL, "--ranks", "4", env=env)
    assert result.exit_code == 0, result.stderr
    assert np.unique(np.load(tmp_path / "b.npz")["rank"]).tolist() == [0, 1, 2, 3]


def test_topic_options_reach_the_trace(tmp_path: Path):
    path = tmp_path / "t.npz"
    result = run("synth", path, *SMALL, "--ranks", "2", "--topics", "3", "--topic-overlap",
                 "0.9,0.1", "--burst-every", "8", "--burst-share", "0.6", "--mix-period", "100",
                 "--request-steps", "5")
    assert result.exit_code == 0, result.stderr
    z = np.load(path)
    assert int(z["synth_topics"]) == 3 and z["synth_topic_overlap"].tolist() == [0.9, 0.1]
    assert float(z["synth_burst_every"]) == 8 and float(z["synth_burst_share"]) == 0.6
    assert float(z["synth_mix_period"]) == 100 and float(z["synth_request_steps"]) == 5
    bad = run("synth", tmp_path / "x.npz", *SMALL, "--request-steps", "3")
    assert bad.exit_code == 2
    assert bad.stderr == ("error: --request-steps: shapes request topics, but --topics is 0\n"
                          "hint: give --topics (2 or more) to use it\n")


# -- the bundled trace -------------------------------------------------------------------


def documented_command() -> list[str]:
    """The ``placer synth`` command traces/README.md gives for the drifting trace."""
    text = (REPO / "traces" / "README.md").read_text(encoding="utf-8")
    found = re.search(r"```\n(placer synth traces/synthetic-dsv3-drift\.npz.*?)\n```", text,
                      re.S)
    assert found, "traces/README.md has no command for synthetic-dsv3-drift.npz"
    return shlex.split(found.group(1).replace("\\\n", " "))


def test_bundled_drift_trace_is_what_its_documented_command_makes(tmp_path: Path):
    args = documented_command()
    assert args[:3] == ["placer", "synth", "traces/synthetic-dsv3-drift.npz"]
    result = run("synth", tmp_path / "again.npz", *args[3:], "-q")
    assert result.exit_code == 0, result.stderr
    again, bundled = np.load(tmp_path / "again.npz"), np.load(DRIFT)
    assert sorted(again.files) == sorted(bundled.files)
    for key in bundled.files:
        np.testing.assert_array_equal(again[key], bundled[key], err_msg=key)


def test_bundled_drift_trace_shape():
    """DeepSeek-V3's routing shape, absolute MoE layer ids, 32 source ranks, steps."""
    assert DRIFT.stat().st_size < 4_000_000
    z = np.load(DRIFT)
    assert bool(z["synthetic"]) and str(z["model"]) == "deepseek-v3"
    assert (int(z["num_experts"]), int(z["top_k"])) == (256, 8)
    assert z["layer_ids"].tolist() == [3, 4, 59, 60]
    assert np.unique(z["rank"]).tolist() == list(range(32))
    assert z["step"].max() + 1 >= 200 and int(z["synth_topics"]) > 1
    groups = np.sort(z["topk_ids"] // 32, axis=2)
    assert (1 + (groups[:, :, 1:] != groups[:, :, :-1]).sum(axis=2)).max() <= 4


@pytest.fixture(scope="module")
def stationary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled trace's command without its topics: the same shape, no drift."""
    args = documented_command()[3:]
    for option in ("--topics", "--burst-every", "--burst-share", "--mix-period",
                   "--request-steps"):
        if option in args:
            at = args.index(option)
            del args[at:at + 2]
    path = tmp_path_factory.mktemp("stationary") / "flat.npz"
    assert run("synth", path, *args, "-q").exit_code == 0
    return path


def test_bundled_drift_trace_drifts_beyond_sampling_noise(stationary: Path):
    """Windows of 32 steps: consecutive windows differ more than in the stationary trace
    of the same shape (whose differences are sampling noise alone), deep layers most."""
    def tv_by_layer(path: Path) -> np.ndarray:
        load = read_routing(path, window_tokens=8192).stats.load  # [windows, layers, E]
        return np.array([np.mean([total_variation(load[w, row], load[w + 1, row])
                                  for w in range(load.shape[0] - 1)])
                         for row in range(load.shape[1])])

    drift, flat = tv_by_layer(DRIFT), tv_by_layer(stationary)
    assert (drift > 1.2 * flat).all()
    assert drift[2:].mean() > drift[:2].mean()  # layers 59 and 60 drift more than 3 and 4
