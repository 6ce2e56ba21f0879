"""The per-batch floor of the hottest GPU, for every placement with given replica counts.

:func:`placer.evaluate.time_bound` floors every placement with ``S`` slots per GPU and
lets the compute of a batch spread over the GPUs like water.  Under a position rule
(``vllm_hash``, ``trtllm_block``, ``round_robin``: a selection goes to replica
``code mod r`` of its expert, :func:`placer.evaluate.dispatch.dispatch_codes`), the
replica counts alone fix how many selections each replica serves in each batch, wherever
the replicas sit.  So for one set of replica counts (a plan's) each batch's work comes in
``P = G x S`` fixed pieces, one per slot, and the hottest GPU holds ``S`` of them:
:func:`counts_floor` floors that GPU.

The argument, per batch and layer (replica ``i`` of expert ``e`` serves ``m_i``
selections, ``h_i`` of them from its busiest source GPU):

1. **A piece's own time.**  The GPU holding replica ``i`` runs it, ``max(w, m_i t)``
   when ``m_i > 0`` (``w`` weight read, ``t`` per-token time, at the fastest GPU's
   rates), and in the per-selection modes receives at least ``m_i - h_i`` of its
   selections from other GPUs (at most one source is its own) and returns as many in
   the combine.  A phase lasts at least the bytes a GPU receives (dispatch) or sends
   (combine) over the sum of its link classes' injection bandwidths (the busiest class
   takes at least its share), so the piece adds at least
   ``v_i = max(w, m_i t) + (m_i - h_i)(a + c) / B`` (``a``, ``c``: dispatch and combine
   bytes per copy; ``B``: the largest injection bandwidth of a GPU over its classes).
   Likewise through the NIC alone: at least ``m_i - n_i`` of its selections come from
   other nodes (``n_i``: from its busiest source node; in ``low_latency_rdma`` every
   other GPU's come through the NIC), so ``u_i = max(w, m_i t) + (m_i - n_i)(a + c) /
   B_nic``.  In ``normal`` mode copies are per token, so both receive terms are left out.
   A GPU that receives a copy also pays each phase's fixed cost and a latency once
   (``F``: twice the least over GPUs of the cheaper class's phase cost plus the nearest
   peer's latency; ``F_nic`` likewise over the NIC); a piece that receives one carries
   ``F / S`` of it (``F_nic / S`` in ``u``), so ``S`` pieces sharing a GPU carry at most
   what that GPU pays.
2. **Packing.**  A GPU's time is at least the sum of its pieces' ``v`` (and of their
   ``u``), and every GPU
   holds exactly ``S`` pieces.  With ``v`` sorted downward, the hottest GPU is at least
   the mean ``sum v / G``, the largest piece, and, for ``j = 1 .. S - 1``, the ``j + 1``
   smallest of the ``j G + 1`` largest pieces (``j G + 1`` pieces on ``G`` GPUs: one GPU
   holds ``j + 1`` of them); the largest piece's GPU also holds ``S - 1`` others, at
   least the ``S - 1`` smallest.
3. The floor of :func:`placer.evaluate.time_bound` (every placement) holds here too: the
   cell is the larger of the two.

What it leaves out: one placement serves every batch (each batch's floor lets the
pieces be packed anew), the send side, pair links.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from placer.errors import Param, UsageError
from placer.evaluate.balance import nan_percentile
from placer.evaluate.batches import Batches
from placer.evaluate.bound import TimeBound, nearest_latency, selected_entries
from placer.evaluate.core import EvalParams, token_source
from placer.evaluate.costs import CostModel, copy_us
from placer.evaluate.dispatch import CODE_POLICIES, dispatch_codes
from placer.evaluate.timing import INTER_NODE, INTRA_NODE
from placer.evaluate.traffic import PER_SELECTION_MODES
from placer.stats import ExpertStats, RoutingData
from placer.stats.windows import resolve_window_range

if TYPE_CHECKING:
    from placer.model import ModelSpec
    from placer.placement import Placement
    from placer.topology import Topology


@dataclass(frozen=True)
class CountsFloor:
    """Floors of the evaluator's layer time for every placement with one plan's replica
    counts (and slots per GPU), dispatched by a position rule.

    Attributes
    ----------
    layer_ids: ``[L]`` int64 layers, in the order of the columns.
    layer_time_us: ``[batches, L]`` float64 floor of each (batch, layer) time,
        microseconds (NaN where the batch has no token).
    hottest_piece_us: ``[batches, L]`` float64 the largest piece (``v`` or ``u``) of each
        cell: what one replica costs its GPU at least.
    policy: the dispatch policy the counts were dispatched by.
    """

    layer_ids: np.ndarray
    layer_time_us: np.ndarray
    hottest_piece_us: np.ndarray
    policy: str

    def metrics(self) -> dict[str, float]:
        """The floors of the evaluator's step figures of the same name (each batch's
        step floor is the sum of its layers' floors)."""
        cells = self.layer_time_us
        has = np.isfinite(cells).any(axis=1)
        step = np.where(has, np.nansum(cells, axis=1), np.nan)
        return {"moe_layer_p99_us": nan_percentile(cells, 99),
                "step_p50_us": nan_percentile(step, 50),
                "step_p99_us": nan_percentile(step, 99),
                "step_mean_us": float(np.nanmean(step)) if has.any() else float("nan")}


