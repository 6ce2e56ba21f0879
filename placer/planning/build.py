"""Turn statistics, a model and a cluster into a :class:`PlacementProblem`.

:func:`build_problem` checks that the pieces agree (the trace's experts and layers
against the model's), chooses the number of slots per GPU, and checks it against
the memory budget (:func:`placer.model.capacity.plan_capacity`) when both the model and
the topology are known.

Slots per GPU: ``--slots-per-gpu S`` or ``--redundant R`` (``S = (E + R) / G``),
never both.  With neither, placer plans without redundant experts: ``S = E / G``,
rounded up when ``G`` does not divide ``E`` (engines need the same ``S`` on every
GPU, so the ``G * S - E`` leftover slots hold replicas).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from placer.constants import GB
from placer.errors import (
    InfeasibleError,
    Param,
    PlacerError,
    TraceError,
    TraceWarning,
    UsageError,
)
from placer.model.slots import fewest_slots_per_gpu
from placer.placement import Placement
from placer.problem import PlacementProblem
from placer.stats import ExpertStats, RoutingData, format_ranges
from placer.stats.windows import OpenRange, parse_window_range, resolve_window_range

if TYPE_CHECKING:
    from placer.model import ModelSpec
    from placer.model.capacity import Capacity
    from placer.topology import Topology

__all__ = ["ProblemSpec", "build_problem", "check_declared_model", "check_trace_model"]


@dataclass(frozen=True)
class ProblemSpec:
    """What a planning problem is built from, besides the routing data.

    Attributes
    ----------
    model: ``placer.model.ModelSpec`` or None.  When given, the trace must have the
        model's number of experts, and its layer ids must be MoE layers of the model
        (its multi-token-prediction layers included: statistics recorded with MTP on
        hold them, and they are planned like any other layer).
    topology: ``placer.topology.Topology`` or None; gives ``G`` and the node of each GPU.
    num_gpus: ``G`` when there is no topology (all GPUs on one node); must agree
        with the topology when both are given.
    slots_per_gpu, redundant: ``S``, or ``R`` redundant experts per layer (``P = E + R``
        must be a multiple of ``G``); at most one of them.  Default: ``ceil(E / G)``.
    dtype, kv_reserve_gb, kv_reserve_fraction: passed to
        ``placer.model.capacity.plan_capacity`` when model and topology are both given.
    current: the deployed placement (migration-aware solvers read it).
    fit: window range ``(start, stop)`` or ``"start:stop"`` of the statistics to fit;
        None fits every window.
    """

    model: ModelSpec | None = None
    topology: Topology | None = None
    num_gpus: int | None = None
    slots_per_gpu: int | None = None
    redundant: int | None = None
    dtype: str | None = None
    kv_reserve_gb: float | None = None
    kv_reserve_fraction: float | None = None
    current: Placement | None = None
    fit: OpenRange | str | None = None

    def with_slots(self, slots_per_gpu: int | None) -> ProblemSpec:
        """The same problem with ``slots_per_gpu`` slots per GPU (no redundancy count)."""
        return replace(self, slots_per_gpu=slots_per_gpu, redundant=None)

    def fitted(self, num_windows: int) -> tuple[int, int] | None:
        """``(start, stop)`` of the fitted windows out of ``num_windows`` (None: every
        window)."""
        if self.fit is None:
            return None
        start, stop = parse_window_range(self.fit) if isinstance(self.fit, str) else self.fit
        return (start or 0, num_windows if stop is None else stop)


def build_problem(routing: RoutingData | ExpertStats,
                  spec: ProblemSpec | None = None) -> PlacementProblem:
    """Build the planning problem of ``routing`` (what a trace reader returned, or its
    ``ExpertStats``) as ``spec`` describes it (None: every default, which leaves the
    number of GPUs unknown: a usage error).

    Raises
    ------
    UsageError: options that contradict each other or the data (named by option).
    TraceError: the trace does not match the model.
    InfeasibleError: the memory budget cannot hold ``S`` slots per GPU.
    """
    spec = spec or ProblemSpec()
    model, topology, redundant = spec.model, spec.topology, spec.redundant
    stats = routing.stats if isinstance(routing, RoutingData) else routing
    stats = _select_fit(stats, spec.fit)
    if model is not None:
        _check_trace_against_model(stats, model)

    gpus, node_of_gpu = _gpus(topology, spec.num_gpus)
    capacity = None
    if model is not None and topology is not None:
        from placer.model.capacity import plan_capacity  # lands with the hardware modules

        capacity = plan_capacity(model, topology, spec.dtype, kv_reserve_gb=spec.kv_reserve_gb,
                                 kv_reserve_fraction=spec.kv_reserve_fraction)
    most = None if capacity is None else int(capacity.slots_per_gpu)
    try:
        slots = _slots_per_gpu(stats.num_experts, gpus, spec.slots_per_gpu, redundant, most)
    except _NoEvenSplitFits as none:
        slots = none.slots  # the fewest even slots overflow the memory: say so below
    if model is not None and topology is not None and capacity is not None:
        option = Param("redundant") if redundant is not None else Param("slots_per_gpu")
        _check_memory(model, topology, capacity, slots, option)
    if spec.current is not None:
        _check_current(spec.current, stats, gpus)

    return PlacementProblem(
        stats=stats,
        num_gpus=gpus,
        slots_per_gpu=slots,
        node_of_gpu=node_of_gpu,
        num_groups=int(getattr(model, "num_groups", 1) or 1) if model is not None else 1,
        topology=topology,
        model=model,
        current=spec.current,
    )


def _select_fit(stats: ExpertStats, fit: OpenRange | str | None) -> ExpertStats:
    if fit is None:
        return stats
    given = parse_window_range(fit) if isinstance(fit, str) else fit
    first, last = resolve_window_range(given, stats.num_windows, option=Param("fit"))
    if (first, last) == (0, stats.num_windows):
        return stats
    return stats.select_windows(first, last)


def _source(stats: ExpertStats) -> str | None:
    sources = stats.provenance.sources
    return sources[0] if len(sources) == 1 else None


def check_trace_model(stats: ExpertStats, model: ModelSpec, *,
                      allow_mismatch: bool = False) -> None:
    """Check that the trace ``stats`` was recorded on ``model``.

    A trace that declares another catalog model than ``model`` (its header's or
    array's ``model``) is a TraceError naming the trace's model, ``model`` and what
    differs (:func:`check_declared_model`); one whose experts or layers are not the
    model's is a TraceError too, with or without ``allow_mismatch``: a plan cannot place
    experts or layers the model lacks.
    """
    check_declared_model(stats.provenance.model, model, num_experts=stats.num_experts,
                         top_k=stats.top_k, layer_ids=stats.layer_ids, where=_source(stats),
                         allow_mismatch=allow_mismatch)
    _check_trace_against_model(stats, model)


def check_declared_model(declared: str | None, model: ModelSpec, *, num_experts: int,
                         top_k: int | None, layer_ids: np.ndarray, where: str | None,
                         allow_mismatch: bool = False) -> None:
    """The trace at ``where`` declares the model ``declared`` and has ``num_experts``,
    ``top_k`` and ``layer_ids``: a TraceError when ``declared`` is another catalog model
    than ``model``, naming both and what differs; with ``allow_mismatch`` a TraceWarning
    instead.  A declared name placer does not know (``synthetic``, a local name) is not
    compared."""
    other = _declared_model(declared, model)
    if other is None:
        return
    differs = _differences(num_experts, top_k, layer_ids, model)
    text = (
        f"the trace declares model {other} but `model` is {model.name}"
        + (f" ({'; '.join(differs)})" if differs else "")
    )
    if not allow_mismatch:
        raise TraceError(
            text, where=where,
            hint=f"give `model` {other}, or pass `allow_model_mismatch` to use"
            f" {other}'s routing for {model.name} anyway",
        )
    warnings.warn(TraceWarning(f"{text}; read as {model.name}'s routing"
                               " (`allow_model_mismatch`)"), stacklevel=3)


def _declared_model(declared: str | None, model: ModelSpec) -> str | None:
    """The catalog model ``declared`` names, when it is not ``model`` (None otherwise)."""
    from placer.model import load_model

    if not declared or declared.lower() == str(model.name).lower():
        return None
    try:
        spec = load_model(declared)
    except (PlacerError, OSError, ValueError):
        return None  # a name placer does not know: nothing to compare it with
    if spec.name.lower() == str(model.name).lower():
        return None
    return str(spec.name)


def _differences(num_experts: int, top_k: int | None, layer_ids: np.ndarray,
                 model: ModelSpec) -> list[str]:
    """What the trace has that ``model`` has not: experts, top-k, layers."""
    out = []
    if num_experts != int(model.num_experts):
        out.append(f"{num_experts} experts per layer, {model.name} has {model.num_experts}")
    if top_k is not None and int(top_k) != int(model.top_k):
        out.append(f"top-k {top_k}, {model.name} has {model.top_k}")
    layers = [int(i) for i in model.moe_layer_ids]
    layers += [int(i) for i in getattr(model, "mtp_layer_ids", ())]
    covered = len({int(i) for i in layer_ids} & set(layers))
    if covered != len(layers) or len(layer_ids) != covered:
        out.append(f"the trace covers {covered} of {model.name}'s {len(layers)} MoE layers"
                   f": {format_ranges(np.asarray(layer_ids))}")
    return out


def _trace_name(stats: ExpertStats) -> str:
    declared = stats.provenance.model
    return f"the trace ({declared})" if declared else "the trace"


def _check_trace_against_model(stats: ExpertStats, model: ModelSpec) -> None:
    name = getattr(model, "name", "the model")
    if stats.num_experts != int(model.num_experts):
        raise TraceError(
            f"{_trace_name(stats)} has {stats.num_experts} experts per layer but {name}"
            f" has {model.num_experts}",
            where=_source(stats),
            hint="give the model the trace was recorded on as `model`",
        )
    moe_layers = [int(i) for i in model.moe_layer_ids]
    # MTP layers (num_hidden_layers + i) are MoE layers too when the engine ran them
    mtp_layers = [int(i) for i in getattr(model, "mtp_layer_ids", ())]
    allowed = set(moe_layers) | set(mtp_layers)
    foreign = [int(i) for i in stats.layer_ids if int(i) not in allowed]
    if foreign:
        trace_layers = format_ranges(stats.layer_ids)
        hint = f"{name}'s MoE layers are {format_ranges(np.array(moe_layers))}"
        if mtp_layers:
            hint += f", and {format_ranges(np.array(mtp_layers))} with multi-token prediction"
        if (stats.layer_ids < len(moe_layers)).all() and min(moe_layers) > 0:
            hint += (
                "; the trace may number MoE layers from 0: re-export it with the model's"
                " absolute layer ids (placer never renumbers layers silently)"
            )
        elif not mtp_layers and foreign[0] >= getattr(model, "num_hidden_layers", foreign[0] + 1):
            hint += (
                f"; layer {foreign[0]} is past the {model.num_hidden_layers} hidden layers,"
                " as a multi-token-prediction (MTP) layer is: give a model with"
                " num_nextn_predict_layers (a model YAML or the checkpoint's config.json)"
            )
        raise TraceError(
            f"{_trace_name(stats).removeprefix('the ')} layer {foreign[0]} is not an MoE"
            f" layer of {name}"
            f" (trace layers: {trace_layers})",
            where=_source(stats),
            hint=hint,
        )


def _gpus(topology: Topology | None, num_gpus: int | None) -> tuple[int, np.ndarray]:
    if topology is not None:
        gpus = int(topology.num_gpus)
        if num_gpus is not None and int(num_gpus) != gpus:
            raise UsageError(
                f"`num_gpus` {num_gpus} contradicts topology {topology.name!r} with {gpus} GPUs",
                where=Param("num_gpus"), hint="give one of `num_gpus` and `topology`",
            )
        return gpus, np.asarray(topology.node_of_gpu, dtype=np.int64)
    if num_gpus is None:
        raise UsageError(
            "the number of GPUs is unknown", where=Param("topology"),
            hint="give `topology` (a preset name or YAML file) or `num_gpus`",
        )
    if int(num_gpus) <= 0:
        raise UsageError(f"expected a positive number of GPUs, got {num_gpus}",
                         where=Param("num_gpus"))
    return int(num_gpus), np.zeros(int(num_gpus), dtype=np.int64)


class _NoEvenSplitFits(Exception):
    """No count of redundant experts both splits evenly and fits the memory budget."""

    def __init__(self, slots: int) -> None:
        super().__init__(slots)
        self.slots = slots


def _slots_per_gpu(
    num_experts: int, num_gpus: int, slots_per_gpu: int | None, redundant: int | None,
    most: int | None = None,
) -> int:
    """``S`` from the options; ``most``: the slots per GPU the memory budget holds (None:
    unknown), so that a value a hint suggests passes the memory check as well."""
    if slots_per_gpu is not None and redundant is not None:
        raise UsageError(
            "`redundant` and `slots_per_gpu` exclude each other", where=Param("redundant"),
            hint=f"give one: S slots per GPU means R = {num_gpus} x S - {num_experts}",
        )
    minimum = fewest_slots_per_gpu(num_experts, num_gpus)
    if redundant is not None:
        if redundant < 0:
            raise UsageError(f"expected R >= 0, got {redundant}", where=Param("redundant"),
                             hint="0 or more redundant experts per layer")
        total = num_experts + redundant
        if total % num_gpus:
            # the even splits next to R, within what a GPU can hold: at least the fewest
            # slots, at most one replica of each expert and what the memory holds
            cap = num_experts if most is None else min(num_experts, most)
            if cap < minimum:
                raise _NoEvenSplitFits(minimum)
            below = min(max(minimum, total // num_gpus), cap)
            above = -(-total // num_gpus)
            choices = sorted({s * num_gpus - num_experts
                              for s in (below, above) if minimum <= s <= cap})
            limit = ""
            if above > cap:
                limit = (f"; the memory budget holds at most {most} slots per GPU"
                         if most is not None and most < num_experts else
                         f"; a GPU holds at most one replica of each of the {num_experts}"
                         " experts")
            raise UsageError(
                f"{num_experts} experts + {redundant} redundant = {total} slots do not split"
                f" evenly over {num_gpus} GPUs",
                where=Param("redundant"),
                hint="engines need equal slots per GPU: try `redundant` "
                + " or ".join(map(str, choices)) + limit,
            )
        return total // num_gpus
    if slots_per_gpu is None:
        return minimum
    if slots_per_gpu < minimum:
        raise UsageError(
            f"{num_gpus} GPUs x {slots_per_gpu} slots cannot hold {num_experts} experts",
            where=Param("slots_per_gpu"), hint=f"use at least {minimum} slots per GPU",
        )
    if slots_per_gpu > num_experts:
        raise UsageError(
            f"{slots_per_gpu} slots per GPU exceed the {num_experts} experts; a GPU would need"
            " two replicas of one expert",
            where=Param("slots_per_gpu"), hint=f"use at most {num_experts}",
        )
    return slots_per_gpu


def _check_memory(
    model: ModelSpec, topology: Topology, capacity: Capacity, slots: int, option: str,
) -> None:
    if slots <= capacity.slots_per_gpu:
        return
    slot_gb = capacity.slot_bytes / GB
    gpu = int(getattr(capacity, "limiting_gpu", 0))
    memory, kv = float(capacity.memory_gb[gpu]), float(capacity.kv_reserve_gb[gpu])
    free = memory - capacity.non_expert_gb - capacity.overhead_gb - kv
    budget = (
        f"{memory:.0f} GB - {capacity.non_expert_gb:.1f} GB non-expert weights"
        f" - {capacity.overhead_gb:.1f} GB runtime - {kv:.1f} GB KV reserve"
        f" = {free:.1f} GB for experts"
    )
    fits = min(capacity.slots_per_gpu, model.num_experts)
    minimum = fewest_slots_per_gpu(model.num_experts, topology.num_gpus)
    if fits < minimum:
        hint = (f"{topology.num_gpus} GPUs need {minimum} slots each to hold the"
                f" {model.num_experts} experts: more GPUs, a smaller `kv_reserve_gb`, or a"
                " lower-precision `dtype`")
    else:
        hint = (f"use at most `slots_per_gpu` {fits}"
                f" (`redundant` {fits * topology.num_gpus - model.num_experts}),"
                " a smaller `kv_reserve_gb`, or a lower-precision `dtype`")
    raise InfeasibleError(
        f"{slots} slots per GPU need {slots * slot_gb:.1f} GB of expert weights per GPU"
        f" ({slot_gb:.2f} GB per slot over {model.num_moe_layers} MoE layers, {capacity.dtype}),"
        f" but the memory budget of {topology.name} holds {capacity.slots_per_gpu}"
        f" (GPU {gpu}: {budget})",
        where=option,
        hint=hint,
    )


def _check_current(current: Placement, stats: ExpertStats, num_gpus: int) -> None:
    if current.num_experts != stats.num_experts or current.num_gpus != num_gpus:
        raise UsageError(
            f"the current placement has {current.num_experts} experts on {current.num_gpus}"
            f" GPUs; the problem has {stats.num_experts} on {num_gpus}",
            where=Param("current"),
        )
    missing = sorted(set(stats.layer_ids.tolist()) - set(current.layer_ids.tolist()))
    if missing:
        raise UsageError(
            f"the current placement lacks layer {missing[0]}", where=Param("current"),
            hint="give the placement deployed for this model's layers",
        )

