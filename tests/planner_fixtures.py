"""Small planning problems with a model and a topology, for the latency-judged planner."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from placer.model import ModelSpec, load_model
from placer.planning.build import ProblemSpec, build_problem
from placer.problem import PlacementProblem
from placer.stats import ExpertStats, RoutingData
from placer.topology import load_topology
from placer.traces import read_routing

#: The bundled synthetic trace (gpt-oss-20b, top-4, pair counts).
SYNTH = Path(__file__).resolve().parent.parent / "traces" / "synthetic-small.jsonl.gz"

#: A small group-limited model: 32 experts in 4 groups, top-4 of 2 groups, 2 MoE layers.
MODEL = ModelSpec(
    name="tiny-grouped", num_hidden_layers=2, moe_layer_ids=(0, 1), num_experts=32, top_k=4,
    num_groups=4, top_groups=2, num_shared_experts=0, hidden_size=1024,
    moe_intermediate_size=512, non_expert_params=1_000_000, default_dtype="bf16",
)


def skewed_stats(seed: int = 0, windows: int = 4) -> ExpertStats:
    """Zipf-like loads over 32 experts, reshuffled per window, with random pairs."""
    rng = np.random.default_rng(seed)
    base = 2000.0 / np.arange(1, 33) ** 1.1
    load = np.stack([
        np.stack([np.round(base[rng.permutation(32)] * rng.uniform(0.8, 1.2)) for _ in range(2)])
        for _ in range(windows)
    ]).astype(np.int64)
    pairs = rng.integers(0, 30, size=(2, 32, 32))
    pairs = pairs + pairs.transpose(0, 2, 1)
    for layer in range(2):
        np.fill_diagonal(pairs[layer], 0)
    tokens = (load.sum(axis=(1, 2)) // 8).astype(np.int64)
    return ExpertStats(load=load, tokens=tokens, layer_ids=np.array([0, 1]), top_k=4,
                       coact=pairs)


def bundled_problem() -> tuple[RoutingData, PlacementProblem]:
    """The bundled synthetic trace read with its tokens, planned on a DGX H100 with 8
    redundant experts, fitted on windows 0:6."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        routing = read_routing(SYNTH, keep_tokens=True)
    problem = build_problem(routing, ProblemSpec(model=load_model("gpt-oss-20b"),
                            topology=load_topology("dgx-h100"), redundant=8, fit=(0, 6)))
    return routing, problem