def counts_floor(
    placement: Placement,
    routing: RoutingData | ExpertStats,
    topology: Topology,
    model: ModelSpec,
    params: EvalParams,
    *,
    general: TimeBound | None = None,
    draws: dict[tuple[int, ...], np.ndarray] | None = None,
) -> CountsFloor:
    """The per-batch floor of every placement with ``placement``'s replica counts and
    slots per GPU, on the tokens ``evaluate`` replays with the same ``params`` (module
    docstring).  ``general``: :func:`placer.evaluate.time_bound` on the same tokens, laid
    under it (argument 3); ``draws`` as in :func:`placer.evaluate.evaluate`.

    Raises
    ------
    UsageError: ``params.policy`` is not a position rule (its replica loads depend on
        where the replicas sit).
    """
    return counts_floors([placement], routing, topology, model, params, general=general,
                         draws=draws)[0]


def counts_floors(
    placements: list[Placement],
    routing: RoutingData | ExpertStats,
    topology: Topology,
    model: ModelSpec,
    params: EvalParams,
    *,
    general: TimeBound | None = None,
    draws: dict[tuple[int, ...], np.ndarray] | None = None,
) -> list[CountsFloor]:
    """:func:`counts_floor` of each placement; placements of the same layers share each
    layer's tokens, selections and dispatch codes (the same figures, drawn once)."""
    if params.policy not in CODE_POLICIES:
        raise UsageError(
            f"the per-batch floor needs a position rule, not {params.policy!r}",
            where=Param("policy"), hint=f"policies: {', '.join(CODE_POLICIES)}")
    if len({p.layer_ids.tobytes() for p in placements}) > 1:
        return [counts_floors([p], routing, topology, model, params, general=general,
                              draws=draws)[0] for p in placements]
    if not placements:
        return []
    if isinstance(routing, ExpertStats):
        routing = RoutingData(routing)
    stats = routing.stats
    windows = resolve_window_range(params.windows if params.windows is not None
                                   else (None, None), stats.num_windows,
                                   option=Param("held_out"))
    num_gpus = topology.num_gpus
    stats_row = {int(i): r for r, i in enumerate(stats.layer_ids.tolist())}
    layer_ids = np.asarray(placements[0].layer_ids, dtype=np.int64)
    experts_of, batches, _, _ = token_source(
        routing, layer_ids, np.array([stats_row[int(i)] for i in layer_ids]), windows, params,
        num_gpus, draws)
    costs = _PieceCosts.of(CostModel.of(topology, model, params.mode, params.dtype))
    cells = np.full((len(placements), batches.num_batches, layer_ids.size), np.nan)
    hottest = np.full_like(cells, np.nan)
    for row in range(layer_ids.size):
        ids = experts_of(row)
        at = _selections(ids, batches, params.policy, num_gpus)
        empty = np.bincount(batches.batch_of_token[(ids >= 0).any(axis=1)],
                            minlength=batches.num_batches) == 0
        for i, placement in enumerate(placements):
            pieces = _pieces(at, batches.num_batches, placement.replica_counts[row], num_gpus,
                             costs, placement.slots_per_gpu)
            floor = np.maximum(*(_packing_floor(p, num_gpus, placement.slots_per_gpu)
                                 for p in pieces))
            cells[i, :, row] = np.where(empty, np.nan, floor)
            hottest[i, :, row] = np.where(empty, np.nan,
                                          np.maximum(*(p.max(axis=1) for p in pieces)))
    if general is not None:
        cols = [list(general.layer_ids).index(int(i)) for i in layer_ids]
        cells = np.fmax(cells, general.layer_time_us[:, cols][None])
    return [CountsFloor(layer_ids=layer_ids, layer_time_us=np.ascontiguousarray(cells[i]),
                        hottest_piece_us=np.ascontiguousarray(hottest[i]),
                        policy=params.policy) for i in range(len(placements))]


@dataclass(frozen=True)
class _PieceCosts:
    """``weight_us``, ``token_us``: a slot's weight read and per-token time at the fastest
    GPU's rates; ``copy_us``, ``nic_us``: a received copy's dispatch plus combine time
    over every link class / the NIC alone, at the largest such bandwidth (0 in ``normal``
    mode, argument 1); ``place_of_gpu``: ``[G]`` what a NIC copy leaves (the node, or
    the GPU in ``low_latency_rdma``); ``fixed_us``, ``fixed_nic_us``: ``F`` and ``F_nic``
    of argument 1 (0 in ``normal`` mode)."""

    weight_us: float
    token_us: float
    copy_us: float
    nic_us: float
    place_of_gpu: np.ndarray
    fixed_us: float = 0.0
    fixed_nic_us: float = 0.0

    @classmethod
    def of(cls, costs: CostModel) -> _PieceCosts:
        fabric = costs.fabric
        per_class = [costs.finite_injection_over(c) for c in (INTRA_NODE, INTER_NODE)]
        selection = costs.mode in PER_SELECTION_MODES
        copy, nic = (copy_us(costs.bytes_per_copy, bw) if selection else 0.0
                     for bw in (per_class[0] + per_class[1], per_class[1]))
        place = (np.arange(fabric.num_gpus) if costs.mode == "low_latency_rdma"
                 else fabric.node_of_gpu)
        fixed = _fixed_us(costs, per_class) if selection else (0.0, 0.0)
        return cls(weight_us=costs.fastest_weight_us, token_us=costs.fastest_token_us,
                   copy_us=copy, nic_us=nic, place_of_gpu=np.asarray(place, dtype=np.int64),
                   fixed_us=fixed[0], fixed_nic_us=fixed[1])


