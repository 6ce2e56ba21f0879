"""Round robin's floor computed two ways gives one answer: residue classes summed from
per-code counts or counted per replica count, codes spread over 32 bits (vLLM's hash)
or dense, the knapsacks merged in a tree or item by item."""

from __future__ import annotations

import numpy as np
import pytest

from placer.evaluate import round_robin_bound as rr
from placer.evaluate.dispatch import dispatch_codes


def _selections(seed: int, batches: int, places: int, experts: int,
                hashed: bool) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    n = 3000
    batch = rng.integers(0, batches, n)
    place = rng.integers(0, places, n)
    expert = np.minimum(rng.zipf(1.5, n) - 1, experts - 1)
    position = rng.integers(0, 64, n)
    kpos = rng.integers(0, 4, n)
    policy = "vllm_hash" if hashed else "round_robin"
    code = dispatch_codes(policy, expert, kpos, place, position, top_k=4)
    return batch, place, expert, code


@pytest.mark.parametrize("hashed", [True, False])
@pytest.mark.parametrize("places", [2, 20])
def test_per_code_sums_equal_counting_per_replica_count(
        monkeypatch: pytest.MonkeyPatch, hashed: bool, places: int) -> None:
    at = _selections(places, 3, places, 40, hashed)
    monkeypatch.setattr(rr, "RESIDUE_SPARSE", 10**6)  # summed from per-code counts
    fast = rr.round_robin_local(at, 3, places, 40, 6, 1.0, 0.1)
    monkeypatch.setattr(rr, "RESIDUE_CELLS", 0)  # every count by its own pass
    slow = rr.round_robin_local(at, 3, places, 40, 6, 1.0, 0.1)
    assert np.array_equal(fast[0], slow[0]) and np.array_equal(fast[1], slow[1])


def test_dense_codes_index_the_distinct_codes() -> None:
    for code in (np.array([7, 3, 7, 9, 3]), np.array([5, 4_000_000_000, 5, 17])):
        values, index = rr.dense_codes(code)
        assert values.tolist() == sorted(set(code.tolist()))
        assert np.array_equal(values[index], code)


def _sequential(items: np.ndarray, best: str) -> np.ndarray:
    """The knapsack item by item: value of exactly ``j`` replicas over every item."""
    size = items.shape[2]
    empty = -np.inf if best == "max" else np.inf
    pick = np.max if best == "max" else np.min
    value = np.full((items.shape[0], size), empty)
    value[:, 0] = 0.0
    for item in range(items.shape[1]):
        value = np.array([[pick([value[b, j - u] + items[b, item, u] for u in range(j + 1)])
                           for j in range(size)] for b in range(items.shape[0])])
    return value


@pytest.mark.parametrize("count", [1, 2, 5, 8])
def test_knapsack_merged_in_a_tree_equals_item_by_item(count: int) -> None:
    rng = np.random.default_rng(count)
    gain = rng.integers(0, 9, (2, count, 5)).astype(np.float64)
    gain[:, :, 0] = 0.0
    added = rng.random((2, count, 5))
    added[:, :, 0] = 0.0
    assert np.array_equal(rr._combined(gain, "max"), _sequential(gain, "max"))
    assert np.allclose(rr._combined(added, "min"), _sequential(added, "min"), rtol=1e-12)


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8])
def test_saturated_knapsack_is_exact_without_saturation_and_a_relaxation_with_it(
        count: int) -> None:
    rng = np.random.default_rng(10 + count)
    gain = rng.integers(0, 9, (2, count, 7)).astype(np.float64)
    gain[:, :, 0] = 0.0
    added = rng.random((2, count, 7))
    added[:, :, 0] = 0.0
    exact_max, exact_min = _sequential(gain, "max"), _sequential(added, "min")
    # a cap at the last count relaxes nothing
    assert np.array_equal(rr._saturated(gain, "max", 6), exact_max)
    assert np.allclose(rr._saturated(added, "min", 6), exact_min, rtol=1e-12)
    for cap in (1, 2, 4):
        # counts past the cap valued at their best: never less gain, never more compute
        relaxed_max, relaxed_min = rr._saturated(gain, "max", cap), rr._saturated(added, "min", cap)
        assert np.all(relaxed_max >= exact_max) and np.all(relaxed_min <= exact_min + 1e-12)
        # and exact where no item takes more than the cap: the item-by-item knapsack of
        # items whose values past the cap are their best there
        flat_g = gain.copy()
        flat_g[:, :, cap:] = gain[:, :, cap:].max(axis=2, keepdims=True)
        flat_a = added.copy()
        flat_a[:, :, cap:] = added[:, :, cap:].min(axis=2, keepdims=True)
        assert np.array_equal(relaxed_max, _sequential(flat_g, "max"))
        assert np.allclose(relaxed_min, _sequential(flat_a, "min"), rtol=1e-12)


def test_huge_redundancy_stays_within_memory_and_below_the_exact_floor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Hundreds of replicas for a few experts: the knapsacks saturate (a bounded tree)
    and the floor's local selections and least compute move only the safe way."""
    at = _selections(3, 2, 2, 12, False)
    exact = rr.round_robin_local(at, 2, 2, 12, 40, 1.0, 0.1)
    monkeypatch.setattr(rr, "KNAPSACK_CELLS", 2000)  # forces the saturated path
    assert rr._saturation(2, 12, 40) is not None
    relaxed = rr.round_robin_local(at, 2, 2, 12, 40, 1.0, 0.1)
    assert np.all(relaxed[0] >= exact[0]) and np.all(relaxed[1] <= exact[1] + 1e-9)
