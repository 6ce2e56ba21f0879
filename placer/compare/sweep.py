"""Sweeps: which redundancies each topology of a comparison runs.

One list of redundant experts rarely suits several clusters: 256 experts + 16 redundant
split evenly over 16 GPUs but not over 72, and engines need the same number of slots on
every GPU.  A :class:`Sweep` says what to try and :func:`topology_sweep` turns it into the
redundancies one topology can run, with a note on what it skipped and why:

- ``Sweep("redundant", (0, 16, 32))``: these ``R``; a value that does not split evenly over
  the topology's ``G`` GPUs, or would give a GPU more than ``E`` slots, is skipped there;
- ``Sweep("slots", (8, 9, 10))``: ``S`` slots per GPU, ``R = S x G - E``; a value below
  ``ceil(E / G)`` (``R < 0``) or above ``E`` (two replicas of one expert on a GPU) is skipped;
- ``Sweep("auto")``: the slot counts ``placer plan --redundant auto`` tries
  (:func:`placer.planning.redundancy.slot_candidates`: ``ceil(E / G)``, then 1, 2, 4, ... more, at
  most 8 counts and ``E`` slots), up to what the GPUs' memory holds;
- ``Sweep()`` (``"fewest"``): the fewest redundant experts that split evenly, ``0`` when
  ``G`` divides ``E``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from placer.compare.scenarios import Scenario, topology_label
from placer.errors import InfeasibleError, UsageError
from placer.model.slots import fewest_slots_per_gpu

if TYPE_CHECKING:
    from placer.model import ModelSpec
    from placer.topology import Topology

#: Kinds of :class:`Sweep`.
SWEEP_KINDS = ("fewest", "redundant", "slots", "auto")

#: Most values one range (``A..B``) may stand for.
MAX_RANGE_VALUES = 1024


@dataclass(frozen=True)
class Sweep:
    """Which redundancies to compare on every topology.

    Attributes
    ----------
    kind: ``"fewest"``, ``"redundant"`` (values are ``R``), ``"slots"`` (values are slots
        per GPU ``S``) or ``"auto"`` (memory-bounded slot counts; see the module).
    values: the ``R`` or ``S`` values in order (empty for ``fewest`` and ``auto``).
    """

    kind: str = "fewest"
    values: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in SWEEP_KINDS:
            raise UsageError(f"unknown kind of sweep {self.kind!r}",
                             hint=f"choose one of: {', '.join(SWEEP_KINDS)}")
        listed = self.kind in ("redundant", "slots")
        if listed and not self.values:
            raise UsageError(f"no value to compare in the {self.kind} sweep", where=self.option)
        if not listed and self.values:
            raise UsageError(f"a {self.kind!r} sweep takes no values", where=self.option)
        if any(v < 0 for v in self.values):
            raise UsageError(f"expected numbers >= 0, got {min(self.values)}", where=self.option,
                             hint="give counts >= 0 (the nearest valid one is 0)")

    @property
    def option(self) -> str:
        """The command-line option the sweep comes from."""
        return "--slots-per-gpu" if self.kind == "slots" else "--redundant"


@dataclass(frozen=True)
class TopologySweep:
    """The redundancies one topology runs.

    Attributes
    ----------
    redundant: ``R`` values, in the sweep's order, without duplicates.
    note: what was skipped and why, or how ``auto`` chose; None when there is nothing to say.
    """

    redundant: tuple[int, ...]
    note: str | None = None


def parse_counts(text: str, option: str, example: str) -> tuple[int, ...]:
    """``"0,16,32"``, ``"8..12"`` or ``"8..10,12"`` -> the integers in order (ranges
    inclusive); UsageError naming ``option``, with ``example`` in the hint, otherwise."""
    values: list[int] = []
    for part in text.split(","):
        low_text, dots, high_text = part.strip().partition("..")
        try:
            low = int(low_text)
            high = int(high_text) if dots else low
        except ValueError:
            raise UsageError(
                f"expected integers or ranges A..B separated by commas, got {text!r}",
                where=option, hint=f"for example {option} {example}",
            ) from None
        if min(low, high) < 0:
            raise UsageError(f"expected numbers >= 0, got {min(low, high)}", where=option,
                             hint=f"give counts >= 0 (the nearest valid one is 0), for"
                             f" example {option} {example}")
        if high < low:
            raise UsageError(f"range {low}..{high} is reversed", where=option,
                             hint=f"write it {high}..{low}")
        if high - low >= MAX_RANGE_VALUES:
            raise UsageError(f"range {low}..{high} stands for {high - low + 1} values",
                             where=option,
                             hint=f"at most {MAX_RANGE_VALUES}; list a few values instead")
        values.extend(range(low, high + 1))
    return tuple(values)


def parse_sweep(redundant: str | None, slots_per_gpu: str | None) -> Sweep:
    """The sweep of ``--redundant`` (``R`` list, ranges or ``auto``) and ``--slots-per-gpu``
    (``S`` list or ranges); at most one of them (``Sweep()`` for neither)."""
    if redundant is not None and slots_per_gpu is not None:
        raise UsageError("--redundant and --slots-per-gpu exclude each other",
                         where="--slots-per-gpu",
                         hint="give one: S slots per GPU means R = S x GPUs - experts")
    if slots_per_gpu is not None:
        return Sweep("slots", parse_counts(slots_per_gpu, "--slots-per-gpu", "8..12"))
    if redundant is None:
        return Sweep()
    if redundant.strip().lower() == "auto":
        return Sweep("auto")
    return Sweep("redundant", parse_counts(redundant, "--redundant", "0,16,32 (or auto)"))


def topology_sweep(
    sweep: Sweep, name: str, num_experts: int, num_gpus: int, max_slots: int | None = None
) -> TopologySweep:
    """The redundancies ``sweep`` gives on one topology.

    Parameters
    ----------
    sweep: what to try.
    name: the topology's label (for the note).
    num_experts, num_gpus: ``E`` and ``G``.
    max_slots: the most slots per GPU the memory holds
        (:attr:`placer.model.capacity.Capacity.slots_per_gpu`); None when even ``ceil(E / G)``
        does not fit.  Read by ``auto`` only: the other kinds let a scenario that does not
        fit say so in its row.
    """
    fewest = fewest_slots_per_gpu(num_experts, num_gpus)
    if sweep.kind == "fewest":
        return TopologySweep((fewest * num_gpus - num_experts,))
    if sweep.kind == "auto":
        return _auto(name, num_experts, num_gpus, fewest, max_slots)
    if sweep.kind == "slots":
        return _slots(sweep.values, name, num_experts, num_gpus, fewest)
    return _redundant(sweep.values, name, num_experts, num_gpus, fewest)


def _auto(name: str, experts: int, gpus: int, fewest: int, max_slots: int | None) -> TopologySweep:
    from placer.planning.redundancy import slot_candidates

    if max_slots is None or max_slots < fewest:
        return TopologySweep(
            (fewest * gpus - experts,),
            f"{name}: --redundant auto: even {fewest} slots per GPU (R = {fewest * gpus - experts})"
            " do not fit in memory; its row says why")
    slots = slot_candidates(experts, gpus, max_slots)
    bound = f"memory holds {max_slots}"
    if max_slots > experts:
        bound += f", a GPU at most the {experts} experts"
    return TopologySweep(
        tuple(s * gpus - experts for s in slots),
        f"{name}: --redundant auto tries R = {_join(s * gpus - experts for s in slots)}"
        f" ({_join(slots)} slots per GPU; {bound})")


def _slots(values: tuple[int, ...], name: str, experts: int, gpus: int,
           fewest: int) -> TopologySweep:
    kept = _unique(s for s in values if fewest <= s <= experts)
    few = _unique(s for s in values if s < fewest)
    many = _unique(s for s in values if s > experts)
    reasons = []
    if few:
        reasons.append(f"{_join(few)} (below {fewest}: {gpus} GPUs x {fewest - 1} slots cannot"
                       f" hold the {experts} experts, R would be negative)")
    if many:
        reasons.append(f"{_join(many)} (more slots than the {experts} experts: a GPU would hold"
                       " two replicas of one expert)")
    return TopologySweep(tuple(s * gpus - experts for s in kept),
                         _skipped(name, "--slots-per-gpu", reasons, bool(kept)))


def _skipped(name: str, flag: str, reasons: list[str], kept: bool) -> str | None:
    """The sweep's note on ``name``: which values of ``flag`` were skipped and why."""
    if not reasons:
        return None
    return f"{name}: skipped {flag} {'; '.join(reasons)}{'' if kept else ' (every value)'}"


