"""Moving from a deployed placement to a new one: what it costs, and what to move.

A *move* is one expert's weights loaded onto a GPU that does not hold them yet: a slot
whose expert the GPU held before costs nothing, whatever slot index it takes (GPUs
renumber slots freely), and a second replica of an expert the GPU holds is copied on the
GPU, not moved.  Per layer::

    moves[l] = number of (e, g) with new[l] putting e on g and current[l] not

:func:`move_cost` turns moves into bytes and an estimated copy time; :class:`Frontier`
chooses which layers to re-plan under a budget.  A layer is re-planned whole or kept as
deployed (a part of a layer's new plan is not a valid placement in general: an expert
moved off one GPU must land on another), so the choice is a 0/1 knapsack over layers:
``gain[l, k]`` (estimated time saved) for ``moves[l, k]``, at most one of a layer's new
plans ``k`` taken (a multiple-choice knapsack: the re-plan's row or a fresh plan's),
solved exactly by dynamic programming over the move count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from placer import constants
from placer.errors import PlacementError
from placer.placement.types import Placement

if TYPE_CHECKING:
    from placer.model import ModelSpec
    from placer.topology import Topology


def moves_from(new: Placement, current: Placement) -> int:
    """Expert weight copies to load to go from ``current`` to ``new``.

    Counted per GPU: an expert ``new`` puts on a GPU that did not hold it before is one
    move (slot order within a GPU is free to change).  A second replica on a GPU that
    already holds the expert is copied on the GPU, not moved: it counts nothing.
    """
    if current.num_gpus != new.num_gpus or current.num_experts != new.num_experts:
        raise PlacementError("placements have different GPUs or experts; moves undefined")
    for i in new.layer_ids:
        current.layer_row(int(i))  # PlacementError for a layer the current one lacks
    return int(layer_moves(new, current).sum())


def layer_moves(new: Placement, current: Placement) -> np.ndarray:
    """``[layers of new]`` int64 weight moves from ``current`` to ``new`` per layer
    (the per-layer terms of :meth:`placer.placement.Placement.moves_from`).

    Layers of ``new`` that ``current`` lacks count every (expert, GPU) pair as a move.
    """
    return np.array([int(added.sum()) for added in _added(new, current)], dtype=np.int64)


def _added(new: Placement, current: Placement) -> list[np.ndarray]:
    """Per layer of ``new``, ``[E, G]`` bool: GPU g gets expert e and lacked it."""
    before, masks = current.expert_gpu_mask, new.expert_gpu_mask  # built once, not per row
    out = []
    for row, layer_id in enumerate(new.layer_ids.tolist()):
        after = masks[row]
        hits = np.flatnonzero(current.layer_ids == layer_id)
        out.append(after & ~before[hits[0]] if hits.size else after.copy())
    return out


@dataclass(frozen=True)
class MoveCost:
    """What loading the moved weights costs.

    Attributes
    ----------
    moves: expert weights loaded onto GPUs that lacked them (all layers).
    gb: their size, GB (``moves x`` one expert's bytes in the dtype).
    copy_s: estimated seconds to copy them: each GPU loads its moved experts from a GPU of
        its node when one holds them (over the node's fabric) and otherwise over its NIC,
        both links at once; the slowest GPU sets the time.  None without a topology.
    """

    moves: int
    gb: float
    copy_s: float | None

    def describe(self, slots: int) -> str:
        """``1,234 weight moves of 16,704 slots (7.4%), 54.3 GB, ~0.9 s to copy``."""
        share = self.moves / slots if slots else 0.0
        text = f"{self.moves:,} weight moves of {slots:,} slots ({share:.1%}), {self.gb:,.1f} GB"
        if self.copy_s is not None:
            text += f", ~{_duration(self.copy_s)} to copy"
        return text


def move_cost(new: Placement, current: Placement, model: ModelSpec | None = None,
              topology: Topology | None = None, dtype: str | None = None) -> MoveCost:
    """Moves from ``current`` to ``new``, their GB (needs ``model``) and copy time (needs
    ``topology`` too)."""
    moves = int(layer_moves(new, current).sum())
    if model is None:
        return MoveCost(moves, float("nan"), None)
    expert_bytes = float(model.expert_bytes(dtype or model.default_dtype))
    gb = moves * expert_bytes / constants.GB
    if topology is None:
        return MoveCost(moves, gb, None)
    local, remote = copy_bytes(new, current, expert_bytes, topology.node_of_gpu)
    copy = copy_seconds(local.sum(axis=0), remote.sum(axis=0), topology)
    return MoveCost(moves, gb, float(copy.max()) if copy.size else 0.0)


def copy_bytes(new: Placement, current: Placement, expert_bytes: float,
               node_of_gpu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``([layers, G], [layers, G])`` float64 bytes each GPU loads for each layer of
    ``new`` from a GPU of its own node that holds the expert in ``current``, and from
    elsewhere (over its NIC)."""
    node = np.asarray(node_of_gpu, dtype=np.int64)
    local = np.zeros((new.num_layers, new.num_gpus))
    remote = np.zeros((new.num_layers, new.num_gpus))
    before = current.expert_gpu_mask
    for row, added in enumerate(_added(new, current)):
        hits = np.flatnonzero(current.layer_ids == int(new.layer_ids[row]))
        held = before[hits[0]] if hits.size else np.zeros_like(added)
        in_node = np.zeros((new.num_experts, int(node.max()) + 1), dtype=bool)
        for g in range(new.num_gpus):
            in_node[:, node[g]] |= held[:, g]
        from_node = in_node[:, node]  # [E, G]
        local[row] = (added & from_node).sum(axis=0) * expert_bytes
        remote[row] = (added & ~from_node).sum(axis=0) * expert_bytes
    return local, remote


def copy_seconds(local: np.ndarray, remote: np.ndarray, topology: Topology) -> np.ndarray:
    """Seconds each GPU takes to load ``local`` bytes over its node's fabric and
    ``remote`` bytes over its NIC (``[..., G]``), both links at once, at their achieved
    speeds."""
    injection = np.asarray(topology.achieved_injection_gbps, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        t_local = np.where(local > 0, local / (injection[:, 1] * 1e9), 0.0)
        t_remote = np.where(remote > 0, remote / (injection[:, 2] * 1e9), 0.0)
    copy = np.maximum(t_local, t_remote)
    return np.where(np.isfinite(copy), copy, 0.0)


@dataclass(frozen=True)
class Frontier:
    """Which layers to re-plan for each move budget, and with which of their new plans
    (a multiple-choice 0/1 knapsack over layers).

    Attributes
    ----------
    moves: ``[L, K]`` moves each of a layer's ``K`` new plans costs (``[L]``: one plan).
    gain: ``[L, K]`` what each saves (e.g. estimated p99 layer time, µs); plans that save
        nothing are never taken, and a layer takes at most one.
    best: ``[M + 1]`` the largest total gain within a budget of ``b`` moves, ``b = 0..M``
        (``M`` the moves of every layer's costliest plan worth taking).
    """

    moves: np.ndarray
    gain: np.ndarray
    best: np.ndarray
    _take: np.ndarray  # [L, M + 1] int: the plan layer l takes in the optimum of budget b

    @classmethod
    def of(cls, moves: np.ndarray, gain: np.ndarray) -> Frontier:
        moves = np.asarray(moves, dtype=np.int64)
        gain = np.asarray(gain, dtype=np.float64)
        if moves.ndim == 1:
            moves, gain = moves[:, None], gain[:, None]
        worth = gain > 0
        total = int(np.where(worth, moves, 0).max(axis=1).sum()) if moves.size else 0
        best = np.zeros(total + 1)
        take = np.full((moves.shape[0], total + 1), -1, dtype=np.int64)
        for layer in range(moves.shape[0]):
            new = best.copy()
            for k in np.flatnonzero(worth[layer]).tolist():
                m, v = int(moves[layer, k]), float(gain[layer, k])
                with_it = np.full(total + 1, -np.inf)
                with_it[m:] = best[: total + 1 - m] + v
                better = with_it > new
                take[layer, better] = k
                new = np.where(better, with_it, new)
            best = new
        return cls(moves, gain, best, take)

    @property
    def max_moves(self) -> int:
        """Moves of the best plan (every layer's costliest plan worth taking)."""
        return int(self.best.size - 1)

    def choice(self, budget: int) -> np.ndarray:
        """``[L]`` int: the plan each layer takes within ``budget`` moves, -1 to keep the
        deployed layer (optimal gain; among equal gains, the fewest moves)."""
        budget = max(0, min(int(budget), self.max_moves))
        # the fewest moves reaching the best gain of this budget
        reach = int(np.flatnonzero(self.best[: budget + 1] >= self.best[budget] - 1e-12)[0])
        picked = np.full(self.moves.shape[0], -1, dtype=np.int64)
        left = reach
        for layer in range(self.moves.shape[0] - 1, -1, -1):  # walk the DP back
            k = int(self._take[layer, left])
            if k >= 0:
                picked[layer] = k
                left -= int(self.moves[layer, k])
        return picked

    def chosen(self, budget: int) -> np.ndarray:
        """``[L]`` bool: the layers to re-plan within ``budget`` moves."""
        return self.choice(budget) >= 0

    def fewest_within(self, tolerance: float, total: float) -> int:
        """The fewest moves whose gain is within ``tolerance x total`` of the best (``total``:
        the time of the best plan, so a re-plan may give up that share of it)."""
        need = self.best[-1] - tolerance * total
        return int(np.flatnonzero(self.best >= need - 1e-12)[0])

    def points(self, budgets: list[int]) -> list[tuple[int, float]]:
        """``(moves used, gain)`` of the optimum within each budget."""
        out = []
        rows = np.arange(self.moves.shape[0])
        for budget in budgets:
            k = self.choice(budget)
            taken = k >= 0
            out.append((int(self.moves[rows[taken], k[taken]].sum()),
                        float(self.gain[rows[taken], k[taken]].sum())))
        return out


def _duration(seconds: float) -> str:
    """Two significant figures without an exponent: ``0.9 s``, ``12 s``, ``400 ms``,
    ``3,600 s``.

    >>> [_duration(x) for x in (0.00042, 0.4, 0.94, 12.3, 3600.0)]
    ['0.42 ms', '400 ms', '940 ms', '12 s', '3,600 s']
    """
    value, unit = (seconds, "s") if seconds >= 1 else (seconds * 1e3, "ms")
    if value >= 100:
        digits = len(str(int(value))) - 2
        return f"{round(value, -digits):,.0f} {unit}"
    return f"{float(f'{value:.2g}'):g} {unit}"

