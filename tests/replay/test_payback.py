"""Whether a replay is long enough for a rebalance to pay back its cost."""

from __future__ import annotations

import math

import numpy as np
import pytest

from placer.replay.payback import paybacks, too_short
from placer.replay.result import PolicyResult, ReplayResult
from placer.replay.timeline import Rebalance


def _result(steps: int, interval: int, *, gain: float = 10.0) -> ReplayResult:
    """Static serves 100 µs a step; the online policy stalls 500 µs at step 10 and then
    serves ``100 - gain`` µs a step."""
    zeros = np.zeros(steps)
    static = PolicyResult("static:default", np.full(steps, 100.0), zeros, zeros,
                          np.ones(steps))
    serving = np.full(steps, 100.0)
    serving[10:] -= gain
    stall = zeros.copy()
    stall[10] = 500.0
    online = PolicyResult(f"eplb:window=10,interval={interval}", serving, stall, zeros,
                          np.ones(steps), rebalances=(Rebalance(10, 4, 0.1, 1, 0.0, 5e-4, 10),))
    return ReplayResult((static, online), {"steps": steps})


def test_the_break_even_is_the_cost_over_the_gain_a_step():
    (row,) = paybacks(_result(40, 100))
    assert row.cost_s == pytest.approx(500e-6)
    assert row.gain_us == pytest.approx(10.0)
    assert row.steps == pytest.approx(50.0)  # 500 µs / 10 µs a step
    serving = (10 * 100 + 30 * 90) / 40  # the online policy's mean serving time, µs
    assert row.seconds == pytest.approx(50 * serving / 1e6)
    assert row.first == 10


def test_a_replay_shorter_than_the_break_even_says_so():
    note = too_short(_result(40, 100), 40)
    assert note is not None
    assert note.startswith("this replay (40 steps, about 0.004 s of serving) is too short")
    assert "breaks even 50 steps" in note and "first rebalance at step 10" in note
    # long enough: 10 + 50 steps fit in 100
    assert too_short(_result(100, 100), 100) is None


def test_a_break_even_past_the_interval_is_a_cadence_that_never_pays():
    note = too_short(_result(40, 20), 40)
    assert note is not None and "more than its interval of 20" in note
    assert "no rebalance pays back however long the trace" in note


def test_a_layout_no_faster_than_static_never_breaks_even():
    (row,) = paybacks(_result(40, 100, gain=-1.0))
    assert math.isinf(row.steps) and row.to_dict()["break_even_steps"] is None
    note = too_short(_result(40, 100, gain=-1.0), 40)
    assert note is not None and "no online policy's layout served faster" in note


def test_no_rebalance_no_note():
    result = _result(40, 100)
    static, online = result.policies
    quiet = ReplayResult((static, PolicyResult(online.label, static.serving_us,
                                               static.stall_us, static.link_us,
                                               static.hot_shard)), result.info)
    assert paybacks(quiet) == [] and too_short(quiet, 40) is None
