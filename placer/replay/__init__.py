"""Serving over time: a per-token trace replayed step by step under rebalancing policies.

- :mod:`placer.replay.policies`: the policies (``static``, the engines' online ``eplb``,
  ``placer``'s online re-plan, the ``oracle``) and how they are written;
- :mod:`placer.replay.steps`: the trace cut into serving steps, streamed;
- :mod:`placer.replay.decide`: what each policy deploys at a rebalance;
- :mod:`placer.replay.timeline`: every policy's placements over the replay and what its
  rebalances cost (stalls, background copies);
- :mod:`placer.replay.run`: every step of every timeline timed by the evaluator;
- :mod:`placer.replay.result`: the figures, per policy and segment, and the verdict.

docs/replay.md says what is modelled, from which engine sources, and what is not.
"""

from placer.replay.policies import ENGINE_DEFAULTS, Policy, parse_policy, policy_help
from placer.replay.result import PolicyResult, ReplayResult
from placer.replay.run import ReplayParams, replay
from placer.replay.steps import StepSource, open_steps

__all__ = ["ENGINE_DEFAULTS", "Policy", "PolicyResult", "ReplayParams", "ReplayResult",
           "StepSource", "open_steps", "parse_policy", "policy_help", "replay"]
