"""Re-planning from a deployed placement: which layers move, judged on the shown figure.

The layer search and the judge give, per layer, the deployed row, the re-plan's row (its
search charged moves) and, with a judge, a fresh plan's row (the same trace planned with
no deployed placement).  :class:`placer.placement.migration.Frontier` chooses per layer
one of them for each move budget from the estimated p99 layer times; with a hard budget
(``max_moves`` / ``max_move_gb``) that choice is the answer.  Without one the frontier's
choice (the fewest moves within ``move_tolerance`` of the best, by the layers' summed
estimate) is then judged on the figures the user is shown -- the evaluator's step p99 and
mean layer p99, under the plan's regime and dispatch, on the judge's batches drawn from
the fitted windows -- and the budget grows along the frontier until the answer is within
``move_tolerance`` of both the best re-plan (every layer's fastest plan) and the fresh
plan on both figures; where no point of the frontier is, the faster of those two by step
p99 is the answer.  So the default re-plan is never more than the tolerance slower, on
the shown step p99, than a fresh plan of the same trace.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from placer import constants
from placer.errors import Param, PlacerWarning, UsageError
from placer.evaluate import evaluate
from placer.evaluate.judge import LayerJudge, eval_params, pooled
from placer.placement import Placement
from placer.placement.migration import Frontier, layer_moves
from placer.planning.solvers.cpsat.layer import LayerData
from placer.planning.solvers.cpsat.search import LayerOutcome
from placer.problem import PlacementProblem, SolveParams

#: Most extra budgets tried between the last frontier point short of the tolerance and the
#: first within it (each one evaluation of a whole placement).
BISECTIONS = 4
#: ``shown(placement) -> (step p99 µs, mean layer p99 µs)``.
Shown = Callable[[Placement], tuple[float, float]]


def shown_figures(problem: PlacementProblem, params: SolveParams, judge: LayerJudge) -> Shown:
    """The figures the summary shows (step p99, mean over layers of the layer p99) of a
    placement, on the judge's sampled batches (drawn once); cached per placement."""
    cache: dict[bytes, tuple[float, float]] = {}
    stats = pooled(problem.stats)
    how = eval_params(problem, params.regime, params.seed)

    def shown(placement: Placement) -> tuple[float, float]:
        key = placement.layer_ids.tobytes() + placement.physical_to_logical.tobytes()
        if key not in cache:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PlacerWarning)
                ev = evaluate(placement, stats, *problem.cluster(), how, draws=judge.draws)
            cache[key] = (float(ev.metrics["step_p99_us"]),
                          float(np.mean(ev.per_layer["layer_time_p99_us"])))
        return cache[key]

    return shown


def move_limit(problem: PlacementProblem, params: SolveParams) -> int | None:
    """The hard move budget of ``params`` (``max_moves``, ``max_move_gb`` in moves), or
    None without one."""
    limits = []
    if params.max_moves is not None:
        limits.append(params.max_moves)
    if params.max_move_gb is not None:
        if problem.model is None:
            raise UsageError("`max_move_gb` needs the model to size expert weights",
                             where=Param("max_move_gb"), hint="pass `model`, or use `max_moves`")
        per_expert = problem.model.expert_bytes(problem.model.default_dtype) / constants.GB
        limits.append(int(np.floor(params.max_move_gb / per_expert + 1e-9)))
    return min(limits) if limits else None


def within_budget(
    plans: list[tuple[str, Placement, np.ndarray]], outcomes: list[LayerOutcome],
    layers: list[LayerData], problem: PlacementProblem, params: SolveParams,
    current_cost: np.ndarray, shown: Shown | None = None,
) -> tuple[Placement, list[LayerOutcome], np.ndarray, dict[str, Any]]:
    """Re-plan only the layers that pay, each with the fastest of its plans that pays.

    ``plans``: ``(name, placement, [layers] cost)`` -- the re-plan first, then (with a
    judge) the fresh plan; costs are estimated p99 layer times (hot shards without a
    judge), as ``current_cost`` is the deployed placement's.  ``shown``: the figures to
    judge the answer on (None: the frontier's choice stands).  Returns the placement,
    outcomes, per-layer costs and the ``details`` block of the re-plan.
    """
    current = problem.current
    assert current is not None
    moves = np.stack([layer_moves(p, current) for _, p, _ in plans], axis=1)  # [L, K]
    gains = np.stack([current_cost - cost for _, _, cost in plans], axis=1)
    frontier = Frontier.of(moves, gains)
    limit = move_limit(problem, params)
    best_total = float((current_cost - np.maximum(gains, 0).max(axis=1)).sum())
    budget = limit if limit is not None else frontier.fewest_within(params.move_tolerance,
                                                                    best_total)
    build = _builder(plans, outcomes, layers, problem, current_cost)
    answer = build(frontier.choice(budget))
    judged: dict[str, Any] | None = None
    if limit is None and shown is not None:
        answer, judged = _judged_on_shown(frontier, budget, build, plans, shown,
                                          params.move_tolerance)
    placement, kept, cost = answer
    total_current = float(current_cost.sum())
    full = frontier.max_moves
    budgets = sorted({round(share * full) for share in constants.FRONTIER_SHARES})
    details: dict[str, Any] = {
        "budget": None if limit is None else int(limit),
        "tolerance": None if limit is not None else params.move_tolerance,
        "moves": int(layer_moves(placement, current).sum()),
        "best_moves": full,
        "cost": "estimated p99 layer time, µs, summed over layers" if problem.model
        is not None and problem.topology is not None else "hot shard, summed over layers",
        "current_cost": total_current,
        "cost_after": float(cost.sum()),
        "best_cost": total_current - float(frontier.best[-1]),
        "frontier": [{"budget": b, "moves": m, "cost": total_current - gain}
                     for b, (m, gain) in zip(budgets, frontier.points(budgets), strict=True)],
        "plans": {name: int(layer_moves(p, current).sum()) for name, p, _ in plans},
        "shown": judged,
    }
    return placement, kept, cost, details


