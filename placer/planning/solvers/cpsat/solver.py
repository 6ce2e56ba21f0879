"""The ``cpsat`` solver: per-layer CP-SAT planning, EPLB as hint and fallback.

Reads from :class:`placer.problem.SolveParams`: ``time_limit_s`` (wall-clock cap
per layer), ``total_time_limit_s``, ``seed``, ``jobs`` (layers solved in parallel
processes), ``ray``, ``progress``, ``regime``, the move budget (``max_moves``,
``max_move_gb``, ``move_tolerance``) and its own ``options``
(:class:`placer.planning.solvers.cpsat.options.CpsatOptions`).

The answer's ``objective`` is objective 1 averaged over layers: the robust hot-shard
ratio (hottest GPU over mean GPU, worst window when ``robust="max"``); ``bound`` is
the average of the per-layer lower bounds.  Per-layer reports, traffic, moves and
which method won are in ``details``.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import replace
from typing import Any

import numpy as np

from placer import constants
from placer.errors import PlacerWarning
from placer.evaluate.judge import EQUAL_TIME, LayerJudge, can_judge, faster_rows
from placer.parallel import Backend
from placer.placement import Placement
from placer.planning.solvers.cpsat.distinct import without_duplicates
from placer.planning.solvers.cpsat.layer import (
    LayerData,
    batch_variance,
    home_nodes,
    load_scale,
    noise_weight,
    tail_windows,
    window_variance,
)
from placer.planning.solvers.cpsat.options import CpsatOptions
from placer.planning.solvers.cpsat.replan import shown_figures, within_budget
from placer.planning.solvers.cpsat.replicas import replica_range
from placer.planning.solvers.cpsat.search import (
    FALLBACK_REASONS,
    LayerOutcome,
    SearchParams,
    solve_layer,
)
from placer.planning.solvers.cpsat.spread import spread_replicas
from placer.planning.solvers.cpsat.traffic import (
    identical_gpus,
    link_costs,
    select_pair_list,
    select_pairs,
)
from placer.planning.solvers.registry import solve
from placer.problem import PlacementProblem, SolveParams, SolveResult
from placer.regime import Regime

__all__ = ["CpsatOptions", "layer_data", "solve_cpsat", "to_mask"]


def to_mask(placement: Placement) -> np.ndarray:
    """``[layers, E, G]`` bool: whether GPU ``g`` holds expert ``e`` in each layer."""
    return placement.expert_gpu_mask


def _mask_to_row(mask: np.ndarray, slots_per_gpu: int, before: np.ndarray | None) -> np.ndarray:
    """``[P]`` physical_to_logical of one layer from ``mask [E, G]``.

    Experts that stay on a GPU keep their slot of ``before`` (``[P]`` or None); the
    others fill the free slots in increasing expert order.
    """
    num_gpus = mask.shape[1]
    row = np.empty(num_gpus * slots_per_gpu, dtype=np.int64)
    for g in range(num_gpus):
        experts = np.flatnonzero(mask[:, g]).tolist()
        slots: list[int | None] = [None] * slots_per_gpu
        if before is not None:  # each expert once, even where ``before`` held it twice
            for k, e in enumerate(before[g * slots_per_gpu : (g + 1) * slots_per_gpu].tolist()):
                if e in experts and e not in slots:
                    slots[k] = e
        rest = iter(e for e in experts if e not in slots)
        row[g * slots_per_gpu : (g + 1) * slots_per_gpu] = [
            e if e is not None else next(rest) for e in slots
        ]
    return row


def keeps_nodes(problem: PlacementProblem, options: CpsatOptions, regime: Regime) -> bool:
    """Whether the plan keeps the hint's expert-to-node packing (``keep_nodes``)."""
    if options.keep_nodes != "auto":
        return options.keep_nodes == "yes"
    return (regime.all_to_all == "normal" and problem.num_nodes > 1 and problem.num_groups > 1
            and problem.num_groups % problem.num_nodes == 0)