def _redundant(values: tuple[int, ...], name: str, experts: int, gpus: int,
               fewest: int) -> TopologySweep:
    most = experts * gpus - experts  # S = E: every expert on every GPU
    even = [r for r in values if (experts + r) % gpus == 0]
    kept = _unique(r for r in even if r <= most)
    uneven = _unique(r for r in values if (experts + r) % gpus)
    many = _unique(r for r in even if r > most)
    reasons = []
    if uneven:
        nearest: set[int] = set()
        for r in uneven:
            slots = (experts + r) // gpus
            nearest.update(s * gpus - experts for s in (slots, slots + 1) if fewest <= s <= experts)
        reasons.append(f"{_join(uneven)} ({experts} experts + R do not split evenly over {gpus}"
                       " GPUs: engines need equal slots per GPU; valid near them:"
                       f" {_join(sorted(nearest) or [most])})")
    if many:
        reasons.append(f"{_join(many)} (above {most}: a GPU would hold two replicas of one"
                       " expert)")
    return TopologySweep(kept, _skipped(name, "--redundant", reasons, bool(kept)))


def _unique(values: Iterable[int]) -> tuple[int, ...]:
    out: list[int] = []
    for v in values:
        if v not in out:
            out.append(int(v))
    return tuple(out)


def _join(values: Iterable[int]) -> str:
    return ", ".join(str(v) for v in values)