_Answer = tuple[Placement, list[LayerOutcome], np.ndarray]


def _builder(
    plans: list[tuple[str, Placement, np.ndarray]], outcomes: list[LayerOutcome],
    layers: list[LayerData], problem: PlacementProblem, current_cost: np.ndarray,
) -> Callable[[np.ndarray], _Answer]:
    """``build(choice)``: the placement, outcomes and costs that take, per layer, plan
    ``choice[l]`` of ``plans`` (-1: the deployed row)."""
    current = problem.current
    assert current is not None
    first = plans[0][1]

    def row_of(placement: Placement, layer_id: int) -> np.ndarray:
        return placement.physical_to_logical[placement.layer_row(layer_id)]

    def build(choice: np.ndarray) -> _Answer:
        rows = first.physical_to_logical.copy()
        kept = list(outcomes)
        cost = current_cost.copy()
        for row, k in enumerate(choice.tolist()):
            layer_id = int(first.layer_ids[row])
            data = layers[row]
            if k == 0:
                cost[row] = plans[0][2][row]
                continue
            name, other = ("current", current) if k < 0 else plans[k][:2]
            rows[row] = row_of(other, layer_id)
            x = other.replicas_on_gpu[other.layer_row(layer_id)]
            cost[row] = current_cost[row] if k < 0 else plans[k][2][row]
            kept[row] = replace(outcomes[row], x=x > 0, balance=data.balance(x),
                                traffic=data.traffic(x), moves=data.moves(x),
                                status="FALLBACK" if k < 0 else "FEASIBLE", winner=name,
                                fallback="moves" if k < 0 else "")
        return replace(first, physical_to_logical=rows), kept, cost

    return build


def _judged_on_shown(
    frontier: Frontier, budget: int, build: Callable[[np.ndarray], _Answer],
    plans: list[tuple[str, Placement, np.ndarray]], shown: Shown, tolerance: float,
) -> tuple[_Answer, dict[str, Any]]:
    """The fewest-move point of the frontier from ``budget`` up whose shown figures are
    within ``tolerance`` of both the best re-plan's and every plan's (the fresh one);
    else the fastest of those by step p99."""
    full = build(frontier.choice(frontier.max_moves))
    references = [("best re-plan", full[0])] + [(name, p) for name, p, _ in plans]
    figures = {name: shown(p) for name, p in references}
    step = min(f[0] for f in figures.values())
    layer = min(f[1] for f in figures.values())
    tried: list[dict[str, Any]] = []

    def within(b: int) -> _Answer | None:
        candidate = build(frontier.choice(b))
        mine = shown(candidate[0])
        tried.append({"budget": b, "step_p99_us": mine[0], "layer_p99_us": mine[1]})
        ok = mine[0] <= step * (1 + tolerance) and mine[1] <= layer * (1 + tolerance)
        return candidate if ok else None

    points = sorted({budget, frontier.max_moves, *(
        round(share * frontier.max_moves) for share in constants.FRONTIER_SHARES)})
    answer, low = None, budget
    for b in (p for p in points if p >= budget):
        answer = within(b)
        if answer is not None:
            break
        low = b
    if answer is not None:  # fewer moves between the last point short and the first within
        high = tried[-1]["budget"]
        for _ in range(BISECTIONS):
            if high - low <= 1:
                break
            middle = (low + high) // 2
            found = within(middle)
            if found is None:
                low = middle
            else:
                answer, high = found, middle
        kept = next(t for t in tried if t["budget"] == high)
        tried.append({**kept, "chosen": True})
    if answer is None:  # no point of the frontier is within: the fastest reference
        name = min(figures, key=lambda n: figures[n][0])
        k = next((i for i, (n, _, _) in enumerate(plans) if n == name), -1)
        answer = full if k < 0 else build(np.full(frontier.moves.shape[0], k, dtype=np.int64))
        tried.append({"budget": None, "plan": name, "step_p99_us": figures[name][0],
                      "layer_p99_us": figures[name][1], "chosen": True})
    return answer, {
        "figures": "estimated step p99 and mean layer p99, µs, batches sampled from the"
                   " fitted windows (the summary's figures, on the judge's tokens)",
        "references": {name: {"step_p99_us": f[0], "layer_p99_us": f[1]}
                       for name, f in figures.items()},
        "tried": tried,
        "step_p99_us": tried[-1]["step_p99_us"],
        "layer_p99_us": tried[-1]["layer_p99_us"],
    }
