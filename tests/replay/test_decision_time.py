"""When a decision lands, what is skipped meanwhile, and foresight as a bound, worked out
by hand on the toy cluster of test_replay.py (2 nodes of 2 GPUs, 8 experts, two slots a
GPU; every step of ``ACROSS`` makes EPLB ask for ``[7 0 | 6 1 | 5 2 | 4 3]``, each GPU
loading one expert over its NIC: a 5.03 ms copy).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_replay import ACROSS, EXPERT_BYTES, NIC, WITHIN, _cluster, _placement_file, _replay

from placer.regime import Regime

COPY_US = EXPERT_BYTES / NIC * 1e6


def _step_us(steps: int) -> float:
    """How long a step of ``ACROSS`` lasts under the engines' layout (every step the same
    load, so the same time): the replay's own timing of it."""
    static = _replay([ACROSS] * steps, ["static:default"], _cluster()).policies[0]
    assert np.ptp(static.serving_us) == pytest.approx(0.0, abs=1e-9)
    return float(static.serving_us[0])


def test_a_decision_of_three_steps_lands_three_steps_later():
    steps = 10
    step_us = _step_us(steps)
    # due at step 4 (its window is step 3); deciding takes 2.5 steps of serving, so the
    # decision lands at the first step that starts after it: step 7, not 4
    decide_ms = 2.5 * step_us / 1e3
    late, instant, static = _replay(
        [ACROSS] * steps,
        [f"eplb:window=1,interval=4,first=4,async,decide-ms={decide_ms:.6f}",
         "eplb:window=1,interval=4,first=4,async,decide-ms=0", "static:default"],
        _cluster()).policies
    (rebalance,) = late.rebalances[:1]
    assert (rebalance.due_step, rebalance.step, rebalance.done_step) == (4, 7, 8)
    assert rebalance.decision_s == pytest.approx(decide_ms / 1e3)
    assert instant.rebalances[0].step == instant.rebalances[0].due_step == 4
    # the old layout serves while it decides (steps 4-6) and while it copies (step 7);
    # the copy lengthens step 7, the new layout serves from step 8
    np.testing.assert_allclose(late.serving_us[:8], static.serving_us[:8], rtol=1e-12)
    np.testing.assert_allclose(late.extra_us, [COPY_US if s == 7 else 0.0
                                               for s in range(steps)], rtol=1e-12)
    np.testing.assert_allclose(late.serving_us[8:], instant.serving_us[8:], rtol=1e-12)
    assert late.serving_us[8] < static.serving_us[8]
    np.testing.assert_array_equal(late.stall_us, np.zeros(steps))


def test_a_rebalance_due_while_one_decides_is_skipped():
    steps = 8
    decide_ms = 2.5 * _step_us(steps) / 1e3
    # due at 2: lands at 5, copies during 5, done at 6; due at 4: mid-decision, skipped;
    # due at 6: decided (the window, step 5, asks for the layout already deployed)
    (policy,) = _replay([ACROSS] * steps,
                        [f"eplb:window=1,interval=2,async,decide-ms={decide_ms:.6f}"],
                        _cluster()).policies
    assert [(r.due_step, r.step, r.done_step) for r in policy.rebalances] == [(2, 5, 6)]
    assert policy.skipped == (4,)
    assert policy.figures()["skipped"] == 1.0
    assert policy.figures(0, 4)["skipped"] == 0.0


def test_a_synchronous_decision_stops_serving_instead():
    steps = 4
    (policy,) = _replay([ACROSS] * steps, ["eplb:window=1,interval=2,decide-ms=3"],
                        _cluster()).policies
    (rebalance,) = policy.rebalances
    assert (rebalance.due_step, rebalance.step) == (2, 2)
    # at step 2: 3 ms of deciding (one layer), then the copy; nothing at step 0 (no load)
    np.testing.assert_allclose(policy.stall_us, [0.0, 0.0, 3e3 + COPY_US, 0.0], rtol=1e-12)


