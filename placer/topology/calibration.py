"""Achieved speeds: what fraction of a link's nominal bandwidth all-to-all kernels reach.

Nominal figures (450 GB/s NVLink, 50 GB/s per NIC) are what a datasheet promises; the
dispatch and combine kernels of an MoE layer reach less, and each phase pays a fixed
cost (kernel launch, notification, synchronisation) whatever it sends.  A
:class:`Calibration` holds, per *link technology*, an efficiency (achieved / nominal)
and a fixed cost per phase, and for expert compute the fraction of HBM bandwidth and of
peak FLOPS that grouped expert GEMMs reach.

Link technologies (the calibration keys)
----------------------------------------
Each GPU sends intra-node traffic over its node's fabric and inter-node traffic through
its NIC.  The key of the fabric is the fabric's ``link:`` (``nvlink``, ``xgmi``,
``pcie``; by default ``nvlink`` for ``nvswitch``/``switch``/``mesh`` fabrics and
``pcie`` for ``pcie`` fabrics; for ``fabric: {kind: none}`` the kind of the GPU's
explicit links); the key of the NIC is the network's ``kind`` (``infiniband``,
``roce``, ``ethernet``).  A key without an entry runs at nominal speed with no fixed
cost.

The defaults (:data:`DEFAULT_CALIBRATION`) are fitted to DeepEP's published V1 tables
(H800, ~160 GB/s NVLink, 400 Gb/s CX7 InfiniBand; see ``docs/evaluate.md`` for the
table, the fit and what is an assumption).  A topology file overrides any of them in a
``calibration:`` section, and ``placer calibrate`` fits them from measured timings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from placer.errors import UsageError


@dataclass(frozen=True)
class LinkCalibration:
    """Achieved speed of one link technology in all-to-all phases.

    Attributes
    ----------
    efficiency: achieved / nominal bandwidth, in (0, 2] (above 1 only when the nominal
        figure in the topology is too low).
    phase_us: fixed cost of one dispatch or combine phase that uses this link,
        microseconds (>= 0).
    """

    efficiency: float = 1.0
    phase_us: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.efficiency) and 0 < self.efficiency <= 2):
            raise UsageError(
                f"expected a link efficiency in (0, 2], got {self.efficiency}",
                where="calibration.links.efficiency",
                hint="efficiency is achieved / nominal bandwidth, e.g. 0.85",
            )
        if not (math.isfinite(self.phase_us) and self.phase_us >= 0):
            raise UsageError(
                f"expected a fixed phase cost >= 0 us, got {self.phase_us}",
                where="calibration.links.phase_us",
            )


@dataclass(frozen=True)
class ComputeCalibration:
    """Achieved speed of expert FFNs (grouped GEMMs).

    Attributes
    ----------
    hbm_efficiency: achieved / nominal HBM bandwidth when reading expert weights, (0, 2].
    flops_efficiency: achieved / peak dense FLOPS for the expert dtype, (0, 2].
    """

    hbm_efficiency: float = 1.0
    flops_efficiency: float = 1.0

    def __post_init__(self) -> None:
        for name in ("hbm_efficiency", "flops_efficiency"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 < value <= 2):
                raise UsageError(
                    f"expected {name} in (0, 2], got {value}",
                    where=f"calibration.compute.{name}",
                    hint="an efficiency is achieved / nominal, e.g. 0.8",
                )


@dataclass(frozen=True)
class RebalanceCalibration:
    """What moving expert weights online costs beyond their bytes (a replay's rebalances).

    Defaults follow the engines' reports (docs/replay.md, "The fit"): vLLM's synchronous
    rearrangement of DeepSeek-R1 on 32 GB200s stalled 0.65-1.70 s, 0.91 s on average,
    over its 58 MoE layers (vLLM PR #43219); with EPLB's decision (~35 ms) and the
    copies (~16 ms) charged apart, that leaves ~50 ms of host work and ~14 ms a layer
    that moves (a batched send/receive and its synchronisation); SGLang reports ~1 s of
    host work plus ~20 ms a layer without NVLink (SGLang issue #7879).  The published
    ITL p99 of background copies (within 4% of synchronous ones, either way) cannot tell
    ``async_share`` apart: it stays at the bound, 1, and replays state their verdict
    over 0.25-1.

    Attributes
    ----------
    host_ms: fixed time a synchronous rebalance stops serving (building the transfers;
        the decision's own time is charged apart), milliseconds, >= 0.
    layer_ms: time per layer whose weights move, milliseconds, >= 0 (synchronous: a
        stall; in the background: one step's delay per layer).
    async_share: share of a background copy's link time that lengthens the step it
        overlaps, in [0, 1] (1: the copy and the all-to-all take turns on the links).
    """

    host_ms: float = 50.0
    layer_ms: float = 14.0
    async_share: float = 1.0

    def __post_init__(self) -> None:
        for name in ("host_ms", "layer_ms"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise UsageError(f"expected {name} >= 0, got {value}",
                                 where=f"calibration.rebalance.{name}",
                                 hint="milliseconds, e.g. 15")
        if not (math.isfinite(self.async_share) and 0 <= self.async_share <= 1):
            raise UsageError(f"expected async_share in [0, 1], got {self.async_share}",
                             where="calibration.rebalance.async_share",
                             hint="the share of a background copy's link time a step pays,"
                             " e.g. 1")


def _frozen_links(links: Mapping[str, LinkCalibration]) -> Mapping[str, LinkCalibration]:
    return MappingProxyType(dict(sorted(links.items())))


@dataclass(frozen=True)
class Calibration:
    """Link and compute efficiencies a topology's figures are scaled by.

    Attributes
    ----------
    links: link technology (``nvlink``, ``infiniband``, ...) -> its calibration.
    compute: expert FFN efficiencies.
    source: where the figures come from (shown by ``placer hardware`` and in reports).
    rebalance: what online weight moves cost beyond their bytes (None: the defaults,
        :attr:`rebalance_costs`).
    """

    links: Mapping[str, LinkCalibration] = field(default_factory=dict)
    compute: ComputeCalibration = field(default_factory=ComputeCalibration)
    source: str = ""
    rebalance: RebalanceCalibration | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "links", _frozen_links(self.links))

    def link(self, kind: str) -> LinkCalibration:
        """The calibration of link technology ``kind`` (nominal when not listed)."""
        return self.links.get(kind, _NOMINAL)

    @property
    def rebalance_costs(self) -> RebalanceCalibration:
        """:attr:`rebalance`, or the defaults when none is given."""
        return self.rebalance if self.rebalance is not None else RebalanceCalibration()

    def merged(self, other: Calibration) -> Calibration:
        """This calibration with ``other``'s links, compute, source and rebalance costs
        laid over it."""
        links = dict(self.links)
        links.update(other.links)
        return Calibration(links, other.compute, other.source or self.source,
                           other.rebalance if other.rebalance is not None else self.rebalance)

    def to_dict(self) -> dict[str, Any]:
        """The ``calibration:`` section of a topology file for this calibration."""
        out: dict[str, Any] = {
            "links": {
                kind: {"efficiency": round(c.efficiency, 6), "phase_us": round(c.phase_us, 4)}
                for kind, c in self.links.items()
            },
            "compute": {
                "hbm_efficiency": round(self.compute.hbm_efficiency, 6),
                "flops_efficiency": round(self.compute.flops_efficiency, 6),
            },
        }
        if self.rebalance is not None:
            r = self.rebalance
            out["rebalance"] = {"host_ms": r.host_ms, "layer_ms": r.layer_ms,
                                "async_share": r.async_share}
        if self.source:
            out["source"] = self.source
        return out


_NOMINAL = LinkCalibration()

#: Link technologies of fabrics and networks, as calibration keys.
LINK_KINDS = ("nvlink", "xgmi", "pcie", "infiniband", "roce", "ethernet")

#: ``placer calibrate bench/data/deepep_v1.csv --topology dgx-h800`` (all 32 rows of
#: DeepEP's published tables; docs/evaluate.md, "Calibrated links"): NVLink 0.833 +- 0.016
#: and 21.2 +- 2.7 us, InfiniBand 0.902 +- 0.014 and 15.8 +- 3.2 us.  xGMI and PCIe take
#: NVLink's figures, RoCE and Ethernet InfiniBand's: assumptions until measured, listed
#: so that a user sees them.
_NVLINK = LinkCalibration(efficiency=0.833, phase_us=21.2)
_INFINIBAND = LinkCalibration(efficiency=0.902, phase_us=15.8)
DEFAULT_CALIBRATION = Calibration(
    links={
        "nvlink": _NVLINK,
        "xgmi": _NVLINK,
        "pcie": _NVLINK,
        "infiniband": _INFINIBAND,
        "roce": _INFINIBAND,
        "ethernet": _INFINIBAND,
    },
    source="placer defaults (DeepEP V1 tables, H800 + CX7 InfiniBand)",
)

# -- where the default calibration holds -------------------------------------------------

#: ``(least, most)`` tokens per GPU of the measurements :data:`DEFAULT_CALIBRATION` was
#: fitted on, per all-to-all mode (DeepEP's published rows, ``placer.calibrate.deepep``;
#: a test holds the two together).
DEFAULT_CALIBRATED_TOKENS: Mapping[str, tuple[int, int]] = MappingProxyType({
    "normal": (4096, 4096), "low_latency": (128, 128), "low_latency_rdma": (128, 128),
})

#: How far (a factor) from those tokens per GPU a mode's figures are still taken as
#: calibrated.
CALIBRATED_FACTOR = 2.0


def extrapolation_note(mode: str, tokens_per_gpu: int, calibration_source: str) -> str:
    """A sentence when the default calibration is used for ``tokens_per_gpu`` far
    (:data:`CALIBRATED_FACTOR`) from what ``mode`` was calibrated on
    (:data:`DEFAULT_CALIBRATED_TOKENS`); "" otherwise (or when the topology carries its
    own calibration, e.g. from ``placer calibrate``).

    >>> d = DEFAULT_CALIBRATION
    >>> extrapolation_note("normal", 128, d.source)[:58]
    'normal-mode all-to-all is calibrated at 4,096 tokens per G'
    >>> extrapolation_note("low_latency", 128, d.source)
    ''
    """
    span = DEFAULT_CALIBRATED_TOKENS.get(mode)
    if span is None or calibration_source != DEFAULT_CALIBRATION.source:
        return ""
    lo, hi = span
    if lo / CALIBRATED_FACTOR <= tokens_per_gpu <= hi * CALIBRATED_FACTOR:
        return ""
    at = f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}"
    return (f"{mode.replace('_', '-')}-mode all-to-all is calibrated at {at} tokens per GPU"
            f" (DeepEP's published rows); at {tokens_per_gpu:,} the model extrapolates"
            " (docs/evaluate.md, 'Where the model is calibrated')")
