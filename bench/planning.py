"""Planning benchmark: the CP-SAT planner against DeepSeek EPLB on real routing data.

The planning targets, each measured in one run, side by side with EPLB, with pass/fail and
the margin.  Reads ``../shared/data/real`` (gpt-oss-20b loads and co-activation,
Qwen3-30B-A3B loads and thresholded co-activation, Mixtral-8x7B per-token logs) the way
``placer plan`` does: through ``placer.traces.read_routing`` (``top_k`` from the model,
as the CLI passes it) and ``placer.planning.build.build_problem`` with the model preset, the
GPU count or topology and ``--slots-per-gpu``.  The gpt-oss-20b ``load_coact.npz`` and
the Mixtral JSONL logs are read as they are; the Qwen3 JSON is converted once, into a
temporary folder, by ``traces/convert_qwen3.py`` (the script that made the bundled
``traces/qwen3-30b-a3b.npz``).  Rows whose data is absent are skipped with a note.
Default solver settings, ``jobs=2``.  EPLB is ``--solver eplb``: deepseek-ai/EPLB's
``rebalance_experts`` exactly, which may put two replicas of one expert on one GPU.

Set ``PLACER_BENCH_PLANNING_QUICK=1`` for a reduced run while developing (gpt-oss-20b
8x5, Qwen3 on 2 x DGX H100 and Mixtral 4x3 only, no traffic-first variants).

Figures:
- hot shard: hottest GPU over mean GPU load per layer, loads summed over the fitted
  windows, each expert split evenly over its replicas (``placement.gpu_loads``);
- remote copies per token: the evaluator's closed form
  (``placer.evaluate.expected_remote_copies``, DeepEP normal mode, uniform source rank),
  mean over layers;
- per-batch hot shard (robustness): the same ratio per held-out window of 16 tokens
  (``--window-tokens 16``), p99 over (window, layer);
- moves: ``Placement.moves_from`` (expert copies loaded onto GPUs).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from bench.__main__ import SHARED_DATA
from placer.errors import PlacerWarning
from placer.evaluate import expected_remote_copies, remote_copy_bounds
from placer.model import load_model
from placer.placement import Placement, gpu_loads, hot_shard_ratio
from placer.placement.migration import moves_from
from placer.planning.build import ProblemSpec, build_problem
from placer.planning.solvers import solve
from placer.problem import PlacementProblem, SolveParams, SolveResult
from placer.stats import RoutingData
from placer.traces import read_routing

REAL = SHARED_DATA / "real"
REPO = Path(__file__).resolve().parent.parent
JOBS = 2
#: Traffic-first variants of the traffic rows: label and ``--balance-tolerance`` (hot
#: shard allowed over EPLB's).  The second shows what co-location alone could buy.
TRAFFIC_FIRST = (("--traffic-first 1%", 0.01), ("--traffic-first 100% (ceiling)", 1.0))
#: Tokens per window (``--window-tokens``) for the Mixtral robustness and migration rows.
MIXTRAL_BATCH_TOKENS = 16
#: Reduced run while developing (see the module docstring).
QUICK = os.environ.get("PLACER_BENCH_PLANNING_QUICK", "") not in ("", "0")


@dataclass
class Plan:
    """One solve: result, wall seconds, and the problem it solved."""

    problem: PlacementProblem
    result: SolveResult
    seconds: float

    @property
    def placement(self) -> Placement:
        return self.result.placement


# -- data, read as placer plan reads it ---------------------------------------------------------
def read(source: Path | list[Path], model: str, **kwargs: Any) -> RoutingData:
    """``read_routing`` with the model's ``top_k`` (as ``placer plan --model`` passes it);
    the reader's warnings go to stderr."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PlacerWarning)
        paths = [str(p) for p in source] if isinstance(source, list) else str(source)
        data = read_routing(paths, top_k=load_model(model).top_k, **kwargs)
    for w in caught:
        if issubclass(w.category, PlacerWarning):
            print(f"[bench]   {model}: warning: {w.message}", file=sys.stderr, flush=True)
    return data


def gpt_oss() -> RoutingData | None:
    """``load_coact.npz`` as it is: an aggregated ``.npz`` (``load``, ``coact``)."""
    path = REAL / "gpt-oss-20b" / "load_coact.npz"
    return read(path, "gpt-oss-20b") if path.exists() else None


