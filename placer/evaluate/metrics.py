"""Load-balance figures as the serving engines define them, from per-batch GPU loads.

Inputs are the hottest and the mean GPU load of each (batch, layer), ``NaN`` where the
batch has no token in that layer (those entries are left out).

- vLLM ``balancedness`` (logged per forward pass by its EPLB): per batch,
  ``sum over layers of mean GPU load / sum over layers of max GPU load``; placer
  reports the mean over batches, which is what averaging vLLM's log lines gives.
- SGLang ``utilization rate`` (``average_utilization_rate_over_window``): per batch and
  layer ``(mean + 1e-5) / (max + 1e-5)``; mean over layers, then over batches.
- TensorRT-LLM imbalance: ``max / mean - 1`` per (iteration, layer), averaged over both.
"""

from __future__ import annotations

import numpy as np

from placer import constants


def vllm_balancedness(batch_max: np.ndarray, batch_mean: np.ndarray) -> float:
    """Mean over batches of ``sum_l mean / sum_l max`` (``[batches, layers]`` inputs)."""
    mean_sum = np.nansum(batch_mean, axis=1)
    max_sum = np.nansum(batch_max, axis=1)
    ok = max_sum > 0
    if not ok.any():
        return float("nan")
    return float(np.mean(mean_sum[ok] / max_sum[ok]))


def sglang_balancedness(batch_max: np.ndarray, batch_mean: np.ndarray) -> float:
    """Mean over batches of the mean over layers of ``(mean + eps) / (max + eps)``."""
    eps = constants.SGLANG_BALANCEDNESS_EPS
    rate = (batch_mean + eps) / (batch_max + eps)
    per_batch = _nanmean(rate, axis=1)
    return float(_nanmean(per_batch, axis=0))


def trtllm_imbalance(batch_max: np.ndarray, batch_mean: np.ndarray) -> float:
    """Mean over (batch, layer) with load of ``max / mean - 1``."""
    ok = np.isfinite(batch_mean) & (batch_mean > 0)
    if not ok.any():
        return float("nan")
    return float(np.mean(batch_max[ok] / batch_mean[ok] - 1.0))


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
