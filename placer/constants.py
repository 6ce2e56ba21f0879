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
