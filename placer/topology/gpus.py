"""GPU types: one kind of GPU's memory and speeds, as a topology file's ``gpu_types:``
names them."""

from __future__ import annotations

from dataclasses import dataclass

from placer.constants import DTYPES
from placer.errors import UsageError


@dataclass(frozen=True)
class GpuType:
    """One kind of GPU.

    Attributes
    ----------
    name: the key of ``gpu_types`` in the topology file (``"h100-sxm"``).
    memory_gb: HBM capacity, GB (1e9 bytes).
    hbm_gbps: HBM bandwidth, GB/s.
    bf16_tflops: dense BF16 tensor throughput, TFLOPS.
    fp8_tflops: dense FP8 tensor throughput, TFLOPS.
    mxfp4_tflops: dense FP4 throughput, TFLOPS, or None when the GPU has no FP4 units
        (MXFP4 experts then run at the FP8 figure).
    """

    name: str
    memory_gb: float
    hbm_gbps: float
    bf16_tflops: float
    fp8_tflops: float
    mxfp4_tflops: float | None = None

    def tflops(self, dtype: str) -> float:
        """Dense throughput for experts stored in ``dtype`` (``bf16``, ``fp8``, ``mxfp4``)."""
        if dtype == "bf16":
            return self.bf16_tflops
        if dtype == "fp8":
            return self.fp8_tflops
        if dtype == "mxfp4":
            return self.mxfp4_tflops if self.mxfp4_tflops is not None else self.fp8_tflops
        raise UsageError(f"unknown dtype '{dtype}'", hint=f"expected one of: {', '.join(DTYPES)}")
