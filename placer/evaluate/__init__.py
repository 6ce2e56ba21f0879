"""The evaluator: the specification of what a placement costs.

``evaluate(placement, routing, topology, model, params) -> Evaluation`` replays
per-token routing (or batches sampled from aggregated statistics) through a dispatch
policy and a communication mode, and reports hot-shard load, traffic and time with the
engines' own metric definitions.  ``window_hot_shard`` and ``expected_remote_copies``
are the exact closed forms planners optimise; ``time_bound`` is the floor of the
estimated times that no placement with a given number of slots per GPU can beat.  The
model is documented in ``docs/evaluate.md`` (the floor in ``docs/planner.md``).
"""

from placer.evaluate.bound import TimeBound, time_bound
from placer.evaluate.core import METRIC_KEYS, Evaluation, evaluate
from placer.evaluate.dispatch import static_dispatch_table
from placer.evaluate.many import PartEvaluation, evaluate_many
from placer.evaluate.params import EvalParams
from placer.evaluate.static import expected_remote_copies, remote_copy_bounds, window_hot_shard
from placer.regime import MODES, POLICIES

__all__ = [
    "METRIC_KEYS",
    "MODES",
    "POLICIES",
    "EvalParams",
    "Evaluation",
    "PartEvaluation",
    "TimeBound",
    "evaluate",
    "evaluate_many",
    "expected_remote_copies",
    "remote_copy_bounds",
    "static_dispatch_table",
    "time_bound",
    "window_hot_shard",
]
