"""When a decision lands: a decision's compute time turned into steps of serving.

A rebalance decided on the window that ends before step ``t`` starts computing when step
``t`` starts; asynchronous, the engine keeps serving meanwhile, and the decision lands at
the first step that starts once its compute time has passed (then its copies start).
How long the steps meanwhile take is the evaluator's: each step's MoE time under the
placement that serves it, estimated from the recorded load (decode: the selections
split evenly over the source GPUs and over each expert's replicas, every layer timed in
one pass of the traffic and phase models, as :func:`placer.evaluate.counted.times_of_loads`
times the replay's steps, each run of :data:`BLOCK_STEPS` steps at its mean load; other
regimes: the placement's sampled p99 layer times on the decision's window, for every
step).

A trace of fewer layers than the model gives both the step's time and the decision's
time of its own layers (a decision's time grows with the layers it re-places); both
scale to the whole model by the same factor, so the steps a decision takes are the
same.
"""

from __future__ import annotations

import numpy as np

from placer.evaluate.costs import CostModel
from placer.evaluate.counted import RunLoads, supports, times_of_loads
from placer.evaluate.params import regime_params
from placer.evaluate.traffic import Segments
from placer.placement import Placement
from placer.replay.decide import judged_layer_times, window_stats
from placer.replay.setting import Setting

#: Consecutive steps timed together, at their mean load, while a decision computes (a
#: step's time in expectation varies little from one step to the next; each estimate of
#: a 58-layer step costs about 35 ms).
BLOCK_STEPS = 16


def step_seconds(placement: Placement, loads: np.ndarray, setting: Setting) -> np.ndarray:
    """``[steps]`` MoE time, seconds, of steps whose recorded load is ``loads``
    (``[steps, layers, E]``) served by ``placement`` (module docstring)."""
    params = regime_params(setting.regime, placement.num_gpus, dtype=setting.dtype)
    steps = loads.shape[0]
    if not supports(params.policy, params.mode):
        window = loads.sum(axis=0)
        if not window.any():
            return np.zeros(steps)
        stats = window_stats(window, placement.layer_ids, setting.model.top_k)
        per_layer = judged_layer_times(placement, stats, setting.topology, setting.model,
                                       setting.regime, {})
        return np.full(steps, float(np.nansum(per_layer)) / 1e6)
    costs = CostModel.of(setting.topology, setting.model, params.mode, setting.dtype)
    gpus, slots = placement.num_gpus, placement.num_physical
    segments = Segments(np.zeros(0, dtype=np.int64), np.zeros(gpus, dtype=np.int64),
                        np.arange(gpus, dtype=np.int64), 1)
    counts_of = placement.replica_counts
    parts, where = [], []
    for step in range(steps):
        for row in range(placement.num_layers):
            load = loads[step, row].astype(np.float64)
            if not load.any():
                continue
            p2l = placement.physical_to_logical[row]
            split = load[p2l] / counts_of[row][p2l] / gpus  # each source GPU's share
            parts.append(RunLoads.of(np.broadcast_to(split, (gpus, slots)).copy(), segments,
                                     gpus))
            where.append(step)
    out = np.zeros(steps)
    if parts:
        times = np.array([t[0] for t, _ in times_of_loads(parts, costs)])
        np.add.at(out, np.asarray(where), times.reshape(-1) / 1e6)
    return out


def landing_step(placement: Placement, loads: np.ndarray, setting: Setting, step: int,
                 seconds: float) -> int:
    """The first step that starts once ``seconds`` of serving have passed since step
    ``step`` started, ``placement`` serving meanwhile (``loads.shape[0]`` when the replay
    ends first)."""
    if seconds <= 0:
        return step
    steps = loads.shape[0]
    elapsed = 0.0
    at = step
    while at < steps:
        stop = min(steps, at + BLOCK_STEPS)
        block = step_seconds(placement, loads[at:stop].mean(axis=0, keepdims=True), setting)
        ends = elapsed + np.cumsum(np.repeat(block, stop - at))
        done = np.flatnonzero(ends >= seconds)
        if done.size:
            return at + int(done[0]) + 1
        elapsed = float(ends[-1])
        at = stop
    return steps

