"""The explanation rows of a plan summary: hot shard on the fitted windows, remote copies
per token and their proven bracket, moves, solve time and gap, for the plan and EPLB."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np

from placer import constants
from placer.errors import DataError
from placer.evaluate import EvalParams, evaluate
from placer.placement import Placement, gpu_loads, hot_shard_ratio
from placer.placement.migration import moves_from
from placer.problem import PlacementProblem, SolveResult
from placer.stats import ExpertStats

# -- the explanation rows: balance and remote copies ------------------------------------------

#: The keys of :func:`remote_figures`.
REMOTE_KEYS = ("remote_gpus_per_token", "remote_nodes_per_token",
               "remote_gpus_per_token_bounds", "remote_nodes_per_token_bounds",
               "remote_copies_from")


def basic_metrics(placement: Placement, stats: ExpertStats) -> dict[str, float]:
    """Hot-shard ratio (max / mean GPU load per layer) of the load summed over windows.

    Returns ``{"hot_shard_ratio_median", "hot_shard_ratio_worst", "hottest_gpu_load"}``;
    the last is the worst layer's hottest GPU load in tokens.
    """
    loads = gpu_loads(placement, stats.mean_load)  # [L, G]
    ratio = hot_shard_ratio(loads)
    return {
        "hot_shard_ratio_median": float(np.median(ratio)),
        "hot_shard_ratio_worst": float(ratio.max()),
        "hottest_gpu_load": float(loads.max()),
    }


def remote_figures(
    problem: PlacementProblem, placement: Placement, stats: ExpertStats | None = None,
    draws: dict[tuple[int, ...], np.ndarray] | None = None,
) -> dict[str, Any]:
    """Remote GPUs and nodes per token (normal mode, uniform source rank, mean over layers),
    the bracket the statistics prove, and how they were obtained.

    ``stats`` (default ``problem.stats``) must hold loads and pair counts over the same
    tokens: pass every window of the trace, as ``--fit`` statistics keep the pair counts
    of all windows (:func:`placer.evaluate.remote_copy_bounds`).  The estimate is

    - the closed form (``expected_remote_copies``) when it is exact: top-k <= 2 with every
      pair counted (:func:`placer.evaluate.static.pairwise_is_exact`), where it equals the
      bracket's lower end; no bracket is shown then;
    - otherwise the evaluator's sampled batches when the model and topology are known,
      drawn from the same statistics (all windows summed), and brought into the bracket
      when the sampled routing (loads matched, pairs only approximately, sampling noise)
      falls outside it (the summary says so);
    - otherwise none: the pairwise closed form is then not an estimate (top-k > 2 counts
      a triple on one GPU as three saved copies; partial pair counts miss pairs), only the
      bracket is shown.

    ``draws`` (a dict the caller keeps, as :func:`placer.evaluate.evaluate` takes it):
    placements compared on the same statistics are sampled on the same tokens, drawn once.

    Returns ``{"remote_gpus_per_token", "remote_nodes_per_token",
    "remote_gpus_per_token_bounds", "remote_nodes_per_token_bounds",
    "remote_copies_from"}``; node figures are None on one node, the others None when not
    known.  Every estimate lies in its bracket, every bracket in ``[0, G - 1]``
    (``[0, N - 1]``).
    """
    from placer.evaluate.static import (
        expected_remote_copies,
        pairwise_is_exact,
        remote_copy_bounds,
    )

    stats = problem.stats if stats is None else stats
    out: dict[str, Any] = {
        "remote_gpus_per_token": None, "remote_nodes_per_token": None,
        "remote_gpus_per_token_bounds": None, "remote_nodes_per_token_bounds": None,
        "remote_copies_from": "no co-activation counts",
    }
    if stats.coact is None:
        return out
    multi = problem.num_nodes > 1
    nodes = _nodes_of(problem)
    windows = ""
    if stats.num_windows != problem.stats.num_windows:
        windows = f", all {stats.num_windows} windows (pair counts cover the whole trace)"
    try:
        bounds = remote_copy_bounds(placement, stats, nodes).mean(axis=0)  # [gpu|node, lo|hi]
        if pairwise_is_exact(stats):
            remote = expected_remote_copies(placement, stats, nodes).mean(axis=0)
            # exact means equal to the lower bound; counts no routing can have are not
            if np.allclose(remote, bounds[:, 0], rtol=1e-9, atol=1e-12):
                out["remote_gpus_per_token"] = float(bounds[0, 0])
                out["remote_nodes_per_token"] = float(bounds[1, 0]) if multi else None
                out["remote_copies_from"] = (
                    f"evaluator, closed form (exact: top-{stats.top_k}, every pair"
                    f" counted){windows}")
                return out
    except DataError as exc:
        out["remote_copies_from"] = f"not shown: {exc.message}"
        return out
    out["remote_gpus_per_token_bounds"] = _outward(bounds[0], problem.num_gpus - 1)
    if multi:
        out["remote_nodes_per_token_bounds"] = _outward(bounds[1], problem.num_nodes - 1)
    if problem.topology is None or problem.model is None:
        out["remote_copies_from"] = (
            f"bounds only (top-{stats.top_k}"
            + ("" if stats.top_k > 2 else ", pairs missing from the counts")
            + ": the pairwise closed form is not an estimate here; with `model` and"
            " `topology` the evaluator samples one)" + windows)
        return out
    _fill_sampled(out, problem, placement, stats, windows, draws)
    return out


def _fill_sampled(
    out: dict[str, Any], problem: PlacementProblem, placement: Placement, stats: ExpertStats,
    windows: str, draws: dict[tuple[int, ...], np.ndarray] | None = None,
) -> None:
    """Put the evaluator's sampled remote GPUs (and nodes) per token into ``out``, each
    brought into its bracket (``out``'s bounds), and say how in ``remote_copies_from``."""
    multi = problem.num_nodes > 1
    sampled = _sampled_remote(problem, placement, stats, draws)
    how = "evaluator, sampled batches" + windows
    moved = []
    for column, label, value in ((0, "GPUs", sampled[0]), (1, "nodes", sampled[1])):
        if column == 1 and not multi:
            continue
        low, high = out[("remote_gpus_per_token_bounds", "remote_nodes_per_token_bounds")
                        [column]]
        inside = min(max(value, low), high)
        if inside != value:
            moved.append(f"{label} {value:.3f} sampled")
        out[("remote_gpus_per_token", "remote_nodes_per_token")[column]] = inside
    if moved:
        how += f"; brought into the bounds ({', '.join(moved)})"
    out["remote_copies_from"] = how


def _sampled_remote(
    problem: PlacementProblem, placement: Placement, stats: ExpertStats,
    draws: dict[tuple[int, ...], np.ndarray] | None = None,
) -> tuple[float, float]:
    """Remote GPUs and nodes per token from the evaluator's sampled batches, every window
    of ``stats`` summed into one (the loads the bracket is proven for), with the
    ``random`` policy (each selection picks a replica uniformly and independently, the
    bracket's assumption; ``round_robin`` agrees only in expectation over list orders).
    ``PLAN_VERSUS_BATCHES`` batches of up to ``PLAN_VERSUS_BATCH_TOKENS``, no more tokens
    than the statistics hold."""
    whole = replace(
        stats, load=stats.load.sum(axis=0, keepdims=True),
        tokens=stats.tokens.sum(keepdims=True),
        window_starts=None if stats.window_starts is None else stats.window_starts[:1],
    )
    total = max(int(stats.total_tokens), 1)
    batches = min(constants.PLAN_VERSUS_BATCHES, total)
    metrics = evaluate(
        placement, whole, *problem.cluster(),
        EvalParams(policy="random", num_batches=batches,
                   batch_tokens=min(constants.PLAN_VERSUS_BATCH_TOKENS, total // batches)),
        draws=draws,
    ).metrics
    return metrics["remote_copies_per_token_gpu"], metrics["remote_copies_per_token_node"]


def _outward(span: np.ndarray, others: int) -> list[float]:
    """``[lower, upper]`` rounded outward to 6 decimals (rounding never narrows it), and
    never past ``[0, others]`` (``G - 1`` or ``N - 1``, which the bounds respect up to
    floating-point noise)."""
    low = max(float(np.floor(span[0] * 1e6) / 1e6), 0.0)
    return [low, min(max(float(np.ceil(span[1] * 1e6) / 1e6), low), float(others))]


def _nodes_of(problem: PlacementProblem) -> Any:
    """The topology, or what the closed forms read of one (``node_of_gpu``) without it."""
    return problem.topology or SimpleNamespace(node_of_gpu=problem.node_of_gpu)


def side_metrics(
    problem: PlacementProblem, result: SolveResult, gap: float | None,
    stats: ExpertStats | None = None,
    draws: dict[tuple[int, ...], np.ndarray] | None = None,
    remote: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One column of the explanation rows: figures of ``result`` on ``problem``'s
    statistics (remote copies on ``stats``, see :func:`remote_figures`, sampled with
    ``draws``; ``remote``: those figures when known already)."""
    basic = basic_metrics(result.placement, problem.stats)
    if remote is None:
        remote = remote_figures(problem, result.placement, stats, draws)
    moves = None
    if problem.current is not None:
        moves = float(moves_from(result.placement, problem.current))
    return {
        "hot_shard_ratio_median": basic["hot_shard_ratio_median"],
        "hot_shard_ratio_worst": basic["hot_shard_ratio_worst"],
        **remote,
        "moves": moves,
        "seconds": round(result.seconds, 3),
        "gap": gap,
    }


def versus_eplb(
    problem: PlacementProblem, result: SolveResult, baseline: SolveResult,
    stats: ExpertStats | None = None,
) -> dict[str, Any]:
    """Explanation rows of ``result`` and EPLB's ``baseline`` on the same problem.

    Hot shard on the fitted windows; remote copies (normal mode, uniform source rank,
    mean over layers) and their bracket from :func:`remote_figures` on ``stats``
    (default ``problem.stats``; ``placer plan`` passes every window of the trace, where
    loads and pair counts agree), None without co-activation counts.  Both are sampled
    on the same tokens, and a plan that is EPLB's placement (the judge kept it) is
    measured once.
    """
    draws: dict[tuple[int, ...], np.ndarray] = {}
    mine = side_metrics(problem, result, result.gap, stats, draws)
    same = result.placement.same_layers(baseline.placement)
    remote = {key: mine[key] for key in REMOTE_KEYS} if same else None
    return {
        "columns": [result.solver, baseline.solver],
        result.solver: mine,
        baseline.solver: side_metrics(problem, baseline, None, stats, draws, remote),
    }
