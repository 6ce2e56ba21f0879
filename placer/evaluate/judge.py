"""The evaluator as the planner's judge: estimated MoE-layer time of candidate plans.

The CP-SAT passes optimize proxies the models can express linearly (the robust hot
shard, co-location of co-activated experts, moves).  What a user pays is the
evaluator's estimated layer time under the engine's dispatch policy, all-to-all kernels
and batch size (:class:`placer.regime.Regime`).  :func:`layer_times` scores whole
placements with :func:`placer.evaluate.evaluate` on batches sampled from the fitted
statistics, their windows pooled (:func:`pooled`) -- the same seeds, so two placements
are judged on the same tokens -- and :func:`faster_rows` keeps, layer by layer, the
placement the evaluator says is faster.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np

from placer.errors import PlacerWarning
from placer.evaluate.core import evaluate
from placer.evaluate.dispatch import STATIC_POLICIES
from placer.evaluate.params import EvalParams
from placer.parallel import Background
from placer.placement import Placement
from placer.problem import PlacementProblem
from placer.regime import Regime
from placer.stats import ExpertStats

#: Relative difference of two layer times below which they count as equal.
EQUAL_TIME = 1e-9


def can_judge(problem: PlacementProblem) -> bool:
    """Whether the evaluator can time plans of ``problem`` (topology and model known)."""
    return problem.topology is not None and problem.model is not None


def eval_params(problem: PlacementProblem, regime: Regime, seed: int) -> EvalParams:
    """How the judge evaluates: the regime's policy, mode and step size, sampled."""
    return EvalParams(
        policy=regime.dispatch, mode=regime.all_to_all,
        batch_tokens=regime.batch_tokens(problem.num_gpus), seed=seed, sample=True,
    )


