"""DeepSeek's EPLB: the reference algorithm alone in :mod:`.reference` (diffable against
deepseek-ai/EPLB's ``eplb.py``), the ``eplb-valid`` variant in :mod:`.valid`, and the two
solvers that run them on a placement problem in :mod:`.adapters`."""

from placer.planning.solvers.eplb.adapters import eplb_placement, solve_eplb, solve_eplb_valid
from placer.planning.solvers.eplb.reference import (
    balanced_packing,
    rebalance_experts,
    rebalance_experts_hierarchical,
    replicate_experts,
)
from placer.planning.solvers.eplb.valid import (
    balanced_packing_apart,
    eplb_valid_placement,
    replicate_experts_capped,
)

__all__ = [
    "balanced_packing",
    "balanced_packing_apart",
    "eplb_placement",
    "eplb_valid_placement",
    "rebalance_experts",
    "rebalance_experts_hierarchical",
    "replicate_experts",
    "replicate_experts_capped",
    "solve_eplb",
    "solve_eplb_valid",
]
