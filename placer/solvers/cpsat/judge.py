"""The evaluator as the planner's judge: estimated MoE-layer time of candidate plans.

The CP-SAT passes optimize proxies the models can express linearly (the robust hot
shard, co-location of co-activated experts, moves).  What a user pays is the
evaluator's estimated layer time under the engine's dispatch policy, all-to-all kernels
and batch size (:class:`placer.workload.Workload`).  :func:`layer_times` scores whole
placements with :func:`placer.evaluate.evaluate` on batches sampled from the fitted
statistics -- the same seeds, so two placements are judged on the same tokens -- and
:func:`faster_rows` keeps, layer by layer, the placement the evaluator says is faster.
"""

from __future__ import annotations

import warnings

import numpy as np

from placer.errors import PlacerWarning
from placer.evaluate import EvalParams, evaluate
from placer.placement import Placement
from placer.problem import PlacementProblem
from placer.workload import Workload

#: Relative difference of two layer times below which they count as equal.
EQUAL_TIME = 1e-9


def can_judge(problem: PlacementProblem) -> bool:
    """Whether the evaluator can time plans of ``problem`` (topology and model known)."""
    return problem.topology is not None and problem.model is not None


def eval_params(problem: PlacementProblem, workload: Workload, seed: int) -> EvalParams:
    """How the judge evaluates: the workload's policy, mode and step size, sampled."""
    return EvalParams(
        policy=workload.policy, mode=workload.mode,
        batch_tokens=workload.batch_tokens(problem.num_gpus), seed=seed, sample=True,
    )


def layer_times(
    placement: Placement, problem: PlacementProblem, workload: Workload, seed: int,
    draws: dict[tuple[int, ...], np.ndarray] | None = None,
) -> np.ndarray:
    """``[layers]`` float64 estimated p99 time over sampled batches of each layer of
    ``problem.stats``, microseconds (layer order of the statistics).  Pass the same
    ``draws`` dict to judge several placements on the same tokens, drawn once."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlacerWarning)  # the user sees them when evaluating
        result = evaluate(placement, problem.stats, *problem.cluster(),
                          eval_params(problem, workload, seed), draws=draws)
    by_id = dict(zip(result.layer_ids.tolist(), result.per_layer["layer_time_p99_us"].tolist(),
                     strict=True))
    return np.array([by_id[int(i)] for i in problem.stats.layer_ids], dtype=np.float64)


def faster_rows(plan: np.ndarray, baseline: np.ndarray) -> np.ndarray:
    """``[layers]`` bool: layers where the baseline is strictly faster than the plan."""
    return baseline < plan * (1 - EQUAL_TIME)
