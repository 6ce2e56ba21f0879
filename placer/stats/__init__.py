"""Statistics of routing: what the readers build and every later stage reads.

- :mod:`placer.stats.routing`: the frozen data (:class:`ExpertStats` per window,
  :class:`RoutingTrace` per token, :class:`RoutingData` both, :class:`PairCounts`,
  :class:`Provenance`);
- :mod:`placer.stats.windows`: which windows a placement is fitted on and judged on
  (ranges, the default split, tokens to windows);
- :mod:`placer.stats.analysis`: derived figures (skew, pairs with lift, drift, affinity).
"""

from placer.stats.routing import (
    ExpertStats,
    PairCounts,
    Provenance,
    RoutingData,
    RoutingTrace,
    TraceSample,
    format_ranges,
)

__all__ = ["ExpertStats", "PairCounts", "Provenance", "RoutingData", "RoutingTrace",
           "TraceSample", "format_ranges"]
