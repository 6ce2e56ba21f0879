"""A proven lower bound on the evaluator's layer time, valid for *every* placement.

:func:`time_bound` takes the same tokens :func:`placer.evaluate.evaluate` would replay
(or sample), the topology, the model and the slots per GPU ``S``, and returns, for each
(batch, layer), a time that no placement with ``S`` slots per GPU can beat under the
evaluator's timing model (:mod:`placer.evaluate.timing`), whatever its replica counts,
wherever its replicas sit and whatever replica each selection is dispatched to.  Since
every (batch, layer) cell is a floor, every percentile, every step sum and every median
over layers of the floors is a floor of the same figure of any placement: the plan
summary states how far a plan is from it.

The argument, per batch and layer (``n[g, e]``: selections of expert ``e`` by tokens whose
source is GPU ``g``; ``M_g``: GPUs of ``g``'s node; ``top_m(v)``: sum of the ``m``
largest entries of ``v``; ``P``: bytes per copy):

1. **Compute.**  Each selected expert runs on at least one slot, and a slot costs
   ``max(w, tokens x t)`` (``w`` weight read, ``t`` per-token GEMM time, at the fastest
   GPU's rates), and splitting tokens over replicas never costs less, so the GPUs'
   compute times sum to at least ``K = sum_e [n_e > 0] max(w, n_e t)``.
2. **Copies a GPU must send.**  GPU ``g`` holds ``S`` slots, so at most ``top_S(n[g])``
   of its selections are served without a copy: in low-latency modes
   ``out_g >= sum_e n[g, e] - top_S(n[g])``.  Its node holds at most ``S x M_g``
   experts, so ``inter_g >= sum_e n[g, e] - top_{S M_g}(n[g])`` selections leave the node
   (every copy does, in ``low_latency_rdma``).  Over all GPUs (nodes) together, each
   expert sits at one place at least and only ``G x S - E`` more (place, expert) pairs
   exist, so at most each expert's busiest place and the heaviest of the remaining
   entries are served where they arise.  Under normal kernels copies are per token: a
   token whose ``k`` experts all sit on ``g`` uses ``k`` of the selections served there,
   so at most ``top_S(n[g]) / k_min`` of ``g``'s tokens need no copy (likewise per node,
   and over all places with the count above).
3. **Communication time of one GPU.**  A phase takes at least the busiest link class's
   volume over its injection bandwidth plus its phase cost, and at least the whole
   volume over the two classes' bandwidths together plus the cheaper phase cost, plus
   the latency of the nearest peer it exchanges with.  The combine phase receives
   exactly what the dispatch sent, so it is bounded the same way with the combine's
   bytes.  This gives each GPU a floor ``a_g`` on dispatch + combine.
4. **Water-filling.**  The layer time is ``max_g (dispatch_g + compute_g + combine_g)``
   with ``compute_g >= 0`` and ``sum_g compute_g >= K``, so it is at least the level
   ``L`` at which ``sum_g max(0, L - a_g) = K`` (and at least ``max_g a_g``):
   ``L = max(max_g a_g, min_j (K + a_(1) + ... + a_(j)) / j)`` over ``a`` sorted upward.
5. **Totals.**  It is also at least the mean over GPUs of the three phases, where the
   inter-node copies are counted per node (a node holds at most ``S x M`` experts, a
   tighter count than the per-GPU one summed).

Under the position rules (``round_robin``, ``vllm_hash``, ``trtllm_block``: replica
``code mod r``, :func:`placer.evaluate.dispatch.dispatch_codes`) the replica rule is counted
too: copies that can stay on their node (under normal kernels, tokens: at most those
selections over ``k_min``), and the weight reads of redundant replicas (every replica
whose residue class has a selection runs), see :mod:`placer.evaluate.round_robin_bound`.

What it leaves out (so a plan's gap to it is an upper bound on what any placement could
gain): per-batch load noise on the hottest GPU, pair-link and receive-side limits, and for
other policies the dispatch rule and the reads of redundant replicas (it holds for every
dispatch there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from placer.errors import Param
from placer.evaluate.balance import nan_percentile
from placer.evaluate.batches import Batches
from placer.evaluate.core import EvalParams, token_source
from placer.evaluate.costs import US_PER_BYTE_GBPS, CostModel, copy_us
from placer.evaluate.dispatch import CODE_POLICIES, dispatch_codes
from placer.evaluate.round_robin_bound import (
    EXACT_REPLICAS,
    Selections,
    dense_codes,
    round_robin_local,
)
from placer.evaluate.timing import INTER_NODE, INTRA_NODE
from placer.evaluate.traffic import PER_SELECTION_MODES, Fabric
from placer.limits import check_allocation
from placer.stats import ExpertStats, RoutingData
from placer.stats.windows import resolve_window_range

if TYPE_CHECKING:
    from placer.model import ModelSpec
    from placer.topology import Topology


@dataclass(frozen=True)
class TimeBound:
    """Floors of the evaluator's layer time for every placement with ``slots_per_gpu``.

    Attributes
    ----------
    layer_ids: ``[L]`` int64 layers, in the order of the columns.
    layer_time_us: ``[batches, L]`` float64 floor of each (batch, layer) time,
        microseconds (NaN where the batch has no token).
    layer_sum_us: ``[L]`` float64 floor of each layer's time summed over the batches
        (tighter than the cells summed: one placement serves every batch).
    slots_per_gpu: slots per GPU the floor holds for.
    source: ``trace`` (per-token replay) or ``sampled``.
    remote_copies: ``[L, 2]`` float64 the fewest copies to another GPU and to another
        node each layer's tokens cost over all batches (argument 2, one placement), in
        the evaluator's units (selections, or deliveries per token under normal kernels).
    tokens: ``[L]`` float64 tokens of each layer over all batches.
    """

    layer_ids: np.ndarray
    layer_time_us: np.ndarray
    layer_sum_us: np.ndarray
    slots_per_gpu: int
    source: str
    remote_copies: np.ndarray
    tokens: np.ndarray

    @property
    def layer_p99_us(self) -> np.ndarray:
        """``[L]`` floor of each layer's p99 over batches."""
        cells = self.layer_time_us
        return np.array([nan_percentile(cells[:, i], 99) for i in range(cells.shape[1])])

    def metrics(self) -> dict[str, float]:
        """The floors of the evaluator's time metrics of the same name."""
        cells = self.layer_time_us
        has = np.isfinite(cells).any(axis=1)
        step = np.where(has, np.nansum(cells, axis=1), np.nan)
        per_layer = self.layer_p99_us
        finite = per_layer[np.isfinite(per_layer)]
        return {
            "moe_layer_p50_us": nan_percentile(cells, 50),
            "moe_layer_p99_us": nan_percentile(cells, 99),
            "layer_p99_us_median": float(np.median(finite)) if finite.size else float("nan"),
            "layer_p99_us_worst": float(finite.max()) if finite.size else float("nan"),
            "step_p50_us": nan_percentile(step, 50),
            "step_p99_us": nan_percentile(step, 99),
            "step_mean_us": (float(np.nansum(self.layer_sum_us)) / int(has.sum())
                             if has.any() else float("nan")),
            **self.copies_per_token(),
        }

    def copies_per_token(self) -> dict[str, float]:
        """Floors of the evaluator's ``remote_copies_per_token_gpu`` and ``_node``: what
        the floor's traffic term counts, to set beside a placement's own figures (where
        the floor is loose)."""
        tokens = float(self.tokens.sum())
        gpu, node = (self.remote_copies.sum(axis=0) / tokens if tokens > 0
                     else (float("nan"), float("nan")))
        return {"remote_copies_per_token_gpu": float(gpu),
                "remote_copies_per_token_node": float(node)}


