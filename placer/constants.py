"""Numeric constants used across placer, in one place, each with its unit."""

#: Bytes in one GB as placer uses it (1e9, as vendors quote bandwidth and memory).
GB = 1_000_000_000

#: Epsilon of SGLang's balancedness metric: mean over layers of (mean + eps) / (max + eps).
SGLANG_BALANCEDNESS_EPS = 1e-5

#: Most windows an ExpertStats keeps; more are merged pairwise while streaming.
MAX_WINDOWS = 64

#: Rows per chunk when streaming per-token traces.
CHUNK_ROWS = 1 << 18

#: Largest integer CP-SAT coefficients should reach after scaling loads.
CPSAT_LOAD_SCALE_MAX = 1_000_000

#: Resolution of pictures embedded in HTML reports and written with --png-dir, dots per inch.
REPORT_DPI = 100

#: Placement maps write each slot's expert id in its cell up to this many slots per layer.
PLACEMENT_MAP_MAX_LABELS = 320

#: Most layers drawn as panels of the per-GPU load bar chart.
GPU_LOAD_MAX_PANELS = 6

#: Share of routing windows a comparison holds out for evaluation (the rest is fitted).
HOLDOUT_FRACTION = 0.25
