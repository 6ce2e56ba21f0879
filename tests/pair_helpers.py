"""Dense views of pair counts for tests that compare them cell by cell."""

from __future__ import annotations

from typing import Any

import numpy as np

from placer.stats import PairCounts


def dense(value: Any) -> Any:
    """``value.to_dense()`` for :class:`~placer.stats.PairCounts`, anything else as is."""
    return value.to_dense() if isinstance(value, PairCounts) else value


def field(stats: Any, name: str) -> Any:
    """A field of statistics, pair counts made dense."""
    return dense(getattr(stats, name))


__all__ = ["dense", "field", "np"]
