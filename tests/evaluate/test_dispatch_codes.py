"""The engines' replica choice, written out by hand from their code.

vLLM (``_eplb_map_and_record_i32_kernel``, vllm/distributed/eplb/cuda_platform_backend.py):
replica ``((token_row * 2654435769) & 0xFFFFFFFF) % count``.  TensorRT-LLM
(``moeComputeRouteKernel``, cpp/tensorrt_llm/kernels/moeLoadBalance/moeLoadBalanceKernels.cu):
replica ``(rank_in_block + block + ep_rank) % count`` over the rank's flat (token, k)
entries in blocks of 1,024.  vLLM before PR #40810: ``(token_row * top_k + k) % count``.
"""

from __future__ import annotations

import numpy as np
import pytest

from placer.evaluate.dispatch import choose_slots, dispatch_codes
from placer.regime import ENGINE_POLICY, Regime

#: One layer, 4 experts on 3 GPUs x 2 slots: expert 0 in slots 0, 2, 4 (3 replicas),
#: expert 1 in slots 1 and 3 (2 replicas), experts 2 and 3 in slots 5 and ... (one each).
#: slot:    0  1  2  3  4  5  6
ROW = np.array([0, 1, 0, 1, 0, 2, 3])
L2P = np.array([[0, 2, 4], [1, 3, -1], [5, -1, -1], [6, -1, -1]])
COUNTS = np.array([3, 2, 1, 1])


def _slots(policy: str, ids: list[list[int]], source: int = 0, run: int | None = None):
    """Slots of a rank's ``[tokens, k]`` expert ids (token rows 0, 1, ...), row-major."""
    ids_arr = np.array(ids, dtype=np.int64)
    tokens, top_k = ids_arr.shape
    experts = ids_arr.reshape(-1)
    kpos = np.tile(np.arange(top_k), tokens)
    row = np.repeat(np.arange(tokens), top_k)
    src = np.full(experts.size, source)
    return choose_slots(policy, experts, kpos, src, row, top_k=top_k,
                        logical_to_physical=L2P, replica_counts=COUNTS, static_table=None,
                        rng=None, run=None if run is None else np.full(experts.size, run)
                        ).reshape(tokens, top_k).tolist()


def test_vllm_hash_of_the_token_row():
    """Hashes of rows 0..3: 0; 2654435769 (= 3 x 884811923: 0 mod 3, 1 mod 2);
    5308871538 - 2**32 = 1013904242 (2 mod 3, 0 mod 2); 7963307307 - 2**32 = 3668340011
    (2 mod 3, 1 mod 2).  Every k position of a row gets the same replica index."""
    zeros = np.zeros(4, dtype=np.int64)
    assert dispatch_codes("vllm_hash", zeros, zeros, zeros, np.arange(4), top_k=2).tolist() \
        == [0, 2654435769, 1013904242, 3668340011]
    got = _slots("vllm_hash", [[0, 1], [0, 1], [1, 0], [0, 1]])
    # expert 0 replicas (slots 0, 2, 4) by row mod 3: 0, 0, 2, 2
    # expert 1 replicas (slots 1, 3) by row mod 2: 0, 1, 0, 1
    assert got == [[0, 1], [0, 3], [1, 4], [4, 3]]


def test_trtllm_counts_earlier_entries_of_the_expert_in_the_block():
    """Rank 0, top-2, rows [0, 1], [0, 2], [3, 0]: expert 0 at flat entries 0, 2, 5 is
    the 0th, 1st, 2nd of its block -> replicas 0, 1, 2 (slots 0, 2, 4); expert 1 once ->
    replica 0.  On rank 1 every offset grows by one (ep rank): replicas 1, 2, 0 and 1."""
    ids = [[0, 1], [0, 2], [3, 0]]
    assert _slots("trtllm_block", ids, source=0) == [[0, 1], [2, 5], [6, 4]]
    assert _slots("trtllm_block", ids, source=1) == [[2, 3], [4, 5], [6, 0]]


def test_trtllm_restarts_in_each_block_of_1024_entries():
    """Top-8, 130 rows with expert 0 at k position 0: rows 0..127 fill block 0 (entries
    0..1023, expert 0's 0th..127th), rows 128, 129 open block 1 (0th and 1st, + block 1).
    Row 127: 127 mod 3 = 1; row 128: (0 + 1) mod 3 = 1; row 129: (1 + 1) mod 3 = 2.  The
    old round robin numbers flat entries: row r at replica 8 r mod 3."""
    ids = [[0, 2, 2, 2, 2, 2, 2, 2]] * 130
    got = [row[0] for row in _slots("trtllm_block", ids)]
    assert got[:4] == [0, 2, 4, 0] and got[127:] == [2, 2, 4]
    old = [row[0] for row in _slots("round_robin", ids)]
    assert old[:4] == [0, 4, 2, 0] and old[127:] == [4, 2, 0]  # 8 r mod 3: 0, 2, 1, 0; 2, 1, 0


def test_trtllm_restarts_on_every_forward_pass():
    """Selections of two batches of one rank (runs 0 and 1) are counted apart."""
    experts = np.array([0, 0, 0, 0])
    zeros = np.zeros(4, dtype=np.int64)
    codes = dispatch_codes("trtllm_block", experts, zeros, zeros, np.array([0, 1, 0, 1]),
                           top_k=1, run=np.array([0, 0, 1, 1]))
    assert codes.tolist() == [0, 1, 0, 1]


def test_old_round_robin_numbers_the_flat_entries():
    """vLLM before its hash: (row x top_k + k) mod count.  Expert 0 at entries 0, 2, 4:
    replicas 0, 2, 1 (slots 0, 4, 2); expert 1 at entries 1, 3, 5, all odd: replica 1
    (slot 3) every time, the k-position bias the hash removed (vLLM's hash: slots 1, 3, 1)."""
    assert _slots("round_robin", [[0, 1], [0, 1], [0, 1]]) == [[0, 3], [4, 3], [2, 3]]
    assert [row[1] for row in _slots("vllm_hash", [[0, 1], [0, 1], [0, 1]])] == [1, 3, 1]


def test_engines_dispatch_as_their_current_releases():
    assert ENGINE_POLICY == {"sglang": "sglang", "vllm": "vllm_hash",
                             "trtllm": "trtllm_block"}
    assert Regime("trtllm").describe() == ("trtllm decode, 128 tokens per GPU (trtllm_block"
                                           " dispatch, low_latency all-to-all)")


def test_unknown_policy_has_no_codes():
    zeros = np.zeros(1, dtype=np.int64)
    with pytest.raises(ValueError, match="no dispatch codes"):
        dispatch_codes("sglang", zeros, zeros, zeros, zeros, top_k=1)
