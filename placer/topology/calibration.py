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
from dataclasses import dataclass, field, replace
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
    """

    links: Mapping[str, LinkCalibration] = field(default_factory=dict)
    compute: ComputeCalibration = field(default_factory=ComputeCalibration)
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "links", _frozen_links(self.links))

    def link(self, kind: str) -> LinkCalibration:
        """The calibration of link technology ``kind`` (nominal when not listed)."""
        return self.links.get(kind, _NOMINAL)

    def merged(self, other: Calibration) -> Calibration:
        """This calibration with ``other``'s links, compute and source laid over it."""
        links = dict(self.links)
        links.update(other.links)
        return Calibration(links, other.compute, other.source or self.source)

    def with_links(self, **links: LinkCalibration) -> Calibration:
        """A copy with some link technologies replaced."""
        merged = dict(self.links)
        merged.update(links)
        return replace(self, links=merged)

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