def merged_windows(load: np.ndarray, most: int) -> np.ndarray:
    """``load: [W, E]`` with its non-empty windows merged, consecutive ones summed, into
    ``most`` of nearly equal counts when there are more (``most`` 0: unchanged)."""
    kept = load[load.sum(axis=1) > 0]
    if most <= 0 or kept.shape[0] <= most:
        return load
    return np.stack([kept[group].sum(axis=0)
                     for group in np.array_split(np.arange(kept.shape[0]), most)])


def layer_data(
    problem: PlacementProblem, row: int, hint_counts: np.ndarray, robust: str,
    options: CpsatOptions | None = None, batch_tokens: int | None = None,
    allowed: np.ndarray | None = None,
) -> LayerData:
    """The planning data of layer row ``row`` of ``problem`` (pure).

    ``hint_counts: [E]`` replica counts of the hint, kept inside the allowed range.
    ``batch_tokens``: plan for the per-batch hot shard of batches of this many tokens
    (adds the batch-noise term, :func:`placer.planning.solvers.cpsat.layer.batch_noise`).
    ``allowed``: ``[E, G]`` bool, the GPUs each expert may use (None: any).
    """
    options = options or CpsatOptions()
    stats = problem.stats
    layer_id = int(stats.layer_ids[row])
    load = merged_windows(stats.load[:, row, :].astype(np.float64), options.max_windows)
    totals = load.sum(axis=1)
    noise = None
    if robust in ("max", "cvar") and (totals > 0).sum() >= 1:
        windows = load[totals > 0]
        shares = windows / windows.sum(axis=1, keepdims=True)
    elif robust == "std" and (totals > 0).sum() >= 1:
        windows = load[totals > 0]
        noise = window_variance(windows / windows.sum(axis=1, keepdims=True), problem.num_gpus)
        summed = load.sum(axis=0, keepdims=True)
        shares = summed / max(float(summed.sum()), 1.0)
    else:
        summed = load.sum(axis=0, keepdims=True)
        shares = summed / max(float(summed.sum()), 1.0)
    if not shares.any():
        shares = np.full((1, stats.num_experts), 1.0 / stats.num_experts)
    mean = load.sum(axis=0)
    mean_share = mean / max(float(mean.sum()), 1.0)
    # tokens as the evaluator counts them (each token once per window), for the same rates
    tokens = float(stats.total_tokens) or float(mean.sum()) / max(stats.top_k, 1)
    if stats.coact is None:
        pairs, rate = select_pairs(None, tokens, options.pair_mass, options.pairs_per_expert)
    else:  # the sparse pairs: no [E, E] matrix
        pairs, rate = select_pair_list(*stats.coact.pairs(row), stats.num_experts, tokens,
                                       options.pair_mass, options.pairs_per_expert)
    gpu_cost, node_cost = link_costs(problem.topology, problem.node_of_gpu)
    if batch_tokens:
        per_batch = batch_variance(shares, problem.num_gpus, max(stats.top_k, 1), batch_tokens)
        noise = per_batch if noise is None else noise + per_batch
    weight = 0.0 if noise is None else noise_weight(noise, hint_counts, problem.num_gpus,
                                                     options.noise_z)
    current = None
    fixed = [hint_counts]
    if problem.current is not None:
        current = problem.current.expert_gpu_mask[problem.current.layer_row(layer_id)]
        fixed.append(current.sum(axis=1))
    return LayerData(
        layer_id=layer_id,
        shares=shares,
        mean_share=mean_share,
        num_gpus=problem.num_gpus,
        slots_per_gpu=problem.slots_per_gpu,
        node_of_gpu=problem.node_of_gpu,
        pairs=pairs,
        pair_rate=rate,
        gpu_cost=gpu_cost,
        node_cost=node_cost,
        current=current,
        replica_range=replica_range(shares, problem.num_gpus, problem.num_physical, fixed),
        scale=load_scale(shares, problem.num_gpus, problem.slots_per_gpu, layer_id),
        identical_gpus=identical_gpus(problem.topology, problem.node_of_gpu),
        tail=tail_windows(shares.shape[0], options.cvar_fraction) if robust == "cvar" else 1,
        noise=noise,
        noise_weight=weight,
        allowed=allowed,
    )


