"""The simulation behind :func:`placer.evaluate.evaluate`: every (batch, layer) replayed
through the dispatch policy, the communication mode and the timing model.

Tokens arrive sorted by (batch, source rank); batches are processed in blocks small
enough for ``[batches, G, G]`` copy matrices.  Per block and layer: slots chosen
(:mod:`placer.evaluate.dispatch`), copies counted (:mod:`placer.evaluate.traffic`),
dispatch / compute / combine times (:mod:`placer.evaluate.timing`), and the figures the
engines report (:mod:`placer.evaluate.balance`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from placer.evaluate.balance import (
    nan_percentile,
    ratio,
    sglang_balancedness,
    trtllm_imbalance,
    vllm_balancedness,
)
from placer.evaluate.batches import Batches
from placer.evaluate.costs import CostModel
from placer.evaluate.dispatch import (
    STATIC_POLICIES,
    OrderBias,
    choose_slots,
    random_generator,
    round_robin_order_bias,
    static_dispatch_table,
)
from placer.evaluate.timing import comm_time_us, compute_time_us
from placer.evaluate.traffic import Fabric, LayerTraffic, Segments, layer_traffic
from placer.placement import Placement, hot_shard_ratio

if TYPE_CHECKING:
    from placer.evaluate.params import EvalParams
    from placer.model import ModelSpec

#: Reads the ``[tokens, k]`` experts of one layer row (in the placement's layer order).
ExpertsOf = Callable[[int], np.ndarray]

#: Batch blocks are cut so ``[batches, G, G]`` copy matrices and ``[tokens, G]`` selection
#: matrices stay below these many cells (memory; a single larger batch is kept whole).
_MAX_COPY_CELLS = 1 << 22
_MAX_TOKEN_CELLS = 1 << 23


@dataclass(frozen=True)
class Block:
    """A run of whole batches processed together (tokens ``lo:hi``)."""

    first_batch: int
    num_batches: int
    lo: int
    hi: int
    segments: Segments


def blocks(batches: Batches, num_gpus: int) -> list[Block]:
    """Cut the batches into blocks small enough for ``[batches, G, G]`` and ``[tokens, G]``."""
    per_batch = batches.tokens_per_batch
    max_batches = max(1, _MAX_COPY_CELLS // (num_gpus * num_gpus))
    max_tokens = max(1, _MAX_TOKEN_CELLS // num_gpus)
    starts = np.r_[0, np.cumsum(per_batch)]
    blocks = []
    first = 0
    while first < batches.num_batches:
        last = first + 1
        while (last < batches.num_batches and last - first < max_batches
               and starts[last + 1] - starts[first] <= max_tokens):
            last += 1
        lo, hi = int(starts[first]), int(starts[last])
        segments = Segments.of(
            batches.batch_of_token[lo:hi] - first, batches.source[lo:hi], last - first
        )
        blocks.append(Block(first, last - first, lo, hi, segments))
        first = last
    return blocks


@dataclass(frozen=True)
class Simulation:
    metrics: dict[str, float]
    per_layer: dict[str, np.ndarray]
    batch_hot_shard: np.ndarray
    layer_time_us: np.ndarray
    gpu_load: np.ndarray
    order_bias: OrderBias | None = None


def simulate(
    placement: Placement,
    batches: Batches,
    experts_of: ExpertsOf,
    costs: CostModel,
    model: ModelSpec,
    params: EvalParams,
    table: np.ndarray | None = None,
) -> Simulation:
    """Replay every (batch, layer): loads, copies, times (tokens sorted by batch).

    ``costs``: the cost model of ``params``' mode and the evaluated dtype; ``table``: the
    ``[layers, G, E]`` static dispatch table of the ``sglang`` and ``local_first``
    policies (drawn here when None).
    """
    if params.policy in STATIC_POLICIES and table is None:
        table = static_dispatch_table(placement, params.seed, policy=params.policy,
                                      node_of_gpu=costs.fabric.node_of_gpu)
    replay = _Replay(
        batches=batches, fabric=costs.fabric, costs=costs,
        policy=params.policy, mode=params.mode, table=table,
        logical_to_physical=placement.logical_to_physical,
        replica_counts=placement.replica_counts,
        physical_to_logical=placement.physical_to_logical,
        num_experts=placement.num_experts, slots_per_gpu=placement.slots_per_gpu,
    )
    tally = _Tally.empty(batches.num_batches, placement)
    block_list = blocks(batches, placement.num_gpus)
    for row in range(placement.num_layers):
        ids_all = experts_of(row)
        rng = random_generator(params.seed, int(placement.layer_ids[row]))
        for blk in block_list:
            # each step's arrays live until the next block's replace them (the heap keeps
            # its pages: freeing them all at once costs a page fault per page each block)
            choice = _choose(replay, row, blk, ids_all[blk.lo : blk.hi], rng)
            if replay.policy == "round_robin":
                tally.count_positions(row, choice.expert, choice.kpos, choice.top_k,
                                      replay.num_experts)
            measured = _measure(replay, row, blk, choice)
            _record(tally, row, blk, choice.tokens_per_batch, measured, replay.costs)

    batch_hot = ratio(tally.batch_max, tally.batch_mean)
    per_layer = _per_layer_figures(tally, batch_hot, placement.layer_ids, replay.costs)
    metrics = _metrics(tally, batch_hot, per_layer, model, replay.costs)
    order_bias = None
    if tally.kpos_counts is not None:
        order_bias = round_robin_order_bias(tally.kpos_counts, tally.slot_total,
                                            placement.physical_to_logical,
                                            placement.num_gpus, placement.layer_ids)
    return Simulation(metrics, per_layer, batch_hot, tally.layer_time, tally.gpu_load,
                      order_bias)


@dataclass(frozen=True)
class _Replay:
    """What every (layer, block) step of the replay reads and never changes.

    ``logical_to_physical``, ``replica_counts``, ``physical_to_logical``: the placement's
    arrays, one row per evaluated layer; ``table``: the static dispatch table or None.
    """

    batches: Batches
    fabric: Fabric
    costs: CostModel
    policy: str
    mode: str
    table: np.ndarray | None
    logical_to_physical: np.ndarray
    replica_counts: np.ndarray
    physical_to_logical: np.ndarray
    num_experts: int
    slots_per_gpu: int

    @property
    def num_slots(self) -> int:
        return int(self.physical_to_logical.shape[1])


@dataclass
class _Tally:
    """The replay's figures, filled in place block by block.

    ``[batches, layers]`` float64 (NaN where the batch has no token in the layer):
    ``batch_max`` / ``batch_mean`` GPU load, ``split_max`` / ``split_mean`` the same with
    each expert's count split evenly over its replicas (TensorRT-LLM's report), and the
    max over GPUs of ``layer_time`` (dispatch + compute + combine), ``a2a_time``
    (dispatch + combine), ``dispatch_time``, ``combine_time``, ``compute_time``,
    microseconds.  ``gpu_load``: ``[layers, G]`` tokens each GPU processed;
    ``slot_total``: ``[layers, P]`` selections each slot served; ``[layers]`` totals:
    ``tokens``, ``remote_gpu`` / ``remote_node`` deliveries, ``copies_intra`` /
    ``copies_inter``.  ``kpos_counts``: ``[layers, E, top_k]`` selections per (expert, k
    position), round robin only (to tell when the order matters), else None.
    """

    batch_max: np.ndarray
    batch_mean: np.ndarray
    split_max: np.ndarray
    split_mean: np.ndarray
    layer_time: np.ndarray
    a2a_time: np.ndarray
    dispatch_time: np.ndarray
    combine_time: np.ndarray
    compute_time: np.ndarray
    gpu_load: np.ndarray
    slot_total: np.ndarray
    tokens: np.ndarray
    remote_gpu: np.ndarray
    remote_node: np.ndarray
    copies_intra: np.ndarray
    copies_inter: np.ndarray
    kpos_counts: np.ndarray | None = None

    @classmethod
    def empty(cls, num_batches: int, placement: Placement) -> _Tally:
        shape = (num_batches, placement.num_layers)
        num_layers = placement.num_layers

        def cells() -> np.ndarray:
            return np.full(shape, np.nan)

        return cls(
            batch_max=cells(), batch_mean=cells(), split_max=cells(), split_mean=cells(),
            layer_time=cells(), a2a_time=cells(), dispatch_time=cells(),
            combine_time=cells(), compute_time=cells(),
            gpu_load=np.zeros((num_layers, placement.num_gpus)),
            slot_total=np.zeros((num_layers, placement.num_physical)),
            tokens=np.zeros(num_layers), remote_gpu=np.zeros(num_layers),
            remote_node=np.zeros(num_layers), copies_intra=np.zeros(num_layers),
            copies_inter=np.zeros(num_layers),
        )

    def count_positions(self, row: int, experts: np.ndarray, kpos: np.ndarray, top_k: int,
                        num_experts: int) -> None:
        """Add the selections per (expert, k position) of one block of layer ``row``."""
        if self.kpos_counts is None:
            self.kpos_counts = np.zeros((self.tokens.size, num_experts, top_k), dtype=np.int64)
        self.kpos_counts[row] += np.bincount(
            experts * top_k + kpos, minlength=num_experts * top_k
        ).reshape(num_experts, top_k)


@dataclass(frozen=True)
class _PhaseTimes:
    """``[batches, G]`` float64 microseconds of each phase of one layer on one block."""

    dispatch: np.ndarray
    compute: np.ndarray
    combine: np.ndarray


@dataclass(frozen=True)
class _Choice:
    """The selections of one layer on one block and the slots dispatch chose.

    Attributes
    ----------
    token, kpos, expert, slot: ``[selections]`` int64 token (index in the block), k
        position, expert and chosen slot of each selection.
    batch: ``[selections]`` int64 batch of each selection, relative to the block.
    tokens_per_batch: ``[batches]`` int64 tokens with at least one expert in each batch.
    num_tokens, top_k: shape of the block's ``[tokens, k]`` expert ids.
    """

    token: np.ndarray
    kpos: np.ndarray
    expert: np.ndarray
    slot: np.ndarray
    batch: np.ndarray
    tokens_per_batch: np.ndarray
    num_tokens: int
    top_k: int


def _choose(replay: _Replay, row: int, blk: Block, ids: np.ndarray,
            rng: np.random.Generator) -> _Choice:
    """Dispatch layer ``row`` on one block (``ids``: the block's ``[tokens, k]`` experts)."""
    batches = replay.batches
    num_tok, top_k = ids.shape
    batch = batches.batch_of_token[blk.lo : blk.hi] - blk.first_batch
    source = batches.source[blk.lo : blk.hi]
    valid = ids >= 0
    tok, kpos, experts = _selections(ids, valid)
    slots = choose_slots(
        replay.policy, experts, kpos, source[tok],
        batches.rank_position[blk.lo : blk.hi][tok],
        top_k=top_k, logical_to_physical=replay.logical_to_physical[row],
        replica_counts=replay.replica_counts[row],
        static_table=None if replay.table is None else replay.table[row], rng=rng,
        run=batch[tok] * replay.fabric.num_gpus + source[tok],
    )
    return _Choice(
        token=tok, kpos=kpos, expert=experts, slot=slots, batch=batch[tok],
        tokens_per_batch=np.bincount(batch[valid.any(axis=1)], minlength=blk.num_batches),
        num_tokens=num_tok, top_k=top_k,
    )


@dataclass(frozen=True)
class _Measured:
    """What one layer costs on one block: ``traffic`` (loads and copies), ``slot_load``
    ``[batches, P]`` selections per slot, ``split_load`` ``[batches, G]`` GPU loads with
    each expert's count split evenly over its replicas, and the phase ``times``."""

    traffic: LayerTraffic
    slot_load: np.ndarray
    split_load: np.ndarray
    times: _PhaseTimes


def _measure(replay: _Replay, row: int, blk: Block, choice: _Choice) -> _Measured:
    """Loads, copies and phase times of layer ``row`` on one block, as dispatched."""
    slot_load, split_bg = _slot_loads(replay, row, blk.num_batches, choice.batch, choice.slot,
                                      choice.expert)
    traffic = layer_traffic(choice.token, choice.kpos, choice.slot // replay.slots_per_gpu,
                            choice.num_tokens, choice.top_k, blk.segments, replay.fabric,
                            replay.mode)
    costs = replay.costs
    times = _PhaseTimes(
        dispatch=comm_time_us(traffic.copies, costs.activation_bytes, replay.fabric),
        compute=compute_time_us(slot_load, replay.slots_per_gpu, costs.weight_us,
                                costs.token_us),
        combine=comm_time_us(traffic.copies.transpose(0, 2, 1), costs.combine_bytes,
                             replay.fabric),
    )
    return _Measured(traffic, slot_load, split_bg, times)


def _selections(ids: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                              np.ndarray]:
    """``(token, k position, expert)`` of each selection of ``[tokens, k]`` ``ids``."""
    num_tok, top_k = ids.shape
    if valid.all():
        return (np.repeat(np.arange(num_tok), top_k), np.tile(np.arange(top_k), num_tok),
                ids.ravel())
    tok, kpos = np.nonzero(valid)
    return tok, kpos, ids[valid]


def _slot_loads(replay: _Replay, row: int, nb: int, batch: np.ndarray, slots: np.ndarray,
                experts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``([nb, P], [nb, G])``: selections each slot served per batch, and each GPU's load
    with every expert's count split evenly over its replicas (TensorRT-LLM's report).

    ``batch``, ``slots``, ``experts``: ``[selections]`` batch (in the block), chosen slot
    and expert of each selection.
    """
    num_slots, num_experts = replay.num_slots, replay.num_experts
    p2l, counts = replay.physical_to_logical[row], replay.replica_counts[row]
    slot_load = np.bincount(batch * num_slots + slots, minlength=nb * num_slots)
    slot_load = slot_load.reshape(nb, num_slots)
    expert_load = np.bincount(batch * num_experts + experts,
                              minlength=nb * num_experts).reshape(nb, num_experts)
    share = expert_load[:, p2l] / counts[p2l]  # [nb, P]
    split_bg = share.reshape(nb, replay.fabric.num_gpus, replay.slots_per_gpu).sum(axis=2)
    return slot_load, split_bg


def _record(tally: _Tally, row: int, blk: Block, tok_per_batch: np.ndarray,
            measured: _Measured, costs: CostModel) -> None:
    """Write one (layer, block)'s figures into ``tally`` (NaN for batches without tokens)."""
    traffic, slot_load, split_bg, times = (measured.traffic, measured.slot_load,
                                           measured.split_load, measured.times)
    load_bg = traffic.gpu_load.astype(np.float64)
    empty = tok_per_batch == 0
    sl = slice(blk.first_batch, blk.first_batch + blk.num_batches)

    def put(target: np.ndarray, values: np.ndarray) -> None:
        target[sl, row] = np.where(empty, np.nan, values)

    put(tally.batch_max, load_bg.max(axis=1))
    put(tally.batch_mean, load_bg.mean(axis=1))
    put(tally.split_max, split_bg.max(axis=1))
    put(tally.split_mean, split_bg.mean(axis=1))
    put(tally.layer_time, (times.dispatch + times.compute + times.combine).max(axis=1))
    put(tally.a2a_time, (times.dispatch + times.combine).max(axis=1))
    put(tally.dispatch_time, times.dispatch.max(axis=1))
    put(tally.combine_time, times.combine.max(axis=1))
    put(tally.compute_time, times.compute.max(axis=1))
    tally.gpu_load[row] += load_bg.sum(axis=0)
    tally.slot_total[row] += slot_load.sum(axis=0)
    tally.tokens[row] += tok_per_batch.sum()
    tally.remote_gpu[row] += traffic.remote_gpu.sum()
    tally.remote_node[row] += traffic.remote_node.sum()
    summed = traffic.copies.sum(axis=0)
    tally.copies_intra[row] += summed[costs.intra].sum()
    tally.copies_inter[row] += summed[costs.inter].sum()


def _per_layer_figures(tally: _Tally, batch_hot: np.ndarray, layer_ids: np.ndarray,
                       costs: CostModel) -> dict[str, np.ndarray]:
    """``[layers]`` figures of :attr:`Evaluation.per_layer` the replay gives."""
    per_token = np.maximum(tally.tokens, 1)
    bytes_per_copy = costs.bytes_per_copy
    copies_intra, copies_inter = tally.copies_intra, tally.copies_inter
    return {
        "layer_id": layer_ids.astype(np.float64),
        "tokens": tally.tokens,
        "gpu_load_max": tally.gpu_load.max(axis=1),
        "gpu_load_mean": tally.gpu_load.mean(axis=1),
        "hot_shard_ratio": hot_shard_ratio(tally.gpu_load),
        "batch_hot_shard_p50": _column_percentile(batch_hot, 50),
        "batch_hot_shard_p99": _column_percentile(batch_hot, 99),
        "remote_copies_gpu": tally.remote_gpu / per_token,
        "remote_copies_node": tally.remote_node / per_token,
        "copies_intra": copies_intra / per_token,
        "copies_inter": copies_inter / per_token,
        "bytes_intra": copies_intra * bytes_per_copy / per_token,
        "bytes_inter": copies_inter * bytes_per_copy / per_token,
        "dispatch_us": _column_mean(tally.dispatch_time),
        "compute_us": _column_mean(tally.compute_time),
        "combine_us": _column_mean(tally.combine_time),
        "all_to_all_us": _column_mean(tally.a2a_time),
        "layer_time_p50_us": _column_percentile(tally.layer_time, 50),
        "layer_time_p99_us": _column_percentile(tally.layer_time, 99),
        # NaN where a batch has no token
        "trtllm_imbalance": _column_mean(ratio(tally.split_max, tally.split_mean) - 1.0),
    }


def _metrics(tally: _Tally, batch_hot: np.ndarray, per_layer: dict[str, np.ndarray],
             model: ModelSpec, costs: CostModel) -> dict[str, Any]:
    """The flat figures of the replay (keys of :data:`placer.evaluate.core.METRIC_KEYS`)."""
    layer_ratio = per_layer["hot_shard_ratio"]
    has_layers = tally.tokens.size > 0
    total_tokens = max(float(tally.tokens.sum()), 1.0)
    bytes_per_copy = costs.bytes_per_copy
    layer_time = tally.layer_time
    step = np.where(np.isfinite(layer_time).any(axis=1), np.nansum(layer_time, axis=1), np.nan)
    p50 = nan_percentile(layer_time, 50)
    p99 = nan_percentile(layer_time, 99)
    layer_p50 = per_layer["layer_time_p50_us"]
    layer_p99 = per_layer["layer_time_p99_us"]
    step_p50 = nan_percentile(step, 50)
    step_p99 = nan_percentile(step, 99)
    copies_intra, copies_inter = tally.copies_intra, tally.copies_inter
    return {
        "hot_shard_ratio_median": float(np.median(layer_ratio)) if has_layers else np.nan,
        "hot_shard_ratio_worst": float(np.max(layer_ratio)) if has_layers else np.nan,
        "batch_hot_shard_p50": nan_percentile(batch_hot, 50),
        "batch_hot_shard_p99": nan_percentile(batch_hot, 99),
        "vllm_balancedness": vllm_balancedness(tally.batch_max, tally.batch_mean),
        "sglang_balancedness": sglang_balancedness(
            tally.batch_max, tally.batch_mean,
            dense_layers=max(model.num_hidden_layers - model.num_moe_layers, 0),
        ),
        "trtllm_imbalance": trtllm_imbalance(tally.split_max, tally.split_mean),
        "remote_copies_per_token_gpu": tally.remote_gpu.sum() / total_tokens,
        "remote_copies_per_token_node": tally.remote_node.sum() / total_tokens,
        "copies_per_token_intra": copies_intra.sum() / total_tokens,
        "copies_per_token_inter": copies_inter.sum() / total_tokens,
        "bytes_per_token_intra": copies_intra.sum() * bytes_per_copy / total_tokens,
        "bytes_per_token_inter": copies_inter.sum() * bytes_per_copy / total_tokens,
        "all_to_all_us": _finite_mean(tally.a2a_time),
        "compute_us": _finite_mean(tally.compute_time),
        "moe_layer_p50_us": p50,
        "moe_layer_p99_us": p99,
        "p99_over_p50": p99 / p50 if p50 > 0 else np.nan,
        "layer_p50_us_median": _finite_median(layer_p50),
        "layer_p99_us_median": _finite_median(layer_p99),
        "layer_p99_us_worst": _finite_max(layer_p99),
        "layer_p99_over_p50_median": _finite_median(ratio(layer_p99, layer_p50)),
        "step_p50_us": step_p50,
        "step_p99_us": step_p99,
        "step_mean_us": _finite_mean(step),
        "step_p99_over_p50": step_p99 / step_p50 if step_p50 > 0 else np.nan,
    }


def _column_percentile(values: np.ndarray, q: float) -> np.ndarray:
    """``[columns]`` percentile ``q`` of each column of ``values``, NaN ignored."""
    return np.array([nan_percentile(values[:, i], q) for i in range(values.shape[1])])


def _column_mean(values: np.ndarray) -> np.ndarray:
    """``[columns]`` mean of each column's finite entries (0 where there is none)."""
    finite = np.isfinite(values)
    total = np.where(finite, values, 0.0).sum(axis=0)
    return total / np.maximum(finite.sum(axis=0), 1)


def _finite_mean(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else float("nan")


def _finite_median(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if finite.size else float("nan")


def _finite_max(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.max()) if finite.size else float("nan")