def qwen3(folder: Path) -> RoutingData | None:
    """The Qwen3 JSON converted by ``traces/convert_qwen3.py`` into ``folder``, then read;
    without ../shared, the bundled ``traces/qwen3-30b-a3b.npz`` (the same conversion)."""
    source = REAL / "qwen3-30b-a3b" / "coactivation_qwen3-30b-a3b.json"
    if not source.exists():
        bundled = REPO / "traces" / "qwen3-30b-a3b.npz"
        return read(bundled, "qwen3-30b-a3b") if bundled.exists() else None
    spec = importlib.util.spec_from_file_location(
        "convert_qwen3", REPO / "traces" / "convert_qwen3.py")
    assert spec is not None and spec.loader is not None
    convert = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(convert)
    path = folder / "qwen3-30b-a3b.npz"
    np.savez_compressed(path, **convert.convert(source))
    return read(path, "qwen3-30b-a3b")


def mixtral_files(*datasets: str) -> list[Path] | None:
    files = [REAL / "mixtral-8x7b" / f"{name}_2_routing.jsonl" for name in datasets]
    return files if all(f.exists() for f in files) else None


def mixtral(*datasets: str) -> RoutingData:
    """The vLLM per-token logs as they are (JSONL; ``problem_id`` and ``token_idx`` are the
    reader's request and token aliases), windows of ``MIXTRAL_BATCH_TOKENS`` tokens."""
    files = mixtral_files(*datasets)
    assert files is not None
    return read(files, "mixtral-8x7b", window_tokens=MIXTRAL_BATCH_TOKENS)


# -- solving and figures ----------------------------------------------------------------------
def problem_for(routing: RoutingData, model: str, num_gpus: int, slots: int,
                topology: Any = None, current: Placement | None = None,
                fit: tuple[int, int] | None = None) -> PlacementProblem:
    """``build_problem`` as ``placer plan TRACE --model M (-g G | --topology T)
    --slots-per-gpu S [--current C] [--fit A:B]`` calls it."""
    return build_problem(routing, ProblemSpec(
        model=load_model(model), topology=topology,
        num_gpus=None if topology is not None else num_gpus, slots_per_gpu=slots,
        current=current, fit=fit))


def run_plan(problem: PlacementProblem, solver: str, **params: Any) -> Plan:
    started = time.perf_counter()
    result = solve(problem, solver, SolveParams(jobs=JOBS, **params))
    seconds = time.perf_counter() - started
    print(f"[bench]   {solver} on {problem.num_gpus}x{problem.slots_per_gpu},"
          f" {problem.stats.num_layers} layers: {seconds:.1f} s", file=sys.stderr, flush=True)
    return Plan(problem, result, seconds)


def ratios(placement: Placement, stats: Any) -> np.ndarray:
    """``[layers]`` hot-shard ratio of the summed load."""
    return hot_shard_ratio(gpu_loads(placement, stats.mean_load))


def remote(plan: Plan) -> np.ndarray:
    """``[2]`` remote GPUs and nodes per token, mean over layers."""
    topology = plan.problem.topology or SimpleNamespace(node_of_gpu=plan.problem.node_of_gpu)
    return expected_remote_copies(plan.placement, plan.problem.stats, topology).mean(axis=0)


def remote_bounds(plan: Plan) -> np.ndarray:
    """``[2]`` lower and upper bound on remote GPUs per token, mean over layers."""
    topology = plan.problem.topology or SimpleNamespace(node_of_gpu=plan.problem.node_of_gpu)
    bounds: np.ndarray = remote_copy_bounds(plan.placement, plan.problem.stats,
                                            topology)[:, 0].mean(axis=0)
    return bounds


def sampled_remote(plan: Plan, model: str, topology: Any) -> np.ndarray:
    """``[2]`` remote GPUs and nodes per token from the evaluator's sampled batches
    (16 batches of 2,048 tokens drawn with co-activation, round-robin dispatch)."""
    from placer.evaluate import EvalParams, evaluate
    from placer.evaluate.dispatch import OrderBiasWarning

    with warnings.catch_warnings():
        # the sampled lists are ordered hot-first; that bias is docs/evaluate.md's matter
        warnings.simplefilter("ignore", OrderBiasWarning)
        evaluation = evaluate(plan.placement, plan.problem.stats, topology, load_model(model),
                              EvalParams(num_batches=16, batch_tokens=2048))
    return np.array([evaluation.metrics["remote_copies_per_token_gpu"],
                     evaluation.metrics["remote_copies_per_token_node"]])


