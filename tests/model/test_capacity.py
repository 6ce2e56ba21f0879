"""placer.model.capacity: the memory budget, checked by hand on two clusters."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placer.constants import GB, RUNTIME_OVERHEAD_GB
from placer.errors import InfeasibleError, UsageError
from placer.model import load_model
from placer.model.capacity import plan_capacity
from placer.topology import load_topology, topology_from_dict


@pytest.fixture(scope="module")
def deepseek():
    """DeepSeek-V3: 58 MoE layers x 256 experts, FP8 by default."""
    return load_model("deepseek-v3")


@pytest.fixture(scope="module")
def mixtral():
    """Mixtral 8x7B: 32 MoE layers x 8 experts, BF16 by default."""
    return load_model("mixtral-8x7b")


def test_deepseek_v3_fp8_on_4x_dgx_h100_by_hand(deepseek):
    """slot = 58 x (44,040,192 + 10,752) B; non-expert FP8 = 15,156,838,400 x 1 +
    1,960,809,984 x 2 B; available = 80 - 19.078458368 - 4 - 20 = 36.921541632 GB;
    S = floor(36.921541632e9 / 2,554,954,752) = 14; R = 32 x 14 - 256 = 192."""
    c = plan_capacity(deepseek, load_topology("4x-dgx-h100"))
    assert RUNTIME_OVERHEAD_GB == 4.0
    assert c.dtype == "fp8"
    assert c.slot_bytes == 58 * 44_050_944 == 2_554_954_752
    assert c.non_expert_gb == pytest.approx(19.078458368)
    assert c.kv_reserve_gb.tolist() == [20.0] * 32
    assert c.available_gb[0] == pytest.approx(36.921541632)
    assert c.slots_per_gpu == 14 and c.min_slots_per_gpu == 8
    assert c.max_redundant == 192
    assert c.expert_gb_per_gpu == pytest.approx(14 * 2.554954752)
    assert c.kv_left_gb == pytest.approx(80 - 19.078458368 - 4 - 14 * 2.554954752)
    assert c.kv_left_gb_at(8) == pytest.approx(80 - 19.078458368 - 4 - 8 * 2.554954752)


def test_mixtral_on_dgx_h100_by_hand(mixtral):
    """slot = 32 x 352,321,536 B = 11.274 GB; non-expert BF16 = 2 x 1,605,636,096 B;
    available = 80 - 3.211272192 - 4 - 20 = 52.788727808 GB -> S = 4, R = 8 x 4 - 8 = 24."""
    c = plan_capacity(mixtral, load_topology("dgx-h100"))
    assert c.dtype == "bf16"
    assert c.slot_bytes == 32 * 352_321_536
    assert c.non_expert_gb == pytest.approx(3.211272192)
    assert c.slots_per_gpu == 4 and c.max_redundant == 24 and c.min_slots_per_gpu == 1
    assert c.kv_left_gb == pytest.approx(80 - 3.211272192 - 4 - 4 * 11.274289152)
    fp8 = plan_capacity(mixtral, load_topology("dgx-h100"), "fp8", kv_reserve_gb=10)
    # FP8 slot = 32 x (176,160,768 + 3 x 112 x 32 x 4) B = 5.638 GB; non-expert FP8
    non_expert = (1_605_636_096 - 263_458_816) + 2 * 263_458_816
    assert fp8.slot_bytes == 32 * (176_160_768 + 43_008)
    assert fp8.slots_per_gpu == math.floor((80e9 - non_expert - 4e9 - 10e9) / fp8.slot_bytes)


def test_reserve_options(mixtral):
    topo = load_topology("dgx-h100")
    by_gb = plan_capacity(mixtral, topo, kv_reserve_gb=0)
    by_fraction = plan_capacity(mixtral, topo, kv_reserve_fraction=0.5)
    assert by_gb.slots_per_gpu == 6  # floor((80 - 3.21 - 4) / 11.27)
    assert by_fraction.kv_reserve_gb.tolist() == [40.0] * 8 and by_fraction.slots_per_gpu == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"kv_reserve_gb": 1.0, "kv_reserve_fraction": 0.1},
            "kv_reserve_gb: give the KV-cache reserve once",
        ),
        (
            {"kv_reserve_gb": -1.0},
            "kv_reserve_gb: KV-cache reserve must be zero or more GB, got -1",
        ),
        (
            {"kv_reserve_fraction": 1.0},
            "kv_reserve_fraction: expected a KV-cache reserve fraction in [0, 1), got 1",
        ),
        ({"overhead_gb": -2.0}, "overhead_gb: overhead must be zero or more GB, got -2"),
        ({"tp": 0}, "tp: tp must be at least 1, got 0"),
        ({"dtype": "fp16"}, "dtype: unknown dtype 'fp16'"),
    ],
)
def test_bad_options(mixtral, kwargs, message):
    with pytest.raises(UsageError) as e:
        plan_capacity(mixtral, load_topology("dgx-h100"), **kwargs)
    assert str(e.value) == message


def test_tp_shards_non_expert_weights(deepseek):
    topo = load_topology("4x-dgx-h100")
    one, two = plan_capacity(deepseek, topo), plan_capacity(deepseek, topo, tp=2)
    assert two.non_expert_gb == pytest.approx(one.non_expert_gb / 2)
    assert two.slots_per_gpu == math.floor((80 - 19.078458368 / 2 - 24) / 2.554954752)


def test_does_not_fit_says_why_and_what_would(deepseek):
    with pytest.raises(InfeasibleError) as e:
        plan_capacity(deepseek, load_topology("dgx-h100"))
    assert str(e.value) == (
        "deepseek-v3 (fp8) does not fit on dgx-h100: each of 8 GPUs needs 124.8 GB"
        " (32 slots x 2.55 GB + 19.1 GB non-expert weights + 4.0 GB overhead + 20.0 GB KV"
        " reserve) but node0/gpu0 has 80.0 GB"
    )
    assert e.value.hint == (
        "would fit: at least 19 GPUs like node0/gpu0 (14 slots each; 3 nodes of 8)"
    )


def test_smaller_dtype_and_lower_reserve_are_suggested(deepseek):
    """BF16 DeepSeek-V3 on 4 x DGX H100 needs 8 x 5.109 GB + 34.235 + 4 + 20 GB > 80 GB;
    a reserve of 80 - 34.235 - 4 - 40.869 = 0.895 GB would do; MXFP4 slots of
    58 x 23,396,352 B leave floor(21.765 / 1.357) = 16 slots."""
    with pytest.raises(InfeasibleError) as e:
        plan_capacity(deepseek, load_topology("4x-dgx-h100"), "bf16")
    assert e.value.hint == (
        "would fit: at least 64 GPUs like node0/gpu0 (4 slots each; 8 nodes of 8);"
        " `kv_reserve_gb` 0.8 or less; `dtype` fp8 (14 slots per GPU);"
        " `dtype` mxfp4 (16 slots per GPU)"
    )


def test_non_expert_weights_alone_too_big(deepseek):
    with pytest.raises(InfeasibleError) as e:
        plan_capacity(deepseek, load_topology("8x-l40s-pcie"), "bf16")
    assert e.value.hint == (
        "the non-expert weights alone do not fit: shard them with `tp` or use larger GPUs"
    )


def test_mixed_cluster_is_bounded_by_its_smallest_gpu(mixtral):
    """One H100 node (80 GB) and one H200 node (141 GB): S is the H100's."""
    types = {
        "h100": {"memory_gb": 80, "hbm_gbps": 3350, "bf16_tflops": 989, "fp8_tflops": 1979},
        "h200": {"memory_gb": 141, "hbm_gbps": 4800, "bf16_tflops": 989, "fp8_tflops": 1979},
    }
    fabric = {"kind": "nvswitch", "gbps": 450}
    topo = topology_from_dict(
        {
            "name": "mixed",
            "gpu_types": types,
            "nodes": [
                {"name": "a", "gpus": 4, "gpu_type": "h200", "fabric": fabric, "nic_gbps": 50},
                {"name": "b", "gpus": 4, "gpu_type": "h100", "fabric": fabric, "nic_gbps": 50},
            ],
            "network": {"kind": "infiniband"},
        }
    )
    c = plan_capacity(mixtral, topo, kv_reserve_gb=20)
    assert c.limiting_gpu == 4 and topo.gpu_names[4] == "b/gpu0"
    assert c.slots_per_gpu == plan_capacity(mixtral, load_topology("dgx-h100")).slots_per_gpu
    assert c.kv_left_gb == pytest.approx(c.kv_left_gb_at(c.slots_per_gpu))
    assert c.to_dict()["limiting_gpu"] == "b/gpu0"


@settings(max_examples=30, deadline=None)
@given(reserve=st.floats(0, 50), overhead=st.floats(0, 8))
def test_slots_fill_but_never_exceed_the_budget(mixtral, reserve, overhead):
    topo = load_topology("dgx-h200")
    c = plan_capacity(mixtral, topo, kv_reserve_gb=reserve, overhead_gb=overhead)
    budget = (141 - overhead - reserve) * GB - mixtral.non_expert_bytes()
    assert c.slots_per_gpu * c.slot_bytes <= budget + 1
    assert (c.slots_per_gpu + 1) * c.slot_bytes > budget
    assert c.kv_left_gb >= reserve - 1e-6
    assert np.isclose(c.max_redundant, 8 * c.slots_per_gpu - 8)
