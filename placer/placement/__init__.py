"""Placements: which logical expert each physical slot of each MoE layer holds.

- :mod:`placer.placement.types`: :class:`Placement` (frozen, validated), :class:`ModelLayers`
  (what a placement is checked against), GPU loads and hot-shard ratios;
- :mod:`placer.placement.document`: placement JSON, read and written atomically against
  the shipped schema;
- :mod:`placer.placement.migration`: weight moves between two placements, their bytes and
  copy time, and the budget frontier of a re-plan.
"""

from placer.placement.types import ModelLayers, Placement, gpu_loads, hot_shard_ratio

__all__ = ["ModelLayers", "Placement", "gpu_loads", "hot_shard_ratio"]
