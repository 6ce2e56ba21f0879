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

import warnings
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from placer import constants
from placer.errors import DataError, Param, PlacementError, PlacerError, PlacerWarning
from placer.evaluate.balance import (
    ratio,
)
from placer.evaluate.batches import Batches, attention_ranks, reordered, sorted_batches
from placer.evaluate.costs import CostModel
from placer.evaluate.dispatch import (
    STATIC_POLICIES,
    OrderBiasWarning,
    static_dispatch_table,
)
from placer.evaluate.params import EvalParams
from placer.evaluate.sampling import plan_sampled_batches, sample_topk
from placer.evaluate.simulate import ExpertsOf, simulate
from placer.evaluate.static import window_hot_shard
from placer.model.capacity import plan_capacity
from placer.placement import Placement, gpu_loads, hot_shard_ratio
from placer.stats import ExpertStats, RoutingData, format_ranges
from placer.stats.windows import resolve_window_range, token_windows

if TYPE_CHECKING:
    from placer.model import ModelSpec
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
    "step_mean_us",
    "step_p99_over_p50",
    "expert_memory_gb",
    "kv_left_gb",
    "num_tokens",
    "num_batches",
    "num_layers",
)


_SAMPLING_STREAM = 3


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
    dealt_ranks: the source ranks a per-token trace records when they are fewer than
        the GPUs, so that its tokens were dealt over every GPU instead
        (:func:`placer.evaluate.batches.attention_ranks`); 0 when its ranks were used,
        or it has none.
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
    dealt_ranks: int = 0


# -- input checks -------------------------------------------------------------------------


def _check_inputs(
    placement: Placement, stats: ExpertStats, topology: Topology, model: ModelSpec
) -> None:
    placement.check_model(model)  # the experts and MoE layers of the model
    if stats.num_experts != model.num_experts:
        raise DataError(
            f"the routing data has {stats.num_experts} experts per layer, model {model.name}"
            f" has {model.num_experts}",
            hint="pass the model the trace was recorded on with `model`",
        )
    if placement.num_gpus != topology.num_gpus:
        raise PlacementError(
            f"the placement is for {placement.num_gpus} GPUs, topology {topology.name} has"
            f" {topology.num_gpus}",
            hint="use a placement planned for this cluster, or pass the matching `topology`",
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
    """Memory left for the KV cache on the smallest GPU, GB (:func:`placer.model.capacity.
    plan_capacity`); when capacity refuses the model outright, the same sum without its
    checks, which may be negative: the evaluation still reports what the placement costs."""
    try:
        return float(plan_capacity(model, topology, dtype).kv_left_gb_at(slots_per_gpu))
    except PlacerError:
        memory = float(np.min(topology.memory_gb))
        return (memory - model.non_expert_bytes(dtype) / constants.GB - expert_gb
                - constants.RUNTIME_OVERHEAD_GB)


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
        stats.num_windows, option=Param("held_out"),
    )
    num_gpus = placement.num_gpus
    costs = CostModel.of(topology, model, params.mode, dtype)

    experts_of, batches, num_tokens, source_name = token_source(
        routing, placement.layer_ids, stats_rows, windows, params, num_gpus, draws
    )

    table = _static_table(full_placement, placement, topology, params)
    sim = simulate(placement, batches, experts_of, costs, model, params, table)
    if sim.order_bias is not None:
        warnings.warn(OrderBiasWarning(sim.order_bias, stats.top_k, source_name),
                      stacklevel=2)

    per_layer, m = _statistics_figures(placement, stats, stats_rows, windows)
    per_layer = {**sim.per_layer, **per_layer}
    m = {**sim.metrics, **m}
    expert_gb = (
        placement.slots_per_gpu * model.expert_bytes(dtype) * model.num_moe_layers / constants.GB
    )
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
        dealt_ranks=attention_ranks(routing.trace.rank, num_gpus)[1]
        if source_name == "trace" and routing.trace is not None else 0,
    )


