"""Dispatch when a GPU holds two replicas of one expert (DeepSeek's EPLB makes such plans):
every policy counts replicas per slot, the static tables pick a rank's lowest own slot as
SGLang does, and the evaluator's loads agree with ``gpu_loads``."""

from __future__ import annotations

import numpy as np
from evaluate_fixtures import cluster, random_routing, tiny_model

from placer.evaluate import EvalParams, evaluate, static_dispatch_table
from placer.evaluate.dispatch import choose_slots, random_generator
from placer.placement import Placement, gpu_loads

# 4 experts, 3 GPUs x 2 slots: expert 0 twice on GPU 0 and once on GPU 2
#   GPU 0: slots 0, 1 = experts 0, 0   GPU 1: slots 2, 3 = experts 1, 2
#   GPU 2: slots 4, 5 = experts 3, 0
ROW = [0, 0, 1, 2, 3, 0]


def _placement() -> Placement:
    return Placement(np.array([ROW]), np.array([0]), num_experts=4, num_gpus=3)


def test_round_robin_and_random_use_every_slot_of_a_duplicate():
    pl = _placement()
    n = 3000
    experts = np.zeros(n, dtype=np.int64)  # every selection is expert 0
    args = dict(top_k=1, logical_to_physical=pl.logical_to_physical[0],
                replica_counts=pl.replica_counts[0], static_table=None)
    slots = choose_slots("round_robin", experts, np.zeros(n, dtype=np.int64),
                         np.zeros(n, dtype=np.int64), np.arange(n), rng=None, **args)
    assert np.bincount(slots, minlength=6).tolist() == [1000, 1000, 0, 0, 0, 1000]
    drawn = choose_slots("random", experts, np.zeros(n, dtype=np.int64),
                         np.zeros(n, dtype=np.int64), np.arange(n),
                         rng=random_generator(0, 0), **args)
    per_gpu = np.bincount(drawn // 2, minlength=3) / n
    assert abs(per_gpu[0] - 2 / 3) < 0.03 and per_gpu[1] == 0


def test_static_tables_use_the_lowest_own_slot_and_draw_over_every_slot():
    """SGLang's table: a rank holding the expert uses its first (lowest) slot; a rank
    holding none draws among all its slots, both of GPU 0's included."""
    pl = _placement()
    for policy in ("sglang", "local_first"):
        table = static_dispatch_table(pl, policy=policy)
        assert table[0, 0, 0] == 0 and table[0, 2, 0] == 5
        assert table[0, 1, 0] in (0, 1, 5)


def test_evaluated_loads_match_gpu_loads_under_round_robin():
    """The evaluator's dispatched hot shard (round robin over the slots, whole trace)
    equals ``gpu_loads``' (each expert split evenly over its slots): GPU 0 serves two
    thirds of expert 0, the hottest expert."""
    pl = _placement()
    routing = random_routing(3000, num_experts=4, top_k=1, layer_ids=(0,), seed=1, holes=False)
    result = evaluate(pl, routing, cluster((3,)), tiny_model(layers=(0,), top_k=1),
                      EvalParams(policy="round_robin"))
    load = routing.stats.mean_load
    expected = gpu_loads(pl, load)[0]
    assert expected[0] == load[0, 0] * 2 / 3
    ratio = expected.max() / expected.mean()
    assert abs(result.metrics["hot_shard_ratio_worst"] - ratio) < 1e-3
    assert abs(result.metrics["static_hot_shard_ratio_worst"] - ratio) < 1e-3
