"""Sampling benchmark: the evaluator's batches drawn from aggregated statistics.

``python -m bench sampling``.  Reads only what ships with placer (``traces/``) and what it
makes itself (``placer.traces.synth``), so it runs in any checkout.  Three cases, default
``EvalParams`` (16 batches x 4,096 tokens, round-robin, normal mode), ``linear``
placement on ``2x-dgx-h100``:

- the bundled Qwen3-30B-A3B statistics (48 layers x 128 experts, top-8, one window,
  partial co-activation);
- a Zipf-1.5 synthetic load of the same shape (one window, no co-activation: the hottest
  experts are capped at one selection per token);
- a skewed synthetic per-token trace (Zipf 1.5, 8 clusters, drift, 16 windows),
  evaluated by replay and by sampling from its statistics: the sampled figures should
  match the replayed ones, for ``linear`` and for an EPLB placement with 16 redundant
  experts (round-robin replica choice reads each token's list order).

Figures: seconds of one ``evaluate`` and of the sampling alone (every layer and window,
``build_sampler`` + ``sample``); ``|marginal - target|`` exact (``TopKSampler.marginals``)
and empirical (the hottest expert's selection frequency in the drawn tokens against its
target, relative, worst window and layer); the largest correction share ``eta``;
hot-shard figures.
"""

from __future__ import annotations

import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

from placer import constants
from placer.evaluate import EvalParams, evaluate
from placer.evaluate.sampling import build_sampler, sampled_batch_windows, target_inclusion
from placer.model import load_model
from placer.placement import Placement
from placer.stats import ExpertStats, RoutingData
from placer.topology import load_topology

REPO = Path(__file__).resolve().parent.parent
MODEL = "qwen3-30b-a3b"
TOPOLOGY = "2x-dgx-h100"
KEYS = ("hot_shard_ratio_median", "hot_shard_ratio_worst", "batch_hot_shard_p99",
        "remote_copies_per_token_gpu", "moe_layer_p99_us")


def linear(stats: ExpertStats, num_gpus: int) -> Placement:
    """Experts in id order, ``E / G`` per GPU, no replicas."""
    e = stats.num_experts
    rows = np.tile(np.arange(e), (stats.num_layers, 1))
    return Placement(rows, stats.layer_ids.copy(), e, num_gpus)


def sampling_only(stats: ExpertStats, params: EvalParams) -> dict[str, float]:
    """Draw every layer and window as the evaluator does; time it and check marginals."""
    batch_tokens = params.batch_tokens or constants.DEFAULT_BATCH_TOKENS
    windows, batches = np.unique(sampled_batch_windows((0, stats.num_windows),
                                                       params.num_batches), return_counts=True)
    load_all = stats.mean_load
    exact = empirical = eta = seconds = 0.0
    for row in range(stats.num_layers):
        for w, n in zip(windows.tolist(), batches.tolist(), strict=True):
            rng = np.random.default_rng((params.seed, row, w))
            coact = stats.coact_dense(row)
            t0 = time.perf_counter()
            sampler = build_sampler(stats.load[w, row], stats.top_k, rng, coact=coact,
                                    load_all=load_all[row])
            ids = sampler.sample(n * batch_tokens, rng)
            seconds += time.perf_counter() - t0
            pi = target_inclusion(stats.load[w, row], stats.top_k)
            freq = np.bincount(ids[ids >= 0], minlength=pi.size) / ids.shape[0]
            hot = int(np.argmax(pi))
            exact = max(exact, float(np.abs(sampler.marginals - pi).max()))
            empirical = max(empirical, abs(float(freq[hot]) - pi[hot]) / pi[hot])
            eta = max(eta, sampler.correction)
    return {"seconds": seconds, "exact": exact, "empirical": empirical, "eta": eta}


def timed_evaluate(placement: Placement, routing: RoutingData | ExpertStats,
                   params: EvalParams) -> tuple[dict[str, float], float]:
    model, topology = load_model(MODEL), load_topology(TOPOLOGY)
    t0 = time.perf_counter()
    evaluation = evaluate(placement, routing, topology, model, params)
    return evaluation.metrics, time.perf_counter() - t0