def one_node(num_gpus: int) -> Any:
    """A single H100 node with ``num_gpus`` GPUs (the DGX H100 figures)."""
    from placer.topology import topology_from_dict

    return topology_from_dict({
        "name": f"{num_gpus}x-h100",
        "gpu_types": {"h100-sxm": {"memory_gb": 80, "hbm_gbps": 3350, "bf16_tflops": 989,
                                   "fp8_tflops": 1979}},
        "nodes": [{"name": "node0", "gpus": num_gpus, "gpu_type": "h100-sxm",
                   "fabric": {"kind": "nvswitch", "gbps": 450}, "nic_gbps": 50}],
    })


def verdict(ok: bool) -> str:
    return "pass" if ok else "**FAIL**"


# -- targets ------------------------------------------------------------------------------------
def run() -> str:
    out = ["## planning: cpsat vs EPLB on real routing data", ""]
    if not SHARED_DATA.exists():
        out += [f"({SHARED_DATA} is absent: the Qwen3-30B-A3B rows come from the bundled"
                " traces/qwen3-30b-a3b.npz, the same data; the gpt-oss-20b and Mixtral rows"
                " need the real data and are left out)", ""]
    with tempfile.TemporaryDirectory(prefix="placer-bench-") as folder:
        return _run(out, Path(folder))