def test_the_oracle_is_never_above_a_row_of_its_cadence():
    # the load alternates, so a layout fitted on a 2-step interval's sum is a compromise
    # that other rows can beat
    steps = [ACROSS, WITHIN, ACROSS, ACROSS, WITHIN, ACROSS]
    plan = f"static:{_placement_file([7, 0, 6, 1, 5, 2, 4, 3])}"
    others = [plan, "static:default", "eplb:window=1,interval=2,decide-ms=0",
              "eplb:window=2,interval=2,async,decide-ms=0",
              "placer:window=2,interval=2,decide-ms=0,horizon=1000"]
    regime = Regime("vllm", "decode", tokens_per_gpu=1)
    result = _replay(steps, [*others, "oracle:interval=2"], _cluster(), regime)
    (own,) = _replay(steps, ["oracle:interval=2"], _cluster(), regime).policies
    oracle = result.oracle
    assert oracle is not None
    rows = result.policies[:-1]
    for first in range(0, len(steps), 2):
        # each interval: the fastest of its own fitted layout and what every row served
        expected = min(p.serving_us[first : first + 2].sum() for p in (own, *rows))
        assert oracle.serving_us[first : first + 2].sum() == pytest.approx(expected,
                                                                          rel=1e-12)
    for row in rows:
        assert oracle.figures()["step_mean_us"] <= row.figures()["step_mean_us"], row.label
        assert result.versus_oracle(row) >= 0
    # on the last interval the layout fitted on its sum is beaten by the user's plan
    # (fitted on ACROSS alone): the oracle took the plan there
    assert own.serving_us[4:6].sum() > rows[0].serving_us[4:6].sum()
    assert oracle.serving_us[4:6].sum() == pytest.approx(rows[0].serving_us[4:6].sum())


def test_online_policies_start_from_the_users_plan():
    plan = f"static:{_placement_file([7, 0, 6, 1, 5, 2, 4, 3])}"
    static, online, oracle = _replay(
        [ACROSS, ACROSS], [plan, "eplb:window=1,interval=5,decide-ms=0", "oracle:interval=2"],
        _cluster()).policies
    assert online.start == plan and oracle.start == plan and static.start == "-"
    np.testing.assert_allclose(online.serving_us, static.serving_us, rtol=1e-12)
    default = _replay([ACROSS, ACROSS], ["eplb:window=1,interval=5"], _cluster()).policies[0]
    assert default.start == "default"


def test_background_copies_retimed_at_another_share():
    (policy,) = _replay([ACROSS] * 3, ["eplb:window=1,interval=1,async,decide-ms=0"],
                        _cluster(async_share=1.0)).policies
    for share in (0.25, 0.5):
        at = policy.at_share(share)
        np.testing.assert_allclose(at.step_us, policy.serving_us + share * policy.link_us,
                                   rtol=1e-12)
    np.testing.assert_allclose(policy.link_us, [0.0, COPY_US, 0.0], rtol=1e-12)


def test_the_verdict_says_when_the_share_of_background_copies_flips_it():
    from placer.replay.result import PolicyResult, ReplayResult

    flat = np.zeros(4)
    static = PolicyResult("static:default", np.full(4, 100.0), flat, flat, flat)
    # 90 µs a step, and one copy of 60 µs of link time: 90 + 15 x share on average
    eplb = PolicyResult("eplb:window=1,interval=2,async", np.full(4, 90.0), flat,
                        np.array([0.0, 60.0, 0.0, 0.0]), flat, async_share=1.0)
    result = ReplayResult((static, eplb))
    assert [(s, p.label) for s, p in result.by_share()] == [
        (0.25, eplb.label), (0.5, eplb.label), (1.0, static.label)]
    line = result.share_verdict()
    assert "flips" in line and "0.25: eplb:window=1,interval=2,async (93.8 µs)" in line
    assert "1: static:default (100.0 µs)" in line
    # a copy of 20 µs: 90 + 5 x share stays below 100 at every share
    light = PolicyResult(eplb.label, eplb.serving_us, flat, np.array([0.0, 20.0, 0.0, 0.0]),
                         flat)
    assert ReplayResult((static, light)).share_verdict().startswith(
        "verdict over async_share 0.25, 0.5, 1: holds, eplb:window=1,interval=2,async")
