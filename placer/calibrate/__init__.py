"""Calibration: benchmark cases placer can predict, DeepEP's published figures, and the
fit of link and compute efficiencies from measured timings (``placer calibrate``)."""

from placer.calibrate.cases import AllToAllCase
from placer.calibrate.deepep import (
    PUBLISHED,
    PUBLISHED_RDMA,
    PublishedRow,
    counted_bytes,
    published_time_us,
)
from placer.calibrate.fit import FitResult, FittedParameter, Predictor, RowFit, fit_calibration
from placer.calibrate.timings import (
    AllToAllTiming,
    GemmTiming,
    Timing,
    deepep_timings,
    format_timings,
    parse_timings,
    read_timings,
    write_deepep_timings,
    write_timings,
)

__all__ = [
    "PUBLISHED",
    "PUBLISHED_RDMA",
    "AllToAllCase",
    "AllToAllTiming",
    "FitResult",
    "FittedParameter",
    "GemmTiming",
    "Predictor",
    "PublishedRow",
    "RowFit",
    "Timing",
    "counted_bytes",
    "deepep_timings",
    "fit_calibration",
    "format_timings",
    "parse_timings",
    "published_time_us",
    "read_timings",
    "write_deepep_timings",
    "write_timings",
]
