"""placer's online policy on plain arrays: the map it returns is valid, moves what the
replay charges, keeps the slots of experts that stay, and is the replay's own decision."""

from __future__ import annotations

import numpy as np
import pytest

from placer.errors import PlacementError, UsageError
from placer.model import load_model
from placer.online import OnlineSettings, rebalance
from placer.online.policy import placer_moves
from placer.placement import Placement
from placer.placement.migration import copy_bytes, layer_moves
from placer.topology import load_topology

E, G, S = 128, 16, 9  # Qwen3-30B-A3B on 2 x DGX H100, 16 redundant experts


@pytest.fixture(scope="module")
def cluster():
    """Qwen3-30B-A3B on 2 x DGX H100 (16 GPUs of 9 slots)."""
    return load_topology("2x-dgx-h100"), load_model("qwen3-30b-a3b")


def _engines_layout(layers: int) -> np.ndarray:
    """``[layers, 144]``: the engines' default layout, expert e on GPU e // 8 in slot
    e % 8, and each GPU's ninth slot a second replica of expert 8 * g + 1 of its own."""
    row = np.empty((G, S), dtype=np.int64)
    row[:, :8] = np.arange(E).reshape(G, 8)
    row[:, 8] = np.arange(G) * 8 + 1
    return np.tile(row.reshape(-1), (layers, 1))


def _one_hot_expert(layers: int) -> np.ndarray:
    """``[layers, E]``: every expert 10 selections, expert 0 (GPU 0) 400."""
    load = np.full((layers, E), 10.0)
    load[:, 0] = 400.0
    return load


def test_one_move_gives_the_hot_expert_a_replica_in_a_spare_slot(cluster) -> None:
    topology, model = cluster
    deployed = _engines_layout(2)
    record = rebalance(_one_hot_expert(2), deployed, topology=topology, model=model,
                       settings=OnlineSettings(max_moves=1))
    changed = np.argwhere(record.physical_to_logical != deployed)
    assert changed.shape == (1, 2)  # one slot of one layer written, every other kept
    layer, slot = changed[0]
    assert record.physical_to_logical[layer, slot] == 0  # the hot expert
    assert slot // S != 0  # on another GPU than GPU 0
    assert slot % S == 8  # in the slot of a second replica (that expert keeps another)
    assert (record.moves, record.layers) == (1, 1)
    assert record.bytes == model.expert_bytes(model.default_dtype)
    assert record.gain_us > 0 and record.step_saved_us > 0


def test_the_map_is_valid_and_moves_what_the_replay_charges(cluster) -> None:
    topology, model = cluster
    rng = np.random.default_rng(7)
    deployed = _engines_layout(4)
    load = rng.gamma(0.4, size=(4, E)) * 100
    record = rebalance(load, deployed, topology=topology, model=model)
    new = record.physical_to_logical
    assert new.shape == deployed.shape
    for row in new:  # every logical expert has a replica; counts sum to the slots
        counts = np.bincount(row, minlength=E)
        assert (counts >= 1).all() and counts.sum() == G * S
    ids = np.arange(4)
    before, after = Placement(deployed, ids, E, G), Placement(new, ids, E, G)
    expert_bytes = float(model.expert_bytes(model.default_dtype))
    local, remote = copy_bytes(after, before, expert_bytes, topology.node_of_gpu)
    assert record.moves == int(layer_moves(after, before).sum()) > 0
    assert record.bytes == pytest.approx(float(local.sum() + remote.sum()))


def _kept_slots_hold(new: np.ndarray, old: np.ndarray) -> bool:
    """In every layer, each GPU's experts that stay on it sit in slots that held them
    (as many of its replicas as both maps put on that GPU)."""
    for a, b in zip(new.reshape(-1, G, S), old.reshape(-1, G, S), strict=True):
        for mine, theirs in zip(a, b, strict=True):
            for e in set(mine.tolist()) & set(theirs.tolist()):
                kept = min((mine == e).sum(), (theirs == e).sum())
                if ((mine == e) & (theirs == e)).sum() != kept:
                    return False
    return True


def test_an_expert_that_stays_on_its_gpu_keeps_its_slot(cluster) -> None:
    topology, model = cluster
    rng = np.random.default_rng(3)
    # a layout fitted to other traffic, then a burst on GPU 0: EPLB's whole re-placement
    # of a layer is taken, its GPUs renumbered and its slots kept
    deployed = np.stack([rng.permutation(_engines_layout(1)[0]) for _ in range(3)])
    load = rng.integers(5, 15, size=(3, E)).astype(np.float64)
    for row in range(3):
        load[row, deployed[row, :S]] = 2_000.0
    record = rebalance(load, deployed, topology=topology, model=model,
                       settings=OnlineSettings(horizon=400))
    assert record.moves > 0
    assert _kept_slots_hold(record.physical_to_logical, deployed)
    assert not _kept_slots_hold(np.roll(record.physical_to_logical, 1, axis=1), deployed)


def test_it_is_the_replays_decision(cluster) -> None:
    """The replay's ``placer`` policy calls :func:`placer_moves`; ``rebalance`` is the
    same decision on arrays."""
    topology, model = cluster
    rng = np.random.default_rng(11)
    deployed = _engines_layout(3)
    load = rng.gamma(0.5, size=(3, E)) * 50
    settings = OnlineSettings(max_moves=12, horizon=300)
    record = rebalance(load, deployed, topology=topology, model=model, settings=settings,
                       layer_ids=np.array([5, 6, 7]))
    decision = placer_moves(Placement(deployed, np.array([5, 6, 7]), E, G), load,
                            topology=topology, model=model, regime=settings.regime,
                            dtype=model.default_dtype, interval=300, max_moves=12,
                            costs=settings.costs(topology))
    assert (record.physical_to_logical == decision.placement.physical_to_logical).all()
    assert record.gain_us == pytest.approx(decision.gain_us)
    assert 0 < record.moves <= 12


def test_no_load_moves_nothing(cluster) -> None:
    topology, model = cluster
    deployed = _engines_layout(2)
    record = rebalance(np.zeros((2, E)), deployed, topology=topology, model=model)
    assert (record.physical_to_logical == deployed).all() and record.moves == 0


@pytest.mark.parametrize(("load", "deployed", "message"), [
    (np.ones((2, 64)), _engines_layout(2), "the load has 64 experts"),
    (np.ones((3, E)), _engines_layout(2), "as many layers"),
    (-np.ones((2, E)), _engines_layout(2), "negative"),
    (np.ones((2, E)), _engines_layout(2)[:, :140], "do not split over the 16 GPUs"),
])
def test_arrays_that_do_not_fit_the_cluster_are_refused(cluster, load, deployed,
                                                        message) -> None:
    topology, model = cluster
    with pytest.raises(PlacementError, match=message) as info:
        rebalance(load, deployed, topology=topology, model=model)
    assert info.value.hint


def test_settings_check_themselves() -> None:
    with pytest.raises(UsageError, match="horizon >= 1"):
        OnlineSettings(horizon=0)
    with pytest.raises(UsageError, match="max_moves >= 0"):
        OnlineSettings(max_moves=-1)
