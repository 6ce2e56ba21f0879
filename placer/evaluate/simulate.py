"""The simulation behind :func:`placer.evaluate.evaluate`: every (batch, layer) replayed
through the dispatch policy, the communication mode and the timing model.

Tokens arrive sorted by (batch, source rank); batches are processed in blocks small
enough for ``[batches, G, G]`` copy matrices.  Per block and layer: slots chosen
(:mod:`placer.evaluate.dispatch`), copies counted (:mod:`placer.evaluate.traffic`),
dispatch / compute / combine times (:mod:`placer.evaluate.timing`), and the figures the
engines report (:mod:`placer.evaluate.metrics`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from placer import constants
from placer.evaluate.batches import Batches
from placer.evaluate.dispatch import (
    STATIC_POLICIES,
    OrderBias,
    choose_slots,
    random_generator,
    round_robin_order_bias,
    static_dispatch_table,
)
from placer.evaluate.metrics import (
    nan_percentile,
    ratio,
    sglang_balancedness,
    trtllm_imbalance,
    vllm_balancedness,
)
from placer.evaluate.timing import INTER_NODE, INTRA_NODE, comm_time_us, compute_time_us
from placer.evaluate.traffic import Fabric, Segments, layer_traffic
from placer.placement import Placement, hot_shard_ratio

if TYPE_CHECKING:
    from placer.evaluate.core import EvalParams
    from placer.models import ModelSpec
    from placer.topology import Topology

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
    fabric: Fabric,
    topology: Topology,
    model: ModelSpec,
    dtype: str,
    params: EvalParams,
    table: np.ndarray | None = None,
) -> Simulation:
    """Replay every (batch, layer): loads, copies, times (tokens sorted by batch).

    ``table`` is the ``[layers, G, E]`` static dispatch table of the ``sglang`` and
    ``local_first`` policies (:func:`_static_table`).
    """
    num_layers = placement.num_layers
    num_gpus = placement.num_gpus
    num_slots = placement.num_physical
    num_experts = placement.num_experts
    slots_per_gpu = placement.slots_per_gpu
    num_batches = batches.num_batches
    l2p = placement.logical_to_physical
    counts = placement.replica_counts
    p2l = placement.physical_to_logical
    if params.policy in STATIC_POLICIES and table is None:
        table = static_dispatch_table(placement, params.seed, policy=params.policy,
                                      node_of_gpu=np.asarray(topology.node_of_gpu))
    # round robin: selections per (expert, k position), to tell when the order matters
    watch_order = params.policy == "round_robin"
    kpos_counts: np.ndarray | None = None
    slot_total = np.zeros((num_layers, num_slots))

    activation_bytes = float(model.activation_bytes(dtype))
    combine_bytes = float(model.hidden_size * constants.COMBINE_BYTES_PER_VALUE)
    expert_bytes = float(model.expert_bytes(dtype))
    flops_per_token = float(
        constants.EXPERT_FFN_FLOPS_FACTOR * model.hidden_size * model.moe_intermediate_size
    )
    hbm = np.asarray(topology.hbm_gbps, dtype=np.float64) * topology.hbm_efficiency
    tflops = topology.tflops(dtype) * topology.flops_efficiency
    intra = (fabric.link_class == INTRA_NODE)
    inter = (fabric.link_class == INTER_NODE)

    shape = (num_batches, num_layers)
    batch_max = np.full(shape, np.nan)
    batch_mean = np.full(shape, np.nan)
    split_max = np.full(shape, np.nan)  # each expert's count split evenly over replicas
    split_mean = np.full(shape, np.nan)
    layer_time = np.full(shape, np.nan)
    a2a_time = np.full(shape, np.nan)
    dispatch_time = np.full(shape, np.nan)
    combine_time = np.full(shape, np.nan)
    compute_time = np.full(shape, np.nan)
    gpu_load = np.zeros((num_layers, num_gpus))
    tokens = np.zeros(num_layers)
    remote_gpu = np.zeros(num_layers)
    remote_node = np.zeros(num_layers)
    copies_intra = np.zeros(num_layers)
    copies_inter = np.zeros(num_layers)

    block_list = blocks(batches, num_gpus)
    for row in range(num_layers):
        ids_all = experts_of(row)
        rng = random_generator(params.seed, int(placement.layer_ids[row]))
        for blk in block_list:
            nb = blk.num_batches
            ids = ids_all[blk.lo : blk.hi]
            num_tok, top_k = ids.shape
            batch = batches.batch_of_token[blk.lo : blk.hi] - blk.first_batch
            source = batches.source[blk.lo : blk.hi]
            valid = ids >= 0
            if valid.all():
                tok = np.repeat(np.arange(num_tok), top_k)
                kpos = np.tile(np.arange(top_k), num_tok)
                experts = ids.ravel()
            else:
                tok, kpos = np.nonzero(valid)
                experts = ids[valid]
            slots = choose_slots(
                params.policy, experts, kpos, source[tok],
                batches.rank_position[blk.lo : blk.hi][tok],
                top_k=top_k, logical_to_physical=l2p[row], replica_counts=counts[row],
                static_table=None if table is None else table[row], rng=rng,
            )
            gpu = slots // slots_per_gpu
            slot_load = np.bincount(batch[tok] * num_slots + slots, minlength=nb * num_slots)
            slot_load = slot_load.reshape(nb, num_slots)
            # TensorRT-LLM's report: expert counts split evenly over replicas, per rank
            expert_load = np.bincount(batch[tok] * num_experts + experts,
                                      minlength=nb * num_experts).reshape(nb, num_experts)
            share = expert_load[:, p2l[row]] / counts[row][p2l[row]]  # [nb, P]
            split_bg = share.reshape(nb, num_gpus, slots_per_gpu).sum(axis=2)
            if watch_order:
                if kpos_counts is None:
                    kpos_counts = np.zeros((num_layers, num_experts, top_k), dtype=np.int64)
                kpos_counts[row] += np.bincount(
                    experts * top_k + kpos, minlength=num_experts * top_k
                ).reshape(num_experts, top_k)
            tok_per_batch = np.bincount(batch[valid.any(axis=1)], minlength=nb)
            traffic = layer_traffic(
                tok, kpos, gpu, num_tok, top_k, blk.segments, fabric, params.mode
            )
            load_bg = traffic.gpu_load.astype(np.float64)

            t_dispatch = comm_time_us(traffic.copies, activation_bytes, fabric)
            t_combine = comm_time_us(traffic.copies.transpose(0, 2, 1), combine_bytes, fabric)
            t_compute = compute_time_us(
                slot_load, slots_per_gpu, expert_bytes, flops_per_token, hbm, tflops
            )
            empty = tok_per_batch == 0
            sl = slice(blk.first_batch, blk.first_batch + nb)

            def put(target: np.ndarray, values: np.ndarray, sl: slice = sl,
                    empty: np.ndarray = empty, row: int = row) -> None:
                target[sl, row] = np.where(empty, np.nan, values)

            put(batch_max, load_bg.max(axis=1))
            put(batch_mean, load_bg.mean(axis=1))
            put(split_max, split_bg.max(axis=1))
            put(split_mean, split_bg.mean(axis=1))
            put(layer_time, (t_dispatch + t_compute + t_combine).max(axis=1))
            put(a2a_time, (t_dispatch + t_combine).max(axis=1))
            put(dispatch_time, t_dispatch.max(axis=1))
            put(combine_time, t_combine.max(axis=1))
            put(compute_time, t_compute.max(axis=1))
            gpu_load[row] += load_bg.sum(axis=0)
            slot_total[row] += slot_load.sum(axis=0)
            tokens[row] += tok_per_batch.sum()
            remote_gpu[row] += traffic.remote_gpu.sum()
            remote_node[row] += traffic.remote_node.sum()
            summed = traffic.copies.sum(axis=0)
            copies_intra[row] += summed[intra].sum()
            copies_inter[row] += summed[inter].sum()

    batch_hot = ratio(batch_max, batch_mean)
    split_imbalance = ratio(split_max, split_mean) - 1.0  # NaN where a batch has no token
    per_token = np.maximum(tokens, 1)
    total_tokens = max(float(tokens.sum()), 1.0)
    bytes_per_copy = activation_bytes + combine_bytes
    layer_ratio = hot_shard_ratio(gpu_load)
    step = np.where(np.isfinite(layer_time).any(axis=1), np.nansum(layer_time, axis=1), np.nan)
    p50 = nan_percentile(layer_time, 50)
    p99 = nan_percentile(layer_time, 99)

    def col_pct(values: np.ndarray, q: float) -> np.ndarray:
        return np.array([nan_percentile(values[:, i], q) for i in range(num_layers)])

    def col_mean(values: np.ndarray) -> np.ndarray:
        finite = np.isfinite(values)
        total = np.where(finite, values, 0.0).sum(axis=0)
        return total / np.maximum(finite.sum(axis=0), 1)

    per_layer = {
        "layer_id": placement.layer_ids.astype(np.float64),
        "tokens": tokens,
        "gpu_load_max": gpu_load.max(axis=1),
        "gpu_load_mean": gpu_load.mean(axis=1),
        "hot_shard_ratio": layer_ratio,
        "batch_hot_shard_p50": col_pct(batch_hot, 50),
        "batch_hot_shard_p99": col_pct(batch_hot, 99),
        "remote_copies_gpu": remote_gpu / per_token,
        "remote_copies_node": remote_node / per_token,
        "copies_intra": copies_intra / per_token,
        "copies_inter": copies_inter / per_token,
        "bytes_intra": copies_intra * bytes_per_copy / per_token,
        "bytes_inter": copies_inter * bytes_per_copy / per_token,
        "dispatch_us": col_mean(dispatch_time),
        "compute_us": col_mean(compute_time),
        "combine_us": col_mean(combine_time),
        "all_to_all_us": col_mean(a2a_time),
        "layer_time_p50_us": col_pct(layer_time, 50),
        "layer_time_p99_us": col_pct(layer_time, 99),
        "trtllm_imbalance": col_mean(split_imbalance),
    }
    layer_p50 = per_layer["layer_time_p50_us"]
    layer_p99 = per_layer["layer_time_p99_us"]
    step_p50 = nan_percentile(step, 50)
    step_p99 = nan_percentile(step, 99)
    metrics: dict[str, Any] = {
        "hot_shard_ratio_median": float(np.median(layer_ratio)) if num_layers else np.nan,
        "hot_shard_ratio_worst": float(np.max(layer_ratio)) if num_layers else np.nan,
        "batch_hot_shard_p50": nan_percentile(batch_hot, 50),
        "batch_hot_shard_p99": nan_percentile(batch_hot, 99),
        "vllm_balancedness": vllm_balancedness(batch_max, batch_mean),
        "sglang_balancedness": sglang_balancedness(
            batch_max, batch_mean,
            dense_layers=max(model.num_hidden_layers - model.num_moe_layers, 0),
        ),
        "trtllm_imbalance": trtllm_imbalance(split_max, split_mean),
        "remote_copies_per_token_gpu": remote_gpu.sum() / total_tokens,
        "remote_copies_per_token_node": remote_node.sum() / total_tokens,
        "copies_per_token_intra": copies_intra.sum() / total_tokens,
        "copies_per_token_inter": copies_inter.sum() / total_tokens,
        "bytes_per_token_intra": copies_intra.sum() * bytes_per_copy / total_tokens,
        "bytes_per_token_inter": copies_inter.sum() * bytes_per_copy / total_tokens,
        "all_to_all_us": _finite_mean(a2a_time),
        "compute_us": _finite_mean(compute_time),
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
    order_bias = None
    if kpos_counts is not None:
        order_bias = round_robin_order_bias(kpos_counts, slot_total, p2l, num_gpus,
                                            placement.layer_ids)
    return Simulation(metrics, per_layer, batch_hot, layer_time, gpu_load, order_bias)


def _finite_mean(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else float("nan")


def _finite_median(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if finite.size else float("nan")


def _finite_max(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.max()) if finite.size else float("nan")
