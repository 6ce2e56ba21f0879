"""Ray as the cluster backend (placer.parallel): the same answers as local runs.

The Ray tests start a local instance; they are skipped, saying why, when Ray is not
installed (``pip install 'placer[ray]'``) or cannot start here.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import asdict

import numpy as np
import pytest
from typer.testing import CliRunner

from placer.cli.main import app
from placer.compare import CompareSettings, compare, expand_scenarios
from placer.errors import UsageError
from placer.parallel import RAY_LOCAL, Backend
from placer.planning.build import build_problem
from placer.planning.solvers import solve
from placer.problem import SolveParams
from placer.traces import read_routing

TRACE = "traces/synthetic-small.jsonl.gz"


def _square(x: int) -> int:
    return x * x


def _scaled(factor: int, x: int) -> int:
    return factor * x


def test_local_backends_agree_and_keep_order() -> None:
    seen: list[int] = []
    for backend in (Backend(jobs=1), Backend(jobs=2)):
        seen.clear()
        assert backend.run(_square, [3, 1, 2], on_done=lambda i, r: seen.append(i)) == [9, 1, 4]
        assert sorted(seen) == [0, 1, 2]
        assert backend.run(_scaled, [1, 2], shared=10) == [10, 20]
    assert Backend(jobs=2).describe() == "2 local processes"
    with pytest.raises(UsageError, match="jobs must be at least 1"):
        Backend(jobs=0)


def test_ray_missing_is_a_usage_error_with_a_hint(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(UsageError) as caught:
        Backend(ray=RAY_LOCAL).run(_square, [1])
    assert caught.value.where == "ray"
    assert "pip install 'placer[ray]'" in (caught.value.hint or "")
    result = CliRunner().invoke(app, ["plan", TRACE, "-g", "8", "--ray", "local", "-o",
                                      "/tmp/placer-ray-missing.json"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --ray: --ray needs Ray, which is not installed")


@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'placer[ray]')")
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR", ignore_reinit_error=True)
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"a local Ray instance cannot start here: {exc}")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def routing():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return read_routing(TRACE, top_k=4)


def test_plan_on_ray_equals_the_local_plan(ray_instance, routing) -> None:
    from placer.model import load_model
    from placer.topology import load_topology

    problem = build_problem(routing, model=load_model("gpt-oss-20b"),
                            topology=load_topology("2x-dgx-h100"), redundant=16)
    # a generous wall limit: the deterministic limits decide, wherever the layers run
    params = SolveParams(jobs=2, time_limit_s=300)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        local = solve(problem, "cpsat", params)
        remote = solve(problem, "cpsat", SolveParams(jobs=2, time_limit_s=300, ray=RAY_LOCAL))
    assert remote.details["wall_limit_hit_layers"] == 0
    np.testing.assert_array_equal(remote.placement.physical_to_logical,
                                  local.placement.physical_to_logical)


def test_compare_on_ray_gives_the_local_table(ray_instance, routing) -> None:
    scenarios = expand_scenarios(["dgx-h100", "2x-dgx-h100"], [0, 16], ["eplb"])
    settings = CompareSettings(model="gpt-oss-20b")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        local = compare(routing, scenarios, settings, jobs=1, keep_details=False)
        remote = compare(routing, scenarios, settings, ray=RAY_LOCAL, keep_details=False)
    def figures(outcomes):  # everything but the wall times, which differ from run to run
        return [{k: v for k, v in asdict(o.row).items() if not k.endswith("_seconds")}
                for o in outcomes]

    assert figures(remote) == figures(local)
    assert all(o.row.ok for o in remote)