def _solve_one(task: tuple[LayerData, np.ndarray, SearchParams]) -> LayerOutcome:
    return solve_layer(*task)


#: What cpsat's objective measures, by ``SolveParams.robust``.
OBJECTIVE_UNIT = {
    "max": "hot-shard ratio of the worst fitted window, mean over layers",
    "cvar": "hot-shard ratio, mean of the worst fitted windows, mean over layers",
    "std": "hot-shard ratio of the mean load plus its spread over windows, mean over layers",
    "mean": "hot-shard ratio of the fitted load summed over windows, mean over layers",
}

#: Share of a whole-plan budget (``SolveParams.total_time_limit_s``) the layer search
#: gets; the rest is for the hint, the judge and the summary.
SEARCH_SHARE = 0.7
#: The budget is deterministic work, in reference seconds
#: (:data:`~placer.planning.solvers.cpsat.search.STEP_WORK`): what the layer search of a
#: 2-core machine running its layers 2 at a time does in ``SEARCH_SHARE`` of the budget.
REFERENCE_CORES = 2
#: Least wall-clock cap of a layer, seconds (the cap is a safety net, not the budget).
MIN_LAYER_WALL_S = 5.0


def _run_layers(tasks: list[tuple[LayerData, np.ndarray, SearchParams]],
                params: SolveParams) -> list[LayerOutcome]:
    """Solve every layer where ``params`` says (this process, ``params.jobs`` local
    processes, or Ray: :class:`placer.parallel.Backend`), reporting
    ``params.progress(done, total)`` as layers finish; outcomes in layer order."""
    total = len(tasks)
    report = params.progress or (lambda done, total: None)
    report(0, total)
    finished = 0

    def done(_index: int, _outcome: LayerOutcome) -> None:
        nonlocal finished
        finished += 1
        report(finished, total)

    backend = Backend(jobs=params.jobs, ray=params.ray)
    return backend.run(_solve_one, tasks, on_done=done,
                       names=[f"layer {task[0].layer_id}" for task in tasks])


_Task = tuple[LayerData, np.ndarray, SearchParams]


def _layer_tasks(
    problem: PlacementProblem, hint: Placement, options: CpsatOptions, params: SolveParams,
) -> list[_Task]:
    """One search task per layer: its data, the hint's [experts, gpus] mask, the search."""
    hint_mask = to_mask(hint)
    stats = problem.stats
    search = SearchParams(seed=params.seed, time_limit_s=params.time_limit_s, options=options)
    keep = keeps_nodes(problem, options, params.regime)
    tasks = []
    for row in range(stats.num_layers):
        layer_id = int(stats.layer_ids[row])
        hint_row = hint.layer_row(layer_id)
        allowed = None
        if keep:
            current = None
            if problem.current is not None:
                current = problem.current.expert_gpu_mask[problem.current.layer_row(layer_id)]
            allowed = home_nodes(problem.node_of_gpu, hint_mask[hint_row], current)
        data = layer_data(problem, row, hint_mask[hint_row].sum(axis=1), options.robust, options,
                          options.batch_tokens, allowed)
        tasks.append((data, hint_mask[hint_row], search))
    return tasks


def _split_budget(tasks: list[_Task], params: SolveParams) -> list[_Task]:
    """Share the whole plan's budget over the layers: deterministic work, the same
    whatever ``jobs``, the machine or the backend, so the same inputs and seed give the
    same plan.  Each layer gets ``total x SEARCH_SHARE x REFERENCE_CORES / layers``
    reference seconds of work (at most ``params.time_limit_s``).  The wall clock is only a
    safety cap, counted from the layer's own start (a layer queued behind others, or on a
    Ray worker still starting, loses nothing): ``params.wall_factor`` times the layer's
    work, at least ``MIN_LAYER_WALL_S``."""
    per_layer = params.time_limit_s
    if params.total_time_limit_s is not None:
        share = params.total_time_limit_s * SEARCH_SHARE * REFERENCE_CORES / max(len(tasks), 1)
        per_layer = min(per_layer, share)
    wall = max(params.wall_factor * per_layer, MIN_LAYER_WALL_S)
    return [(data, mask, replace(search, work=per_layer, time_limit_s=wall))
            for data, mask, search in tasks]