def time_bound(
    routing: RoutingData | ExpertStats,
    topology: Topology,
    model: ModelSpec,
    params: EvalParams,
    slots_per_gpu: int,
    *,
    draws: dict[tuple[int, ...], np.ndarray] | None = None,
) -> TimeBound:
    """The floor of every placement's layer time on the tokens ``evaluate`` uses with
    the same ``params`` (and the same ``draws``), for ``slots_per_gpu`` slots per GPU.

    Every layer of the routing data is bounded.  Only the mode, dtype, windows and
    batch settings of ``params`` matter: the floor holds for every dispatch policy.
    """
    if isinstance(routing, ExpertStats):
        routing = RoutingData(routing)
    stats = routing.stats
    windows = resolve_window_range(
        params.windows if params.windows is not None else (None, None),
        stats.num_windows, option=Param("held_out"),
    )
    num_gpus = topology.num_gpus
    costs = CostModel.of(topology, model, params.mode, params.dtype)
    layer_ids = np.asarray(stats.layer_ids, dtype=np.int64)
    experts_of, batches, _, source = token_source(
        routing, layer_ids, np.arange(layer_ids.size), windows, params, num_gpus, draws
    )
    cells = np.full((batches.num_batches, layer_ids.size), np.nan)
    sums = np.full(layer_ids.size, np.nan)
    copies = np.zeros((layer_ids.size, 2))
    tokens = np.zeros(layer_ids.size)
    for row in range(layer_ids.size):
        cells[:, row], sums[row], copies[row], tokens[row] = layer_floor(
            experts_of(row), batches, slots_per_gpu, stats.num_experts, costs, params.policy)
    return TimeBound(layer_ids=layer_ids, layer_time_us=cells, layer_sum_us=sums,
                     slots_per_gpu=slots_per_gpu, source=source, remote_copies=copies,
                     tokens=tokens)


