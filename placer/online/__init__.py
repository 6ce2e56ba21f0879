"""placer's online policy: what to move at a rebalance, engine-neutral, numpy only.

- :mod:`placer.online.moves`: one layer's moves, greedily, and all layers' within a budget;
- :mod:`placer.online.value`: what a candidate is worth: layer times on the window, copies;
- :mod:`placer.online.policy`: the decision on a :class:`~placer.placement.Placement`;
- :mod:`placer.online.rebalance`: the same decision on plain arrays, as engines hold them;
- :mod:`placer.online.config`: the policy's settings from a file or the environment;
- :mod:`placer.online.vllm`: the plugin that runs it inside vLLM's EPLB (torch only there).
"""

from placer.online.policy import Decision, placer_moves
from placer.online.rebalance import OnlineSettings, RebalanceRecord, rebalance
from placer.online.value import CopyCosts

__all__ = ["CopyCosts", "Decision", "OnlineSettings", "RebalanceRecord", "placer_moves",
           "rebalance"]
