"""The summary's floors, on the tokens the plans were judged on, in two processes:
:func:`plan_floors`.

The floor of every placement (:func:`placer.evaluate.time_bound`) and each plan's
per-batch floor under a position rule (:func:`placer.evaluate.hot_floor.counts_floor`,
laid over the first) cost more than judging the plans, and each layer's are its own:
every other layer is floored in a forked child (:class:`placer.parallel.Background`)
while this process floors the rest, and the halves are put back in layer order, the
arrays in the layout one call makes, so the figures are the same to the last bit.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np

from placer.errors import PlacerError, PlacerWarning
from placer.evaluate import EvalParams, time_bound
from placer.evaluate.bound import TimeBound
from placer.evaluate.dispatch import CODE_POLICIES
from placer.evaluate.hot_floor import CountsFloor, counts_floors
from placer.parallel import Background
from placer.placement import Placement
from placer.problem import PlacementProblem, SolveResult
from placer.stats import RoutingData

#: The figure the per-batch floor line compares (the verdict's).
BATCH_FLOOR_FIGURE = "step_p99_us"

#: One half's floors: the general floor (None: refused) and the per-batch floor of each
#: distinct replica count (None: not floored).
_Half = tuple[TimeBound | None, dict[bytes, CountsFloor] | None]


def plan_floors(
    routing: RoutingData, problem: PlacementProblem, results: list[SolveResult],
    params: EvalParams, draws: dict[tuple[int, ...], np.ndarray],
) -> tuple[TimeBound | None, dict[str, float] | None]:
    """The floor of every placement with the problem's slots per GPU on the judged tokens
    (None when the evaluator refuses), and each plan's per-batch floor of step p99 under
    a position rule (solver -> figure; None under other dispatch, or when a plan has a
    layer the data lacks)."""
    ids = np.asarray(routing.stats.layer_ids)
    if ids.size < 2:
        return _whole(_half(routing, problem, results, params, draws, ids), results, ids)
    theirs = Background(_half, routing, problem, results, params, draws, ids[1::2])
    try:
        mine = _half(routing, problem, results, params, draws, ids[0::2])
        other = theirs.result()
    finally:
        theirs.cancel()
    bound = None if mine[0] is None or other[0] is None else _joined_bound(
        [mine[0], other[0]], ids)
    if mine[1] is None or other[1] is None:
        return bound, None
    out = {}
    for r in results:
        key = _counts_key(r.placement)
        floor = _joined_counts([mine[1][key], other[1][key]], r.placement.layer_ids)
        out[r.solver] = floor.metrics()[BATCH_FLOOR_FIGURE]
    return bound, out


def _whole(half: _Half, results: list[SolveResult],
           layer_ids: np.ndarray) -> tuple[TimeBound | None, dict[str, float] | None]:
    bound, floors = half
    if floors is None:
        return bound, None
    return bound, {r.solver: floors[_counts_key(r.placement)].metrics()[BATCH_FLOOR_FIGURE]
                   for r in results}


def _half(routing: RoutingData, problem: PlacementProblem, results: list[SolveResult],
          params: EvalParams, draws: dict[tuple[int, ...], np.ndarray],
          layer_ids: np.ndarray) -> _Half:
    """The floors of the layers ``layer_ids`` alone (see :data:`_Half`)."""
    assert problem.topology is not None and problem.model is not None
    stats = routing.stats
    part = routing if layer_ids.size == stats.num_layers else replace(
        routing, stats=stats.select_layers(layer_ids))
    bound: TimeBound | None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlacerWarning)  # said when evaluating
        try:
            bound = time_bound(part, problem.topology, problem.model, params,
                               problem.slots_per_gpu, draws=draws)
        except PlacerError:
            bound = None
        if params.policy not in CODE_POLICIES:
            return bound, None
        plans: dict[bytes, Placement] = {}  # the floor depends on the replica counts alone
        known = set(stats.layer_ids.tolist())
        for r in results:
            key = _counts_key(r.placement)
            if key in plans:
                continue
            if not set(r.placement.layer_ids.tolist()) <= known:
                return bound, None  # a layer the data lacks: not floored
            plans[key] = _layers_of(r.placement, layer_ids)
        try:  # every plan at once: each layer's tokens and codes drawn once
            done = counts_floors(list(plans.values()), routing, problem.topology,
                                 problem.model, params, general=bound, draws=draws)
        except (PlacerError, KeyError):
            return bound, None
    return bound, dict(zip(plans, done, strict=True))


def _counts_key(placement: Placement) -> bytes:
    return placement.layer_ids.tobytes() + placement.replica_counts.tobytes()


def _layers_of(placement: Placement, layer_ids: np.ndarray) -> Placement:
    """``placement`` restricted to its layers among ``layer_ids``, in its own order."""
    wanted = set(layer_ids.tolist())
    rows = [r for r, i in enumerate(placement.layer_ids.tolist()) if i in wanted]
    if len(rows) == placement.num_layers:
        return placement
    return Placement(physical_to_logical=placement.physical_to_logical[rows],
                     layer_ids=placement.layer_ids[rows], num_experts=placement.num_experts,
                     num_gpus=placement.num_gpus, meta=placement.meta)


def _order(parts_ids: list[np.ndarray], layer_ids: np.ndarray) -> np.ndarray:
    """Where each of ``layer_ids`` is in the concatenated ``parts_ids``."""
    at = {int(i): n for n, i in enumerate(np.concatenate(parts_ids).tolist())}
    return np.array([at[int(i)] for i in layer_ids], dtype=np.int64)


def _columns(parts: list[np.ndarray], order: np.ndarray) -> np.ndarray:
    # C order, as one call makes them: sums over a row add in the same order
    return np.ascontiguousarray(np.concatenate(parts, axis=1)[:, order])


def _joined_bound(parts: list[TimeBound], layer_ids: np.ndarray) -> TimeBound:
    """The floors of ``parts`` (distinct layers, the same batches) as one, in the order of
    ``layer_ids``."""
    order = _order([p.layer_ids for p in parts], layer_ids)
    first = parts[0]
    return TimeBound(
        layer_ids=np.concatenate([p.layer_ids for p in parts])[order],
        layer_time_us=_columns([p.layer_time_us for p in parts], order),
        layer_sum_us=np.concatenate([p.layer_sum_us for p in parts])[order],
        slots_per_gpu=first.slots_per_gpu, source=first.source,
        remote_copies=np.concatenate([p.remote_copies for p in parts])[order],
        tokens=np.concatenate([p.tokens for p in parts])[order],
    )


def _joined_counts(parts: list[CountsFloor], layer_ids: np.ndarray) -> CountsFloor:
    """The per-batch floors of ``parts`` as one, in the order of ``layer_ids``."""
    order = _order([p.layer_ids for p in parts], layer_ids)
    return CountsFloor(
        layer_ids=np.concatenate([p.layer_ids for p in parts])[order],
        layer_time_us=_columns([p.layer_time_us for p in parts], order),
        hottest_piece_us=_columns([p.hottest_piece_us for p in parts], order),
        policy=parts[0].policy,
    )
