"""The evaluator against a plain-loop, per-token simulation written independently here.

Each case replays a small trace token by token: picks the replica by the policy's
definition, counts GPU loads, copies per link (with DeepEP's relays in normal mode),
and times with the documented formulas; the vectorised evaluator must agree exactly.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from evaluate_fixtures import cluster, placement, random_routing, tiny_model

from placer.evaluate import EvalParams, evaluate, static_dispatch_table

BATCH = 8


def _simulate(pl, routing, topo, model, policy, mode, seed=0):
    """Plain loops: per-layer GPU load, per-(batch, layer) hot shard, link copies by class,
    remote deliveries, and layer time per batch."""
    trace = routing.trace
    num_gpus = pl.num_gpus
    slots_per_gpu = pl.slots_per_gpu
    node = [int(n) for n in topo.node_of_gpu]
    members = {}
    for g, n in enumerate(node):
        members.setdefault(n, []).append(g)
    table = static_dispatch_table(pl, seed) if policy == "local_first" else None
    steps = sorted(set(trace.step.tolist()))
    act = model.activation_bytes("bf16")
    comb = model.hidden_size * 2
    out = {"load": np.zeros((pl.num_layers, num_gpus)), "intra": [0] * pl.num_layers,
           "inter": [0] * pl.num_layers, "remote_gpu": [0] * pl.num_layers,
           "remote_node": [0] * pl.num_layers, "tokens": [0] * pl.num_layers,
           "hot": np.full((len(steps), pl.num_layers), np.nan),
           "time": np.full((len(steps), pl.num_layers), np.nan)}
    for row in range(pl.num_layers):
        p2l = [int(x) for x in pl.physical_to_logical[row]]
        for b, step in enumerate(steps):
            tokens = [t for t in range(trace.num_tokens) if trace.step[t] == step]
            load = [0] * num_gpus
            slot_load = [0] * pl.num_physical
            copies = [[0] * num_gpus for _ in range(num_gpus)]
            seen_on_rank = {}
            any_token = False
            for position, t in enumerate(tokens):
                r = int(trace.rank[t])
                src = r % num_gpus if r >= 0 else position % num_gpus
                rank_pos = seen_on_rank.get(src, 0)
                seen_on_rank[src] = rank_pos + 1
                dests = []
                for kpos, e in enumerate(trace.topk_ids[t, row]):
                    e = int(e)
                    if e < 0:
                        continue
                    replicas = [s for s in range(pl.num_physical) if p2l[s] == e]
                    if policy == "round_robin":
                        slot = replicas[(rank_pos * model.top_k + kpos) % len(replicas)]
                    else:
                        own = [s for s in replicas if s // slots_per_gpu == src]
                        slot = own[0] if own else int(table[row, src, e])
                        assert slot in replicas
                    d = slot // slots_per_gpu
                    load[d] += 1
                    slot_load[slot] += 1
                    dests.append(d)
                if not dests:
                    continue
                any_token = True
                out["tokens"][row] += 1
                if mode == "low_latency":
                    for d in dests:
                        if d != src:
                            copies[src][d] += 1
                            out["remote_gpu"][row] += 1
                            out["remote_node"][row] += node[d] != node[src]
                    continue
                for d in sorted(set(dests)):
                    if d != src:
                        out["remote_gpu"][row] += 1
                    if d != src and node[d] == node[src]:
                        copies[src][d] += 1
                for n in sorted({node[d] for d in dests} - {node[src]}):
                    out["remote_node"][row] += 1
                    local_index = members[node[src]].index(src)
                    relay = members[n][local_index % len(members[n])]
                    copies[src][relay] += 1
                    for d in sorted({d for d in dests if node[d] == n}):
                        if d != relay:
                            copies[relay][d] += 1
            if not any_token:
                continue
            for g in range(num_gpus):
                out["load"][row, g] += load[g]
                for h in range(num_gpus):
                    if copies[g][h]:
                        key = "intra" if node[g] == node[h] else "inter"
                        out[key][row] += copies[g][h]
            mean = sum(load) / num_gpus
            out["hot"][b, row] = max(load) / mean
            out["time"][b, row] = max(
                _phase(copies, g, act, topo) + _compute(slot_load, g, pl, model, topo)
                + _phase([list(c) for c in zip(*copies, strict=True)], g, comb, topo)
                for g in range(num_gpus)
            )
    return out


def _phase(copies, g, payload, topo):
    """Documented communication time of GPU g for one phase, microseconds."""
    num_gpus = len(copies)
    worst = 0.0
    for c in (1, 2):
        sent = sum(copies[g][h] * payload for h in range(num_gpus) if topo.link_class[g, h] == c)
        recv = sum(copies[h][g] * payload for h in range(num_gpus) if topo.link_class[h, g] == c)
        if max(sent, recv):
            worst = max(worst, max(sent, recv) / topo.injection_gbps[g, c])
    latency = 0.0
    for h in range(num_gpus):
        if h != g and (copies[g][h] or copies[h][g]):
            worst = max(worst, copies[g][h] * payload / topo.bandwidth_gbps[g, h],
                        copies[h][g] * payload / topo.bandwidth_gbps[h, g])
            latency = max(latency, topo.latency_us[g, h])
    return worst / 1e3 + latency


def _compute(slot_load, g, pl, model, topo):
    gpu = topo.gpu_type_of_gpu[g]
    total = 0.0
    for s in range(g * pl.slots_per_gpu, (g + 1) * pl.slots_per_gpu):
        n = slot_load[s]
        if n:
            weights_us = model.expert_bytes("bf16") / (gpu.hbm_gbps * 1e3)
            flops_us = 6 * model.hidden_size * model.moe_intermediate_size * n / (
                gpu.tflops("bf16") * 1e6)
            total += max(weights_us, flops_us)
    return total


CASES = {
    # 2 GPUs, 4 experts, 3 slots each: experts 0 and 3 replicated
    "one-node": (cluster((2,), pair_gbps=40.0),
                 [[0, 1, 3, 2, 3, 0], [1, 2, 0, 3, 0, 1]], 2),
    # 2 nodes x 2 GPUs, 2 slots each: every expert twice
    "two-nodes": (cluster((2, 2)), [[0, 1, 2, 3, 0, 2, 1, 3], [0, 1, 2, 3, 1, 0, 3, 2]], 4),
    # 2 nodes x 2 GPUs without replicas: random is deterministic
    "two-nodes-single": (cluster((2, 2)), [[0, 1, 2, 3], [3, 2, 1, 0]], 4),
}


@pytest.mark.parametrize("mode", ["normal", "low_latency"])
@pytest.mark.parametrize("policy", ["round_robin", "local_first"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_evaluator_matches_per_token_loops(case, policy, mode):
    topo, rows, num_gpus = CASES[case]
    pl = placement(rows, num_gpus)
    model = tiny_model()
    routing = random_routing(48, batch=BATCH, ranks=num_gpus, seed=3)
    ev = evaluate(pl, routing, topo, model, EvalParams(policy=policy, mode=mode))
    ref = _simulate(pl, routing, topo, model, policy, mode)
    tokens = np.array(ref["tokens"], dtype=float)
    np.testing.assert_array_equal(ev.gpu_load, ref["load"])
    np.testing.assert_allclose(ev.batch_hot_shard, ref["hot"], equal_nan=True)
    np.testing.assert_allclose(ev.per_layer["copies_intra"], np.array(ref["intra"]) / tokens)
    np.testing.assert_allclose(ev.per_layer["copies_inter"], np.array(ref["inter"]) / tokens)
    np.testing.assert_allclose(ev.per_layer["remote_copies_gpu"],
                               np.array(ref["remote_gpu"]) / tokens)
    np.testing.assert_allclose(ev.per_layer["remote_copies_node"],
                               np.array(ref["remote_node"]) / tokens)
    per_copy = model.activation_bytes("bf16") + 2 * model.hidden_size
    np.testing.assert_allclose(ev.per_layer["bytes_inter"],
                               np.array(ref["inter"]) * per_copy / tokens)
    np.testing.assert_allclose(ev.layer_time_us, ref["time"], rtol=1e-12, equal_nan=True)
    assert ev.metrics["num_tokens"] == 48


@pytest.mark.parametrize("mode", ["normal", "low_latency"])
def test_random_policy_without_replicas_matches_loops(mode):
    """With one replica per expert every policy serves the same slot."""
    topo, rows, num_gpus = CASES["two-nodes-single"]
    pl = placement(rows, num_gpus)
    model = tiny_model()
    routing = random_routing(40, batch=BATCH, seed=5)
    ev = evaluate(pl, routing, topo, model, EvalParams(policy="random", mode=mode, seed=9))
    ref = _simulate(pl, routing, topo, model, "round_robin", mode)
    np.testing.assert_array_equal(ev.gpu_load, ref["load"])
    np.testing.assert_allclose(ev.layer_time_us, ref["time"], equal_nan=True)


def test_random_policy_splits_evenly_and_is_seeded():
    """Each selection of a replicated expert picks a replica uniformly: over many tokens
    both replicas of expert 0 get about half its load; the same seed repeats exactly."""
    topo = cluster((2,))
    pl = placement([[0, 1, 2, 0, 3, 1], [0, 1, 2, 0, 3, 1]], 2)
    routing = random_routing(4000, batch=64, seed=1, holes=False)
    ev = evaluate(pl, routing, topo, tiny_model(), EvalParams(policy="random", seed=4))
    again = evaluate(pl, routing, topo, tiny_model(), EvalParams(policy="random", seed=4))
    other = evaluate(pl, routing, topo, tiny_model(), EvalParams(policy="random", seed=5))
    np.testing.assert_array_equal(ev.gpu_load, again.gpu_load)
    assert not np.array_equal(ev.gpu_load, other.gpu_load)
    load = routing.stats.mean_load[0]
    expected = np.array([load[0] / 2 + load[1] / 2 + load[2], load[0] / 2 + load[3] + load[1] / 2])
    np.testing.assert_allclose(ev.gpu_load[0], expected, rtol=0.05)


def test_static_dispatch_table_prefers_own_replica_and_shares_fairly():
    """SGLang static: a GPU with a replica uses it; the others split evenly over replicas."""
    pl = placement([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7]], num_gpus=6, num_experts=8,
                   layer_ids=(0,))
    table = static_dispatch_table(pl, seed=0)
    gpu_of = table // pl.slots_per_gpu
    # expert 0 lives on GPU 0 (slot 0) and GPU 2 (slot 4)
    assert table[0, 0, 0] == 0 and table[0, 2, 0] == 4
    others = [int(gpu_of[0, g, 0]) for g in (1, 3, 4, 5)]
    assert sorted(others) == [0, 0, 2, 2]
    # expert 4 has one replica: everyone uses it
    assert set(table[0, :, 4].tolist()) == {8}
    np.testing.assert_array_equal(table, static_dispatch_table(pl, seed=0))


def test_round_robin_uses_the_flat_position_on_each_rank():
    """vLLM numbers the (token, k) selections of a rank: token j's k-th pick uses replica
    ``(j * top_k + k) mod r``.  With top_k = 1 and two replicas tokens alternate."""
    topo = cluster((2,))
    model = tiny_model(top_k=1, layers=(0,))
    pl = placement([[0, 1, 2, 0, 3, 1]], 2, layer_ids=(0,))
    ids = np.zeros((8, 1, 1), dtype=np.int32)  # every token picks expert 0
    from evaluate_fixtures import routing_of

    routing = routing_of(ids, np.array([0]), np.zeros(8, np.int64), np.zeros(8, np.int64), 4)
    ev = evaluate(pl, routing, topo, model, EvalParams(policy="round_robin"))
    assert ev.gpu_load[0].tolist() == [4.0, 4.0]
    assert math.isclose(ev.metrics["remote_copies_per_token_gpu"], 0.5)
