"""Round robin's floor against a straightforward reference on small random instances.

The reference follows the module's definitions one loop at a time: for each batch,
expert and replica count ``c``, the residue classes ``code mod c`` counted per place,
``f(c) = sum_i max_x m[x, i]`` and the compute ``sum_i max(w, m_i t)`` of the classes
with a selection; then, over every split of the ``extra`` replicas among the experts,
the most local selections (at most ``extra``) and the least added compute (exactly
``extra``), by a knapsack over the experts one at a time.  Small instances with at most
``EXACT_REPLICAS - 1`` redundant replicas are counted exactly by the optimized routine,
so both must agree: the local selections to the unit, the compute to rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placer.evaluate import round_robin_bound as rr
from placer.evaluate.bound import _dense_codes
from placer.evaluate.dispatch import dispatch_codes

W, T = 1.0, 0.3


def _classes(place: np.ndarray, code: np.ndarray, count: int, places: int) -> np.ndarray:
    """``[places, count]`` selections of each residue class from each place."""
    m = np.zeros((places, count), dtype=np.int64)
    for x, k in zip(place.tolist(), code.tolist(), strict=True):
        m[x, k % count] += 1
    return m


def _knapsack(values: list[list[float]], budget: int, best: str) -> list[float]:
    """Value of exactly ``j`` extra replicas over all experts, ``j = 0 .. budget``:
    ``values[e][u]`` is expert ``e``'s value with ``u`` extra replicas."""
    pick = max if best == "max" else min
    empty = -np.inf if best == "max" else np.inf
    table = [0.0] + [empty] * budget
    for item in values:
        table = [pick(table[j - u] + item[u] for u in range(j + 1)) for j in range(budget + 1)]
    return table


def reference(at: tuple[np.ndarray, ...], batches: int, places: int, experts: int,
              extra: int) -> tuple[np.ndarray, np.ndarray]:
    batch, place, expert, code = at
    local, added = np.zeros(batches), np.zeros(batches)
    for b in range(batches):
        served, spent = [], []
        for e in range(experts):
            mine = (batch == b) & (expert == e)
            f, c_us = [], []
            for count in range(1, extra + 2):
                m = _classes(place[mine], code[mine], count, places)
                f.append(float(m.max(axis=0).sum()))
                runs = m.sum(axis=0)
                c_us.append(sum(max(W, r * T) for r in runs.tolist() if r > 0))
            served.append(f)
            spent.append([max(c - c_us[0], 0.0) for c in c_us])
        local[b] = max(_knapsack(served, extra, "max"))
        added[b] = _knapsack(spent, extra, "min")[extra]
    return local, added


def _instance(seed: int, batches: int, places: int, experts: int, hashed: bool,
              size: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    batch = rng.integers(0, batches, size)
    place = rng.integers(0, places, size)
    expert = np.minimum(rng.zipf(1.6, size) - 1, experts - 1)
    position = rng.integers(0, 24, size)
    kpos = rng.integers(0, 3, size)
    code = dispatch_codes("vllm_hash" if hashed else "round_robin", expert, kpos, place,
                          position, top_k=3)
    return batch, place, expert, code


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), batches=st.integers(1, 3),
       places=st.sampled_from([1, 2, 3, 4, 20]), experts=st.integers(1, 6),
       extra=st.integers(0, rr.EXACT_REPLICAS - 1), hashed=st.booleans(),
       size=st.integers(0, 80), per_count=st.booleans())
def test_round_robin_local_equals_the_reference(
        seed: int, batches: int, places: int, experts: int, extra: int, hashed: bool,
        size: int, per_count: bool) -> None:
    at = _instance(seed, batches, places, experts, hashed, size)
    want_local, want_added = reference(at, batches, places, experts, extra)
    with pytest.MonkeyPatch.context() as patch:
        # both ways of counting the residue classes: from per-code sums, or per count
        patch.setattr(rr, "RESIDUE_SPARSE", 0 if per_count else 10**6)
        local, added = rr.round_robin_local(at, batches, places, experts, extra, W, T)
    assert local.tolist() == want_local.tolist()
    assert np.allclose(added, want_added, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_class_sums_equal_each_residue_class_summed_directly(seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = np.unique(rng.integers(0, 2**32, 40))
    per_code = rng.integers(0, 9, (values.size, 7)).astype(np.int32)
    counts = range(2, 14)
    for count, sums in zip(counts, rr._class_sums(per_code, values, counts), strict=True):
        want = np.array([per_code[values % count == r].sum(axis=0) for r in range(count)])
        assert np.array_equal(sums, want)


@pytest.mark.parametrize("policy", ["vllm_hash", "round_robin"])
def test_dense_codes_from_positions_equal_the_codes_sorted(policy: str) -> None:
    rng = np.random.default_rng(7)
    position = rng.integers(0, 300, 5000)
    kpos = rng.integers(0, 8, 5000)
    code = dispatch_codes(policy, kpos, kpos, kpos, position, top_k=8)
    values, index = _dense_codes(policy, position, code)
    want_values, want_index = np.unique(code, return_inverse=True)
    assert np.array_equal(values, want_values)
    assert np.array_equal(index, want_index.reshape(-1))
