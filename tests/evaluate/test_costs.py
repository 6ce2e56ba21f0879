"""The cost model (placer.evaluate.costs): its figures worked out by hand on a small
cluster, the floors' rates never above any GPU's own, and the simulation's compute time
read from it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from evaluate_fixtures import GPU, cluster, random_routing, tiny_model

from placer.calibrate.fit import gemm_model, gemm_time_us
from placer.calibrate.timings import GemmTiming
from placer.evaluate import EvalParams, evaluate
from placer.evaluate.costs import CostModel, copy_us, expert_ffn_flops
from placer.placement import Placement
from placer.topology import GpuType, load_topology

#: A GPU twice as fast as the fixtures' in both HBM and FLOPS.
FAST = GpuType("fast", memory_gb=80.0, hbm_gbps=2000.0, bf16_tflops=200.0, fp8_tflops=400.0)


def test_unit_costs_by_hand():
    """hidden 64, ffn 32, BF16 on 1000 GB/s and 100 TFLOPS (times the calibration)."""
    topology = cluster((2, 2))
    model = tiny_model()
    costs = CostModel.of(topology, model, "low_latency", "bf16")
    assert costs.dtype == "bf16" and costs.mode == "low_latency"
    assert costs.activation_bytes == 64 * 2 and costs.combine_bytes == 64 * 2
    assert costs.bytes_per_copy == 256
    assert costs.expert_bytes == 3 * 64 * 32 * 2
    assert costs.flops_per_token == 6 * 64 * 32 == expert_ffn_flops(64, 32)
    # 1 GB/s moves 1e3 bytes a microsecond; 1 TFLOPS runs 1e6 flops a microsecond
    hbm = 1000.0 * topology.hbm_efficiency
    tflops = 100.0 * topology.flops_efficiency
    np.testing.assert_allclose(costs.weight_us, 12288 / (hbm * 1e3), rtol=1e-15)
    np.testing.assert_allclose(costs.token_us, 12288 / (tflops * 1e6), rtol=1e-15)
    assert costs.intra.sum() == 4 and costs.inter.sum() == 8  # 2 pairs a node, both ways


def test_dtype_defaults_to_the_models_and_rdma_sends_every_copy_through_the_nics():
    topology = cluster((2, 2))
    model = replace(tiny_model(), default_dtype="fp8")
    costs = CostModel.of(topology, model, "low_latency_rdma")
    assert costs.dtype == "fp8"
    assert costs.expert_bytes == model.expert_bytes("fp8")
    assert not costs.intra.any() and costs.inter.sum() == 12
    np.testing.assert_array_equal(costs.injection_over(1), np.zeros(4))
    assert costs.peers_over(2).all()


def test_the_floors_rates_are_never_above_any_gpus_own():
    """Two GPU types: the floors take the faster one's rates, exactly the least of the
    per-GPU figures the simulation charges."""
    topology = cluster((2, 2))
    topology = replace(topology, gpu_type_of_gpu=(GPU, FAST, GPU, GPU))
    costs = CostModel.of(topology, tiny_model(), "low_latency", "bf16")
    assert costs.fastest_weight_us == costs.weight_us.min() == costs.weight_us[1]
    assert costs.fastest_token_us == costs.token_us.min() == costs.token_us[1]
    assert costs.weight_us[0] == pytest.approx(2 * costs.weight_us[1], rel=1e-15)


def test_a_copy_at_the_fastest_link_and_none_without_one():
    assert copy_us(2000.0, np.array([0.0, 100.0, 400.0, np.inf])) == pytest.approx(5e-3)
    assert copy_us(2000.0, np.array([0.0, np.inf])) == 0.0
    assert copy_us(2000.0, np.zeros(0)) == 0.0


def test_the_simulation_charges_the_cost_models_compute():
    """One GPU holding every expert: no copies, so each batch's layer time is the slots'
    ``max(weight_us, tokens x token_us)`` summed, from the cost model."""
    model = replace(tiny_model(num_experts=4, top_k=2, layers=(0,)), hidden_size=2048,
                    moe_intermediate_size=4096)
    routing = random_routing(64, num_experts=4, top_k=2, layer_ids=(0,), batch=16, seed=3,
                             holes=False)
    topology = cluster((1,))
    placement = Placement(np.array([[0, 1, 2, 3]]), np.array([0]), 4, 1)
    params = EvalParams(policy="round_robin", mode="low_latency", batch_tokens=16)
    result = evaluate(placement, routing, topology, model, params)
    costs = CostModel.of(topology, model, "low_latency", params.dtype)
    ids = routing.trace.topk_ids[:, 0, :]
    for b in range(4):
        load = np.bincount(ids[b * 16:(b + 1) * 16].ravel(), minlength=4)
        expected = np.where(load > 0, np.maximum(costs.weight_us[0], load * costs.token_us[0]),
                            0.0).sum()
        assert result.layer_time_us[b, 0] == pytest.approx(expected, rel=1e-12)


def test_calibrations_gemm_time_is_the_cost_models():
    h800 = load_topology("dgx-h800")
    row = GemmTiming(32, 300, 7168, 2048, "fp8", 1.0)
    costs = CostModel.of(h800, gemm_model(row), dtype="fp8")
    expected = 32 * max(costs.weight_us[0], 300 * costs.token_us[0])
    assert gemm_time_us(row, h800) == pytest.approx(expected, rel=1e-12)
