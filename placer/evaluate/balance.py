"""Load-balance figures as the serving engines define them, from per-batch GPU loads.

Inputs are the hottest and the mean GPU load of each (batch, layer), ``[batches,
layers]``, ``NaN`` where the batch has no token in that layer.  Each engine's source:

- vLLM ``balancedness`` (vllm/distributed/eplb/eplb_state.py, ``_compute_eplb_load_stats``
  and the ``EPLB step`` log line): per forward pass, over the MoE layers,
  ``sum over layers of mean GPU load / sum over layers of max GPU load`` (0 when no
  load); the loads are physical (the replicas' actual tokens).  placer reports the
  mean over batches, which is what averaging vLLM's log lines gives.
- SGLang ``balancedness`` / utilization rate (sglang/srt/eplb/expert_distribution.py,
  ``compute_utilization_rate``, averaged by ``torch.mean`` and over the recorder's
  window): per forward pass and layer ``(mean + 1e-5) / (max + 1e-5)`` of the physical
  GPU loads, then the mean over **all** ``num_hidden_layers`` rows of SGLang's map.  A
  dense layer, or a MoE layer no token reached, has no load and scores exactly 1.
- TensorRT-LLM imbalance ratio (examples/wide_ep/ep_load_balancer/
  report_load_statistics.py, ``calculate_load_statistics``): per layer and iteration,
  each expert's token count is split evenly over its replicas, summed per rank, and
  ``max / mean - 1`` taken; averaged over iterations, then over layers.  It is computed
  from the logical counts and the placement, not from the replicas each token used, so
  the evaluator passes its own per-batch even-split loads.
"""

from __future__ import annotations

import numpy as np

from placer import constants


def vllm_balancedness(batch_max: np.ndarray, batch_mean: np.ndarray) -> float:
    """vLLM's balancedness, averaged over batches.

    Parameters
    ----------
    batch_max, batch_mean: ``[batches, layers]`` float64 hottest and mean GPU load
        (selections served), NaN where the batch has no token in the layer (left out
        of the sums).

    Returns
    -------
    Mean over batches with load of ``sum_l mean / sum_l max``; NaN when no batch has load.
    """
    mean_sum = np.nansum(batch_mean, axis=1)
    max_sum = np.nansum(batch_max, axis=1)
    ok = max_sum > 0
    if not ok.any():
        return float("nan")
    return float(np.mean(mean_sum[ok] / max_sum[ok]))


def sglang_balancedness(
    batch_max: np.ndarray, batch_mean: np.ndarray, *, dense_layers: int = 0
) -> float:
    """SGLang's balancedness, averaged over batches.

    Parameters
    ----------
    batch_max, batch_mean: ``[batches, layers]`` float64 hottest and mean GPU load of the
        evaluated MoE layers; NaN (no token in that layer) scores 1, as zero load does
        in SGLang.
    dense_layers: layers of the model without experts (``num_hidden_layers`` minus the
        MoE layers); each scores 1 in every batch.  MoE layers that were not evaluated
        are left out (their balance is unknown).

    Returns
    -------
    Mean over batches of the mean over the ``layers + dense_layers`` layers of
    ``(mean + eps) / (max + eps)`` (``eps = constants.SGLANG_BALANCEDNESS_EPS``); NaN
    without batches.
    """
    eps = constants.SGLANG_BALANCEDNESS_EPS
    rate = (batch_mean + eps) / (batch_max + eps)
    rate = np.where(np.isfinite(rate), rate, 1.0)
    if rate.shape[0] == 0 or rate.shape[1] + dense_layers == 0:
        return float("nan")
    per_batch = (rate.sum(axis=1) + dense_layers) / (rate.shape[1] + dense_layers)
    return float(per_batch.mean())


def trtllm_imbalance(split_max: np.ndarray, split_mean: np.ndarray) -> float:
    """TensorRT-LLM's imbalance ratio, from even-split rank loads.

    Parameters
    ----------
    split_max, split_mean: ``[batches, layers]`` float64 hottest and mean rank load with
        each expert's count split evenly over its replicas (TensorRT-LLM's projection),
        NaN or 0 mean where the batch has no token in the layer (left out).

    Returns
    -------
    Mean over layers of the mean over batches of ``max / mean - 1``; layers without any
    loaded batch are left out; NaN when none has load.
    """
    per_batch = ratio(split_max, split_mean) - 1.0
    per_layer = _nanmean(per_batch, axis=0)
    finite = per_layer[np.isfinite(per_layer)]
    return float(finite.mean()) if finite.size else float("nan")


def ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """``numerator / denominator`` with NaN where the denominator is 0 or NaN."""
    ok = np.isfinite(denominator) & (denominator > 0)
    out = np.full(np.shape(numerator), np.nan)
    np.divide(numerator, denominator, out=out, where=ok)
    return out


def nan_percentile(values: np.ndarray, q: float) -> float:
    """``numpy.nanpercentile`` (linear interpolation), NaN when nothing is finite."""
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    return float(np.percentile(finite, q)) if finite.size else float("nan")


def _nanmean(values: np.ndarray, axis: int) -> np.ndarray:
    finite = np.isfinite(values)
    count = finite.sum(axis=axis)
    total = np.where(finite, values, 0.0).sum(axis=axis)
    out = np.full(np.shape(total), np.nan)
    np.divide(total, count, out=out, where=count > 0)
    return out
