"""Calibration: benchmark cases placer can predict, DeepEP's published figures, and the
fit of link and compute efficiencies from measured timings (``placer calibrate``)."""

from placer.calibrate.deepep import (
    PUBLISHED,
    PUBLISHED_RDMA,
    PublishedRow,
    counted_bytes,
    published_time_us,
)
from placer.calibrate.workload import AllToAllCase

__all__ = [
    "PUBLISHED",
    "PUBLISHED_RDMA",
    "AllToAllCase",
    "PublishedRow",
    "counted_bytes",
    "published_time_us",
]
