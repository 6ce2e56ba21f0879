"""DeepEP's published all-to-all figures, and how its tests count the bytes behind them.

Source: deepseek-ai/DeepEP, the V1 performance tables (README of V1, now ``docs/legacy.md``)
measured on H800 (~160 GB/s NVLink) with one CX7 InfiniBand 400 Gb/s NIC (~50 GB/s) per
GPU, hidden 7168, top-8 of 256 experts, FP8 dispatch and BF16 combine:

- normal kernels, 4096 tokens per rank, top-4 groups (DeepEP's ``num_topk_groups``
  default ``min(num_nodes, 4)``, one group per node): *bottleneck bandwidth* per EP size;
- low-latency kernels, 128 tokens per rank, no group limit: *latency* per EP size (and a
  bandwidth that is selections x bytes / latency).

The low-latency table above is the one DeepEP published after its low-latency kernels
learned to use NVLink inside a node (mode ``low_latency``); its first README (February
2025) published the same setting with pure-RDMA kernels (every copy through the NIC,
mode ``low_latency_rdma``): :data:`PUBLISHED_RDMA`.

The normal tables give a bandwidth, not a time.  DeepEP's tests compute it as bytes over
the kernel's time, with these byte counts (``tests/test_intranode.py``,
``tests/test_internode.py``):

- intranode (EP 8): tokens the rank *receives* (its own included) x bytes per token;
- internode: the rank's (token, node) pairs with at least one selected expert, *its own
  node included*, x bytes per token (the "RDMA" figure);

with FP8 tokens of ``hidden * (1 + 4 / 128)`` bytes and BF16 tokens of ``hidden * 2``.
:func:`published_time_us` turns a published bandwidth back into the time it was measured
from, with these counts taken on the same routing placer evaluates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from placer.calibrate.cases import AllToAllCase
from placer.constants import BF16_BYTES

#: DeepEP's FP8 token: hidden bytes plus one float32 scale per 128 values.
_FP8_FACTOR = 1 + 4 / 128


@dataclass(frozen=True)
class PublishedRow:
    """One published figure.

    Attributes
    ----------
    case: the configuration (routing as DeepEP's test draws it).
    phase: ``dispatch`` or ``combine``.
    figure: the published number: GB/s for normal kernels, microseconds for low-latency.
    unit: ``"GB/s"`` or ``"us"``.
    """

    case: AllToAllCase
    phase: str
    figure: float
    unit: str

    @property
    def label(self) -> str:
        kind = {"normal": "normal", "low_latency": "low-latency",
                "low_latency_rdma": "low-latency RDMA"}[self.case.mode]
        return f"{kind} EP{self.case.num_gpus} {self.phase}"


def _normal(ep: int, dispatch_gbps: float, combine_gbps: float) -> list[PublishedRow]:
    nodes = ep // 8
    case = AllToAllCase(ep, 8, 4096, top_groups=min(nodes, 4) if nodes > 1 else 0,
                        mode="normal")
    return [PublishedRow(case, "dispatch", dispatch_gbps, "GB/s"),
            PublishedRow(case, "combine", combine_gbps, "GB/s")]


def _low_latency(ep: int, dispatch_us: float, combine_us: float,
                 mode: str = "low_latency") -> list[PublishedRow]:
    case = AllToAllCase(ep, 8, 128, mode=mode)
    return [PublishedRow(case, "dispatch", dispatch_us, "us"),
            PublishedRow(case, "combine", combine_us, "us")]


#: Every row of DeepEP's V1 tables (normal: GB/s; low-latency: us).
PUBLISHED: tuple[PublishedRow, ...] = tuple(
    _normal(8, 153, 158) + _normal(16, 43, 43) + _normal(32, 58, 57) + _normal(64, 51, 50)
    + _low_latency(8, 77, 114) + _low_latency(16, 118, 195) + _low_latency(32, 155, 273)
    + _low_latency(64, 173, 314) + _low_latency(128, 192, 369) + _low_latency(256, 194, 360)
)


#: DeepEP's first low-latency table (README, February 2025): pure RDMA, same setting.
PUBLISHED_RDMA: tuple[PublishedRow, ...] = tuple(
    _low_latency(8, 163, 318, "low_latency_rdma") + _low_latency(16, 173, 329, "low_latency_rdma")
    + _low_latency(32, 182, 350, "low_latency_rdma")
    + _low_latency(64, 186, 353, "low_latency_rdma")
    + _low_latency(128, 192, 369, "low_latency_rdma")
    + _low_latency(256, 194, 360, "low_latency_rdma")
)


def counted_bytes(case: AllToAllCase, phase: str, topk_ids: np.ndarray | None = None) -> float:
    """Bytes per rank (mean over ranks) DeepEP's test divides by the time (module doc).

    ``topk_ids`` is the case's routing (``case.topk_ids()``; drawn when None).
    """
    ids = case.topk_ids() if topk_ids is None else topk_ids
    token_bytes = case.hidden * (_FP8_FACTOR if phase == "dispatch" else BF16_BYTES)
    per_gpu = case.num_experts // case.num_gpus
    if case.mode != "normal":
        return float((ids >= 0).sum()) / case.num_gpus * (
            case.hidden + case.hidden / 128 * 4 + 16 if phase == "dispatch"
            else case.hidden * BF16_BYTES)
    tokens = ids.shape[0]
    if case.num_nodes == 1:
        hit = np.zeros((tokens, case.num_gpus), dtype=bool)
        np.put_along_axis(hit, ids // per_gpu, True, axis=1)
        return float(hit.sum()) / case.num_gpus * token_bytes  # received, mean over ranks
    hit = np.zeros((tokens, case.num_nodes), dtype=bool)
    np.put_along_axis(hit, ids // (per_gpu * case.gpus_per_node), True, axis=1)
    return float(hit.sum()) / case.num_gpus * token_bytes  # (token, node) pairs sent


def published_time_us(row: PublishedRow, topk_ids: np.ndarray | None = None) -> float:
    """The time behind a published figure, microseconds."""
    if row.unit == "us":
        return row.figure
    return counted_bytes(row.case, row.phase, topk_ids) / (row.figure * 1e9) * 1e6


def calibrated_tokens(mode: str) -> tuple[int, int] | None:
    """``(least, most)`` tokens per GPU of DeepEP's published rows in all-to-all ``mode``
    (the range placer's default link efficiencies were fitted on:
    :data:`placer.topology.calibration.DEFAULT_CALIBRATED_TOKENS`), or None without any.

    >>> calibrated_tokens("normal"), calibrated_tokens("low_latency")
    ((4096, 4096), (128, 128))
    """
    tokens = [r.case.tokens_per_gpu for r in PUBLISHED + PUBLISHED_RDMA if r.case.mode == mode]
    return (min(tokens), max(tokens)) if tokens else None