def layer_floor(
    ids: np.ndarray, batches: Batches, slots_per_gpu: int, num_experts: int,
    costs: CostModel, policy: str,
) -> tuple[np.ndarray, float, np.ndarray, float]:
    """``([batches], total, [2], tokens)``: the floor of one layer's time for each batch,
    the floor of its time summed over the batches (module docstring), the fewest copies
    to another GPU and to another node over all batches, and the tokens.

    The sum's floor counts copies on all batches together: one placement serves every
    batch, so it cannot follow each batch's own noise as the per-batch floors allow.

    ``ids``: ``[tokens, k]`` expert ids of the tokens of ``batches`` (-1: no expert).
    """
    fabric, mode = costs.fabric, costs.mode
    num_batches, num_gpus = batches.num_batches, fabric.num_gpus
    valid = ids >= 0
    tok, kpos = selected_entries(valid)
    experts = ids[valid]
    cell = batches.batch_of_token * num_gpus + batches.source  # [tokens] (batch, source)
    check_allocation((num_batches, num_gpus, num_experts), f"the time floor's {num_batches:,}"
                     f" x {num_gpus:,} x {num_experts:,} [batches, GPUs, experts] counts",
                     "fewer batches (a larger `tokens_per_gpu`) or fewer GPUs", itemsize=16)
    n = np.bincount(cell[tok] * num_experts + experts,
                    minlength=num_batches * num_gpus * num_experts)
    n = n.reshape(num_batches, num_gpus, num_experts).astype(np.float64)
    at, dense = _selections(policy, experts, kpos, batches, tok, ids.shape[1], num_gpus)
    per_token = valid.sum(axis=1)
    has = per_token > 0
    counted = np.bincount(cell[has], minlength=num_batches * num_gpus)
    fewest = np.full(num_batches * num_gpus, np.iinfo(np.int64).max)
    np.minimum.at(fewest, cell[has], per_token[has])
    k_min = np.where(counted > 0, fewest, 1).reshape(num_batches, num_gpus)
    tokens = counted.reshape(num_batches, num_gpus).astype(np.float64)
    copies = _Copies(slots_per_gpu, num_experts, policy, costs)

    # (2) copies: each GPU's floors, and totals per batch and over all batches
    out, inter = copies.per_gpu(n, tokens, k_min)
    # per batch (the cells' floors) counts few replica counts exactly; all batches together
    # (the mean's floor, the figure the gap is measured on) counts every one it can
    out_total, node_inter, replica_compute = copies.totals(n, tokens, k_min, at, num_batches,
                                                           exact=EXACT_REPLICAS, dense=dense)
    out_all, inter_all, _ = copies.totals(
        n.sum(axis=0, keepdims=True), tokens.sum(axis=0, keepdims=True),
        k_min.min(axis=0, keepdims=True), (np.zeros_like(at[0]), *at[1:]), 1, dense=dense)
    out_total = np.maximum(out_total, out.sum(axis=1))
    rdma = mode == "low_latency_rdma"
    if not rdma:
        node_inter = np.maximum(node_inter, inter.sum(axis=1))
    copies_all = np.array([max(float(out_all[0]), float(out_total.sum())),
                           max(float(inter_all[0]), float(node_inter.sum()))])
    if rdma:  # every copy goes through the NIC, not only those to another node
        node_inter, inter_all = out_total, out_all

    # (1) compute
    load = n.sum(axis=1)  # [B, E]
    total_compute = np.where(
        load > 0, np.maximum(costs.fastest_weight_us, load * costs.fastest_token_us), 0.0
    ).sum(axis=1) + replica_compute

    # (3) per-GPU communication floors and summed floors, dispatch then combine
    per_gpu = np.zeros((num_batches, num_gpus))
    summed = np.zeros(num_batches)
    coupled = 0.0
    for payload in (costs.activation_bytes, costs.combine_bytes):
        phase = _PhaseFloor.of(out, inter, payload, costs)
        per_gpu += phase.per_gpu
        by_batch = phase.summed(out_total, node_inter)
        summed += by_batch
        coupled += max(float(by_batch.sum()), phase.summed_over_batches(out_all[0],
                                                                       inter_all[0]))

    # (4) water-filling, (5) totals
    level = _water_level(per_gpu, total_compute)
    result = np.maximum(level, (total_compute + summed) / num_gpus)
    empty = np.bincount(batches.batch_of_token[has], minlength=num_batches) == 0
    cells = np.where(empty, np.nan, result)
    total = max(float(np.nansum(cells)), (float(total_compute.sum()) + coupled) / num_gpus)
    return cells, total, copies_all, float(tokens.sum())