def _placement_of(
    outcomes: list[LayerOutcome], problem: PlacementProblem, hint: Placement,
) -> Placement:
    """The layers' solutions as a placement; replicas stay in their slots where they can."""
    current = problem.current
    stats = problem.stats
    rows = []
    for row, outcome in enumerate(outcomes):
        before = None
        if current is not None:
            before = current.physical_to_logical[current.layer_row(int(stats.layer_ids[row]))]
        rows.append(_mask_to_row(outcome.x, problem.slots_per_gpu, before))
    return Placement(
        physical_to_logical=np.stack(rows),
        layer_ids=stats.layer_ids,
        num_experts=stats.num_experts,
        num_gpus=problem.num_gpus,
        meta=dict(hint.meta),
    )


def _judged(
    placement: Placement, outcomes: list[LayerOutcome], layers: list[LayerData],
    problem: PlacementProblem, params: SolveParams, hint_result: SolveResult,
    judge: LayerJudge,
) -> tuple[Placement, list[LayerOutcome], tuple[np.ndarray, np.ndarray], np.ndarray | None,
           dict[str, int]]:
    """Judge the plan against the hint, EPLB, spread variants and the current placement.

    Every candidate but the deployed placement competes without duplicate replicas
    (:func:`~placer.planning.solvers.cpsat.distinct.without_duplicates`); the reference
    EPLB itself, untouched, is still what the plan's figures are compared with.  The
    last item returned counts the layers repaired per candidate.
    """
    hint = hint_result.placement
    load = problem.stats.load.sum(axis=0).astype(np.float64)
    gpus_per_node = problem.num_gpus // problem.num_nodes
    repaired: dict[str, int] = {}

    def distinct(name: str, candidate: Placement) -> tuple[str, Placement]:
        fixed, count = without_duplicates(candidate, placement, load, gpus_per_node)
        if count:
            repaired[name] = count
        return name, fixed

    candidates = [distinct(hint_result.solver, hint)]
    # the reference users compare with, or its valid variant where the engine needs one
    baseline = "eplb-valid" if params.distinct else "eplb"
    reference = hint if hint_result.solver == baseline else solve(
        problem, baseline, params.shared()).placement
    if params.regime.dispatch == "sglang" and problem.num_nodes > 1:
        # node-local dispatch: the same plans with replicas spread over nodes
        candidates += [
            ("cpsat+spread", spread_replicas(placement, problem.node_of_gpu, load)),
            ("eplb+spread", spread_replicas(distinct(baseline, reference)[1],
                                            problem.node_of_gpu, load)),
        ]
    if hint_result.solver != baseline:  # the reference EPLB is what users compare with
        candidates.append(distinct(baseline, reference))
    if problem.current is not None and not (
            params.distinct and problem.current.duplicate_gpus.any()):
        candidates.append(("current", problem.current))  # re-planning: moving nothing
    return (*_keep_faster(placement, candidates, outcomes, layers, problem, params,
                          reference, judge), repaired)