def _fixed_us(costs: CostModel, per_class: list[np.ndarray]) -> tuple[float, float]:
    """``(F, F_nic)``: the least a GPU that receives a copy (from another node) pays in
    fixed costs over dispatch and combine, phase costs and one latency each."""
    fabric, phase = costs.fabric, costs.phase_us
    ph_intra = np.where(per_class[0] > 0, phase[:, INTRA_NODE], np.inf)
    ph_inter = np.where(per_class[1] > 0, phase[:, INTER_NODE], np.inf)
    any_peer = np.minimum(ph_intra, ph_inter) + nearest_latency(fabric, any_peer=True)
    nic = ph_inter + nearest_latency(fabric, any_peer=False)
    least = [float(v[np.isfinite(v)].min()) if np.isfinite(v).any() else 0.0
             for v in (any_peer, nic)]
    return 2.0 * least[0], 2.0 * least[1]


def _selections(ids: np.ndarray, batches: Batches, policy: str,
                num_gpus: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(batch, source, expert, code)`` of each selection of ``ids`` (``[tokens, k]``
    expert ids of the batches' tokens), its dispatch code under ``policy``."""
    valid = ids >= 0
    tok, kpos = selected_entries(valid)
    experts = ids[valid].astype(np.int64)
    source = batches.source[tok]
    code = dispatch_codes(policy, experts, kpos, source, batches.rank_position[tok],
                          top_k=ids.shape[1],
                          run=batches.batch_of_token[tok] * num_gpus + source)
    return batches.batch_of_token[tok], source, experts, code


def _pieces(at: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], num_batches: int,
            counts: np.ndarray, num_gpus: int, costs: _PieceCosts,
            slots: int) -> tuple[np.ndarray, np.ndarray]:
    """``([B, P], [B, P])`` the least time each replica adds to its GPU in each batch,
    ``v`` and ``u`` (argument 1); ``at``: :func:`_selections` of the batches' tokens,
    ``counts``: ``[E]``, ``slots``: slots per GPU."""
    batch, source, experts, code = at
    first = np.r_[0, np.cumsum(counts)[:-1]]
    piece = first[experts] + code % counts[experts]
    num_pieces = int(counts.sum())
    cell = batch * num_pieces + piece  # (batch, piece)
    load = np.bincount(cell, minlength=num_batches * num_pieces)
    load = load.reshape(num_batches, num_pieces).astype(np.float64)
    by_source = np.bincount(cell * num_gpus + source,
                            minlength=num_batches * num_pieces * num_gpus)
    by_source = by_source.reshape(num_batches, num_pieces, num_gpus)
    places = int(costs.place_of_gpu.max()) + 1
    by_place = np.zeros((num_batches, num_pieces, places))
    for place in range(places):
        by_place[:, :, place] = by_source[:, :, costs.place_of_gpu == place].sum(axis=2)
    run = np.where(load > 0, np.maximum(costs.weight_us, load * costs.token_us), 0.0)
    remote = load - by_source.max(axis=2)
    across = load - by_place.max(axis=2)
    return (run + remote * costs.copy_us + np.where(remote > 0, costs.fixed_us / slots, 0.0),
            run + across * costs.nic_us + np.where(across > 0, costs.fixed_nic_us / slots, 0.0))


def _packing_floor(pieces: np.ndarray, num_gpus: int, slots_per_gpu: int) -> np.ndarray:
    """``[B]`` the least time of the hottest GPU when ``G`` GPUs hold ``S`` of the
    ``[B, P]`` pieces each, a GPU's time at least the sum of its pieces (argument 2)."""
    ordered = -np.sort(-pieces, axis=1)  # largest first
    num_pieces = ordered.shape[1]
    floor = np.maximum(ordered.sum(axis=1) / num_gpus, ordered[:, 0])
    for j in range(1, slots_per_gpu):
        last = j * num_gpus + 1  # the j G + 1 largest pieces
        if last > num_pieces:
            break
        floor = np.maximum(floor, ordered[:, last - j - 1 : last].sum(axis=1))
    if slots_per_gpu > 1:
        smallest = ordered[:, num_pieces - (slots_per_gpu - 1):].sum(axis=1)
        floor = np.maximum(floor, ordered[:, 0] + smallest)
    return floor
