"""The metric table: what each figure of an evaluation is called, its unit, format and sense.

One entry per key of :attr:`placer.evaluate.Evaluation.metrics`; plan, evaluate, compare,
report and the benchmarks all render from here, so a metric has one label, one unit and
one number format everywhere.  docs/evaluate.md defines each metric.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Microseconds, as every table writes it.
US = "µs"


@dataclass(frozen=True)
class Metric:
    """How one metric is shown.

    Attributes
    ----------
    key: the evaluator's key.
    label: a few words for a row heading ("step p99").
    header: a short column heading for wide tables ("step p99 µs").
    unit: the unit ("µs", "GB/GPU", "max/mean", ...).
    what: what the number is, in a few words (tables' last column).
    fmt: ``str.format`` pattern of the number.
    better: ``"lower"``, ``"higher"`` or ``""`` (a count, neither).
    """

    key: str
    label: str
    header: str
    unit: str
    what: str
    fmt: str = "{:.3f}"
    better: str = "lower"

    def cell(self, value: float | None) -> str:
        """The number as shown (``-`` when missing or not finite)."""
        if value is None or not math.isfinite(float(value)):
            return "-"
        return self.fmt.format(float(value))


def _time(key: str, label: str, header: str, what: str, fmt: str = "{:.1f}") -> Metric:
    return Metric(key, label, header, US, what, fmt)


_RATIO = "max/mean"

#: Every metric, in the order tables show them.
METRICS: tuple[Metric, ...] = (
    Metric("hot_shard_ratio_median", "hot shard, median layer", "hot shard", _RATIO,
           "GPU load over all batches, median layer", "{:.4f}"),
    Metric("hot_shard_ratio_worst", "hot shard, worst layer", "worst hot shard", _RATIO,
           "GPU load over all batches, worst layer", "{:.4f}"),
    Metric("batch_hot_shard_p50", "batch hot shard p50", "batch hot p50", _RATIO,
           "per (batch, layer), p50", "{:.4f}"),
    Metric("batch_hot_shard_p99", "batch hot shard p99", "batch hot p99", _RATIO,
           "per (batch, layer), p99", "{:.4f}"),
    Metric("static_hot_shard_ratio_median", "static hot shard, median layer",
           "static hot shard", _RATIO, "even split of summed load, median layer", "{:.4f}"),
    Metric("static_hot_shard_ratio_worst", "static hot shard, worst layer",
           "static worst", _RATIO, "even split of summed load, worst layer", "{:.4f}"),
    Metric("window_hot_shard_ratio_median", "window hot shard, median layer",
           "window hot shard", _RATIO, "worst window, even split, median layer", "{:.4f}"),
    Metric("window_hot_shard_ratio_worst", "window hot shard, worst layer",
           "window worst", _RATIO, "worst window, even split, worst layer", "{:.4f}"),
    Metric("vllm_balancedness", "vLLM balancedness", "vLLM bal", "mean/max",
           "vLLM EPLB log line (1 = even)", "{:.4f}", better="higher"),
    Metric("sglang_balancedness", "SGLang balancedness", "SGLang bal", "mean/max",
           "SGLang, over all hidden layers (1 = even)", "{:.4f}", better="higher"),
    Metric("trtllm_imbalance", "TensorRT-LLM imbalance", "TRT-LLM imb", "max/mean-1",
           "TensorRT-LLM load report (0 = even)", "{:.4f}"),
    Metric("remote_copies_per_token_gpu", "remote copies per token, GPU", "remote/tok GPU",
           "copies/token", "deliveries to another GPU", "{:.3f}"),
    Metric("remote_copies_per_token_node", "remote copies per token, node",
           "remote/tok node", "copies/token", "deliveries to another node", "{:.3f}"),
    Metric("copies_per_token_intra", "copies per token, intra-node", "copies/tok intra",
           "copies/token", "copies over intra-node links", "{:.3f}"),
    Metric("copies_per_token_inter", "copies per token, inter-node", "copies/tok inter",
           "copies/token", "copies over inter-node links", "{:.3f}"),
    Metric("bytes_per_token_intra", "bytes per token, intra-node", "B/tok intra", "B/token",
           "dispatch + combine bytes, intra-node", "{:,.0f}"),
    Metric("bytes_per_token_inter", "bytes per token, inter-node", "B/tok inter", "B/token",
           "dispatch + combine bytes, inter-node", "{:,.0f}"),
    _time("all_to_all_us", "all-to-all, mean", "a2a µs",
          "dispatch + combine of the slowest GPU, mean over (batch, layer)"),
    _time("compute_us", "expert compute, mean", "compute µs",
          "expert GEMMs of the slowest GPU, mean over (batch, layer)"),
    _time("moe_layer_p50_us", "MoE layer p50, pooled", "p50 µs",
          "MoE-layer time over every (batch, layer) pair, p50"),
    _time("moe_layer_p99_us", "MoE layer p99, pooled", "p99 µs",
          "MoE-layer time over every (batch, layer) pair, p99"),
    Metric("p99_over_p50", "p99 / p50, pooled", "p99/p50", "ratio",
           "pooled p99/p50 (mostly spread of layers)"),
    _time("layer_p50_us_median", "layer p50, median layer", "layer p50 µs",
          "each layer's p50 over batches, median over layers"),
    _time("layer_p99_us_median", "layer p99, median layer", "layer p99 µs",
          "each layer's p99 over batches, median over layers"),
    _time("layer_p99_us_worst", "layer p99, worst layer", "worst layer p99 µs",
          "each layer's p99 over batches, worst layer"),
    Metric("layer_p99_over_p50_median", "layer p99 / p50, median layer", "layer p99/p50",
           "ratio", "each layer's p99/p50 over batches, median"),
    _time("step_p50_us", "step p50", "step p50 µs",
          "one batch through every MoE layer, p50 over batches"),
    _time("step_p99_us", "step p99", "step p99 µs",
          "one batch through every MoE layer, p99 over batches"),
    _time("step_mean_us", "step mean", "step mean µs",
          "one batch through every MoE layer, mean over batches"),
    Metric("step_p99_over_p50", "step p99 / p50", "step p99/p50", "ratio",
           "step p99/p50 over batches"),
    Metric("expert_memory_gb", "expert weights per GPU", "experts GB", "GB/GPU",
           "expert weights per GPU", "{:.2f}", better=""),
    Metric("kv_left_gb", "left for the KV cache", "KV left GB", "GB/GPU",
           "left for the KV cache, tightest GPU", "{:.2f}", better="higher"),
    Metric("num_tokens", "tokens", "tokens", "tokens", "evaluated", "{:,.0f}", better=""),
    Metric("num_batches", "batches", "batches", "batches", "evaluated", "{:,.0f}", better=""),
    Metric("num_layers", "layers", "layers", "layers", "evaluated", "{:,.0f}", better=""),
)

#: Figures computed from the metrics rather than by the evaluator (``placer compare``'s
#: throughput, ``placer.compare.throughput``); rendered like the metrics.
DERIVED: tuple[Metric, ...] = (
    Metric("tokens_per_s_per_gpu", "tokens/s per GPU", "tok/s/GPU", "tokens/s",
           "tokens of a judged batch over the mean step and the GPUs (MoE layers only)",
           "{:,.0f}", better="higher"),
)

_BY_KEY = {m.key: m for m in (*METRICS, *DERIVED)}


def metric(key: str) -> Metric:
    """The :class:`Metric` of ``key``: an evaluator metric or a :data:`DERIVED` figure
    (KeyError for another key)."""
    return _BY_KEY[key]


def cell(key: str, value: float | None) -> str:
    """``value`` as the table of every command shows metric ``key``."""
    entry = _BY_KEY.get(key)
    if entry is None:
        return "-" if value is None or not math.isfinite(float(value)) else f"{value:.6g}"
    return entry.cell(value)
