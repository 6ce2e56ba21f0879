"""Online decision time: placer's policy on a DeepSeek-V3-shaped rearrangement, one core.

The input is what vLLM's EplbState holds at a rearrangement of DeepSeek-V3 on 4 x DGX H100
(EP32, 32 redundant experts: 288 slots of 9 per GPU): the window's load ``[layers, 256]``
and the deployed physical-to-logical map ``[layers, 288]``, for the 58 MoE layers and the
59 with the MTP layer.  The deployed map is the reference EPLB's on yesterday's load
(vLLM's default policy runs the same algorithm); the window is that load drifted (each
expert's load times a gamma(2, 0.5) factor).

Each figure is the median of :data:`REPEATS` calls, measured in a process of its own
pinned to one core with one BLAS/torch thread: wall-clock seconds, and the process's CPU
seconds beside them (the machine is shared: the CPU figure is the work itself).

- **placer library**: :func:`placer.online.rebalance` (numpy), with no move budget and
  with 256 moves;
- **placer through vLLM**: placer's policy as vLLM calls it, ``EPLB_POLICIES["default"]
  .rebalance_experts(...)`` after ``vllm.plugins.load_general_plugins()`` with
  ``PLACER_VLLM_POLICY`` set (torch tensors in and out), 256 moves;
- **vLLM default**: vLLM's own ``DefaultEplbPolicy.rebalance_experts`` on the same
  tensors.

The two vLLM columns need the engine tier's environment (``make test-engine`` makes it;
``PLACER_ENGINE_VENV``, default ``~/.cache/placer/vllm-0.33.0``); without it they say so.
Target: a 59-layer decision through vLLM's interface under 1 s on one core.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
ENGINE_VENV = Path(os.environ.get("PLACER_ENGINE_VENV",
                                  Path.home() / ".cache" / "placer" / "vllm-0.33.0"))
#: Calls per figure (the median is reported).
REPEATS = 5
#: DeepSeek-V3 on 4 x DGX H100.
EXPERTS, GROUPS, RANKS, SLOTS, NODES = 256, 8, 32, 9, 4
CONFIG = "topology=4x-dgx-h100,model=deepseek-v3,max_moves=256,horizon=1000"
#: One core, one thread: the figures are a single core's.
ONE_CORE = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run() -> str:
    out = ["## online: one rearrangement of DeepSeek-V3 on 4 x DGX H100, one core", "",
           "Median of 5 calls, wall s (CPU s); EP32, 256 experts, 288 slots.", "",
           "| layers | placer library, no budget | placer library, 256 moves |"
           " placer through vLLM, 256 moves | vLLM default | moves (256 budget) | GB |"
           " target < 1 s through vLLM |",
           "|---|---|---|---|---|---|---|---|"]
    engine = ENGINE_VENV / "bin" / "python"
    with tempfile.TemporaryDirectory() as tmp:
        for layers in (58, 59):
            path = Path(tmp) / f"window-{layers}.npz"
            _inputs(layers, path)
            lib = _measure(sys.executable, "library", path)
            vllm = _measure(str(engine), "vllm", path) if engine.exists() else None
            through = _cell(vllm["placer"]) if vllm else "(no engine env)"
            default = _cell(vllm["default"]) if vllm else "(no engine env)"
            verdict = ("yes" if vllm and vllm["placer"]["wall"] < 1.0 else
                       "no" if vllm else "not measured")
            out.append(f"| {layers} | {_cell(lib['none'])} | {_cell(lib['budget'])} |"
                       f" {through} | {default} | {lib['budget']['moves']} |"
                       f" {lib['budget']['gb']:.1f} | {verdict} |")
    out += ["", f"vLLM columns: {engine} ({'present' if engine.exists() else 'absent'})."]
    return "\n".join(out) + "\n"


def _cell(figure: dict[str, float]) -> str:
    return f"{figure['wall']:.3f} ({figure['cpu']:.3f})"


def _inputs(layers: int, path: Path) -> None:
    """The window's load and the deployed map (module docstring), saved for both
    environments."""
    from placer.planning.solvers.eplb import eplb_placement

    rng = np.random.default_rng(layers)
    yesterday = rng.gamma(0.5, size=(layers, EXPERTS)) * 1_000
    today = (yesterday * rng.gamma(2.0, 0.5, size=(layers, EXPERTS))).round()
    deployed, _ = eplb_placement(yesterday, np.arange(layers), RANKS, SLOTS,
                                 num_groups=GROUPS, num_nodes=NODES)
    np.savez(path, load=today.astype(np.int64), deployed=deployed.physical_to_logical)


def _measure(python: str, what: str, path: Path) -> dict:
    """Run :func:`_timed` in a process of its own, pinned to one core."""
    env = {**os.environ, **ONE_CORE, "PYTHONPATH": str(REPO), "PLACER_VLLM_POLICY": CONFIG}
    env.pop("VLLM_PLUGINS", None)
    code = f"from bench.online import _timed; _timed({what!r}, {str(path)!r})"
    done = subprocess.run([python, "-c", code], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=900, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _timed(what: str, path: str) -> None:
    """In the measuring process: time each call :data:`REPEATS` times, print JSON."""
    import time

    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    data = np.load(path)
    load, deployed = data["load"], data["deployed"]

    def median(call) -> dict[str, float]:
        walls, cpus = [], []
        result = None
        for _ in range(REPEATS):
            w, c = time.perf_counter(), time.process_time()
            result = call()
            walls.append(time.perf_counter() - w)
            cpus.append(time.process_time() - c)
        return {"wall": float(np.median(walls)), "cpu": float(np.median(cpus)),
                "result": result}

    if what == "library":
        from placer.model import load_model
        from placer.online import OnlineSettings, rebalance
        from placer.topology import load_topology

        model, topology = load_model("deepseek-v3"), load_topology("4x-dgx-h100")
        out = {}
        for key, budget in (("none", None), ("budget", 256)):
            settings = OnlineSettings(max_moves=budget)
            fig = median(lambda s=settings: rebalance(load, deployed, topology=topology,
                                                      model=model, settings=s))
            record = fig.pop("result")
            out[key] = {**fig, "moves": record.moves, "gb": record.bytes / 1e9}
    else:
        import torch
        import vllm.plugins
        from vllm.distributed.eplb.policy import EPLB_POLICIES, DefaultEplbPolicy

        torch.set_num_threads(1)
        vllm.plugins.load_general_plugins()
        weight = torch.from_numpy(load.astype(np.int32))
        old = torch.from_numpy(deployed)
        args = (weight, RANKS * SLOTS, GROUPS, NODES, RANKS, old)
        placer_policy = EPLB_POLICIES["default"]
        assert placer_policy is not DefaultEplbPolicy, "placer's plugin did not load"
        out = {"placer": median(lambda: placer_policy.rebalance_experts(*args)),
               "default": median(lambda: DefaultEplbPolicy.rebalance_experts(*args))}
        for fig in out.values():
            fig.pop("result")
    print(json.dumps(out))