def sweep_scenarios(
    topologies: Sequence[str],
    sweep: Sweep,
    solvers: Sequence[str],
    model: ModelSpec,
    *,
    dtype: str | None = None,
    kv_reserve_gb: float | None = None,
    loaded: Mapping[str, Topology] | None = None,
) -> tuple[tuple[Scenario, ...], tuple[str, ...]]:
    """Every (topology, redundancy, solver) the sweep gives, topology-major, and the notes.

    Parameters
    ----------
    topologies: preset names or YAML paths.
    sweep: what to try on each.
    solvers: solver names.
    model: ``placer.model.ModelSpec`` (``E``, and the memory ``auto`` sizes against).
    dtype, kv_reserve_gb: as ``placer.model.capacity.plan_capacity`` takes them (``auto`` only).
    loaded: topologies already loaded, by argument (the others are loaded here).

    Returns
    -------
    ``(scenarios, notes)``: ``notes`` has one line per topology with something to say
    (skipped values, the slot counts ``auto`` tries), prefixed by the topology's label.
    """
    from placer.model.capacity import plan_capacity
    from placer.topology import load_topology

    if not topologies:
        raise UsageError("no topology to compare", where="--topology",
                         hint="give --topology at least once (a preset name or a YAML file)")
    if not solvers:
        raise UsageError("no solver to compare", where="--solver")
    scenarios: list[Scenario] = []
    notes: list[str] = []
    for name in _unique_names(topologies):
        topology = (loaded or {}).get(name) or load_topology(name)
        max_slots = None
        if sweep.kind == "auto":
            try:
                max_slots = int(plan_capacity(model, topology, dtype,
                                              kv_reserve_gb=kv_reserve_gb).slots_per_gpu)
            except InfeasibleError:
                max_slots = None
        chosen = topology_sweep(sweep, topology_label(name), int(model.num_experts),
                                int(topology.num_gpus), max_slots)
        if chosen.note:
            notes.append(chosen.note)
        scenarios.extend(Scenario(name, r, s) for r in chosen.redundant for s in solvers)
    return tuple(scenarios), tuple(notes)


def _unique_names(names: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(names))