def layer_times(
    placement: Placement, problem: PlacementProblem, regime: Regime, seed: int,
    draws: dict[tuple[int, ...], np.ndarray] | None = None,
) -> np.ndarray:
    """``[layers]`` float64 estimated p99 time over sampled batches of each layer of
    ``problem.stats``, microseconds (layer order of the statistics).  Pass the same
    ``draws`` dict to judge several placements on the same tokens, drawn once."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlacerWarning)  # the user sees them when evaluating
        result = evaluate(placement, pooled(problem.stats), *problem.cluster(),
                          eval_params(problem, regime, seed), draws=draws)
    by_id = dict(zip(result.layer_ids.tolist(), result.per_layer["layer_time_p99_us"].tolist(),
                     strict=True))
    return np.array([by_id[int(i)] for i in problem.stats.layer_ids], dtype=np.float64)


class LayerJudge:
    """:func:`layer_times` of many candidate placements of one problem, each distinct
    layer timed once.

    The planner's judge times the plan, its hint, the reference EPLB and their merge on
    the same sampled tokens; most of their layers are the very same rows.  A layer's
    time depends on its row alone (its tokens are drawn per layer, its dispatch stream
    is seeded per layer) except under the static tables of SGLang and ``local_first``,
    which draw every layer's choices from one stream: there a whole placement is timed
    once (a candidate equal to an earlier one costs nothing), elsewhere each (layer,
    row) once, the layers not timed yet evaluated together.  The times are those
    :func:`layer_times` gives (tests: equal to the last bit).
    """

    def __init__(self, problem: PlacementProblem, regime: Regime, seed: int) -> None:
        self.problem = problem
        self.regime = regime
        self.seed = seed
        self.draws: dict[tuple[int, ...], np.ndarray] = {}
        self.coupled = regime.dispatch in STATIC_POLICIES
        self._rows: dict[tuple[int, bytes], float] = {}
        self._whole: dict[bytes, np.ndarray] = {}

    def __call__(self, placement: Placement) -> np.ndarray:
        """``[layers]`` estimated p99 layer times of ``placement``, as :func:`layer_times`."""
        problem = self.problem
        if self.coupled:
            key = placement.layer_ids.tobytes() + placement.physical_to_logical.tobytes()
            if key not in self._whole:
                self._whole[key] = layer_times(placement, problem, self.regime, self.seed,
                                               self.draws)
            return self._whole[key].copy()
        keys = self._keys(placement)
        self._rows.update(self._time(self._untimed([placement])))
        return np.array([self._rows[k] for k in keys], dtype=np.float64)

    def prefetch(self, placements: list[Placement], jobs: int) -> None:
        """Time every layer of ``placements`` not timed yet, the layers split between
        this process and a forked child when ``jobs`` allows (each layer's tokens are
        drawn in one process only; the times are the same wherever they are computed).
        Nothing under static tables, whose placements are timed whole."""
        todo = [] if self.coupled else self._untimed(placements)
        layers = sorted({layer for layer, _ in todo})
        if jobs < 2 or len(layers) < 2:
            self._rows.update(self._time(todo))
            return
        theirs = set(layers[1::2])
        child = Background(self._time, [t for t in todo if t[0] in theirs])
        self._rows.update(self._time([t for t in todo if t[0] not in theirs]))
        self._rows.update(child.result())

    def _keys(self, placement: Placement) -> list[tuple[int, bytes]]:
        return [(int(i), placement.physical_to_logical[placement.layer_row(int(i))].tobytes())
                for i in self.problem.stats.layer_ids]

    def _untimed(self, placements: list[Placement]) -> list[tuple[int, bytes]]:
        """The distinct (layer, row) of ``placements`` with no time yet."""
        keys = [k for placement in placements for k in self._keys(placement)]
        return [k for k in dict.fromkeys(keys) if k not in self._rows]

    def _time(self, todo: list[tuple[int, bytes]]) -> dict[tuple[int, bytes], float]:
        """Times of the (layer, row) ``todo``: a layer's rows one evaluation each, the
        layers of an evaluation together (each layer's tokens drawn once)."""
        out: dict[tuple[int, bytes], float] = {}
        rounds: list[list[tuple[int, bytes]]] = []
        for key in todo:  # the n-th row of a layer goes to the n-th evaluation
            seen = sum(1 for k in out if k[0] == key[0])
            out[key] = 0.0
            while len(rounds) <= seen:
                rounds.append([])
            rounds[seen].append(key)
        problem = self.problem
        width = problem.num_physical
        for group in rounds:
            ids = np.array([i for i, _ in group], dtype=np.int64)
            rows = np.stack([np.frombuffer(row, dtype=np.int64, count=width)
                             for _, row in group])
            part = Placement(physical_to_logical=rows, layer_ids=ids,
                             num_experts=problem.stats.num_experts, num_gpus=problem.num_gpus)
            sub = replace(problem, stats=problem.stats.select_layers(ids))
            times = layer_times(part, sub, self.regime, self.seed, self.draws)
            out.update(zip(group, times.tolist(), strict=True))
        return out


def pooled(stats: ExpertStats) -> ExpertStats:
    """``stats`` with its fitted windows summed into one: the judge's view of the future.

    The plan is fitted on the windows themselves (the robust hot shard balances the worst
    of them), so timing candidates on batches drawn window by window rewards fitting those
    very windows; when routing drifts, the windows that come next are none of them.
    Batches drawn from the summed load score what the fitted period looks like on
    average, the same for every candidate: a placement balanced for the average
    degrades more gracefully than one fitted to each past window.  Measured against
    per-window batches (one run each, same code otherwise; docs/planner.md, "The
    judge"): the 16 rows of ``python -m bench latency`` equal or better, and on
    synthetic Qwen3 traces over 16 DP ranks whose expert popularity drifts 0.5 ranks per
    step, held-out step p99 against EPLB went from 38.2% slower to equal (vLLM) and from
    32.5% slower to 7.4% faster (SGLang).
    """
    if stats.num_windows == 1:
        return stats
    return replace(stats, load=stats.load.sum(axis=0, keepdims=True),
                   tokens=stats.tokens.sum(keepdims=True),
                   window_starts=None if stats.window_starts is None else stats.window_starts[:1])


def faster_rows(plan: np.ndarray, baseline: np.ndarray) -> np.ndarray:
    """``[layers]`` bool: layers where the baseline is strictly faster than the plan."""
    return baseline < plan * (1 - EQUAL_TIME)