def _run(out: list[str], folder: Path) -> str:
    out += ["Inputs read by `read_routing` and planned from `build_problem` as `placer plan`"
            " reads and plans them; EPLB is `--solver eplb` (deepseek-ai/EPLB's"
            " `rebalance_experts` exactly)." + (" Quick run (PLACER_BENCH_PLANNING_QUICK):"
                                                " fewer rows." if QUICK else ""), ""]
    timings: list[tuple[str, float]] = []
    plans: dict[str, tuple[Plan, Plan]] = {}

    oss, qwen = gpt_oss(), qwen3(folder)
    cases: list[tuple[str, RoutingData, int, int, Any]] = []
    if oss is not None:
        cases += [("gpt-oss-20b", oss, 8, 5, None)] if QUICK else [
            ("gpt-oss-20b", oss, 4, 9, None), ("gpt-oss-20b", oss, 8, 5, None)]
    if qwen is not None:
        from placer.topology import load_topology

        two_nodes = ("qwen3-30b-a3b", qwen, 16, 9, load_topology("2x-dgx-h100"))
        cases += [two_nodes] if QUICK else [
            ("qwen3-30b-a3b", qwen, 16, 9, None), ("qwen3-30b-a3b", qwen, 32, 5, None),
            two_nodes]
    traffic_first: dict[str, list[tuple[str, Plan]]] = {}
    for name, routing, gpus, slots, topology in cases:
        key = f"{name} {'2x-dgx-h100 ' if topology is not None else ''}{gpus}x{slots}"
        problem = problem_for(routing, name, gpus, slots, topology)
        eplb = run_plan(problem, "eplb")
        cpsat = run_plan(problem, "cpsat")
        plans[key] = (cpsat, eplb)
        timings.append((key, cpsat.seconds))
        if (name == "gpt-oss-20b" or topology is not None) and not QUICK:
            variants = []
            for label, tolerance in TRAFFIC_FIRST:
                plan = run_plan(problem, "cpsat", options={
                    "traffic_first": True, "balance_tolerance": tolerance})
                timings.append((f"{key} ({label})", plan.seconds))
                variants.append((label, plan))
            traffic_first[key] = variants

    # 1. balance
    out += ["### 1. Balance: hot shard per layer (hottest / mean GPU load), summed load", "",
            "| plan | EPLB median | cpsat median | EPLB worst | cpsat worst |"
            " layers cpsat <= EPLB | median <= 1.005 | verdict |",
            "|---|---|---|---|---|---|---|---|"]
    for key, (cpsat, eplb) in plans.items():
        if "2x-dgx" in key:
            continue
        mine, theirs = ratios(cpsat.placement, cpsat.problem.stats), ratios(
            eplb.placement, eplb.problem.stats)
        not_worse = int((mine <= theirs + 1e-12).sum())
        median = float(np.median(mine))
        ok = not_worse == mine.size and median <= 1.005
        out.append(
            f"| {key} | {np.median(theirs):.4f} | {median:.4f} | {theirs.max():.4f} |"
            f" {mine.max():.4f} | {not_worse}/{mine.size} | {median - 1:.2%} (margin"
            f" {1.005 - median:+.2%}) | {verdict(ok)} |"
        )

    # 2. traffic, one node
    out += ["", "### 2. Traffic: remote GPUs per token (normal mode), one node", "",
            "Sampled (the verdict): the evaluator's `evaluate` on 16 batches of 2,048 tokens"
            " drawn with co-activation.  Bounds: `remote_copy_bounds`, valid for any routing"
            " with these loads and pair counts (lower: pairwise inclusion-exclusion, the closed"
            " form; upper: Hunter's spanning-tree bound); the change bracket pairs cpsat's"
            " lower with EPLB's upper bound and the reverse.  Hot shard: median over layers"
            " of the summed load.", "",
            "| plan | settings | EPLB sampled | cpsat sampled | change (target <= -25%) |"
            " EPLB bounds | cpsat bounds | change, closed form | change bracket |"
            " hot shard EPLB | cpsat | change (target <= +1%) | verdict |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, (cpsat, eplb) in plans.items():
        if not key.startswith("gpt-oss"):
            continue
        topology = one_node(cpsat.problem.num_gpus)
        r_theirs = remote(eplb)[0]
        b_theirs = remote_bounds(eplb)
        s_theirs = sampled_remote(eplb, "gpt-oss-20b", topology)[0]
        h_theirs = float(np.median(ratios(eplb.placement, eplb.problem.stats)))
        for label, plan in [("default", cpsat), *traffic_first.get(key, [])]:
            r_mine = remote(plan)[0]
            b_mine = remote_bounds(plan)
            s_mine = sampled_remote(plan, "gpt-oss-20b", topology)[0]
            h_mine = float(np.median(ratios(plan.placement, plan.problem.stats)))
            change, hot = s_mine / s_theirs - 1, h_mine / h_theirs - 1
            out.append(
                f"| {key} | {label} | {s_theirs:.3f} | {s_mine:.3f} | {change:+.1%} |"
                f" {b_theirs[0]:.3f}-{b_theirs[1]:.3f} | {b_mine[0]:.3f}-{b_mine[1]:.3f} |"
                f" {r_mine / r_theirs - 1:+.1%} | {b_mine[0] / b_theirs[1] - 1:+.1%} to"
                f" {b_mine[1] / b_theirs[0] - 1:+.1%} | {h_theirs:.4f} | {h_mine:.4f} |"
                f" {hot:+.2%} | {verdict(change <= -0.25 and hot <= 0.01)} |"
            )

    # 3. multi-node
    out += ["", "### 3. Multi-node: remote nodes per token, Qwen3-30B-A3B on 2 x DGX H100", "",
            "Sampled evaluator (the pairwise closed form is not valid for top-8 with strong"
            " co-location: it can go negative).", "",
            "| plan | settings | EPLB nodes/token | cpsat | change (target <= -25%) |"
            " EPLB GPUs/token | cpsat | hot shard EPLB | cpsat | change | verdict |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, (cpsat, eplb) in plans.items():
        if "2x-dgx" not in key:
            continue
        topology = cpsat.problem.topology
        theirs = sampled_remote(eplb, "qwen3-30b-a3b", topology)
        h_theirs = float(np.median(ratios(eplb.placement, eplb.problem.stats)))
        for label, plan in [("default", cpsat), *traffic_first.get(key, [])]:
            mine = sampled_remote(plan, "qwen3-30b-a3b", topology)
            h_mine = float(np.median(ratios(plan.placement, plan.problem.stats)))
            change, hot = mine[1] / theirs[1] - 1, h_mine / h_theirs - 1
            out.append(
                f"| {key} | {label} | {theirs[1]:.3f} | {mine[1]:.3f} | {change:+.1%} |"
                f" {theirs[0]:.3f} | {mine[0]:.3f} | {h_theirs:.4f} | {h_mine:.4f} |"
                f" {hot:+.2%} | {verdict(change <= -0.25 and hot <= 0.01)} |"
            )

    # 4. robustness and 5. migration on Mixtral per-token logs
    if mixtral_files("gsm8k", "humaneval") is None:
        out += ["", "(Mixtral rows skipped: data absent)"]
    else:
        out += _robustness(timings)
        out += _migration(timings)

    # 6. time
    out += ["", "### 6. Time: wall seconds per plan, default settings, jobs=2 (target < 60 s)", "",
            "| plan | cpsat seconds | verdict |", "|---|---|---|"]
    for key, seconds in timings:
        out.append(f"| {key} | {seconds:.1f} | {verdict(seconds < 60)} |")
    return "\n".join(out) + "\n"


def _p99_batch_hot_shard(placement: Placement, loads: np.ndarray) -> float:
    per_batch = hot_shard_ratio(gpu_loads(placement, loads))  # [batches, layers]
    return float(np.percentile(per_batch, 99))


def _shapes() -> tuple[tuple[int, int], ...]:
    return ((4, 3),) if QUICK else ((4, 3), (8, 2))


def _robustness(timings: list) -> list[str]:
    """Both logs in file order (GSM8K first), windows of 16 tokens: fit the first half of
    the windows (``--fit 0:H``), judge on the full windows of the second half."""
    routing = mixtral("gsm8k", "humaneval")
    stats = routing.stats
    half = stats.num_windows // 2
    full = np.flatnonzero(stats.tokens == MIXTRAL_BATCH_TOKENS)
    held_out = stats.load[full[full >= half]]  # [windows, layers, experts]
    lines = ["", "### 4. Robustness: Mixtral-8x7B, fitted on the first half of the tokens,"
             f" judged on windows of {MIXTRAL_BATCH_TOKENS} tokens of the second half", "",
             "| plan | settings | windows fitted | EPLB p99 batch hot shard | cpsat p99 | change |"
             " EPLB mean | cpsat mean | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for gpus, slots in _shapes():
        problem = problem_for(routing, "mixtral-8x7b", gpus, slots, fit=(0, half))
        eplb = run_plan(problem, "eplb")
        theirs = _p99_batch_hot_shard(eplb.placement, held_out)
        theirs_mean = float(hot_shard_ratio(gpu_loads(eplb.placement, held_out)).mean())
        for label, extra in (("default", {}),
                             (f"--noise-batch-tokens {MIXTRAL_BATCH_TOKENS}",
                              {"options": {"batch_tokens": MIXTRAL_BATCH_TOKENS}})):
            cpsat = run_plan(problem, "cpsat", **extra)
            timings.append((f"mixtral-8x7b {gpus}x{slots} (first half, {label})",
                            cpsat.seconds))
            mine = _p99_batch_hot_shard(cpsat.placement, held_out)
            mine_mean = float(hot_shard_ratio(gpu_loads(cpsat.placement, held_out)).mean())
            lines.append(
                f"| mixtral-8x7b {gpus}x{slots} | {label} | {problem.stats.num_windows} |"
                f" {theirs:.4f} | {mine:.4f} | {mine / theirs - 1:+.2%} | {theirs_mean:.4f} |"
                f" {mine_mean:.4f} | {verdict(mine <= theirs + 1e-12)} |"
            )
    return lines


def _migration(timings: list) -> list[str]:
    """Plan on GSM8K tokens, re-plan on HumanEval tokens with the first plan as current."""
    before, after = mixtral("gsm8k"), mixtral("humaneval")
    lines = ["", "### 5. Migration: Mixtral-8x7B planned on GSM8K, re-planned on HumanEval", "",
             "| plan | fresh moves | re-plan moves | ratio (target <= 0.5) |"
             " fresh hot shard | re-plan hot shard | change (target <= +1%) | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for gpus, slots in _shapes():
        current = run_plan(problem_for(before, "mixtral-8x7b", gpus, slots), "cpsat").placement
        fresh = run_plan(problem_for(after, "mixtral-8x7b", gpus, slots), "cpsat")
        replan = run_plan(problem_for(after, "mixtral-8x7b", gpus, slots, current=current),
                          "cpsat")
        timings.append((f"mixtral-8x7b {gpus}x{slots} (re-plan)", replan.seconds))
        m_fresh = moves_from(fresh.placement, current)
        m_replan = moves_from(replan.placement, current)
        h_fresh = float(fresh.result.objective or 0)
        h_replan = float(replan.result.objective or 0)
        ratio = m_replan / m_fresh if m_fresh else 0.0
        change = h_replan / h_fresh - 1
        lines.append(
            f"| mixtral-8x7b {gpus}x{slots} | {m_fresh} | {m_replan} | {ratio:.2f} |"
            f" {h_fresh:.4f} | {h_replan:.4f} | {change:+.2%} |"
            f" {verdict(ratio <= 0.5 and change <= 0.01)} |"
        )
    return lines


if __name__ == "__main__":
    print(run())
