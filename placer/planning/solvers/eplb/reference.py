"""DeepSeek's Expert Parallelism Load Balancer (EPLB), as the reference computes it.

:func:`rebalance_experts` is deepseek-ai/EPLB's ``rebalance_experts`` (``eplb.py``, MIT)
step for step, with its arithmetic and its tie rules, in one file laid out as the
reference is (``balanced_packing``, ``replicate_experts``,
``rebalance_experts_hierarchical``, ``rebalance_experts``); the solver ``eplb``
(:mod:`placer.planning.solvers.eplb.adapters`) runs it:

- ``replicate``: every logical expert starts with one replica; each redundant slot goes
  to the expert whose load per replica (float32 ``load / count``) is highest, the first
  such expert on ties (``torch.max(dim=-1).indices``).
- ``pack``: items sorted by weight, heaviest first, each put on the lightest pack that
  still has room, the first such pack on ties (Python's ``min``); pack weights add up in
  float32, as the reference's tensor sums do; every pack takes exactly ``n / packs``
  items.
- Hierarchical policy (when ``num_groups % num_nodes == 0``): pack expert groups to
  nodes, replicate within each node, pack each node's replicas onto its GPUs.  Otherwise
  the global policy: the same with one node and one group.

Like the reference it neither caps an expert's replicas nor keeps two replicas of one
expert off one GPU: a GPU may hold an expert twice (SGLang, TensorRT-LLM and DeepSeek's
own serving load such placements; vLLM-Ascend's map cannot express them).  The variant
that does both, ``eplb-valid``, is :mod:`placer.planning.solvers.eplb.valid`; it reuses
steps 1-3 here with its own replication and packing.

Arithmetic is the reference's: loads are cast to float32 (``weight.float()``) and every
division and sum is rounded to float32.  Two points where the reference itself depends
on the torch build, and the rule used here:

- equal weights in the packing sort: the reference sorts with torch's unstable sort,
  whose order among equal values differs between torch builds (``std::sort`` or
  x86-simd-sort); here equal weights keep index order (the order torch gives for up to
  16 items).  Equal weights swap places only with each other, so every pack's weight is
  the same either way: no GPU's load changes, only which of two equally loaded replicas
  (and so which replica rank in ``log2phy``) sits where.
- group sums (hierarchical policy with several groups per node): summed exactly and
  rounded to float32 once; torch's vectorized float32 sum gives the same figure whenever
  the sums are exact in float32 (integer loads with group sums below 2**24).

Example (the published one, 12 experts, 16 slots, 2 nodes of 4 GPUs, 4 groups)::

    >>> weight = np.array([[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
    ...                    [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]])
    >>> phy2log, log2phy, logcnt = rebalance_experts(weight, 16, 4, 2, 8)
    >>> phy2log[0].tolist()
    [5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1]
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np

from placer.errors import UsageError
from placer.limits import check_allocation

__all__ = [
    "balanced_packing",
    "pack_rows",
    "rebalance_experts",
    "rebalance_experts_hierarchical",
    "replicate_experts",
]


def balanced_packing(weight: np.ndarray, num_packs: int) -> tuple[np.ndarray, np.ndarray]:
    """Pack ``n`` weighted items into ``num_packs`` packs of exactly ``n / num_packs`` items.

    Greedy, as the reference: items by decreasing float32 weight (equal weights in index
    order), each to the lightest pack with room (the first such pack on ties); a pack's
    weight is the float32 sum of its items, added in the order they were packed.

    Parameters
    ----------
    weight: ``[rows, n]`` float, weight of each item; each row is packed on its own.
    num_packs: packs per row; must divide ``n``.

    Returns
    -------
    pack_index: ``[rows, n]`` int64, pack of each item.
    rank_in_pack: ``[rows, n]`` int64, position of each item within its pack (the
        order items were put in).
    """
    return pack_rows(weight, num_packs, _pack_row)


#: ``pack_row(row, values, items, num_packs, per_pack, pack_out, rank_out)``: one row's
#: greedy packing (see :func:`pack_rows`).
RowPacker = Callable[[int, list[float], list[int], int, int, np.ndarray, np.ndarray], None]


def pack_rows(
    weight: np.ndarray, num_packs: int, pack_row: RowPacker
) -> tuple[np.ndarray, np.ndarray]:
    """The frame of :func:`balanced_packing`: checks, the one-item-per-pack case, and
    each row's items heaviest first handed to ``pack_row``, which fills that row of
    ``pack_index`` and ``rank_in_pack`` (``values``: the row's float32 weights as Python
    floats; ``items``: item indices by decreasing weight, equal weights in index order).
    Same arguments and arrays as :func:`balanced_packing`."""
    weight = np.asarray(weight, dtype=np.float32)
    num_rows, num_items = weight.shape
    if num_packs <= 0 or num_items % num_packs:
        raise UsageError(f"{num_items} items do not split evenly into {num_packs} packs")
    per_pack = num_items // num_packs
    if per_pack == 1:
        index = np.broadcast_to(np.arange(num_items, dtype=np.int64), weight.shape).copy()
        return index, np.zeros_like(index)

    pack_index = np.full(weight.shape, -1, dtype=np.int64)
    rank_in_pack = np.full(weight.shape, -1, dtype=np.int64)
    order = np.argsort(-weight, axis=1, kind="stable")
    for row in range(num_rows):
        # float32 values held as Python floats; each sum is rounded back to float32
        # (exact for a float32 sum: double rounding is innocuous for + at 53 vs 24 bits)
        values = weight[row].astype(np.float64).tolist()
        items = order[row].tolist()
        pack_row(row, values, items, num_packs, per_pack, pack_index[row], rank_in_pack[row])
    return pack_index, rank_in_pack


def f32(x: float) -> float:
    """``x`` rounded to the nearest float32."""
    return float(np.float32(x))


def _pack_row(
    row: int, values: list[float], items: list[int], num_packs: int, per_pack: int,
    pack_out: np.ndarray, rank_out: np.ndarray,
) -> None:
    """The reference's packing of one row: a heap of (weight, pack) gives the lightest
    pack with room, the lowest-numbered on ties, as ``min`` over packs does."""
    heap = [(0.0, p) for p in range(num_packs)]
    count = [0] * num_packs
    for item in items:
        load, pack = heapq.heappop(heap)
        pack_out[item] = pack
        rank_out[item] = count[pack]
        count[pack] += 1
        if count[pack] < per_pack:
            heapq.heappush(heap, (f32(load + values[item]), pack))


def replicate_experts(
    weight: np.ndarray, num_physical: int, max_replicas: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Give ``num_physical - n`` redundant slots to the experts with the most load per replica.

    Load per replica is the float32 quotient ``weight / count``, as the reference's; the
    first such expert on ties (``torch.max(dim=-1).indices``).

    Parameters
    ----------
    weight: ``[rows, n]`` float, load of each logical expert.
    num_physical: slots per row, ``>= n``.
    max_replicas: an expert with this many replicas is passed over (``eplb-valid``'s
        cap); None, as the reference: no cap.

    Returns
    -------
    physical_to_logical: ``[rows, num_physical]`` int64; slot ``i < n`` holds expert ``i``,
        slot ``i >= n`` the expert that received the ``(i - n)``-th redundant slot.
    replica_rank: ``[rows, num_physical]`` int64, which replica of its expert each slot is.
    replica_counts: ``[rows, n]`` int64.
    """
    weight = np.asarray(weight, dtype=np.float32)
    num_rows, num_logical = weight.shape
    if num_physical < num_logical:
        raise UsageError(f"{num_physical} slots cannot hold {num_logical} experts")
    physical_to_logical = np.tile(np.arange(num_physical, dtype=np.int64), (num_rows, 1))
    replica_rank = np.zeros((num_rows, num_physical), dtype=np.int64)
    replica_counts = np.ones((num_rows, num_logical), dtype=np.int64)
    rows = np.arange(num_rows)
    for slot in range(num_logical, num_physical):
        per_replica = weight / replica_counts.astype(np.float32)  # float32, as torch
        if max_replicas is not None:
            per_replica = np.where(replica_counts < max_replicas, per_replica, -np.inf)
        chosen = np.argmax(per_replica, axis=1)  # first maximum on ties
        physical_to_logical[:, slot] = chosen
        replica_rank[:, slot] = replica_counts[rows, chosen]
        replica_counts[rows, chosen] += 1
    return physical_to_logical, replica_rank, replica_counts


