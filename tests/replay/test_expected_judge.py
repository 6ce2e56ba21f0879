"""The online decision's judge: a step with the window's load in expectation."""

from __future__ import annotations

import numpy as np
from evaluate_fixtures import cluster, tiny_model

from placer.evaluate.batches import Batches
from placer.evaluate.costs import CostModel
from placer.evaluate.params import EvalParams
from placer.evaluate.simulate import simulate
from placer.placement import Placement
from placer.regime import Regime
from placer.replay.decide import expected_layer_times


def test_a_step_that_is_exactly_its_expectation_is_timed_as_simulate_times_it():
    # 4 experts on 4 GPUs (one slot each), top-2, 4 tokens per GPU: every source rank
    # sends each expert exactly 2 selections, so the expected step is a real one
    model = tiny_model(num_experts=4, top_k=2, layers=(0,))
    topology = cluster((2, 2))
    placement = Placement(np.array([[2, 0, 3, 1]]), np.array([0]), 4, 4)
    pairs = np.array([[0, 1], [2, 3], [0, 2], [1, 3]])  # each expert twice
    ids = np.tile(pairs, (4, 1))  # 16 tokens: 4 per source rank
    source = np.repeat(np.arange(4), 4)
    batches = Batches(np.zeros(16, dtype=np.int64), source, np.tile(np.arange(4), 4), 1)
    regime = Regime("vllm", "decode", tokens_per_gpu=4)
    params = EvalParams(policy="round_robin", mode="low_latency", batch_tokens=16)
    sim = simulate(placement, batches, lambda row: ids,
                   CostModel.of(topology, model, "low_latency", "bf16"), model, params)
    load = np.bincount(ids.ravel(), minlength=4)[None].astype(float) * 7  # any scale
    expected = expected_layer_times(placement, load, topology, model, regime, "bf16")
    assert expected is not None
    np.testing.assert_allclose(expected, sim.layer_time_us[0], rtol=1e-12)


def test_replicas_split_an_expert_evenly_and_a_hot_gpu_is_slower():
    model = tiny_model(num_experts=4, top_k=2, layers=(0,))
    topology = cluster((4,))
    load = np.array([[40.0, 10.0, 10.0, 20.0]])
    regime = Regime("vllm", "decode", tokens_per_gpu=8)
    crowded = Placement(np.array([[0, 3, 1, 2, 0, 1, 2, 3]]), np.array([0]), 4, 4)
    spread = Placement(np.array([[0, 1, 0, 2, 3, 1, 2, 3]]), np.array([0]), 4, 4)
    t_crowded = expected_layer_times(crowded, load, topology, model, regime, "bf16")
    t_spread = expected_layer_times(spread, load, topology, model, regime, "bf16")
    assert t_crowded is not None and t_spread is not None
    # crowded: GPU 0 holds both replicas of the hottest expert and half of expert 3
    assert t_spread[0] < t_crowded[0]


def test_normal_mode_is_left_to_the_sampled_judge():
    model = tiny_model(num_experts=4, top_k=2, layers=(0,))
    placement = Placement(np.array([[0, 1, 2, 3]]), np.array([0]), 4, 4)
    assert expected_layer_times(placement, np.ones((1, 4)), cluster((4,)), model,
                                Regime("vllm", "prefill"), "bf16") is None
