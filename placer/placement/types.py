"""Placement: which logical expert each physical slot holds, per layer.

Glossary: ``P`` physical slots per layer, ``G`` GPUs, ``S = P / G`` slots per
GPU; GPU ``g`` holds slots ``g*S .. g*S+S-1`` (the contiguous convention of
every engine).  A logical expert with several slots has several *replicas*.

Two replicas of one expert may sit on one GPU (a *duplicate*): DeepSeek's EPLB
produces such placements and SGLang, TensorRT-LLM and vLLM load them.  The second
copy costs a slot of memory and a weight read but adds no dispatch bandwidth of its
own: the GPU serves that expert's share for both replicas.  Every figure here counts
replicas per slot (a GPU with two of an expert's three replicas gets two thirds of its
load when replicas share evenly); ``expert_gpu_mask`` only says whether a GPU holds
the expert at all.  vLLM-Ascend's expert map cannot express duplicates, and the
``eplb-valid`` solver avoids them.

Example: 4 experts, 2 GPUs, 3 slots per GPU (2 redundant experts)::

    physical_to_logical = [[0, 1, 3,  2, 3, 0]]
    GPU 0 holds experts {0, 1, 3}, GPU 1 holds {2, 3, 0};
    replica counts [2, 1, 1, 2]; logical_to_physical [[0, 5], [1, -1], [3, -1], [2, 4]]
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from placer.errors import PlacementError, PlacerWarning
from placer.stats import format_ranges


class ModelLayers(Protocol):
    """What a placement is checked against: the model's name, experts and MoE (and MTP)
    layer ids (``placer.model.ModelSpec`` has them)."""

    @property
    def name(self) -> str: ...
    @property
    def num_experts(self) -> int: ...
    @property
    def moe_layer_ids(self) -> tuple[int, ...]: ...
    @property
    def mtp_layer_ids(self) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class Placement:
    """A validated expert placement.

    Attributes
    ----------
    physical_to_logical: ``[layers, P]`` int64, logical expert held by each slot.
    layer_ids: ``[layers]`` int64, absolute layer index of each row.
    num_experts: ``E``, logical experts per layer.
    num_gpus: ``G``; ``P`` must be a multiple of it.
    meta: free-form provenance (model and topology names, solver report); not
        part of equality.
    """

    physical_to_logical: np.ndarray
    layer_ids: np.ndarray
    num_experts: int
    num_gpus: int
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        p2l = _slot_rows(self.physical_to_logical, self.num_gpus)
        object.__setattr__(self, "physical_to_logical", p2l)
        object.__setattr__(self, "layer_ids", np.asarray(self.layer_ids, dtype=np.int64))
        self.validate()

    # -- validation -----------------------------------------------------------------
    def validate(self, where: str | None = None) -> None:
        """Raise PlacementError unless this is a placement engines accept.

        Checks shapes, equal slots per GPU, expert ids in range and a replica for every
        expert.  A GPU holding two replicas of one expert is valid (see the module
        docstring and :meth:`duplicate_warning`).
        """
        p2l = self.physical_to_logical
        if p2l.ndim != 2:
            raise PlacementError(
                f"physical_to_logical must be [layers, slots], got shape {p2l.shape}", where=where
            )
        num_layers, num_slots = p2l.shape
        if self.layer_ids.shape != (num_layers,):
            raise PlacementError(
                f"{self.layer_ids.size} layer ids for {num_layers} layers", where=where
            )
        if len(set(self.layer_ids.tolist())) != num_layers:
            raise PlacementError("layer ids repeat", where=where)
        if self.num_gpus <= 0 or num_slots % self.num_gpus:
            raise PlacementError(
                f"{num_slots} slots per layer do not split evenly over {self.num_gpus} GPUs",
                where=where,
                hint="engines need the same number of slots on every GPU: a row lists"
                f" {self.num_gpus} GPUs x S slots per GPU",
            )
        if num_slots < self.num_experts:
            raise PlacementError(
                f"{num_slots} slots cannot hold {self.num_experts} experts", where=where
            )
        bad = (p2l < 0) | (p2l >= self.num_experts)
        if bad.any():
            row, col = (int(x) for x in np.argwhere(bad)[0])
            raise PlacementError(
                f"slot {col} of layer {int(self.layer_ids[row])} holds expert {int(p2l[row, col])},"
                f" outside [0, {self.num_experts})",
                where=where,
            )
        counts = self.replica_counts
        missing = np.argwhere(counts == 0)
        if missing.size:
            row, expert = (int(x) for x in missing[0])
            raise PlacementError(
                f"expert {expert} of layer {int(self.layer_ids[row])} has no replica", where=where,
                hint="every logical expert needs at least one slot",
            )

    def __eq__(self, other: object) -> bool:
        """Same layers, experts, GPUs and slot contents (``meta`` is ignored)."""
        if not isinstance(other, Placement):
            return NotImplemented
        return (
            self.num_experts == other.num_experts
            and self.num_gpus == other.num_gpus
            and np.array_equal(self.layer_ids, other.layer_ids)
            and np.array_equal(self.physical_to_logical, other.physical_to_logical)
        )

    def __hash__(self) -> int:
        return hash(
            (self.num_experts, self.num_gpus, self.layer_ids.tobytes(),
             self.physical_to_logical.shape, self.physical_to_logical.tobytes())
        )

    def check_model(self, model: ModelLayers, where: str | None = None) -> None:
        """Raise PlacementError unless this placement fits ``model``: same number of
        experts, and every layer id one of the model's MoE layers (or its MTP layers,
        ``mtp_layer_ids``).
        """
        name = model.name
        if int(model.num_experts) != self.num_experts:
            raise PlacementError(
                f"the placement has {self.num_experts} experts per layer but {name} has"
                f" {model.num_experts}",
                where=where, hint="plan with the model you deploy (`model`)",
            )
        moe_layers = {int(i) for i in (*model.moe_layer_ids, *model.mtp_layer_ids)}
        foreign = [int(i) for i in self.layer_ids if int(i) not in moe_layers]
        if foreign:
            raise PlacementError(
                f"layer {foreign[0]} of the placement is not a MoE layer of {name}",
                where=where,
                hint=f"{name}'s MoE layers are {format_ranges(np.array(sorted(moe_layers)))}",
            )

    # -- shape ----------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return int(self.physical_to_logical.shape[0])

    @property
    def num_physical(self) -> int:
        """``P``, slots per layer."""
        return int(self.physical_to_logical.shape[1])

    @property
    def num_redundant(self) -> int:
        """``R = P - E``."""
        return self.num_physical - self.num_experts

    @property
    def slots_per_gpu(self) -> int:
        """``S = P / G``."""
        return self.num_physical // self.num_gpus

    # -- derived views ----------------------------------------------------------------
    @property
    def gpu_of_slot(self) -> np.ndarray:
        """``[P]`` int64, GPU holding each slot."""
        return np.arange(self.num_physical, dtype=np.int64) // self.slots_per_gpu

    @property
    def replica_counts(self) -> np.ndarray:
        """``[layers, E]`` int64, replicas of each logical expert."""
        out = np.zeros((self.num_layers, self.num_experts), dtype=np.int64)
        rows = np.repeat(np.arange(self.num_layers), self.num_physical)
        np.add.at(out, (rows, self.physical_to_logical.ravel()), 1)
        return out

    @property
    def logical_to_physical(self) -> np.ndarray:
        """``[layers, E, X]`` int64 slots of each expert in increasing order, -1 padded.

        ``X`` is the largest replica count; a duplicate lists both slots of its GPU.
        """
        counts = self.replica_counts
        width = int(counts.max()) if counts.size else 1
        out = np.full((self.num_layers, self.num_experts, width), -1, dtype=np.int64)
        p2l = self.physical_to_logical
        order = np.argsort(p2l, axis=1, kind="stable")  # slots by expert, then slot
        experts = np.take_along_axis(p2l, order, axis=1)
        first = np.cumsum(counts, axis=1) - counts  # [layers, E] first sorted position
        rank = np.arange(self.num_physical)[None, :] - np.take_along_axis(first, experts, 1)
        rows = np.arange(self.num_layers)[:, None]
        out[rows, experts, rank] = order
        return out

    @property
    def replicas_on_gpu(self) -> np.ndarray:
        """``[layers, E, G]`` int64, replicas of expert e on GPU g (2 for a duplicate).

        ``replicas_on_gpu / replica_counts[:, :, None]`` is the share of an expert's
        selections each GPU serves when selections split evenly over replicas.
        """
        out = np.zeros((self.num_layers, self.num_experts, self.num_gpus), dtype=np.int64)
        rows = np.repeat(np.arange(self.num_layers), self.num_physical)
        gpus = np.tile(self.gpu_of_slot, self.num_layers)
        np.add.at(out, (rows, self.physical_to_logical.ravel(), gpus), 1)
        return out

    @property
    def expert_gpu_mask(self) -> np.ndarray:
        """``[layers, E, G]`` bool, whether GPU g holds at least one replica of expert e.

        A duplicate counts once: use :attr:`replicas_on_gpu` for shares of load.
        """
        mask = np.zeros((self.num_layers, self.num_experts, self.num_gpus), dtype=bool)
        rows = np.repeat(np.arange(self.num_layers), self.num_physical)
        gpus = np.tile(self.gpu_of_slot, self.num_layers)
        mask[rows, self.physical_to_logical.ravel(), gpus] = True
        return mask

    @property
    def duplicate_gpus(self) -> np.ndarray:
        """``[layers, G]`` bool, whether the GPU holds some expert more than once."""
        grid = np.sort(
            self.physical_to_logical.reshape(self.num_layers, self.num_gpus, self.slots_per_gpu),
            axis=2,
        )
        dup: np.ndarray = (grid[:, :, 1:] == grid[:, :, :-1]).any(axis=2)
        return dup

    @property
    def duplicate_pairs(self) -> list[tuple[int, int]]:
        """``(layer id, GPU)`` of each GPU holding some expert twice, in layer-row order."""
        return [(int(self.layer_ids[row]), int(gpu))
                for row, gpu in np.argwhere(self.duplicate_gpus)]

    @property
    def forced_duplicates(self) -> bool:
        """Whether every duplicate is forced by the replica counts: in each layer with one,
        some expert has more replicas than there are GPUs (no arrangement of those replicas
        keeps one per GPU).  False without duplicates."""
        dup = self.duplicate_gpus.any(axis=1)
        forced = self.replica_counts.max(axis=1) > self.num_gpus
        return bool(dup.any() and not (dup & ~forced).any())

    def duplicate_warning(self, source: str | None = None, why: str | None = None,
                          said: set[tuple[int, int]] | None = None) -> str | None:
        """A sentence on this placement's duplicates for the user, or None without any.

        ``source`` (a file name) starts the sentence when given; ``why`` (how the plan came
        to hold them: ``"as ..."``) follows the duplicates it names.  Duplicates the
        replica counts force are said to be forced.  ``said``: ``(layer id, GPU)`` pairs
        already said, left out (None when none were).
        """
        dup = self.duplicate_gpus.copy()
        for layer, gpu in said or ():
            rows = np.flatnonzero(self.layer_ids == layer)
            if rows.size and 0 <= gpu < self.num_gpus:
                dup[rows[0], gpu] = False
        if not dup.any():
            return None
        row, gpu = (int(x) for x in np.argwhere(dup)[0])
        experts = self.experts_on_gpu(row, gpu)
        values, counts = np.unique(experts, return_counts=True)
        expert = int(values[np.argmax(counts)])
        where = f"{source}: " if source else ""
        more = int(dup.sum()) - 1
        others = f" (and {more} more (layer, GPU) pairs)" if more else ""
        if self.forced_duplicates:
            replicas = self.replica_counts
            top_row = int(np.argmax(replicas.max(axis=1)))
            top = int(np.argmax(replicas[top_row]))
            why = (f"forced by the replica counts (expert {top} of layer"
                   f" {int(self.layer_ids[top_row])} has {int(replicas[top_row, top])}"
                   f" replicas for {self.num_gpus} GPUs)")
        return (
            f"{where}GPU {gpu} holds {int(counts.max())} replicas of expert {expert} in layer"
            f" {int(self.layer_ids[row])}{others}{f', {why}' if why else ''}: a second replica"
            " on one GPU takes a slot of memory but adds no dispatch bandwidth; SGLang,"
            " TensorRT-LLM and vLLM load such placements, vLLM-Ascend's expert map cannot"
            " express them"
        )

    def warn_duplicates(self, source: str | None = None, stacklevel: int = 2,
                        why: str | None = None) -> None:
        """Issue :meth:`duplicate_warning` as a :class:`PlacerWarning`, once: of the
        duplicates ``meta["duplicates"]`` does not record as said (placer wrote the file and
        said them when it did), none when it records every one; then record them all
        there, so that the placement written from this one does not say them again.
        """
        message = self.duplicate_warning(source, why, said_pairs(self.meta))
        if message is None:
            return
        warnings.warn(message, PlacerWarning, stacklevel=stacklevel + 1)
        self.meta[DUPLICATES_KEY] = duplicates_record(self, why)

    def check_distinct(self, reader: str, hint: str, where: str | None = None,
                       unit: str = "GPU") -> None:
        """Raise PlacementError when a GPU holds an expert twice, for a ``reader`` that
        keeps one slot per expert on a GPU (vLLM-Ascend's expert map): the first one, the
        count, and ``hint`` (what to do)."""
        dup = self.duplicate_gpus
        if not dup.any():
            return
        row, gpu = (int(x) for x in np.argwhere(dup)[0])
        values, counts = np.unique(self.experts_on_gpu(row, gpu), return_counts=True)
        raise PlacementError(
            f"{unit} {gpu} holds expert {int(values[np.argmax(counts)])} twice in layer"
            f" {int(self.layer_ids[row])} ({int(dup.sum())} (layer, {unit}) pairs in"
            f" all); {reader}", where=where, hint=hint,
        )

    def experts_on_gpu(self, layer_row: int, gpu: int) -> np.ndarray:
        """``[S]`` logical experts held by ``gpu`` in layer row ``layer_row``."""
        s = self.slots_per_gpu
        return self.physical_to_logical[layer_row, gpu * s : (gpu + 1) * s].copy()

    def layer_row(self, layer_id: int) -> int:
        hits = np.flatnonzero(self.layer_ids == layer_id)
        if hits.size == 0:
            raise PlacementError(
                f"layer {layer_id} is not in the placement",
                hint=f"the placement's layers are {format_ranges(self.layer_ids)}")
        return int(hits[0])

    def same_layers(self, other: Placement) -> bool:
        """Whether ``other`` holds the same experts in the same slots of the same layers
        (``meta`` aside): what evaluates ``self`` evaluates ``other`` the same."""
        return (self.num_gpus == other.num_gpus and self.num_experts == other.num_experts
                and np.array_equal(self.layer_ids, other.layer_ids)
                and np.array_equal(self.physical_to_logical, other.physical_to_logical))


#: The key of ``Placement.meta`` (and of placement JSON) that records the duplicates
#: already said: ``{"pairs": [[layer id, GPU], ...], "why": str | None}``.
DUPLICATES_KEY = "duplicates"


def duplicates_record(placement: Placement, why: str | None = None) -> dict[str, Any] | None:
    """The record of ``placement``'s duplicates (:data:`DUPLICATES_KEY`), None without any."""
    pairs = placement.duplicate_pairs
    if not pairs:
        return None
    return {"pairs": [list(p) for p in pairs], "why": why}


def said_pairs(meta: dict[str, Any]) -> set[tuple[int, int]]:
    """The ``(layer id, GPU)`` duplicates ``meta`` records as said (empty when none)."""
    record = meta.get(DUPLICATES_KEY)
    pairs = record.get("pairs") if isinstance(record, dict) else None
    if not isinstance(pairs, list):
        return set()
    return {(int(p[0]), int(p[1])) for p in pairs
            if isinstance(p, list | tuple) and len(p) == 2}


def _slot_rows(rows: Any, num_gpus: int) -> np.ndarray:
    """``physical_to_logical`` as an int64 array, or PlacementError when its rows differ in
    length (each lists GPUs x slots per GPU experts) or a slot holds no integer."""
    try:
        array = np.asarray(rows)
    except ValueError:
        array = np.asarray(rows, dtype=object)
    if array.dtype == object and array.ndim == 1 and all(np.ndim(r) == 1 for r in array):
        lengths = [len(r) for r in array]
        row = next((i for i, n in enumerate(lengths) if n != lengths[0]), 0)
        raise PlacementError(
            f"layer row {row} has {lengths[row]} slots, row 0 has {lengths[0]}",
            hint=f"every row lists the expert of each slot: {num_gpus} GPUs x the same slots"
            " per GPU",
        )
    if array.dtype.kind in "iu":
        return array.astype(np.int64, copy=False)
    if array.dtype.kind == "f" and array.size and bool(np.isfinite(array).all()) \
            and bool((array == np.round(array)).all()):
        return array.astype(np.int64)
    if array.size == 0 and array.dtype.kind in "fb":
        return array.astype(np.int64)
    bad = next((v for v in np.asarray(rows, dtype=object).ravel().tolist()
                if not (isinstance(v, int | np.integer) and not isinstance(v, bool))
                and not (isinstance(v, float) and v.is_integer())), None)
    raise PlacementError(
        f"physical_to_logical holds {bad!r}, not an expert id",
        hint="each slot holds the integer id of the logical expert it serves",
    )


def gpu_loads(placement: Placement, load: np.ndarray) -> np.ndarray:
    """Expected load of each GPU when each expert's load splits evenly over its replicas.

    Parameters
    ----------
    load: ``[layers, E]`` or ``[windows, layers, E]`` loads, layer rows matching
        ``placement.layer_ids``.

    Returns
    -------
    ``[layers, G]`` or ``[windows, layers, G]`` float64 load per GPU.  This is the
    figure EPLB balances and the planners' balance objective.
    """
    load = np.asarray(load, dtype=np.float64)
    squeeze = load.ndim == 2
    if squeeze:
        load = load[None]
    counts = placement.replica_counts  # [L, E]
    per_replica = load / counts[None]  # [W, L, E]
    p2l = placement.physical_to_logical  # [L, P]
    slot_load = np.take_along_axis(per_replica, np.broadcast_to(p2l, load.shape[:1] + p2l.shape), 2)
    out = slot_load.reshape(load.shape[0], placement.num_layers, placement.num_gpus, -1).sum(axis=3)
    return out[0] if squeeze else out


def hot_shard_ratio(gpu_load: np.ndarray) -> np.ndarray:
    """max / mean over the last (GPU) axis; 1.0 where a layer has no load."""
    mean = gpu_load.mean(axis=-1)
    mx = gpu_load.max(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(mean > 0, mx / np.where(mean > 0, mean, 1), 1.0)
    return ratio