def _inverse(permutation: np.ndarray) -> np.ndarray:
    """Row-wise inverse of ``[rows, n]`` permutations."""
    inverse = np.empty_like(permutation)
    np.put_along_axis(
        inverse, permutation, np.broadcast_to(np.arange(permutation.shape[1]), permutation.shape), 1
    )
    return inverse


#: Step 2's replication: ``(load [rows, n], slots per row) -> (phy_to_log, rank, counts)``.
Replicate = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray, np.ndarray]]
#: Step 3's packing: ``(replica load [rows, n], packs, replica's expert [rows, n]) ->
#: (pack, rank in pack)``.
PackReplicas = Callable[[np.ndarray, int, np.ndarray], tuple[np.ndarray, np.ndarray]]


def _pack_replicas(
    replica_load: np.ndarray, num_packs: int, experts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The reference's step 3: replicas packed by load alone (``experts`` unused)."""
    del experts
    return balanced_packing(replica_load, num_packs)


def rebalance_experts_hierarchical(
    weight: np.ndarray,
    num_physical: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    replicate: Replicate = replicate_experts,
    pack_replicas: PackReplicas = _pack_replicas,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The hierarchical policy on float32 ``weight``: ``(phy2log, replica rank, logcnt)``.

    ``replicate`` and ``pack_replicas`` are the reference's steps 2 and 3 unless given
    (``eplb-valid`` caps replicas and keeps an expert's replicas apart:
    :mod:`placer.planning.solvers.eplb.valid`).
    """
    num_layers, num_logical = weight.shape
    group_size = num_logical // num_groups
    groups_per_node = num_groups // num_nodes
    gpus_per_node = num_gpus // num_nodes
    slots_per_gpu = num_physical // num_gpus
    logical_per_node = num_logical // num_nodes

    # Step 1: pack expert groups to nodes; renumber experts node-major ("mlog"),
    # keeping each group's experts contiguous and in order.
    # (summed exactly, rounded to float32 once: see the module docstring)
    group_load = (
        weight.reshape(num_layers, num_groups, group_size).astype(np.float64).sum(axis=2)
    ).astype(np.float32)
    group_node, group_rank = balanced_packing(group_load, num_nodes)
    group_start = (group_node * groups_per_node + group_rank) * group_size  # [L, groups]
    logical_to_mlog = (group_start[:, :, None] + np.arange(group_size)).reshape(num_layers, -1)
    mlog_to_logical = _inverse(logical_to_mlog)

    # Step 2: replicate experts within each node: rows are (layer, node).
    mlog_load = np.take_along_axis(weight, mlog_to_logical, axis=1).reshape(
        num_layers * num_nodes, logical_per_node
    )
    phy_to_mlog, phy_rank, mlog_count = replicate(mlog_load, num_physical // num_nodes)

    # Step 3: pack each node's replicas onto its GPUs by replica load.
    replica_load = np.take_along_axis(
        mlog_load / mlog_count.astype(np.float32), phy_to_mlog, axis=1
    )
    gpu_in_node, rank_on_gpu = pack_replicas(replica_load, gpus_per_node, phy_to_mlog)
    phy_to_slot = gpu_in_node * slots_per_gpu + rank_on_gpu
    slot_to_phy = _inverse(phy_to_slot)

    # Back to logical ids: node-local mlog -> global mlog -> logical.
    slot_to_mlog = np.take_along_axis(phy_to_mlog, slot_to_phy, axis=1).reshape(
        num_layers, num_nodes, -1
    )
    node_offset = (np.arange(num_nodes) * logical_per_node)[None, :, None]
    slot_to_mlog = (slot_to_mlog + node_offset).reshape(num_layers, -1)
    physical_to_logical = np.take_along_axis(mlog_to_logical, slot_to_mlog, axis=1)
    replica_rank = np.take_along_axis(phy_rank, slot_to_phy, axis=1).reshape(num_layers, -1)
    replica_counts = np.take_along_axis(
        mlog_count.reshape(num_layers, -1), logical_to_mlog, axis=1
    )
    return physical_to_logical, replica_rank, replica_counts


def _check_shape(
    weight: np.ndarray, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int
) -> None:
    if weight.ndim != 2:
        raise UsageError(f"weight must be [layers, experts], got shape {weight.shape}")
    num_logical = weight.shape[1]
    if min(num_groups, num_nodes, num_gpus) <= 0:
        raise UsageError("groups, nodes and GPUs must be positive")
    if num_replicas < num_logical:
        raise UsageError(f"{num_replicas} physical experts cannot hold {num_logical} experts")
    if num_replicas % num_gpus:
        raise UsageError(
            f"{num_replicas} physical experts do not split evenly over {num_gpus} GPUs"
        )
    if num_logical % num_groups:
        raise UsageError(f"{num_logical} experts do not split into {num_groups} equal groups")
    if not np.isfinite(weight).all() or (weight < 0).any():
        raise UsageError("expert loads must be finite and non-negative")


def rebalance_experts(
    weight: np.ndarray, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """DeepSeek EPLB's ``rebalance_experts``: the placement of ``num_replicas`` slots per layer.

    Parameters
    ----------
    weight: ``[layers, E]`` load of each logical expert (tokens); cast to float32.
    num_replicas: ``P``, physical experts per layer; a multiple of ``num_gpus``.
    num_groups: expert groups (DeepSeek-V3: 8); ``E`` must be a multiple.
    num_nodes: nodes; the hierarchical policy runs when ``num_groups % num_nodes == 0``,
        else the global one (one node, one group).
    num_gpus: GPUs, a multiple of ``num_nodes`` under the hierarchical policy.

    Returns
    -------
    phy2log: ``[layers, P]`` int64, logical expert of each slot (slot p on GPU p // (P / G)).
    log2phy: ``[layers, E, X]`` int64, slots of each expert by replica rank, -1 padded;
        ``X`` is the largest replica count (vLLM's copy pads to ``P - E + 1``).
    logcnt: ``[layers, E]`` int64, replica counts.

    Like the reference, this neither caps replica counts at the number of GPUs nor
    keeps an expert's replicas on different GPUs (one GPU may hold an expert twice);
    :func:`eplb_valid_placement` does both.
    """
    weight32 = checked_weight(weight, num_replicas, num_groups, num_nodes, num_gpus)
    num_groups, num_nodes = policy(num_groups, num_nodes, num_gpus)
    phy2log, rank, logcnt = rebalance_experts_hierarchical(
        weight32, num_replicas, num_groups, num_nodes, num_gpus
    )
    return phy2log, _log2phy(phy2log, rank, logcnt), logcnt


def checked_weight(
    weight: np.ndarray, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int
) -> np.ndarray:
    """``weight`` as float32 (the reference's ``weight.float()``), after the checks."""
    weight = np.asarray(weight, dtype=np.float64)
    _check_shape(weight, num_replicas, num_groups, num_nodes, num_gpus)
    weight32 = weight.astype(np.float32)
    if not np.isfinite(weight32).all():
        raise UsageError("expert loads must fit in float32 (EPLB computes in float32)")
    return weight32


def policy(num_groups: int, num_nodes: int, num_gpus: int) -> tuple[int, int]:
    """(groups, nodes) to run: as given (hierarchical) or (1, 1) (global policy)."""
    if num_groups % num_nodes:
        return 1, 1
    if num_gpus % num_nodes:
        raise UsageError(f"{num_gpus} GPUs do not split evenly over {num_nodes} nodes")
    return num_groups, num_nodes


def _log2phy(phy2log: np.ndarray, rank: np.ndarray, logcnt: np.ndarray) -> np.ndarray:
    num_layers, num_physical = phy2log.shape
    width = int(logcnt.max())
    check_allocation((num_layers, logcnt.shape[1], width), "the [layers, experts, replicas]"
                     " map", "fewer `redundant` experts")
    out = np.full((num_layers, logcnt.shape[1], width), -1, dtype=np.int64)
    rows = np.repeat(np.arange(num_layers), num_physical)
    out[rows, phy2log.ravel(), rank.ravel()] = np.tile(np.arange(num_physical), num_layers)
    return out