def solve_cpsat(problem: PlacementProblem, params: SolveParams) -> SolveResult:
    """Plan every layer with CP-SAT; see the module docstring for what is read and returned."""
    started = time.perf_counter()
    options = CpsatOptions.from_options(params.options)
    hint_result = solve(problem, options.hint, params.shared())
    hint = hint_result.placement
    tasks = _split_budget(_layer_tasks(problem, hint, options, params), params)
    outcomes = _run_layers(tasks, params)

    outcomes = [replace(o, winner=hint_result.solver) if o.winner == "hint" else o
                for o in outcomes]
    placement = _placement_of(outcomes, problem, hint)
    layers = [task[0] for task in tasks]
    times = current_times = None
    repaired: dict[str, int] = {}
    judge = LayerJudge(problem, params.regime, params.seed) if can_judge(problem) else None
    if judge is not None:
        placement, outcomes, times, current_times, repaired = _judged(
            placement, outcomes, layers, problem, params, hint_result, judge)
    budget: dict[str, Any] | None = None
    if problem.current is not None:
        placement, outcomes, times, budget = _replanned(
            placement, outcomes, layers, problem, params, times, current_times, judge)
    # what the plan had to beat and would have kept: the judge's last candidate, or the
    # hint layer by layer when there is no judge
    if times is None:
        baseline = hint_result.solver
    else:
        baseline = "current" if problem.current is not None else "eplb"
    result = _result(placement, outcomes, hint_result, time.perf_counter() - started, params,
                     baseline, OBJECTIVE_UNIT[options.robust], times, budget)
    # candidates' layers that held an expert twice on a GPU and competed repaired
    result.details["repaired_layers"] = repaired
    # (layer, GPU) pairs of the answer holding an expert twice: only where the slots
    # leave no other choice, or the deployed placement is kept
    result.details["duplicate_gpus"] = int(placement.duplicate_gpus.sum())
    return result


def _replanned(
    placement: Placement, outcomes: list[LayerOutcome], layers: list[LayerData],
    problem: PlacementProblem, params: SolveParams,
    times: tuple[np.ndarray, np.ndarray] | None, current_times: np.ndarray | None,
    judge: LayerJudge | None,
) -> tuple[Placement, list[LayerOutcome], tuple[np.ndarray, np.ndarray] | None,
           dict[str, Any]]:
    """Re-plan only the layers that pay (:func:`placer.planning.solvers.cpsat.replan.
    within_budget`); with a judge, each layer may also take a fresh plan's row (the same
    trace planned with nothing deployed), and the answer is judged on the shown figures."""
    current = problem.current
    assert current is not None
    if judge is None or times is None or current_times is None:  # the hot shard is the cost
        cost = np.array([o.balance for o in outcomes])
        current_cost = np.array([data.balance(current.replicas_on_gpu[
            current.layer_row(data.layer_id)]) for data in layers])
        placement, outcomes, _, budget = within_budget(
            [("cpsat", placement, cost)], outcomes, layers, problem, params, current_cost)
        return placement, outcomes, times, budget
    fresh = solve_cpsat(replace(problem, current=None), replace(params, progress=None))
    plans = [("cpsat", placement, times[0]), ("fresh", fresh.placement, judge(fresh.placement))]
    placement, outcomes, cost, budget = within_budget(
        plans, outcomes, layers, problem, params, current_times,
        shown_figures(problem, params, judge))
    # the answer depends on the fresh plan too: a layer whose fresh search the wall-clock
    # cap stopped makes it as unreproducible as its own
    walled = [bool(entry["hit_wall_limit"]) for entry in fresh.details["layers"]]
    outcomes = [replace(o, hit_wall_limit=True) if hit and not o.hit_wall_limit else o
                for o, hit in zip(outcomes, walled, strict=True)]
    return placement, outcomes, (cost, times[1]), budget


