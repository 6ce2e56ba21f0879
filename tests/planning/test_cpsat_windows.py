"""The cpsat model's windows: at most ``max_windows``, more fitted windows merged,
consecutive ones summed, so a step's model does not grow with the trace's length."""

from __future__ import annotations

import numpy as np
import pytest
from planner_fixtures import MODEL, skewed_stats

from placer.errors import UsageError
from placer.planning.solvers import solve
from placer.planning.solvers.cpsat import CpsatOptions, layer_data
from placer.planning.solvers.cpsat.solver import merged_windows, to_mask
from placer.problem import PlacementProblem
from placer.topology import load_topology


def test_windows_past_the_cap_are_merged_consecutively_and_nothing_is_lost() -> None:
    rng = np.random.default_rng(3)
    load = rng.integers(0, 50, size=(10, 6)).astype(np.float64)
    load[4] = 0.0  # an empty window is dropped before merging
    merged = merged_windows(load, 3)
    kept = load[[0, 1, 2, 3, 5, 6, 7, 8, 9]]
    assert merged.shape == (3, 6)
    np.testing.assert_array_equal(merged, [kept[0:3].sum(0), kept[3:6].sum(0),
                                           kept[6:9].sum(0)])
    np.testing.assert_array_equal(merged.sum(axis=0), load.sum(axis=0))


@pytest.mark.parametrize("most", [0, 10, 40])
def test_windows_within_the_cap_are_left_as_they_are(most: int) -> None:
    load = np.arange(60, dtype=np.float64).reshape(10, 6)
    assert merged_windows(load, most) is load


def test_a_layers_model_holds_at_most_max_windows() -> None:
    topo = load_topology("2x-dgx-h100")
    prob = PlacementProblem(stats=skewed_stats(windows=12), num_gpus=topo.num_gpus,
                            slots_per_gpu=3, node_of_gpu=topo.node_of_gpu, num_groups=4,
                            topology=topo, model=MODEL)
    hint = to_mask(solve(prob, "eplb-valid").placement)[0].sum(axis=1)
    assert layer_data(prob, 0, hint, "max", CpsatOptions(max_windows=0)).num_windows == 12
    capped = layer_data(prob, 0, hint, "max", CpsatOptions(max_windows=5))
    assert capped.num_windows == 5
    whole = prob.stats.load[:, 0, :].sum(axis=0)
    np.testing.assert_allclose(capped.mean_share, whole / whole.sum())


def test_a_negative_cap_is_refused() -> None:
    with pytest.raises(UsageError, match="max_windows"):
        CpsatOptions(max_windows=-1)