def capped_hot_shard(stats: ExpertStats, num_gpus: int) -> float:
    """Median over layers of max / mean expected GPU load of ``linear`` under the capped
    target ``pi`` (what sampling aims at; the static figure uses the raw load)."""
    ratios = []
    for row in range(stats.num_layers):
        pi = target_inclusion(stats.load.sum(axis=0)[row], stats.top_k)
        per_gpu = pi.reshape(num_gpus, -1).sum(axis=1)
        ratios.append(per_gpu.max() / per_gpu.mean())
    return float(np.median(ratios))


def eplb(routing: RoutingData) -> Placement:
    """EPLB with 16 redundant experts on the benchmark's model and topology."""
    from placer.planning.build import ProblemSpec, build_problem
    from placer.planning.solvers import solve

    problem = build_problem(routing, ProblemSpec(
        model=load_model(MODEL), topology=load_topology(TOPOLOGY), redundant=16))
    return solve(problem, "eplb").placement


def zipf_stats(exponent: float = 1.5, tokens: int = 65_536, seed: int = 0) -> ExpertStats:
    """48 layers x 128 experts, top-8: Zipf loads in a random expert order per layer."""
    rng = np.random.default_rng(seed)
    share = (np.arange(128) + 1.0) ** -exponent
    share /= share.sum()
    load = np.stack([np.round(tokens * 8 * share[rng.permutation(128)]) for _ in range(48)])
    return ExpertStats(load=load.astype(np.int64)[None], tokens=np.array([tokens]),
                       layer_ids=np.arange(48), top_k=8)


def skewed_trace(folder: Path) -> RoutingData:
    from placer.traces import read_routing
    from placer.traces.synth import SynthParams, write_synth

    path = folder / "skewed.npz"
    write_synth(path, SynthParams(num_tokens=16_384, layer_ids=tuple(range(48)),
                                  num_experts=128, top_k=8, zipf=1.5, clusters=8, drift=0.1,
                                  tokens_per_step=1024, num_ranks=16, seed=1))
    return read_routing(path, keep_tokens=True)


def run() -> str:
    warnings.simplefilter("ignore")
    params = EvalParams()
    out = ["## sampling: batches drawn from aggregated statistics", "",
           "| case | evaluate s | sampling s | max abs marginal error (exact) |"
           " hottest expert's max rel error (drawn) | max eta | hot shard median:"
           " sampled / static / capped pi |",
           "|---|---|---|---|---|---|---|"]
    from placer.traces import read_routing

    qwen = read_routing(REPO / "traces" / "qwen3-30b-a3b.npz").stats
    zipf = zipf_stats()
    with tempfile.TemporaryDirectory() as tmp:
        trace = skewed_trace(Path(tmp))
    for name, stats in (("Qwen3-30B-A3B bundled", qwen), ("Zipf-1.5 load, no coact", zipf),
                        ("skewed trace, 16 windows", trace.stats)):
        placement = linear(stats, 16)
        metrics, seconds = timed_evaluate(placement, stats, params)
        alone = sampling_only(stats, params)
        out.append(f"| {name} | {seconds:.2f} | {alone['seconds']:.2f} | {alone['exact']:.1e}"
                   f" | {alone['empirical']:.2%} | {alone['eta']:.4f}"
                   f" | {metrics['hot_shard_ratio_median']:.4f}"
                   f" / {metrics['static_hot_shard_ratio_median']:.4f}"
                   f" / {capped_hot_shard(stats, 16):.4f} |")
    per_token = replace(params, batch_tokens=1024)
    columns = []
    for label, placement in (("linear", linear(trace.stats, 16)), ("eplb r16", eplb(trace))):
        replay, _ = timed_evaluate(placement, trace, per_token)
        sampled, _ = timed_evaluate(placement, trace, replace(per_token, sample=True))
        columns += [(f"{label} replayed", replay), (f"{label} sampled", sampled)]
    out += ["", "Skewed trace, 16 batches of 1,024 tokens: replayed per-token routing against"
            " batches sampled from its statistics (round-robin).", "",
            "| metric | " + " | ".join(name for name, _ in columns) + " |",
            "|---|" + "---|" * len(columns)]
    for key in KEYS:
        out.append(f"| {key} | " + " | ".join(f"{m[key]:.4f}" for _, m in columns) + " |")
    return "\n".join(out) + "\n"