def _keep_faster(
    placement: Placement, candidates: list[tuple[str, Placement]],
    outcomes: list[LayerOutcome], layers: list[LayerData], problem: PlacementProblem,
    params: SolveParams, reference: Placement, timed: LayerJudge,
) -> tuple[Placement, list[LayerOutcome], tuple[np.ndarray, np.ndarray], np.ndarray | None]:
    """The fastest of the plan and the ``candidates`` (the hint, the reference EPLB) by
    the evaluator's estimated p99 layer time.

    Layer by layer, each candidate's row replaces the plan's where it is faster (the plan
    on ties).  Some dispatch tables couple layers (SGLang's static dispatch draws every
    layer's fair choices from one random stream per rank), so the merged placement is
    timed again and the answer is the fastest whole placement by estimated step time
    (the sum of the layers' p99 times): the merge, the plan or a candidate -- and the
    last candidate (the reference EPLB) itself unless the answer is estimated at least
    ``constants.JUDGE_MARGIN`` faster than it.

    The last candidate is the baseline: the reference EPLB, or with ``--current`` the
    deployed placement (so that a re-plan moves nothing unless that is estimated
    ``JUDGE_MARGIN`` faster).

    Returns the placement, the outcomes (a candidate's rows with the candidate's name as
    winner and its figures, ``FALLBACK`` for the hint's and the baseline's), and
    ``(chosen_times, eplb_times)``: ``[layers]`` estimated p99 layer times, microseconds,
    of the returned placement and of ``reference`` (the reference EPLB as users run it,
    duplicates included, whichever candidate competed in its place), and
    the deployed placement's times (candidate ``current``; None without one).
    """
    # all judged on the same sampled tokens, each distinct layer once, the layers split
    # over the cores the search used
    timed.prefetch([placement, *(other for _, other in candidates), reference],
                   1 if params.ray else params.jobs)

    def taken(row: int, name: str, other: Placement, why: str = "judged") -> LayerOutcome:
        x = other.replicas_on_gpu[other.layer_row(int(placement.layer_ids[row]))]
        data = layers[row]
        kept_baseline = name in (candidates[0][0], "eplb", "eplb-valid", "current")
        return replace(outcomes[row], x=x > 0, balance=data.balance(x),
                       traffic=data.traffic(x), moves=data.moves(x),
                       status="FALLBACK" if kept_baseline else "FEASIBLE", winner=name,
                       fallback=why if kept_baseline else "")

    plan_times = timed(placement)
    best_times = plan_times.copy()
    rows = placement.physical_to_logical.copy()
    merged_outcomes = list(outcomes)
    whole: list[tuple[str, Placement, np.ndarray]] = [("cpsat", placement, plan_times)]
    for name, other in candidates:
        other_times = timed(other)
        whole.append((name, other, other_times))
        faster = faster_rows(best_times, other_times)
        for row in np.flatnonzero(faster).tolist():
            rows[row] = other.physical_to_logical[other.layer_row(int(placement.layer_ids[row]))]
            merged_outcomes[row] = taken(row, name, other)
        best_times = np.where(faster, other_times, best_times)
    merged = replace(placement, physical_to_logical=rows)
    merged_times = timed(merged) if not np.array_equal(rows, placement.physical_to_logical) \
        else plan_times
    baseline_times = whole[-1][2]
    eplb_times = timed(reference)
    best = ("merged", merged, merged_times)
    for entry in whole:
        if entry[2].sum() < best[2].sum() * (1 - EQUAL_TIME):
            best = entry
    why = "judged"  # a candidate's whole placement timed fastest
    if candidates and best[2].sum() > baseline_times.sum() * (1 - constants.JUDGE_MARGIN):
        if best[0] != whole[-1][0] and best[2].sum() < baseline_times.sum() * (1 - EQUAL_TIME):
            why = "margin"  # faster, but not by the margin
        best = whole[-1]  # not clearly faster than the baseline (EPLB): keep the baseline
    name, chosen, chosen_times = best
    current_times = next((t for n, _, t in whole if n == "current"), None)
    if name == "merged":
        return merged, merged_outcomes, (chosen_times, eplb_times), current_times
    if name == "cpsat":
        return placement, list(outcomes), (chosen_times, eplb_times), current_times
    return chosen, [taken(row, name, chosen, why) for row in range(len(outcomes))], (
        chosen_times, eplb_times), current_times


def _layer_entries(placement: Placement, outcomes: list[LayerOutcome]) -> list[dict[str, Any]]:
    """The per-layer entries of the solve result's ``details["layers"]``."""
    return [
        {
            "layer": int(lid),
            "status": o.status,
            "winner": o.winner,
            "method": o.method,
            "balance": o.balance,
            "eplb_balance": o.hint_balance,
            "bound": o.bound,
            "balance_first_pass": o.balance_first,
            "balance_cap": o.cap,
            "traffic": o.traffic,
            "eplb_traffic": o.hint_traffic,
            "moves": o.moves,
            "eplb_moves": o.hint_moves,
            "steps": o.steps,
            "seconds": o.seconds,
            "hit_wall_limit": o.hit_wall_limit,
            "work": o.work,
            "hit_work_limit": o.hit_work_limit,
            "fallback": o.fallback or None,
        }
        for lid, o in zip(placement.layer_ids.tolist(), outcomes, strict=True)
    ]


