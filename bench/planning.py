"""Planning benchmark: the CP-SAT planner against DeepSeek EPLB on real routing data.

Targets of issue 5, each measured in one run, side by side with EPLB, with pass/fail and
the margin.  Reads ``../shared/data/real`` (gpt-oss-20b loads and co-activation,
Qwen3-30B-A3B loads and thresholded co-activation, Mixtral-8x7B per-token logs); rows
whose data is absent are skipped with a note.  Default solver settings, ``jobs=2``.

Figures:
- hot shard: hottest GPU over mean GPU load per layer, loads summed over the fitted
  windows, each expert split evenly over its replicas (``placement.gpu_loads``);
- remote copies per token: the evaluator's closed form
  (``placer.evaluate.expected_remote_copies``, DeepEP normal mode, uniform source rank),
  mean over layers;
- per-batch hot shard (robustness): the same ratio per batch of held-out tokens, p99 over
  (batch, layer);
- moves: ``Placement.moves_from`` (expert copies loaded onto GPUs).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from bench.__main__ import SHARED_DATA
from placer.evaluate import expected_remote_copies, remote_copy_bounds
from placer.placement import Placement, gpu_loads, hot_shard_ratio
from placer.problem import PlacementProblem, SolveParams, SolveResult, solve
from placer.stats import ExpertStats

REAL = SHARED_DATA / "real"
JOBS = 2
#: Traffic-first variants of the traffic rows: label and ``--balance-tolerance`` (hot
#: shard allowed over EPLB's).  The second shows what co-location alone could buy.
TRAFFIC_FIRST = (("--traffic-first 1%", 0.01), ("--traffic-first 100% (ceiling)", 1.0))
#: Tokens per batch for the Mixtral robustness and migration rows.
MIXTRAL_BATCH_TOKENS = 16


@dataclass
class Plan:
    """One solve: result, wall seconds, and the problem it solved."""

    problem: PlacementProblem
    result: SolveResult
    seconds: float

    @property
    def placement(self) -> Placement:
        return self.result.placement


# -- data ------------------------------------------------------------------------------------
def gpt_oss() -> ExpertStats | None:
    path = REAL / "gpt-oss-20b" / "load_coact.npz"
    if not path.exists():
        return None
    data = np.load(path)
    load = data["load"].astype(np.int64)
    return ExpertStats(
        load=load[None], tokens=np.array([872_749]), layer_ids=np.arange(load.shape[0]),
        top_k=4, coact=data["coact"].astype(np.int64),
    )


def qwen3() -> ExpertStats | None:
    path = REAL / "qwen3-30b-a3b" / "coactivation_qwen3-30b-a3b.json"
    if not path.exists():
        return None
    doc = json.loads(path.read_text())
    num_layers, num_experts = int(doc["n_layers"]), int(doc["n_expert_per_layer"])
    load = np.zeros((num_layers, num_experts), dtype=np.int64)
    coact = np.zeros((num_layers, num_experts, num_experts), dtype=np.int64)
    for layer in doc["layers"]:
        row = int(layer["layer"])
        load[row] = layer["heat"]
        for i, j, count, _lift in layer["pairs"]:
            coact[row, int(i), int(j)] = coact[row, int(j), int(i)] = int(count)
    return ExpertStats(
        load=load[None], tokens=np.array([int(doc["n_decode_tokens"])]),
        layer_ids=np.arange(num_layers), top_k=int(doc["k"]), coact=coact,
    )


def mixtral_tokens() -> tuple[np.ndarray, np.ndarray] | None:
    """``topk [tokens, 32, 2]`` (-1 where a row was dropped) and dataset index per token,
    in file order (gsm8k first), tokens ordered by (problem, token index)."""
    files = [REAL / "mixtral-8x7b" / f"{name}_2_routing.jsonl" for name in ("gsm8k", "humaneval")]
    if not all(f.exists() for f in files):
        return None
    tokens: dict[tuple[int, int, int], np.ndarray] = {}
    for source, path in enumerate(files):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            key = (source, int(row["problem_id"]), int(row["token_idx"]))
            slot = tokens.setdefault(key, np.full((32, 2), -1, dtype=np.int64))
            slot[int(row["layer"])] = row["experts"]
    keys = sorted(tokens)
    return np.stack([tokens[k] for k in keys]), np.array([k[0] for k in keys])


def batch_loads(topk: np.ndarray, batch_tokens: int, num_experts: int = 8) -> np.ndarray:
    """``[batches, layers, experts]`` load of consecutive batches of ``batch_tokens``."""
    num_batches = topk.shape[0] // batch_tokens
    out = np.zeros((num_batches, topk.shape[1], num_experts), dtype=np.int64)
    for b in range(num_batches):
        chunk = topk[b * batch_tokens : (b + 1) * batch_tokens]
        for layer in range(topk.shape[1]):
            ids = chunk[:, layer].ravel()
            out[b, layer] = np.bincount(ids[ids >= 0], minlength=num_experts)
    return out


def mixtral_stats(topk: np.ndarray, batch_tokens: int) -> ExpertStats:
    """Windows = batches of ``batch_tokens`` (merged to at most 64), co-activation counted."""
    load = batch_loads(topk, batch_tokens)
    while load.shape[0] > 64:
        load = load[: load.shape[0] // 2 * 2].reshape(-1, 2, *load.shape[1:]).sum(axis=1)
    coact = np.zeros((topk.shape[1], 8, 8), dtype=np.int64)
    valid = (topk >= 0).all(axis=2)
    for layer in range(topk.shape[1]):
        pairs = topk[valid[:, layer], layer]
        np.add.at(coact[layer], (pairs[:, 0], pairs[:, 1]), 1)
        np.add.at(coact[layer], (pairs[:, 1], pairs[:, 0]), 1)
    return ExpertStats(
        load=load, tokens=np.full(load.shape[0], batch_tokens * (topk.shape[0] // batch_tokens
                                                               // load.shape[0])),
        layer_ids=np.arange(topk.shape[1]), top_k=2, coact=coact,
    )


# -- solving and figures ----------------------------------------------------------------------
def problem_for(stats: ExpertStats, num_gpus: int, slots: int, topology: Any = None,
                current: Placement | None = None) -> PlacementProblem:
    node_of_gpu = (np.asarray(topology.node_of_gpu) if topology is not None
                   else np.zeros(num_gpus, dtype=np.int64))
    return PlacementProblem(stats=stats, num_gpus=num_gpus, slots_per_gpu=slots,
                            node_of_gpu=node_of_gpu, topology=topology, current=current)


def run_plan(problem: PlacementProblem, solver: str, **params: Any) -> Plan:
    started = time.perf_counter()
    result = solve(problem, solver, SolveParams(jobs=JOBS, **params))
    seconds = time.perf_counter() - started
    print(f"[bench]   {solver} on {problem.num_gpus}x{problem.slots_per_gpu},"
          f" {problem.stats.num_layers} layers: {seconds:.1f} s", file=sys.stderr, flush=True)
    return Plan(problem, result, seconds)


def ratios(placement: Placement, stats: ExpertStats) -> np.ndarray:
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
    from placer.models import load_model

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
        out.append(f"(skipped: {SHARED_DATA} is absent; these rows need the real data)")
        return "\n".join(out) + "\n"
    timings: list[tuple[str, float]] = []
    plans: dict[str, tuple[Plan, Plan]] = {}

    oss, qwen = gpt_oss(), qwen3()
    cases = []
    if oss is not None:
        cases += [("gpt-oss-20b", oss, 4, 9, None), ("gpt-oss-20b", oss, 8, 5, None)]
    if qwen is not None:
        from placer.topology import load_topology

        cases += [("qwen3-30b-a3b", qwen, 16, 9, None), ("qwen3-30b-a3b", qwen, 32, 5, None),
                  ("qwen3-30b-a3b", qwen, 16, 9, load_topology("2x-dgx-h100"))]
    traffic_first: dict[str, list[tuple[str, Plan]]] = {}
    for name, stats, gpus, slots, topology in cases:
        key = f"{name} {'2x-dgx-h100 ' if topology is not None else ''}{gpus}x{slots}"
        problem = problem_for(stats, gpus, slots, topology)
        eplb = run_plan(problem, "eplb")
        cpsat = run_plan(problem, "cpsat")
        plans[key] = (cpsat, eplb)
        timings.append((key, cpsat.seconds))
        if name == "gpt-oss-20b" or topology is not None:
            variants = []
            for label, tolerance in TRAFFIC_FIRST:
                plan = run_plan(problem, "cpsat", traffic_first=True,
                                balance_tolerance=tolerance)
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
    tokens = mixtral_tokens()
    if tokens is None:
        out += ["", "(Mixtral rows skipped: data absent)"]
    else:
        out += _robustness(*tokens, timings)
        out += _migration(*tokens, timings)

    # 6. time
    out += ["", "### 6. Time: wall seconds per plan, default settings, jobs=2 (target < 60 s)", "",
            "| plan | cpsat seconds | verdict |", "|---|---|---|"]
    for key, seconds in timings:
        out.append(f"| {key} | {seconds:.1f} | {verdict(seconds < 60)} |")
    return "\n".join(out) + "\n"


def _p99_batch_hot_shard(placement: Placement, loads: np.ndarray) -> float:
    per_batch = hot_shard_ratio(gpu_loads(placement, loads))  # [batches, layers]
    return float(np.percentile(per_batch, 99))


def _robustness(topk: np.ndarray, source: np.ndarray, timings: list) -> list[str]:
    del source
    half = topk.shape[0] // 2
    fit = mixtral_stats(topk[:half], MIXTRAL_BATCH_TOKENS)
    held_out = batch_loads(topk[half:], MIXTRAL_BATCH_TOKENS)
    lines = ["", "### 4. Robustness: Mixtral-8x7B, fitted on the first half of the tokens,"
             f" judged on batches of {MIXTRAL_BATCH_TOKENS} tokens of the second half", "",
             "| plan | settings | windows fitted | EPLB p99 batch hot shard | cpsat p99 | change |"
             " EPLB mean | cpsat mean | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for gpus, slots in ((4, 3), (8, 2)):
        problem = problem_for(fit, gpus, slots)
        eplb = run_plan(problem, "eplb")
        theirs = _p99_batch_hot_shard(eplb.placement, held_out)
        theirs_mean = float(hot_shard_ratio(gpu_loads(eplb.placement, held_out)).mean())
        for label, extra in (("default", {}),
                             (f"--batch-tokens {MIXTRAL_BATCH_TOKENS}",
                              {"batch_tokens": MIXTRAL_BATCH_TOKENS})):
            cpsat = run_plan(problem, "cpsat", **extra)
            timings.append((f"mixtral-8x7b {gpus}x{slots} (first half, {label})",
                            cpsat.seconds))
            mine = _p99_batch_hot_shard(cpsat.placement, held_out)
            mine_mean = float(hot_shard_ratio(gpu_loads(cpsat.placement, held_out)).mean())
            lines.append(
                f"| mixtral-8x7b {gpus}x{slots} | {label} | {fit.num_windows} | {theirs:.4f} |"
                f" {mine:.4f} | {mine / theirs - 1:+.2%} | {theirs_mean:.4f} |"
                f" {mine_mean:.4f} | {verdict(mine <= theirs + 1e-12)} |"
            )
    return lines


def _migration(topk: np.ndarray, source: np.ndarray, timings: list) -> list[str]:
    """Plan on GSM8K tokens, re-plan on HumanEval tokens with the first plan as current."""
    before = mixtral_stats(topk[source == 0], MIXTRAL_BATCH_TOKENS)
    after = mixtral_stats(topk[source == 1], MIXTRAL_BATCH_TOKENS)
    lines = ["", "### 5. Migration: Mixtral-8x7B planned on GSM8K, re-planned on HumanEval", "",
             "| plan | fresh moves | re-plan moves | ratio (target <= 0.5) |"
             " fresh hot shard | re-plan hot shard | change (target <= +1%) | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for gpus, slots in ((4, 3), (8, 2)):
        current = run_plan(problem_for(before, gpus, slots), "cpsat").placement
        fresh = run_plan(problem_for(after, gpus, slots), "cpsat")
        replan = run_plan(problem_for(after, gpus, slots, current=current), "cpsat")
        timings.append((f"mixtral-8x7b {gpus}x{slots} (re-plan)", replan.seconds))
        m_fresh = fresh.placement.moves_from(current)
        m_replan = replan.placement.moves_from(current)
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