def _statistics_figures(
    placement: Placement, stats: ExpertStats, stats_rows: np.ndarray, windows: tuple[int, int]
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """The figures on the evaluated windows' statistics (no batches): ``[layers]`` arrays
    of :attr:`Evaluation.per_layer` and the static and per-window hot-shard metrics."""
    window_stats = stats.select_windows(*windows)
    static_load = gpu_loads(placement, window_stats.load[:, stats_rows].sum(axis=0))
    static_ratio = hot_shard_ratio(static_load)
    window_max = window_hot_shard(placement, window_stats)  # [W, L]
    window_mean = window_stats.load[:, stats_rows].sum(axis=2) / placement.num_gpus
    per_window = ratio(window_max, window_mean)  # NaN where a window has no load
    window_ratio = np.where(np.isfinite(per_window), per_window, -np.inf).max(axis=0)
    window_ratio = np.where(np.isfinite(window_ratio), window_ratio, 1.0)
    per_layer = {
        "static_hot_shard_ratio": static_ratio,
        "window_hot_shard_max": window_max.max(axis=0),
        "window_hot_shard_mean": window_max.mean(axis=0),
        "window_hot_shard_ratio": window_ratio,
    }
    metrics = {
        "static_hot_shard_ratio_median": float(np.median(static_ratio)),
        "static_hot_shard_ratio_worst": float(np.max(static_ratio)),
        "window_hot_shard_ratio_median": float(np.median(window_ratio)),
        "window_hot_shard_ratio_worst": float(np.max(window_ratio)),
    }
    return per_layer, metrics


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


def token_source(
    routing: RoutingData, layer_ids: np.ndarray, stats_rows: np.ndarray,
    windows: tuple[int, int], params: EvalParams, num_gpus: int,
    draws: dict[tuple[int, ...], np.ndarray] | None = None,
) -> tuple[ExpertsOf, Batches, int, str]:
    """The evaluated tokens: a per-layer expert reader (row ``i`` reads layer
    ``layer_ids[i]``, statistics row ``stats_rows[i]``), the batches sorted by (batch,
    source), the token count and the source's name (``trace`` or ``sampled``).

    Per-token routing is replayed when the data has it and ``params.sample`` is off;
    otherwise batches are sampled from the statistics (``draws`` as in :func:`evaluate`).
    """
    if routing.trace is not None and not params.sample:
        experts_of, batches, num_tokens = _trace_source(
            routing, layer_ids, windows, params, num_gpus
        )
        return experts_of, batches, num_tokens, "trace"
    experts_of, batches, num_tokens = _sampled_source(
        routing.stats, layer_ids, stats_rows, windows, params, num_gpus, draws
    )
    return experts_of, batches, num_tokens, "sampled"


def _trace_source(
    routing: RoutingData, layer_ids: np.ndarray, windows: tuple[int, int],
    params: EvalParams, num_gpus: int,
) -> tuple[ExpertsOf, Batches, int]:
    """Tokens of the evaluated windows, sorted by batch, and a per-layer expert reader."""
    trace = routing.trace
    assert trace is not None
    token_window = token_windows(trace, routing.stats)
    selected = np.flatnonzero((token_window >= windows[0]) & (token_window < windows[1]))
    rank, _ = attention_ranks(trace.rank, num_gpus)
    batches, order = sorted_batches(
        selected.size, num_gpus,
        step=trace.step[selected], rank=None if rank is None else rank[selected],
        batch_tokens=params.batch_tokens, default_batch_tokens=constants.DEFAULT_BATCH_TOKENS,
    )
    selected = selected[order]
    trace_cols = {int(i): col for col, i in enumerate(trace.layer_ids.tolist())}
    missing = [int(i) for i in layer_ids if int(i) not in trace_cols]
    if missing:
        raise DataError(
            f"the per-token trace has no column for layer {format_ranges(np.array(missing))}",
            hint="read the trace with keep_tokens=True for every layer",
        )
    cols = [trace_cols[int(i)] for i in layer_ids]
    in_order = bool(np.array_equal(selected, np.arange(trace.num_tokens)))

    def experts_of(row: int) -> np.ndarray:
        if in_order:  # every token, already sorted: a strided view, one copy
            return trace.topk_ids[:, cols[row]].astype(np.int64)
        return np.asarray(trace.topk_ids[selected, cols[row]], dtype=np.int64)

    return experts_of, batches, int(selected.size)


def _check_sampled_memory(num_batches: int, batch_tokens: int, top_k: int, num_gpus: int,
                          cached_layers: int, asked_batches: int | None) -> None:
    """Refuse sampled batches larger than the memory free (:func:`placer.limits.
    check_allocation`): about ``11 k + 32`` bytes a token while a layer is timed, and the
    drawn ids of ``cached_layers`` layers kept (2 bytes a selection).  The hint's largest
    batch that fits counts the ``asked_batches`` that smaller batches would be drawn."""
    from placer.limits import check_allocation

    per_token = 11 * top_k + 32 + cached_layers * top_k * 2

    def hint(free: int) -> str:
        batches = max(num_batches, asked_batches or constants.DEFAULT_SAMPLED_BATCHES)
        most = max(1, free // (per_token * batches * num_gpus))
        return (f"a smaller `tokens_per_gpu` (a batch is that many tokens on each of the"
                f" {num_gpus:,} GPUs): at most about {most:,} fits")

    check_allocation(num_batches * batch_tokens * per_token,
                     f"{num_batches:,} sampled batches of {batch_tokens:,} tokens", hint,
                     where=Param("tokens_per_gpu"))


def _sampled_source(
    stats: ExpertStats, layer_ids: np.ndarray, stats_rows: np.ndarray,
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
    _check_sampled_memory(num_batches, batch_tokens, stats.top_k, num_gpus,
                          layer_ids.size if draws is not None else 0, params.num_batches)
    position = np.tile(np.arange(batch_tokens, dtype=np.int64), num_batches)
    batches = Batches(
        batch_of_token=np.repeat(np.arange(num_batches, dtype=np.int64), batch_tokens),
        source=position % num_gpus,
        rank_position=position // num_gpus,
        num_batches=num_batches,
    )
    # sampled tokens are exchangeable: order them by (batch, source) like trace tokens
    batches = reordered(batches, np.lexsort((batches.source, batches.batch_of_token)))
    load_all = stats.mean_load
    pairs = stats.coact
    if pairs is not None and not pairs.dense_fits():
        warnings.warn(
            f"co-activation of {stats.num_experts:,} experts is too large for the sampler's"
            f" dense [experts, experts] matrices (more than {constants.MAX_COACT_BYTES >> 20}"
            " MiB a layer, docs/limits.md): tokens are sampled from the loads alone",
            PlacerWarning, stacklevel=3)
        pairs = None

    def experts_of(row: int) -> np.ndarray:
        layer_id = int(layer_ids[row])
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
        coact = None if pairs is None else pairs.dense(srow)  # the anchor mixture is dense
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


