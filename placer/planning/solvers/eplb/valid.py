"""``eplb-valid``: DeepSeek's EPLB with at most one replica of an expert per GPU.

For consumers that cannot load an expert twice on one GPU (vLLM-Ascend's map): the
reference's steps (:mod:`placer.planning.solvers.eplb.reference`) with two changes,
:func:`replicate_experts_capped` (an expert never gets more replicas than a node has
GPUs) and :func:`balanced_packing_apart` (a replica goes to the lightest GPU with room
that lacks its expert, when there is one), then a repair by swaps of what is left.
Wherever the reference's answer has no GPU holding an expert twice, the two are the same.
"""

from __future__ import annotations

import numpy as np

from placer.errors import UsageError
from placer.placement import Placement
from placer.planning.solvers.eplb.reference import (
    checked_weight,
    f32,
    pack_rows,
    policy,
    rebalance_experts_hierarchical,
    replicate_experts,
)

__all__ = [
    "balanced_packing_apart", "eplb_valid_placement", "repair_layer", "replicate_experts_capped",
]


def replicate_experts_capped(
    weight: np.ndarray, num_physical: int, max_replicas: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The reference's replication (:func:`~.reference.replicate_experts`) with a cap:
    an expert with ``max_replicas`` replicas is passed over.  Same arrays returned."""
    num_logical = np.shape(weight)[1]
    if max_replicas * num_logical < num_physical:
        raise UsageError(
            f"{num_physical} slots need more than {max_replicas} replicas of some of"
            f" {num_logical} experts"
        )
    return replicate_experts(weight, num_physical, max_replicas)


def balanced_packing_apart(
    weight: np.ndarray, num_packs: int, labels: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The reference's packing (:func:`~.reference.balanced_packing`), except that an item
    avoids packs already holding an item with its label when a pack with room does not
    (labels: the replicas' experts, so two replicas of one expert stay off one GPU).
    Without such conflicts it packs as the reference does."""
    def pack_row(row: int, values: list[float], items: list[int], num_packs: int,
                 per_pack: int, pack_out: np.ndarray, rank_out: np.ndarray) -> None:
        _pack_row_labelled(values, items, [int(x) for x in labels[row]], num_packs,
                           per_pack, pack_out, rank_out)

    return pack_rows(weight, num_packs, pack_row)


def _pack_row_labelled(
    values: list[float], items: list[int], labels: list[int], num_packs: int, per_pack: int,
    pack_out: np.ndarray, rank_out: np.ndarray,
) -> None:
    """The packing of one row preferring packs without the item's label (``eplb-valid``)."""
    pack_weight = [0.0] * num_packs
    count = [0] * num_packs
    held: list[set[int]] = [set() for _ in range(num_packs)]
    for item in items:
        label = labels[item]
        best, best_free = -1, -1
        for p in range(num_packs):
            if count[p] == per_pack:
                continue
            if best < 0 or pack_weight[p] < pack_weight[best]:
                best = p
            if label not in held[p] and (
                best_free < 0 or pack_weight[p] < pack_weight[best_free]
            ):
                best_free = p
        pack = best_free if best_free >= 0 else best
        pack_out[item] = pack
        rank_out[item] = count[pack]
        pack_weight[pack] = f32(pack_weight[pack] + values[item])
        count[pack] += 1
        held[pack].add(label)


def eplb_valid_placement(
    weight: np.ndarray,
    layer_ids: np.ndarray,
    num_gpus: int,
    slots_per_gpu: int,
    num_groups: int = 1,
    num_nodes: int = 1,
) -> tuple[Placement, dict[str, object]]:
    """EPLB with at most one replica of an expert per GPU (``eplb-valid``) and a report.

    Same as :func:`rebalance_experts` except where the reference's answer puts an
    expert twice on a GPU: an expert never gets more replicas than a node has GPUs,
    and a replica is packed onto a GPU that lacks its expert whenever one with room
    does.  Whenever the reference's answer has no such GPU the two are identical.
    Duplicates the packing could not avoid are removed by swapping slots between GPUs
    (of one node when possible).  The hierarchical policy also needs ``S <= E / nodes``
    (a GPU draws its experts from its node's groups); otherwise the global policy runs.

    Parameters and the policy are those of :func:`eplb_placement`.

    Returns
    -------
    The placement, and ``{"policy": "hierarchical" | "global", "repaired_slots": int}``.
    """
    num_physical = num_gpus * slots_per_gpu
    weight32 = checked_weight(weight, num_physical, num_groups, num_nodes, num_gpus)
    # The reference's rule (even for one node), unless a node's GPUs would need more
    # distinct experts than the node's groups hold.
    hierarchical = num_groups % num_nodes == 0 and slots_per_gpu * num_nodes <= weight32.shape[1]
    if not hierarchical:
        num_groups, num_nodes = 1, 1
    num_groups, num_nodes = policy(num_groups, num_nodes, num_gpus)
    gpus_per_node = num_gpus // num_nodes
    phy2log, _, _ = rebalance_experts_hierarchical(
        weight32, num_physical, num_groups, num_nodes, num_gpus,
        replicate=lambda load, slots: replicate_experts_capped(load, slots, gpus_per_node),
        pack_replicas=balanced_packing_apart,
    )
    repaired = _repair_duplicates(phy2log, weight32.astype(np.float64), num_gpus, num_nodes)
    placement = Placement(
        physical_to_logical=phy2log, layer_ids=layer_ids, num_experts=weight32.shape[1],
        num_gpus=num_gpus,
    )
    return placement, {
        "policy": "hierarchical" if (num_groups, num_nodes) != (1, 1) else "global",
        "repaired_slots": repaired,
    }


def _repair_duplicates(
    phy2log: np.ndarray, weight: np.ndarray, num_gpus: int, num_nodes: int
) -> int:
    """Swap slots in place until no GPU holds an expert twice; return the slots changed
    (:func:`repair_layer` on every layer)."""
    swaps = 0
    for layer in range(phy2log.shape[0]):
        made = repair_layer(phy2log[layer], weight[layer], num_gpus, num_gpus // num_nodes)
        if made is None:
            raise RuntimeError("EPLB repair found no swap; please report this input")
        swaps += made
    return swaps


def repair_layer(
    row: np.ndarray, load: np.ndarray, num_gpus: int, gpus_per_node: int
) -> int | None:
    """Swap slots of one layer in place until no GPU holds an expert twice.

    A second replica of expert ``e`` on GPU ``g`` is swapped with a slot of another
    GPU ``h`` that lacks ``e`` and holds an expert ``g`` lacks: ``h`` in ``g``'s node
    when possible, choosing the swap whose replica loads are closest (least change to
    the two GPUs' loads).  Each swap removes one duplicate and adds none, and the
    experts' replica counts never change.

    Parameters
    ----------
    row: ``[P]`` int64 expert of each slot (GPU-major), modified in place.
    load: ``[E]`` the layer's expert load; a replica carries ``load / replicas``.

    Where no single swap is left but every expert has at most one replica per GPU to
    give (no expert with more replicas than GPUs), the row is dealt afresh
    (:func:`_deal`): the swaps can corner themselves where a chain of moves is needed.

    Returns the slots changed, or None when an expert has more replicas than there are
    GPUs (the row is then left partly repaired: copy it first to keep the original).
    """
    slots_per_gpu = row.size // num_gpus
    replica_load = np.asarray(load, dtype=np.float64) / np.maximum(
        np.bincount(row, minlength=np.size(load)), 1)
    swaps = 0
    while (duplicate := _first_duplicate(row, num_gpus)) is not None:
        slot, gpu = duplicate
        expert = int(row[slot])
        grid = row.reshape(num_gpus, slots_per_gpu)
        on_gpu = set(grid[gpu].tolist())
        node_start = (gpu // gpus_per_node) * gpus_per_node
        node = range(node_start, node_start + gpus_per_node)
        in_node = [h for h in node if h != gpu]
        elsewhere = [h for h in range(num_gpus) if h not in node]
        target = None
        for candidates in (in_node, elsewhere):
            options = [
                (abs(replica_load[f] - replica_load[expert]), h * slots_per_gpu + k)
                for h in candidates if expert not in grid[h]
                for k, f in enumerate(grid[h].tolist()) if f not in on_gpu
            ]
            if options:
                target = min(options)[1]
                break
        if target is None:
            return _deal(row, replica_load, num_gpus)
        row[slot], row[target] = row[target], row[slot]
        swaps += 1
    return swaps


def _deal(row: np.ndarray, replica_load: np.ndarray, num_gpus: int) -> int | None:
    """Lay ``row``'s replicas out again, in place, so no GPU holds an expert twice: the
    experts by replica load, heaviest first, each expert's replicas in a run, the k-th
    replica of the run order on GPU ``k mod G``.  An expert's run is at most ``G`` long,
    so its replicas land on distinct GPUs, and every GPU gets ``S`` slots; the replica
    counts are kept.  Returns the slots changed, or None when an expert has more
    replicas than GPUs (the row untouched)."""
    counts = np.bincount(row, minlength=replica_load.size)
    if counts.max() > num_gpus:
        return None
    slots_per_gpu = row.size // num_gpus
    experts = np.argsort(-replica_load, kind="stable")
    order = np.repeat(experts, counts[experts])
    dealt = np.empty_like(row)
    k = np.arange(order.size)
    dealt[(k % num_gpus) * slots_per_gpu + k // num_gpus] = order
    changed = int((dealt != row).sum())
    row[:] = dealt
    return changed


def _first_duplicate(row: np.ndarray, num_gpus: int) -> tuple[int, int] | None:
    """(slot, gpu) of the first slot whose expert already sits earlier on its GPU."""
    slots_per_gpu = row.size // num_gpus
    for gpu in range(num_gpus):
        seen: set[int] = set()
        for k in range(slots_per_gpu):
            expert = int(row[gpu * slots_per_gpu + k])
            if expert in seen:
                return gpu * slots_per_gpu + k, gpu
            seen.add(expert)
    return None