def selected_entries(valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.nonzero`` of a ``[tokens, k]`` mask, the same arrays, from its flat indices
    (cheaper than the two-dimensional form)."""
    flat = np.flatnonzero(valid)
    tok = flat // valid.shape[1]
    return tok, flat - tok * valid.shape[1]


def _selections(policy: str, experts: np.ndarray, kpos: np.ndarray, batches: Batches,
                tok: np.ndarray, top_k: int, num_gpus: int,
                ) -> tuple[Selections, tuple[np.ndarray, np.ndarray] | None]:
    """``(batch, source, expert, code)`` of each selection, its dispatch code (``code mod
    r`` picks its replica, :func:`placer.evaluate.dispatch.dispatch_codes`), and the
    codes' :func:`dense_codes` (both replica counts share them): only a position rule
    reads them (empty arrays and None under other policies)."""
    if policy not in CODE_POLICIES:
        return (tok[:0],) * 4, None
    position, source = batches.rank_position[tok], batches.source[tok]
    code = dispatch_codes(policy, experts, kpos, source, position, top_k=top_k,
                          run=batches.batch_of_token[tok] * num_gpus + source)
    return ((batches.batch_of_token[tok], source, experts, code),
            _dense_codes(policy, position, code))


def _dense_codes(policy: str, position: np.ndarray,
                 code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`dense_codes` of ``code``; under ``vllm_hash`` (a code is the hash of its
    selection's rank ``position`` alone) from the few distinct positions, without
    sorting every selection's code."""
    if policy != "vllm_hash":
        return dense_codes(code)
    at, where = dense_codes(position)
    at = at.astype(position.dtype, copy=False)
    values, inverse = np.unique(dispatch_codes(policy, at, at, at, at, top_k=1),
                                return_inverse=True)
    return values, inverse.reshape(-1)[where]


@dataclass(frozen=True)
class _Copies:
    """Floors of the copies a layer's selections cost (argument 2 of the module)."""

    slots_per_gpu: int
    num_experts: int
    policy: str
    costs: CostModel

    @property
    def extra(self) -> int:
        return self.slots_per_gpu * self.costs.fabric.num_gpus - self.num_experts

    def per_gpu(self, n: np.ndarray, tokens: np.ndarray,
                k_min: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``([B, G], [B, G])`` copies each GPU must send, and send across nodes."""
        fabric, num_gpus = self.costs.fabric, self.costs.fabric.num_gpus
        own = np.full(num_gpus, self.slots_per_gpu)
        node_slots = self.slots_per_gpu * fabric.node_size[fabric.node_of_gpu]
        if self.costs.mode in PER_SELECTION_MODES:
            out = _uncovered(n, own)
            inter = out if self.costs.mode == "low_latency_rdma" else _uncovered(n, node_slots)
            return out, inter
        return (_uncovered_tokens(n, tokens, k_min, own),
                _uncovered_tokens(n, tokens, k_min, node_slots))

    def totals(self, n: np.ndarray, tokens: np.ndarray, k_min: np.ndarray,
               at: Selections, num_batches: int, exact: int | None = None,
               dense: tuple[np.ndarray, np.ndarray] | None = None,
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``([B], [B], [B])`` copies sent and copies across nodes, over all GPUs, and
        the least compute redundant replicas add (round robin; 0 otherwise).  ``exact``:
        the replica counts round robin's floor counts exactly (None: its default);
        ``dense``: the codes' :func:`dense_codes` when the caller has them."""
        fabric = self.costs.fabric
        by_node = _per_node(n, fabric)
        node_slots = self.slots_per_gpu * fabric.node_size
        if self.costs.mode not in PER_SELECTION_MODES:
            return self._token_totals(n, by_node, tokens, k_min, at, num_batches, exact, dense)
        selections = n.sum(axis=(1, 2))
        out = selections - np.minimum(
            _top_sums(n, np.full(fabric.num_gpus, self.slots_per_gpu)).sum(axis=1),
            _covering(n, self.extra))
        inter = selections - np.minimum(_top_sums(by_node, node_slots).sum(axis=1),
                                        _covering(by_node, self.extra))
        compute = np.zeros(num_batches)
        if self.policy in CODE_POLICIES:
            local, compute = self._round_robin_home(at, num_batches, exact, dense)
            if fabric.num_nodes == 1:
                out = np.maximum(out, selections - local)
            else:
                inter = np.maximum(inter, selections - local)
        return np.maximum(out, 0.0), np.maximum(inter, 0.0), compute

    def _round_robin_home(self, at: Selections, num_batches: int, exact: int | None,
                          dense: tuple[np.ndarray, np.ndarray] | None,
                          ) -> tuple[np.ndarray, np.ndarray]:
        """:func:`round_robin_local` where the copies that matter most arise: at each
        selection's own GPU on one node, at its node on several (the inter-node copies)."""
        batch, source, experts, code = at
        fabric = self.costs.fabric
        one_node = fabric.num_nodes == 1
        return round_robin_local(
            (batch, source if one_node else fabric.node_of_gpu[source], experts, code),
            num_batches, fabric.num_gpus if one_node else fabric.num_nodes, self.num_experts,
            self.extra, self.costs.fastest_weight_us, self.costs.fastest_token_us, exact, dense)

    def _token_totals(self, n: np.ndarray, by_node: np.ndarray, tokens: np.ndarray,
                      k_min: np.ndarray, at: Selections, num_batches: int, exact: int | None,
                      dense: tuple[np.ndarray, np.ndarray] | None = None,
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`totals` under ``normal`` kernels, where copies are per token: a token
        needs no copy to another GPU (node) only when every one of its at least
        ``k_min`` selections is served there, so the tokens that stay are at most the
        selections a place can serve where they arise over ``k_min``: per place, its
        ``S`` (``S x M``) busiest experts; over all places together, each expert where
        it is selected most and the ``extra`` replicas where they add most
        (:func:`_covering`); under a position rule, what round robin can serve where it
        arises (:func:`round_robin_local`)."""
        fabric = self.costs.fabric
        node_slots = self.slots_per_gpu * fabric.node_size
        token_sum = tokens.sum(axis=1)
        fewest = np.maximum(k_min.min(axis=1), 1).astype(np.float64)  # [B]

        def left(served: np.ndarray) -> np.ndarray:  # tokens that need a copy
            return np.maximum(token_sum - np.floor(served / fewest), 0.0)

        out = np.maximum(_uncovered_tokens(n, tokens, k_min, np.full(
            fabric.num_gpus, self.slots_per_gpu)).sum(axis=1), left(_covering(n, self.extra)))
        inter = np.maximum(_uncovered_tokens(
            by_node, _per_node(tokens[:, :, None], fabric)[:, :, 0], _node_min(k_min, fabric),
            node_slots).sum(axis=1), left(_covering(by_node, self.extra)))
        compute = np.zeros(num_batches)
        if self.policy in CODE_POLICIES:  # every count exactly would cost too much here
            local, compute = self._round_robin_home(
                at, num_batches, EXACT_REPLICAS if exact is None else exact, dense)
            if fabric.num_nodes == 1:
                out = np.maximum(out, left(local))
            else:
                inter = np.maximum(inter, left(local))
        return out, inter, compute


def _per_node(values: np.ndarray, fabric: Fabric) -> np.ndarray:
    """``[B, N, ...]`` sums of ``[B, G, ...]`` over each node's GPUs."""
    out = np.zeros((values.shape[0], fabric.num_nodes, *values.shape[2:]))
    for node in range(fabric.num_nodes):
        out[:, node] = values[:, fabric.node_of_gpu == node].sum(axis=1)
    return out


def _node_min(values: np.ndarray, fabric: Fabric) -> np.ndarray:
    """``[B, N]`` minimum of ``[B, G]`` over each node's GPUs."""
    out = np.full((values.shape[0], fabric.num_nodes), np.iinfo(np.int64).max)
    for node in range(fabric.num_nodes):
        out[:, node] = values[:, fabric.node_of_gpu == node].min(axis=1)
    return out


def _top_sums(n: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``[B, X]``: sum of the ``counts[x]`` largest entries of ``n[b, x, :]``."""
    ordered = -np.sort(-n, axis=2)
    cumulative = np.concatenate([np.zeros((*n.shape[:2], 1)), ordered.cumsum(axis=2)], axis=2)
    take = np.minimum(counts, n.shape[2]).astype(np.int64)
    return np.take_along_axis(cumulative, np.broadcast_to(take[None, :, None],
                                                          (n.shape[0], n.shape[1], 1)),
                              axis=2)[:, :, 0]


def _uncovered(n: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """``[B, X]`` selections of ``n[b, x]`` that ``slots[x]`` experts cannot all serve."""
    return np.maximum(n.sum(axis=2) - _top_sums(n, slots), 0.0)


def _covering(n: np.ndarray, extra: int) -> np.ndarray:
    """``[B]`` most selections ``n[b, x, e]`` that placements with ``extra`` slots beyond
    one per expert can serve where they arise (``x``: a GPU or a node).

    Every expert sits at one place at least, and only ``extra`` more (place, expert)
    pairs exist: at best each expert sits where it is selected most, and the ``extra``
    pairs take the heaviest of the remaining entries (capacities ignored: an upper
    bound).
    """
    ordered = np.sort(n, axis=1)  # [B, X, E], each expert's places upward
    best = ordered[:, -1, :].sum(axis=1)
    if extra <= 0 or n.shape[1] < 2:
        return best
    rest = ordered[:, :-1, :].reshape(n.shape[0], -1)
    take = min(extra, rest.shape[1])
    top = -np.partition(-rest, take - 1, axis=1)[:, :take]
    return best + top.sum(axis=1)


def _uncovered_tokens(n: np.ndarray, tokens: np.ndarray, k_min: np.ndarray,
                      slots: np.ndarray) -> np.ndarray:
    """``[B, X]`` tokens that need a copy: a token served entirely by a set of ``slots``
    experts uses at least ``k_min`` of the set's ``top_slots`` selections."""
    covered = np.floor(_top_sums(n, slots) / np.maximum(k_min, 1))
    return np.maximum(tokens - covered, 0.0)


@dataclass(frozen=True)
class _PhaseFloor:
    """Floors of one phase (dispatch or combine) from the copies (argument 3).

    Attributes
    ----------
    per_gpu: ``[B, G]`` each GPU's floor.
    fixed_inter, fixed_any: ``[B]`` phase costs and latencies summed over GPUs that
        surely send across nodes / send at all.
    us_inter, us_any: microseconds per copy at the fastest NIC / the fastest pair of
        link classes together.
    """

    per_gpu: np.ndarray
    fixed_inter: np.ndarray
    fixed_any: np.ndarray
    us_inter: float
    us_any: float

    @classmethod
    def of(cls, out: np.ndarray, inter: np.ndarray, payload: float,
           costs: CostModel) -> _PhaseFloor:
        fabric = costs.fabric
        # the link classes each GPU's copies can take (no NIC traffic on one node, no
        # NVLink traffic when every copy goes through the NICs)
        has_intra, has_inter = costs.peers_over(INTRA_NODE), costs.peers_over(INTER_NODE)
        inj_inter = costs.injection_over(INTER_NODE)
        phase = costs.phase_us
        ph_intra = np.where(has_intra, phase[:, INTRA_NODE], np.inf)
        ph_inter = np.where(has_inter, phase[:, INTER_NODE], np.inf)
        both = costs.finite_injection_over(INTRA_NODE) + costs.finite_injection_over(INTER_NODE)
        cheaper = np.minimum(ph_intra, ph_inter)
        cheaper = np.where(np.isfinite(cheaper), cheaper, 0.0)
        ph_inter = np.where(np.isfinite(ph_inter), ph_inter, 0.0)
        sends_inter = inter > 0
        sends = out > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            inter_us = np.where(sends_inter, inter * payload / inj_inter * US_PER_BYTE_GBPS
                                + ph_inter, 0.0)
            all_us = np.where(sends, out * payload / both * US_PER_BYTE_GBPS + cheaper, 0.0)
        latency = np.maximum(np.where(sends, nearest_latency(fabric, any_peer=True), 0.0),
                             np.where(sends_inter, nearest_latency(fabric, any_peer=False), 0.0))
        return cls(
            per_gpu=np.maximum(inter_us, all_us) + latency,
            fixed_inter=(np.where(sends_inter, ph_inter, 0.0) + latency).sum(axis=1),
            fixed_any=(np.where(sends, cheaper, 0.0) + latency).sum(axis=1),
            us_inter=copy_us(payload, inj_inter),
            us_any=copy_us(payload, both),
        )

    def summed(self, out_total: np.ndarray, node_inter: np.ndarray) -> np.ndarray:
        """``[B]`` floor of the phase's time summed over GPUs, per batch: the per-GPU
        floors summed, or the totals of copies (tighter than the per-GPU ones summed)."""
        return np.maximum(self.per_gpu.sum(axis=1), np.maximum(
            node_inter * self.us_inter + self.fixed_inter,
            out_total * self.us_any + self.fixed_any))

    def summed_over_batches(self, out_all: float, inter_all: float) -> float:
        """Floor of the phase's time summed over GPUs and batches from the copies of
        all batches together (one placement for every batch)."""
        return max(inter_all * self.us_inter + float(self.fixed_inter.sum()),
                   out_all * self.us_any + float(self.fixed_any.sum()))


def nearest_latency(fabric: Fabric, any_peer: bool) -> np.ndarray:
    """``[G]`` latency to the nearest other GPU (``any_peer``) or other-node GPU."""
    peers = ~np.eye(fabric.num_gpus, dtype=bool)
    if not any_peer:
        peers &= fabric.link_class == INTER_NODE
    lat = np.where(peers, fabric.latency_us, np.inf).min(axis=1)
    return np.where(np.isfinite(lat), lat, 0.0)


def _water_level(floors: np.ndarray, work: np.ndarray) -> np.ndarray:
    """``[B]`` the smallest ``L >= max_g floors[b, g]`` with
    ``sum_g max(0, L - floors[b, g]) >= work[b]``."""
    ordered = np.sort(floors, axis=1)
    count = np.arange(1, floors.shape[1] + 1)
    level = ((work[:, None] + ordered.cumsum(axis=1)) / count[None]).min(axis=1)
    return np.maximum(level, ordered[:, -1])
