"""The evaluator: what a placement costs on routing data, batch by batch, layer by layer.

For each evaluated layer and batch (see ``docs/evaluate.md`` for the full model):

1. every token has a source rank (:mod:`placer.evaluate.batches`) and up to ``top_k``
   experts (from the trace, or sampled: :mod:`placer.evaluate.sampling`);
2. the dispatch policy picks one replica per selection (:mod:`placer.evaluate.dispatch`);
3. the communication mode turns selections into copies over links
   (:mod:`placer.evaluate.traffic`);
4. per GPU, dispatch time (copies x ``model.activation_bytes(dtype)``), expert compute
   time and combine time (the transposed copies x ``hidden x 2`` bytes) are computed
   (:mod:`placer.evaluate.timing`);
5. the layer's time for the batch is ``max over GPUs of (dispatch + compute + combine)``.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from placer import constants
from placer.errors import DataError, PlacementError, PlacerError, PlacerWarning, UsageError
from placer.evaluate.batches import Batches, make_batches
from placer.evaluate.dispatch import (
    POLICIES,
    STATIC_POLICIES,
    OrderBias,
    OrderBiasWarning,
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
from placer.evaluate.sampling import plan_sampled_batches, sample_topk
from placer.evaluate.static import window_hot_shard
from placer.evaluate.timing import INTER_NODE, INTRA_NODE, comm_time_us, compute_time_us
from placer.evaluate.traffic import MODES, Fabric, Segments, layer_traffic
from placer.evaluate.windows import resolve_window_range, token_windows
from placer.placement import Placement, gpu_loads, hot_shard_ratio
from placer.stats import ExpertStats, RoutingData, format_ranges

if TYPE_CHECKING:
    from placer.models import ModelSpec
    from placer.topology import Topology

#: Metric keys every Evaluation carries, in display order (compare/report/plan read them).
METRIC_KEYS = (
    "hot_shard_ratio_median",
    "hot_shard_ratio_worst",
    "batch_hot_shard_p50",
    "batch_hot_shard_p99",
    "static_hot_shard_ratio_median",
    "static_hot_shard_ratio_worst",
    "window_hot_shard_ratio_median",
    "window_hot_shard_ratio_worst",
    "vllm_balancedness",
    "sglang_balancedness",
    "trtllm_imbalance",
    "remote_copies_per_token_gpu",
    "remote_copies_per_token_node",
    "copies_per_token_intra",
    "copies_per_token_inter",
    "bytes_per_token_intra",
    "bytes_per_token_inter",
    "all_to_all_us",
    "compute_us",
    "moe_layer_p50_us",
    "moe_layer_p99_us",
    "p99_over_p50",
    "layer_p50_us_median",
    "layer_p99_us_median",
    "layer_p99_us_worst",
    "layer_p99_over_p50_median",
    "step_p50_us",
    "step_p99_us",
    "step_p99_over_p50",
    "expert_memory_gb",
    "kv_left_gb",
    "num_tokens",
    "num_batches",
    "num_layers",
)

#: Batch blocks are cut so ``[batches, G, G]`` copy matrices and ``[tokens, G]`` selection
#: matrices stay below these many cells (memory; a single larger batch is kept whole).
_MAX_COPY_CELLS = 1 << 22
_MAX_TOKEN_CELLS = 1 << 23

_SAMPLING_STREAM = 3


@dataclass(frozen=True)
class EvalParams:
    """How to evaluate.

    Attributes
    ----------
    policy: dispatch policy, one of ``round_robin`` (vLLM, TensorRT-LLM), ``sglang``
        (current SGLang static dispatch), ``local_first`` (SGLang's earlier static
        dispatch), ``random``.
    mode: ``normal`` (DeepEP normal kernels: one copy per destination GPU, one per
        destination node across nodes) or ``low_latency`` (one copy per selection).
    batch_tokens: tokens per batch; None = the trace's steps when every token has one,
        else ``constants.DEFAULT_BATCH_TOKENS``.  Sampled batches have this many tokens.
    num_batches: batches to sample when only aggregated statistics are available.
    seed: seeds sampling, the ``random`` policy and the static tables (``sglang`` draws
        with Python's ``random.Random(42 + seed)``: seed 0 is SGLang's own table).
    dtype: expert dtype (``bf16``, ``fp8``, ``mxfp4``); None = the model's default.
    windows: ``(start, stop)`` windows of the routing data to evaluate; None = all.
    sample: sample batches from the statistics even when a per-token trace is present.
    """

    policy: str = "round_robin"
    mode: str = "normal"
    batch_tokens: int | None = None
    num_batches: int = constants.DEFAULT_SAMPLED_BATCHES
    seed: int = 0
    dtype: str | None = None
    windows: tuple[int, int] | None = None
    sample: bool = False

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise UsageError(
                f"unknown dispatch policy {self.policy!r}", where="--policy",
                hint=f"choose one of: {', '.join(POLICIES)}",
            )
        if self.mode not in MODES:
            raise UsageError(
                f"unknown communication mode {self.mode!r}", where="--mode",
                hint=f"choose one of: {', '.join(MODES)}",
            )
        if self.batch_tokens is not None and self.batch_tokens < 1:
            raise UsageError("expected batch tokens >= 1", where="--batch-tokens")
        if self.num_batches < 1:
            raise UsageError("expected number of batches >= 1", where="--num-batches")
        if self.dtype is not None and self.dtype not in constants.DTYPES:
            raise UsageError(
                f"unknown dtype {self.dtype!r}", where="--dtype",
                hint=f"choose one of: {', '.join(constants.DTYPES)}",
            )
        if self.windows is not None and not 0 <= self.windows[0] < self.windows[1]:
            raise UsageError(
                f"window range {self.windows[0]}:{self.windows[1]} is empty", where="--eval"
            )


@dataclass(frozen=True)
class Evaluation:
    """What a placement costs on the evaluated routing data.

    Attributes
    ----------
    metrics: flat figures keyed by :data:`METRIC_KEYS` (definitions in docs/evaluate.md).
    per_layer: ``[layers]`` float64 arrays, layers in :attr:`layer_ids` order (keys in
        docs/evaluate.md: ``hot_shard_ratio``, ``window_hot_shard_max``, ...).
    batch_hot_shard: ``[batches, layers]`` float64 max / mean GPU load per batch, NaN
        where the batch has no token in the layer.
    layer_time_us: ``[batches, layers]`` float64 layer time (max over GPUs of dispatch +
        compute + combine), microseconds, NaN where empty.
    layer_ids: ``[layers]`` int64 absolute layer ids evaluated.
    gpu_load: ``[layers, G]`` float64 tokens processed by each GPU over all batches.
    windows: ``(start, stop)`` windows evaluated.
    source: ``"trace"`` (per-token routing) or ``"sampled"`` (drawn from statistics).
    params: the parameters used.
    """

    metrics: dict[str, float]
    per_layer: dict[str, np.ndarray]
    batch_hot_shard: np.ndarray
    layer_time_us: np.ndarray
    layer_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    gpu_load: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    windows: tuple[int, int] = (0, 0)
    source: str = "trace"
    params: EvalParams = field(default_factory=EvalParams)


# -- input checks -------------------------------------------------------------------------


def _check_inputs(
    placement: Placement, stats: ExpertStats, topology: Topology, model: ModelSpec
) -> None:
    if placement.num_experts != model.num_experts:
        raise PlacementError(
            f"the placement is for {placement.num_experts} experts per layer, model"
            f" {model.name} has {model.num_experts}",
            hint="use a placement planned for this model, or pass the matching --model",
        )
    if stats.num_experts != model.num_experts:
        raise DataError(
            f"the routing data has {stats.num_experts} experts per layer, model {model.name}"
            f" has {model.num_experts}",
            hint="pass the model the trace was recorded on with --model",
        )
    if placement.num_gpus != topology.num_gpus:
        raise PlacementError(
            f"the placement is for {placement.num_gpus} GPUs, topology {topology.name} has"
            f" {topology.num_gpus}",
            hint="use a placement planned for this cluster, or pass the matching --topology",
        )
    moe_layers = set(int(i) for i in model.moe_layer_ids)
    foreign = [int(i) for i in placement.layer_ids if int(i) not in moe_layers]
    if foreign:
        raise PlacementError(
            f"placement layer {format_ranges(foreign)} is not a MoE layer of {model.name}",
            hint=f"MoE layers of {model.name}: {format_ranges(np.array(sorted(moe_layers)))}",
        )


def _evaluated_layers(placement: Placement, stats: ExpertStats) -> tuple[Placement, np.ndarray]:
    """The placement restricted to the layers the routing data has, and their stats rows."""
    in_placement = set(int(i) for i in placement.layer_ids)
    missing = [int(i) for i in stats.layer_ids if int(i) not in in_placement]
    if missing:
        raise PlacementError(
            f"the placement has no layer {format_ranges(np.array(missing))} of the routing data",
            hint=f"placement layers: {format_ranges(placement.layer_ids)}; plan for every MoE layer"
            " of the trace",
        )
    in_stats = {int(i): row for row, i in enumerate(stats.layer_ids.tolist())}
    keep = [row for row, i in enumerate(placement.layer_ids.tolist()) if int(i) in in_stats]
    if len(keep) < placement.num_layers:
        skipped = [int(i) for i in placement.layer_ids if int(i) not in in_stats]
        warnings.warn(
            f"placement layer {format_ranges(np.array(skipped))} has no routing data and is not"
            " evaluated", PlacerWarning, stacklevel=3,
        )
        placement = Placement(
            physical_to_logical=placement.physical_to_logical[keep],
            layer_ids=placement.layer_ids[keep],
            num_experts=placement.num_experts,
            num_gpus=placement.num_gpus,
            meta=placement.meta,
        )
    rows = np.array([in_stats[int(i)] for i in placement.layer_ids], dtype=np.int64)
    return placement, rows


def _kv_left_gb(model: ModelSpec, topology: Topology, dtype: str, slots_per_gpu: int,
                expert_gb: float) -> float:
    """Memory left for the KV cache on the smallest GPU, GB (placer.capacity when present)."""
    try:
        capacity = importlib.import_module("placer.capacity")
    except ImportError:
        capacity = None
    if capacity is not None:
        try:
            plan = capacity.plan_capacity(model, topology, dtype)
            return float(plan.kv_left_gb_at(slots_per_gpu))
        except PlacerError:
            pass
    overhead = float(getattr(constants, "RUNTIME_OVERHEAD_GB", 0.0))
    memory = float(np.min(topology.memory_gb))
    return memory - model.non_expert_bytes(dtype) / constants.GB - expert_gb - overhead


# -- the evaluator --------------------------------------------------------------------------


def evaluate(
    placement: Placement,
    routing: RoutingData | ExpertStats,
    topology: Topology,
    model: ModelSpec,
    params: EvalParams | None = None,
    *,
    draws: dict[tuple[int, ...], np.ndarray] | None = None,
) -> Evaluation:
    """Evaluate ``placement`` on ``routing`` (see the module docstring and docs/evaluate.md).

    Per-token routing (``routing.trace``) is replayed batch by batch; without it (or with
    ``params.sample``, or when ``routing`` is bare ``ExpertStats``) batches are sampled
    from the statistics.  Layers of the routing
    data must all be in the placement; placement layers without routing data are skipped
    with a warning.  ``draws`` (an empty dict the caller keeps) holds the sampled tokens
    so that later calls on the same statistics judge other placements on the very same
    tokens without drawing them again (planners comparing candidates).

    Raises PlacementError / DataError for a placement or data that does not fit the model
    or topology, UsageError for a window range outside the data.
    """
    params = params or EvalParams()
    if isinstance(routing, ExpertStats):
        routing = RoutingData(routing)
    stats = routing.stats
    _check_inputs(placement, stats, topology, model)
    full_placement = placement
    placement, stats_rows = _evaluated_layers(placement, stats)
    dtype = params.dtype or model.default_dtype
    windows = resolve_window_range(
        params.windows if params.windows is not None else (None, None),
        stats.num_windows, option="--eval",
    )
    num_gpus = placement.num_gpus
    fabric = Fabric.from_topology(topology, params.mode)

    use_trace = routing.trace is not None and not params.sample
    if use_trace:
        assert routing.trace is not None
        experts_of, batches, num_tokens = _trace_source(
            routing, placement, windows, params, num_gpus
        )
        source_name = "trace"
    else:
        experts_of, batches, num_tokens = _sampled_source(
            stats, placement, stats_rows, windows, params, num_gpus, draws
        )
        source_name = "sampled"

    table = _static_table(full_placement, placement, topology, params)
    sim = _simulate(placement, batches, experts_of, fabric, topology, model, dtype, params,
                    table)
    if sim.order_bias is not None:
        warnings.warn(OrderBiasWarning(sim.order_bias, stats.top_k, source_name),
                      stacklevel=2)

    # -- figures on the evaluated statistics (no batches) ------------------------------
    window_stats = stats.select_windows(*windows)
    static_load = gpu_loads(placement, window_stats.load[:, stats_rows].sum(axis=0))
    static_ratio = hot_shard_ratio(static_load)
    window_max = window_hot_shard(placement, window_stats)  # [W, L]
    window_mean = window_stats.load[:, stats_rows].sum(axis=2) / num_gpus
    per_window = ratio(window_max, window_mean)  # NaN where a window has no load
    window_ratio = np.where(np.isfinite(per_window), per_window, -np.inf).max(axis=0)
    window_ratio = np.where(np.isfinite(window_ratio), window_ratio, 1.0)

    per_layer = dict(sim.per_layer)
    per_layer["static_hot_shard_ratio"] = static_ratio
    per_layer["window_hot_shard_max"] = window_max.max(axis=0)
    per_layer["window_hot_shard_mean"] = window_max.mean(axis=0)
    per_layer["window_hot_shard_ratio"] = window_ratio

    expert_gb = (
        placement.slots_per_gpu * model.expert_bytes(dtype) * model.num_moe_layers / constants.GB
    )
    m = dict(sim.metrics)
    m["static_hot_shard_ratio_median"] = float(np.median(static_ratio))
    m["static_hot_shard_ratio_worst"] = float(np.max(static_ratio))
    m["window_hot_shard_ratio_median"] = float(np.median(window_ratio))
    m["window_hot_shard_ratio_worst"] = float(np.max(window_ratio))
    m["expert_memory_gb"] = float(expert_gb)
    m["kv_left_gb"] = _kv_left_gb(model, topology, dtype, placement.slots_per_gpu, expert_gb)
    m["num_tokens"] = float(num_tokens)
    m["num_batches"] = float(batches.num_batches)
    m["num_layers"] = float(placement.num_layers)
    metrics = {key: float(m[key]) for key in METRIC_KEYS}
    return Evaluation(
        metrics=metrics,
        per_layer=per_layer,
        batch_hot_shard=sim.batch_hot_shard,
        layer_time_us=sim.layer_time_us,
        layer_ids=placement.layer_ids.copy(),
        gpu_load=sim.gpu_load,
        windows=windows,
        source=source_name,
        params=replace(params, dtype=dtype, windows=windows),
    )


ExpertsOf = Callable[[int], np.ndarray]


def _static_table(
    full_placement: Placement, placement: Placement, topology: Topology, params: EvalParams
) -> np.ndarray | None:
    """``[layers, G, E]`` static dispatch table of the evaluated rows, or None.

    Built on the whole placement (SGLang builds it over every layer, so a layer's draws
    depend on the layers before it), then restricted to the evaluated layer rows.
    """
    if params.policy not in STATIC_POLICIES:
        return None
    table = static_dispatch_table(
        full_placement, params.seed, policy=params.policy,
        node_of_gpu=np.asarray(topology.node_of_gpu, dtype=np.int64),
    )
    rows = [full_placement.layer_row(int(i)) for i in placement.layer_ids]
    return table[rows]


def _trace_source(
    routing: RoutingData, placement: Placement, windows: tuple[int, int],
    params: EvalParams, num_gpus: int,
) -> tuple[ExpertsOf, Batches, int]:
    """Tokens of the evaluated windows, sorted by batch, and a per-layer expert reader."""
    trace = routing.trace
    assert trace is not None
    token_window = token_windows(trace, routing.stats)
    selected = np.flatnonzero((token_window >= windows[0]) & (token_window < windows[1]))
    batches = make_batches(
        selected.size, num_gpus,
        step=trace.step[selected], rank=trace.rank[selected],
        batch_tokens=params.batch_tokens, default_batch_tokens=constants.DEFAULT_BATCH_TOKENS,
    )
    order = np.lexsort((batches.source, batches.batch_of_token))
    selected = selected[order]
    batches = _reorder(batches, order)
    trace_cols = {int(i): col for col, i in enumerate(trace.layer_ids.tolist())}
    missing = [int(i) for i in placement.layer_ids if int(i) not in trace_cols]
    if missing:
        raise DataError(
            f"the per-token trace has no column for layer {format_ranges(np.array(missing))}",
            hint="read the trace with keep_tokens=True for every layer",
        )
    cols = [trace_cols[int(i)] for i in placement.layer_ids]
    in_order = bool(np.array_equal(selected, np.arange(trace.num_tokens)))

    def experts_of(row: int) -> np.ndarray:
        if in_order:  # every token, already sorted: a strided view, one copy
            return trace.topk_ids[:, cols[row]].astype(np.int64)
        return np.asarray(trace.topk_ids[selected, cols[row]], dtype=np.int64)

    return experts_of, batches, int(selected.size)


def _sampled_source(
    stats: ExpertStats, placement: Placement, stats_rows: np.ndarray,
    windows: tuple[int, int], params: EvalParams, num_gpus: int,
    draws: dict[tuple[int, ...], np.ndarray] | None = None,
) -> tuple[ExpertsOf, Batches, int]:
    """Sampled batches (sorted by batch) and a per-layer sampler.

    Windows with too few tokens for the batches drawn from them are merged with their
    neighbours first (:func:`placer.evaluate.sampling.plan_sampled_batches`, with a
    PlacerWarning).  ``draws`` keeps each layer's drawn tokens for later calls with the
    same statistics (the draws depend on the statistics, windows, seed and batch
    sizes, never on the placement).
    """
    plan = plan_sampled_batches(
        stats.tokens, windows, params.num_batches,
        params.batch_tokens or constants.DEFAULT_BATCH_TOKENS,
    )
    if plan.message:
        warnings.warn(plan.message, PlacerWarning, stacklevel=3)
    batch_tokens = plan.batch_tokens
    num_batches = plan.num_batches
    position = np.tile(np.arange(batch_tokens, dtype=np.int64), num_batches)
    batches = Batches(
        batch_of_token=np.repeat(np.arange(num_batches, dtype=np.int64), batch_tokens),
        source=position % num_gpus,
        rank_position=position // num_gpus,
        num_batches=num_batches,
    )
    # sampled tokens are exchangeable: order them by (batch, source) like trace tokens
    batches = _reorder(batches, np.lexsort((batches.source, batches.batch_of_token)))
    load_all = stats.mean_load

    def experts_of(row: int) -> np.ndarray:
        layer_id = int(placement.layer_ids[row])
        key = (layer_id, *windows, params.seed, batch_tokens, num_batches)
        if draws is not None and key in draws:
            return draws[key].astype(np.int64)
        drawn = draw(row, layer_id)
        if draws is not None:
            small = np.int16 if stats.num_experts < np.iinfo(np.int16).max else np.int32
            draws[key] = drawn.astype(small)
        return drawn

    def draw(row: int, layer_id: int) -> np.ndarray:
        srow = int(stats_rows[row])
        coact = None if stats.coact is None else stats.coact[srow]
        chunks = []
        for (lo, hi), n in zip(plan.groups, plan.group_batches, strict=True):
            if hi - lo == 1:  # a window on its own: the same draws as ever
                rng = np.random.default_rng((params.seed, layer_id, _SAMPLING_STREAM, lo))
                load = stats.load[lo, srow]
            else:
                rng = np.random.default_rng(
                    (params.seed, layer_id, _SAMPLING_STREAM, lo, hi)
                )
                load = stats.load[lo:hi, srow].sum(axis=0)
            chunks.append(sample_topk(load, n * batch_tokens, stats.top_k, rng,
                                      coact=coact, load_all=load_all[srow]))
        return np.concatenate(chunks)

    return experts_of, batches, num_batches * batch_tokens


def _reorder(batches: Batches, order: np.ndarray) -> Batches:
    return Batches(
        batches.batch_of_token[order], batches.source[order],
        batches.rank_position[order], batches.num_batches,
    )


@dataclass(frozen=True)
class _Block:
    """A run of whole batches processed together (tokens ``lo:hi``)."""

    first_batch: int
    num_batches: int
    lo: int
    hi: int
    segments: Segments


def _blocks(batches: Batches, num_gpus: int) -> list[_Block]:
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
        blocks.append(_Block(first, last - first, lo, hi, segments))
        first = last
    return blocks


@dataclass(frozen=True)
class _Simulation:
    metrics: dict[str, float]
    per_layer: dict[str, np.ndarray]
    batch_hot_shard: np.ndarray
    layer_time_us: np.ndarray
    gpu_load: np.ndarray
    order_bias: OrderBias | None = None


def _simulate(
    placement: Placement,
    batches: Batches,
    experts_of: ExpertsOf,
    fabric: Fabric,
    topology: Topology,
    model: ModelSpec,
    dtype: str,
    params: EvalParams,
    table: np.ndarray | None = None,
) -> _Simulation:
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

    blocks = _blocks(batches, num_gpus)
    for row in range(num_layers):
        ids_all = experts_of(row)
        rng = random_generator(params.seed, int(placement.layer_ids[row]))
        for blk in blocks:
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
        "step_p99_over_p50": step_p99 / step_p50 if step_p50 > 0 else np.nan,
    }
    order_bias = None
    if kpos_counts is not None:
        order_bias = round_robin_order_bias(kpos_counts, slot_total, p2l, num_gpus,
                                            placement.layer_ids)
    return _Simulation(metrics, per_layer, batch_hot, layer_time, gpu_load, order_bias)


def _finite_mean(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else float("nan")


def _finite_median(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if finite.size else float("nan")


def _finite_max(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.max()) if finite.size else float("nan")
