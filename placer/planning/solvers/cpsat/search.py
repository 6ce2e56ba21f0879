"""The search of one layer: a balance pass, then a traffic-and-migration pass.

Small layers are solved as one CP-SAT model (all GPUs free), which gives CP-SAT's
own status and bound.  Larger layers use large-neighbourhood search with CP-SAT as
the engine: each step frees a few GPUs (``constants.CPSAT_NEIGHBOURHOOD_SLOTS``
slots), solves that sub-model exactly or to its deterministic-time limit, re-scores
the answer with the exact figures of :mod:`placer.planning.solvers.cpsat.layer` and keeps it
only if it is better.  Steps draw their neighbourhoods from a generator seeded with
``(seed, layer)``; with deterministic-time limits this makes the search reproducible.

Pass 1 (balance) minimizes the robust hot-shard ratio ``T``, starting from the
better of the hint (EPLB) and the current placement.  Pass 2 fixes
``T <= cap = min((1 + tolerance) * T1, T_hint)`` and minimizes
``traffic_weight * traffic / reference + migration_weight * moves / P``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from placer import constants
from placer.planning.solvers.cpsat import stop
from placer.planning.solvers.cpsat.layer import LayerData
from placer.planning.solvers.cpsat.model import BALANCE, COST, LayerModel, SubResult
from placer.planning.solvers.cpsat.options import CpsatOptions
from placer.planning.solvers.cpsat.packing import window_packing

#: Steps without improvement after which a neighbourhood grows by one GPU.
STALL_GROWTH = 3


#: The search's deterministic work measure, in *reference seconds* (about a second of one
#: core of a quiet 2-core machine): each neighbourhood step or full model costs
#: ``STEP_WORK`` (building the model, re-scoring the answer) plus ``DTIME_WORK`` per
#: deterministic second CP-SAT reports for it.  Fitted on 15-20 layers of the DeepSeek-V3
#: bench trace, process time of a layer's search against its steps and deterministic time
#: (2 cores shared with other jobs, load 3 and 9): 0.017 and 0.016 s a step plus 0.99 and
#: 1.25 s per deterministic second (the second under heavier load).
STEP_WORK = 0.016
DTIME_WORK = 1.0
#: ... and a model past ``STEP_TERMS`` non-zero load terms (:attr:`LayerModel.load_terms`;
#: the bench's models hold up to about 6,500) costs ``STEP_TERM_WORK`` more per term past
#: them: writing and presolving a model grows with it (a 2,048-GPU layer of 180,000-360,000
#: terms spent 0.6-0.8 s a step beyond its deterministic time, against 0.015 s at 2,000).
STEP_TERMS = 10_000
STEP_TERM_WORK = 3.3e-6


def step_work(load_terms: int) -> float:
    """The fixed work of one step on a model of ``load_terms`` load terms, reference
    seconds (:data:`STEP_WORK`, more past :data:`STEP_TERMS`)."""
    return STEP_WORK + STEP_TERM_WORK * max(0, load_terms - STEP_TERMS)


@dataclass(frozen=True)
class SearchParams:
    """What one layer's search reads.

    Attributes
    ----------
    seed: the search's seed (with the layer id).
    time_limit_s: wall-clock safety cap of the layer, seconds.
    options: the solver's options.
    work: the layer's deterministic budget, reference seconds (:data:`STEP_WORK`); None:
        only the passes' step counts and the wall-clock cap stop it.
    """

    seed: int
    time_limit_s: float
    options: CpsatOptions = field(default_factory=CpsatOptions)
    work: float | None = None


@dataclass
class LayerOutcome:
    """One layer's answer and how it was found.

    Attributes
    ----------
    x: ``[E, G]`` bool, the placement.
    balance, hint_balance, bound: objective 1 of the answer and of the hint, and a
        proven lower bound on it (hot-shard ratios).
    traffic, hint_traffic, moves, hint_moves: objectives 2 and 3.
    status: ``OPTIMAL`` (balance proven optimal), ``FEASIBLE`` or ``FALLBACK`` (the
        hint kept unchanged).
    winner: ``"cpsat"`` or ``"hint"`` (the solver reports the hint's name).
    method: ``"full"`` (one model) or ``"lns"``.
    balance_first, cap: objective 1 after the balance pass, and the cap the second
        pass kept it under.
    steps: sub-models solved and accepted, per pass.
    seconds: wall time; hit_wall_limit: the wall-clock safety cap stopped a pass (the
        answer then depends on the machine's speed and load: not reproducible).
    work: the deterministic work spent, reference seconds; hit_work_limit: the
        deterministic budget stopped a pass (reproducible).
    fallback: why a ``FALLBACK`` layer kept another layout (a key of
        :data:`FALLBACK_REASONS`), "" otherwise.
    """

    x: np.ndarray
    balance: float
    hint_balance: float
    bound: float
    traffic: float
    hint_traffic: float
    moves: int
    hint_moves: int
    status: str
    winner: str
    method: str
    balance_first: float = 0.0
    cap: float = 0.0
    steps: dict[str, list[int]] = field(default_factory=dict)
    seconds: float = 0.0
    hit_wall_limit: bool = False
    fallback: str = ""
    work: float = 0.0
    hit_work_limit: bool = False


#: Why a layer kept a layout other than CP-SAT's (``LayerOutcome.fallback``).
FALLBACK_REASONS = {
    "search": "CP-SAT found no layout better than the hint's within its budget",
    "judged": "the evaluator times the kept layout at least as fast as every candidate",
    "margin": "the plan was estimated less than the judge's margin faster than the kept"
              " layout over the whole step",
    "moves": "re-planning the layer did not pay for its weight moves (or the move budget"
             " had no room for them)",
}


class _Clock:
    """A layer's budget: deterministic work first, the wall clock only as a safety cap.

    Every pass asks :meth:`go` before a step and solves it with :meth:`solve` (the step's
    deterministic-time limit cut to the work left, the wall seconds left as CP-SAT's wall
    limit), which books the work CP-SAT reports.  The work check comes first, so a search
    the wall clock never stops gives the same answer on any machine and under any load.
    """

    def __init__(self, limit: float, work: float | None = None) -> None:
        self.start = time.perf_counter()
        self.limit = limit
        self.work_left = float("inf") if work is None else float(work)
        self.spent = 0.0
        self.wall_hit = False
        self.work_hit = False

    def left(self) -> float:
        """Wall seconds left (the safety cap); noted when none are."""
        left = self.limit - (time.perf_counter() - self.start)
        if left <= 0:
            self.wall_hit = True
        return left

    def go(self) -> bool:
        """Whether another step fits: work left for more than a step's fixed cost, then
        wall time left."""
        if self.work_left <= STEP_WORK:
            self.work_hit = True
            return False
        return self.left() > 0

    def dtime(self, cap: float, fixed: float = STEP_WORK) -> float:
        """A step's deterministic-time limit: ``cap``, cut to the work left past the
        step's ``fixed`` work."""
        return max(1e-3, min(cap, (self.work_left - fixed) / DTIME_WORK))

    def solve(self, model: LayerModel, cap: float, seed: int, lns: bool = False) -> SubResult:
        """One step: ``model`` solved within ``cap`` deterministic seconds cut to the work
        left, and the wall seconds left; the step's work booked, and the wall cap noted
        when it is what ended the solve."""
        wall = max(self.left(), 1e-3)
        began = time.perf_counter()
        fixed = step_work(model.load_terms)
        result = model.solve(self.dtime(cap, fixed), wall, seed, lns=lns)
        if time.perf_counter() - began >= wall:
            self.wall_hit = True
        cost = fixed + DTIME_WORK * float(result.dtime)
        self.work_left -= cost
        self.spent += cost
        return result


def solve_layer(data: LayerData, hint: np.ndarray, params: SearchParams) -> LayerOutcome:
    """Plan one layer from the hint placement ``hint: [E, G] bool``."""
    opts = params.options
    clock = _Clock(params.time_limit_s, params.work)
    rng = np.random.default_rng([params.seed, data.layer_id])
    scale = data.scale
    full = _full_model_size(data) <= opts.full_model_max_vars
    steps: dict[str, list[int]] = {}

    start = hint
    # the current placement seeds the search only when the model can hold it: one replica
    # of an expert per GPU (DeepSeek's EPLB may have put two on one GPU; the judge still
    # weighs the deployed placement as it is)
    current = data.current if _representable(data, data.current) else None
    if current is not None and data.balance_key(current) < data.balance_key(hint):
        start = current
    if not full and data.current is None and opts.window_packing and opts.balance_iterations:
        packed = window_packing(data, hint)  # the steps go on from the better start
        if packed is not None and data.balance_key(packed) < data.balance_key(start):
            start = packed
    bound = data.balance_bound()

    # Pass 1: balance.
    if full:
        x1, bound1, proven = _full_balance(data, start, scale, params, clock)
        bound = max(bound, bound1)
    else:
        x1, tried, kept = _lns_balance(data, start, scale, params, rng, clock, bound)
        steps["balance"] = [tried, kept]
        proven = False
    balance1 = data.balance(x1)
    hint_balance = data.balance(hint)
    if balance1 > hint_balance:  # cannot happen with a kept hint; guard the promise anyway
        x1, balance1 = hint, hint_balance
    proven = proven or balance1 <= bound * (1 + 1e-9)

    # Pass 2: traffic and migration under the balance cap.
    x = x1
    cap = balance1
    has_cost = (data.pairs.size and opts.traffic_weight > 0) or (
        data.current is not None and opts.migration_weight > 0
    )
    if has_cost:
        cap = balance_cap(balance1, hint_balance, bound, opts.balance_tolerance,
                          opts.traffic_first)
        x2 = _cost_start(data, x1, (current, hint), cap, params)
        if full:
            x = _full_cost(data, x2, scale, cap, params, clock)
        else:
            x, tried, kept = _lns_cost(data, x2, scale, cap, params, rng, clock)
            steps["cost"] = [tried, kept]

    final_balance = data.balance(x)
    unchanged = bool(np.array_equal(x, hint))
    if unchanged:
        status, winner = "FALLBACK", "hint"
    else:
        status = "OPTIMAL" if proven and final_balance <= balance1 * (1 + 1e-12) else "FEASIBLE"
        winner = "cpsat"
    return LayerOutcome(
        x=x,
        balance=final_balance,
        hint_balance=hint_balance,
        bound=min(bound, final_balance),
        traffic=data.traffic(x),
        hint_traffic=data.traffic(hint),
        moves=data.moves(x),
        hint_moves=data.moves(hint),
        status=status,
        winner=winner,
        method="full" if full else "lns",
        balance_first=balance1,
        cap=cap,
        steps=steps,
        seconds=time.perf_counter() - clock.start,
        hit_wall_limit=clock.wall_hit,
        fallback="search" if unchanged else "",
        work=clock.spent,
        hit_work_limit=clock.work_hit,
    )


def _cost_start(
    data: LayerData, first: np.ndarray, others: tuple[np.ndarray | None, ...], cap: float,
    params: SearchParams,
) -> np.ndarray:
    """Where pass 2 starts: the cheapest placement that meets the cap among pass 1's
    (relabelled to the current slots) and ``others`` (the current one, the hint's: pass 1
    may have traded the hint's co-location for balance)."""
    start = _relabel_to_current(data, first) if data.current is not None else first
    for other in others:
        if (
            other is not None
            and data.balance(other) <= cap
            and _cost(data, other, params) < _cost(data, start, params)
        ):
            start = other
    return start


def balance_cap(
    first: float, hint: float, bound: float, tolerance: float, traffic_first: bool = False
) -> float:
    """Hot-shard ratio the second pass may reach.

    Balance first (the default): ``min(hint, max((1 + tol) * bound, first))``.  The
    tolerance is measured from the balance lower bound (about 1.0, a perfectly even
    split), so the default 0.005 promises a hot shard within 0.5% of the mean GPU load
    whenever the balance pass got there; it never exceeds the hint's (EPLB's) hot shard.

    Traffic first: ``max(first, (1 + tol) * hint)``, the tolerance measured from the
    hint's hot shard: ``--traffic-first --balance-tolerance 0.01`` trades up to 1% of
    hot shard over EPLB's for co-location.
    """
    if traffic_first:
        return max(first, (1.0 + tolerance) * hint)
    return min(hint, max((1.0 + tolerance) * bound, first))


# -- full model ---------------------------------------------------------------------------
def _full_model_size(data: LayerData) -> int:
    choices = (data.replica_range[:, 1] - data.replica_range[:, 0] + 1).sum()
    pair_vars = data.pairs.shape[0] * data.num_gpus
    return int(choices * data.num_gpus + pair_vars)


def _full_balance(
    data: LayerData, start: np.ndarray, scale: float, params: SearchParams, clock: _Clock
) -> tuple[np.ndarray, float, bool]:
    """Pass 1 as one model; returns the placement, its proven bound and whether optimal."""
    opts = params.options
    symmetric = data.current is None and data.identical_gpus
    x0 = _canonical(data, start) if symmetric else start
    model = LayerModel(
        data, x0, np.arange(data.num_gpus), mode=BALANCE, scale=scale, symmetry=symmetric
    )
    if not clock.go():
        return start, 0.0, False
    result = clock.solve(model, opts.full_model_dtime, params.seed)
    if result.x is None or data.balance_key(result.x) >= data.balance_key(x0):
        return start, 0.0, False
    unit = scale / data.num_gpus
    slack = 0.5 * data.slots_per_gpu / unit  # rounding of the integer loads
    bound = max(0.0, result.bound / model.objective_windows / unit - slack)
    return result.x, bound, result.status == "OPTIMAL"


def _full_cost(
    data: LayerData, start: np.ndarray, scale: float, cap: float, params: SearchParams,
    clock: _Clock,
) -> np.ndarray:
    opts = params.options
    model = LayerModel(
        data, start, np.arange(data.num_gpus), mode=COST, scale=scale, cap=cap,
        traffic_weight=opts.traffic_weight, migration_weight=opts.migration_weight,
        free_counts=data.current is not None,
    )
    if not clock.go():
        return start
    result = clock.solve(model, opts.full_model_dtime, params.seed)
    if result.x is None or not _better_cost(data, result.x, start, cap, params):
        return start
    return result.x


# -- large-neighbourhood search -----------------------------------------------------------
def _neighbourhood_size(data: LayerData, params: SearchParams, stall: int) -> int:
    """GPUs to free: ``neighbourhood_slots / S`` (at least 2), one more GPU for every
    ``STALL_GROWTH`` steps without improvement, up to twice the base size."""
    opts = params.options
    base = max(2, round(opts.neighbourhood_slots / data.slots_per_gpu))
    size = min(base + stall // STALL_GROWTH, 2 * base)
    return int(min(size, data.num_gpus))


def _lns_balance(
    data: LayerData, x: np.ndarray, scale: float, params: SearchParams,
    rng: np.random.Generator, clock: _Clock, bound: float,
) -> tuple[np.ndarray, int, int]:
    """Pass 1 by neighbourhoods: the hottest GPU plus GPUs drawn toward the coldest."""
    opts = params.options
    key = data.balance_key(x)
    tried = kept = stall = 0
    while tried < opts.balance_iterations and stall < opts.patience and clock.go():
        if key[0] <= bound * (1 + constants.CPSAT_BALANCE_GAP):
            break
        size = _neighbourhood_size(data, params, stall)
        worst = data.gpu_ratio(x).max(axis=0)  # [G]
        hottest = int(np.argmax(worst))
        gpus = _draw(rng, hottest, worst.max() - worst + 1e-9, size)
        model = LayerModel(data, x, gpus, mode=BALANCE, scale=scale)
        result = clock.solve(model, opts.submodel_dtime, params.seed + tried, lns=True)
        tried += 1
        if result.x is not None and (new := data.balance_key(result.x)) < key:
            x, key = result.x, new
            kept += 1
            stall = 0
        else:
            stall += 1
    return x, tried, kept


def _lns_cost(
    data: LayerData, x: np.ndarray, scale: float, cap: float, params: SearchParams,
    rng: np.random.Generator, clock: _Clock,
) -> tuple[np.ndarray, int, int]:
    """Pass 2 by neighbourhoods: around a heavy pair that is split, or at random."""
    opts = params.options
    tried = kept = stall = 0
    patience = min(opts.patience, opts.cost_patience)
    while tried < opts.cost_iterations and stall < patience and clock.go():
        size = _neighbourhood_size(data, params, stall)
        gpus = _cost_neighbourhood(data, x, rng, size, tried)
        model = LayerModel(
            data, x, gpus, mode=COST, scale=scale, cap=cap,
            traffic_weight=opts.traffic_weight, migration_weight=opts.migration_weight,
            free_counts=data.current is not None,
        )
        result = clock.solve(model, opts.submodel_dtime, params.seed + tried, lns=True)
        tried += 1
        if result.x is not None and _better_cost(data, result.x, x, cap, params):
            x = result.x
            kept += 1
            stall = 0
        else:
            stall += 1
    return x, tried, kept


def _cost_neighbourhood(
    data: LayerData, x: np.ndarray, rng: np.random.Generator, size: int, step: int
) -> np.ndarray:
    """Even steps: GPUs of a heavy split pair (drawn by rate); odd steps: at random.

    Steps that reduce moves start from a GPU holding an expert the current placement
    does not have there.
    """
    g_all = np.arange(data.num_gpus)
    if data.current is not None and step % 3 == 2:
        moved = np.flatnonzero((x & ~data.current).any(axis=0))
        if moved.size:
            first = int(rng.choice(moved))
            return _draw(rng, first, np.ones(data.num_gpus), size)
    if data.pairs.size and step % 2 == 0:
        split = ~(x[data.pairs[:, 0]] & x[data.pairs[:, 1]]).any(axis=1)
        if split.any():
            rates = data.pair_rate * split
            pick = int(rng.choice(rates.size, p=rates / rates.sum()))
            i, j = data.pairs[pick]
            gi = int(rng.choice(np.flatnonzero(x[i])))
            gj = int(rng.choice(np.flatnonzero(x[j])))
            weight = np.ones(data.num_gpus)
            weight[gj] = 1e6  # make sure the partner's GPU comes along
            return _draw(rng, gi, weight, size)
    return np.sort(rng.choice(g_all, size=size, replace=False))


def _draw(rng: np.random.Generator, first: int, weight: np.ndarray, size: int) -> np.ndarray:
    """``first`` plus ``size - 1`` other GPUs drawn without replacement by ``weight``."""
    weight = np.asarray(weight, dtype=np.float64).copy()
    weight[first] = 0.0
    others = np.flatnonzero(weight > 0)
    take = min(size - 1, others.size)
    p = weight[others] / weight[others].sum()
    chosen = rng.choice(others, size=take, replace=False, p=p) if take else np.zeros(0, int)
    return np.sort(np.concatenate([[first], chosen]).astype(np.int64))


# -- scoring ------------------------------------------------------------------------------
def _cost(data: LayerData, x: np.ndarray, params: SearchParams) -> float:
    opts = params.options
    return data.cost(x, opts.traffic_weight, opts.migration_weight)


def _better_cost(
    data: LayerData, new: np.ndarray, old: np.ndarray, cap: float, params: SearchParams
) -> bool:
    if data.balance(new) > cap * (1 + 1e-12):
        return False
    return _cost(data, new, params) < _cost(data, old, params) - 1e-12


def _representable(data: LayerData, x: np.ndarray | None) -> bool:
    """Whether ``x`` is a placement of the model: ``slots_per_gpu`` distinct experts on
    every GPU, every expert somewhere."""
    return x is not None and bool((x.sum(axis=0) == data.slots_per_gpu).all()
                                  and (x.sum(axis=1) >= 1).all())


def _canonical(data: LayerData, x: np.ndarray) -> np.ndarray:
    """The same placement with each node's GPUs sorted by summed load, heaviest first."""
    total = data.gpu_ratio(x).sum(axis=0)
    order = np.arange(data.num_gpus)
    for node in range(data.num_nodes):
        members = np.flatnonzero(data.node_of_gpu == node)
        order[members] = members[np.argsort(-total[members], kind="stable")]
    return x[:, order]


def _relabel_to_current(data: LayerData, x: np.ndarray) -> np.ndarray:
    """Permute identical GPUs within nodes so that ``x`` keeps most of the current placement.

    An assignment problem per node (GPUs of ``x`` to GPU ranks), solved with CP-SAT;
    the loads and the traffic do not change, the moves only go down.
    """
    current = data.current
    if current is None or not data.identical_gpus:
        return x
    order = np.arange(data.num_gpus)
    for node in range(data.num_nodes):
        members = np.flatnonzero(data.node_of_gpu == node)
        overlap = (x[:, members].T.astype(np.int64) @ current[:, members].astype(np.int64))
        model = cp_model.CpModel()
        a = {
            (p, q): model.new_bool_var(f"a_{p}_{q}")
            for p in range(members.size) for q in range(members.size)
        }
        for p in range(members.size):
            model.add_exactly_one(a[p, q] for q in range(members.size))
            model.add_exactly_one(a[q, p] for q in range(members.size))
        model.maximize(sum(int(overlap[p, q]) * var for (p, q), var in a.items()))
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        solver.parameters.max_deterministic_time = 1.0
        if stop.solve(solver, model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            continue
        for (p, q), var in a.items():
            if solver.value(var):
                order[members[q]] = members[p]
    relabelled = x[:, order]
    return relabelled if data.moves(relabelled) <= data.moves(x) else x