def _result(
    placement: Placement, outcomes: list[LayerOutcome], hint_result: SolveResult,
    seconds: float, params: SolveParams, baseline: str, objective_unit: str,
    times: tuple[np.ndarray, np.ndarray] | None = None,
    budget: dict[str, Any] | None = None,
) -> SolveResult:
    statuses = {o.status for o in outcomes}
    if statuses == {"FALLBACK"}:
        status = "FALLBACK"
    elif statuses <= {"OPTIMAL"}:
        status = "OPTIMAL"
    else:
        status = "FEASIBLE"
    winners = [o.winner for o in outcomes]
    reasons = [o.fallback or "search" for o in outcomes if o.status == "FALLBACK"]
    fell = [(int(lid), o.fallback or "search") for lid, o in zip(
        placement.layer_ids.tolist(), outcomes, strict=True) if o.status == "FALLBACK"]
    per_layer = _layer_entries(placement, outcomes)
    details: dict[str, Any] = {
        "hint": hint_result.solver,
        "winners": {name: winners.count(name) for name in sorted({"cpsat", *winners})},
        "eplb_objective": float(np.mean([o.hint_balance for o in outcomes])),
        "traffic": float(np.mean([o.traffic for o in outcomes])),
        "eplb_traffic": float(np.mean([o.hint_traffic for o in outcomes])),
        "moves": int(sum(o.moves for o in outcomes)),
        "eplb_moves": int(sum(o.hint_moves for o in outcomes)),
        "wall_limit_hit_layers": int(sum(o.hit_wall_limit for o in outcomes)),
        # the deterministic budget (reproducible) and the wall-clock safety cap (not)
        "work_limit_hit_layers": int(sum(o.hit_work_limit for o in outcomes)),
        "work": float(sum(o.work for o in outcomes)),
        "reproducible": not any(o.hit_wall_limit for o in outcomes),
        # why the FALLBACK layers kept another layout: reason -> layers, which, the reason
        "fallback": {reason: {"layers": reasons.count(reason), "why": FALLBACK_REASONS[reason],
                              "layer_ids": [lid for lid, r in fell if r == reason]}
                     for reason in sorted(set(reasons))},
        "layers": per_layer,
    }
    if times is not None:
        plan_times, hint_times = times
        details["judged_by"] = (
            "estimated p99 layer time, " + params.regime.describe()
            + ", batches sampled from the fitted windows"
        )
        details["layer_time_us"] = float(plan_times.mean())
        details["eplb_layer_time_us"] = float(hint_times.mean())
        for entry, mine, theirs in zip(per_layer, plan_times.tolist(), hint_times.tolist(),
                                       strict=True):
            entry["layer_time_us"] = mine
            entry["eplb_layer_time_us"] = theirs
    walled = int(sum(o.hit_wall_limit for o in outcomes))
    if walled:  # said with the placement too: it depends on the machine's load
        warnings.warn(
            f"the wall-clock safety cap stopped the search in {walled} of {len(outcomes)}"
            " layers before its deterministic budget: this plan depends on the machine's"
            " speed and load, and the same inputs and seed may give another one (a smaller"
            " budget for the whole plan fits the machine)", PlacerWarning, stacklevel=3)
        placement = replace(placement, meta={**placement.meta, "reproducible": False,
                                             "wall_limit_hit_layers": walled})
    return SolveResult(
        placement=placement,
        solver="cpsat",
        status=status,
        objective=float(np.mean([o.balance for o in outcomes])),
        objective_unit=objective_unit,
        bound=float(np.mean([o.bound for o in outcomes])),
        seconds=seconds,
        baseline=baseline,
        replan=budget,
        details=details,
    )
