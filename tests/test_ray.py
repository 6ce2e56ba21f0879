"""Ray as the cluster backend (placer.parallel): the same answers as local runs, and the
same answers when a worker dies mid-piece.

The Ray tests share one local instance (they run on one xdist worker, in order).  They are
skipped, saying why, when Ray is not installed (``pip install 'placer[ray]'``) or cannot
start here, except where ``PLACER_REQUIRE_RAY=1`` (``.ci/run``): there they fail, so that
every submission exercises the Ray backend.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import types
import warnings
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from placer.cli.main import app
from placer.compare import CompareSettings, compare, expand_scenarios
from placer.errors import UsageError
from placer.parallel import (
    RAY_LOCAL,
    Backend,
    WorkerLostError,
    WorkerWarning,
    check_reachable,
    connect_ray,
)
from placer.planning.build import ProblemSpec, build_problem
from placer.planning.solvers import solve
from placer.problem import SolveParams
from placer.traces import read_routing

pytestmark = pytest.mark.xdist_group("ray")

TRACE = "traces/synthetic-small.jsonl.gz"
#: Set by CI: Ray must be there and start; a skip would hide that the backend is untested.
REQUIRED = os.environ.get("PLACER_REQUIRE_RAY") == "1"


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"PLACER_REQUIRE_RAY=1 but {reason}")
    pytest.skip(reason)


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
    """One local Ray instance of 2 CPUs for the module; this module's functions travel to
    its workers by value (the tests folder is not on their path)."""
    try:
        import ray
    except ImportError:
        _unavailable("Ray is not installed (pip install 'placer[ray]')")
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR", ignore_reinit_error=True)
    except Exception as exc:  # pragma: no cover - depends on the machine
        _unavailable(f"a local Ray instance cannot start here: {exc}")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield ray
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    ray.shutdown()


@pytest.fixture(scope="module")
def routing():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return read_routing(TRACE, top_k=4)


def test_plan_on_ray_equals_the_local_plan(ray_instance, routing) -> None:
    from placer.model import load_model
    from placer.topology import load_topology

    problem = build_problem(routing, ProblemSpec(model=load_model("gpt-oss-20b"),
                            topology=load_topology("2x-dgx-h100"), redundant=16))
    # a generous wall limit: the deterministic limits decide, wherever the layers run; few
    # search steps keep the test short (the answer is compared, not its quality)
    short = {"balance_iterations": 3, "cost_iterations": 3}
    params = SolveParams(jobs=2, time_limit_s=300, options=short)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        local = solve(problem, "cpsat", params)
        remote = solve(problem, "cpsat", SolveParams(jobs=2, time_limit_s=300, ray=RAY_LOCAL,
                                                     options=short))
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


def test_compare_cpsat_on_ray_gives_the_local_placements(ray_instance, routing) -> None:
    # a budget small enough to stop every layer's search: the deterministic work decides,
    # not the wall clock, so Ray's workers plan what local processes plan, to the byte
    scenarios = expand_scenarios(["2x-dgx-h100"], [16], ["cpsat"])
    settings = CompareSettings(model="gpt-oss-20b", time_limit_s=0.6)
    for _ in range(3):  # a machine loaded past the wall-clock safety cap: try again
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            local = compare(routing, scenarios, settings, jobs=1)
            remote = compare(routing, scenarios, settings, ray=RAY_LOCAL)
        capped = [o for o in (*local, *remote)
                  if o.placement is not None and "reproducible" in o.placement.meta]
        if not capped:
            break
    else:
        pytest.xfail("every try hit the wall-clock safety cap (the machine is overloaded):"
                     " the placements are not meant to repeat then")
    for mine, theirs in zip(remote, local, strict=True):
        assert mine.row.ok and theirs.row.ok
        assert mine.placement is not None and theirs.placement is not None
        assert mine.placement.physical_to_logical.tobytes() == \
            theirs.placement.physical_to_logical.tobytes()
        assert {k: v for k, v in asdict(mine.row).items() if not k.endswith("_seconds")} == \
            {k: v for k, v in asdict(theirs.row).items() if not k.endswith("_seconds")}


def test_replay_on_ray_gives_the_local_figures(ray_instance) -> None:
    from placer.model import load_model
    from placer.regime import Regime
    from placer.replay import ReplayParams, replay
    from placer.replay.policies import parse_policy
    from placer.replay.steps import open_steps
    from placer.topology import load_topology

    model, topology = load_model("deepseek-v3"), load_topology("4x-dgx-h100")
    source = open_steps("traces/synthetic-dsv3-drift.npz", num_gpus=32, batch_tokens=256,
                        trace_steps=True, num_experts=256)
    policies = [parse_policy(p) for p in ("static:default", "eplb:window=32,interval=64",
                                          "placer:window=32,interval=32,async,decide-ms=5")]
    params = ReplayParams(Regime("vllm"), redundant=32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        local = replay(source, policies, model, topology, params)
        remote = replay(source, policies, model, topology,
                        ReplayParams(Regime("vllm"), redundant=32, ray=RAY_LOCAL))

    def figures(result):  # everything but the decisions' wall times (placer's is fixed:
        # a measured one would move where its decisions land)
        doc = result.to_dict()
        for policy in doc["policies"]:
            for part in (policy["figures"], *policy["segments"]):
                part.pop("decision_s_max")
            for r in policy["rebalances"]:
                r.pop("decision_s")
        return doc

    assert figures(remote) == figures(local)
    assert local.policies[1].rebalances  # eplb did rebalance: the comparison is not empty


# -- faults -----------------------------------------------------------------------------------
def _cube_dying_once(folder: str, x: int) -> int:
    """x ** 3; the first time it runs item 1 it kills its own Ray worker (SIGKILL)."""
    marker = Path(folder) / f"{x}.died"
    if x == 1 and not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return x**3


def _cube_always_dying(folder: str, x: int) -> int:
    if x == 1:
        (Path(folder) / f"death-{time.monotonic_ns()}").touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return x**3


def _refuses_two(x: int) -> int:
    if x == 2:
        raise UsageError("two is refused", where="x", hint="pass another number")
    return x


def test_a_ray_worker_killed_mid_piece_is_retried_with_the_same_answer(ray_instance,
                                                                        tmp_path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = Backend(ray=RAY_LOCAL).run(_cube_dying_once, [0, 1, 2, 3], shared=str(tmp_path),
                                         names=["layer 0", "layer 1", "layer 2", "layer 3"])
    assert got == [0, 1, 8, 27]
    assert (tmp_path / "1.died").exists()
    messages = [str(w.message) for w in caught if issubclass(w.category, WorkerWarning)]
    assert len(messages) == 1
    assert messages[0].startswith("the worker running layer 1 died (")
    assert messages[0].endswith("); layer 1 runs again (retry 1 of 2)")


def test_a_ray_piece_whose_worker_always_dies_is_lost_and_named(ray_instance,
                                                                 tmp_path) -> None:
    with warnings.catch_warnings(record=True), pytest.raises(WorkerLostError) as caught:
        warnings.simplefilter("always")
        Backend(ray=RAY_LOCAL, retries=1).run(_cube_always_dying, [0, 1, 2],
                                              shared=str(tmp_path), names=["a", "b", "c"])
    assert caught.value.where == "Ray (local instance)"
    assert caught.value.message.startswith("b was lost: its worker died 2 times (")
    assert len(list(tmp_path.glob("death-*"))) == 2


def test_what_a_ray_piece_raises_is_raised_as_it_was(ray_instance) -> None:
    with pytest.raises(UsageError) as caught:
        Backend(ray=RAY_LOCAL).run(_refuses_two, [1, 2, 3])
    assert type(caught.value) is UsageError  # not Ray's wrapper with a traceback inside
    assert str(caught.value) == "x: two is refused"
    assert caught.value.hint == "pass another number"


def test_an_unreachable_cluster_is_a_clear_error_without_a_wait() -> None:
    """No Ray needed: the address is tried before Ray is asked to join it."""
    with socket.socket() as server:  # a port nothing listens on: refused at once
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
    never = types.SimpleNamespace(is_initialized=lambda: False, init=_never_called)
    start = time.monotonic()
    with pytest.raises(UsageError) as caught:
        connect_ray(never, Backend(ray=f"ray://127.0.0.1:{port}"))
    assert time.monotonic() - start < 5
    error = caught.value
    assert error.where == "ray" and error.exit_code == 2
    assert error.message.startswith(f"cannot reach the Ray cluster at ray://127.0.0.1:{port}:")
    assert "ray status" in (error.hint or "")
    with socket.socket() as server, socket.socket() as first:  # a port that never answers:
        server.bind(("127.0.0.1", 0))  # its one-place queue is taken, so a connection waits
        server.listen(0)
        address = f"127.0.0.1:{server.getsockname()[1]}"
        first.connect(server.getsockname())
        start = time.monotonic()
        with pytest.raises(UsageError) as caught:
            check_reachable(address, timeout_s=0.5)
        assert time.monotonic() - start < 3  # the timeout bounds the wait
    assert caught.value.message == f"cannot reach the Ray cluster at {address}: no answer" \
        " within 0.5 s"


def _never_called(**kwargs: object) -> None:
    raise AssertionError("ray.init was called for an unreachable address")


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc: Linux")
def test_ray_workers_die_with_a_driver_killed_by_sigkill(tmp_path) -> None:
    """A run that started its own Ray instance, killed by SIGKILL mid-run: the Ray
    workers running its pieces are gone within seconds (Ray's node agents follow by
    their own check, within about a minute: docs/limits.md)."""
    if not REQUIRED:
        pytest.importorskip("ray", reason="Ray is not installed (pip install 'placer[ray]')")
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import ray, test_ray
        from placer.parallel import Backend
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR")
        ray.cloudpickle.register_pickle_by_value(test_ray)
        print("started", flush=True)
        Backend(ray="local").run(test_ray._sleep, [120.0, 120.0])
    """)
    driver = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    assert driver.stdout is not None and driver.stdout.readline() == "started\n"
    workers: list[int] = []
    deadline = time.monotonic() + 60
    while len(workers) < 2 and time.monotonic() < deadline:
        tree, stack = [], [driver.pid]
        while stack:
            kids = _children(stack.pop())
            tree += kids
            stack += kids
        workers = [p for p in tree if _command(p).startswith("ray::_call")]
        time.sleep(0.2)
    assert len(workers) == 2, "the pieces did not start on Ray workers"
    driver.kill()
    driver.wait(timeout=10)
    deadline = time.monotonic() + 15
    while any(_command(p).startswith("ray::") for p in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_command(p).startswith("ray::") for p in workers), "Ray workers outlived it"


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds
