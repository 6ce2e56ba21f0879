"""The cost model: one object, built once from the topology, the model and the regime's
mode and dtype, that says what a copy, an expert and a token cost.

The simulation (:mod:`placer.evaluate.simulate`), the floors (:mod:`placer.evaluate.bound`,
:mod:`placer.evaluate.hot_floor`), the replay and calibration all read one
:class:`CostModel`; every unit conversion and every cost formula is written here once.

Units: a link of 1 GB/s moves :data:`BYTES_PER_GBPS_US` bytes in a microsecond, a GPU of
1 TFLOPS runs :data:`FLOPS_PER_TFLOPS_US` flops in a microsecond.  One expert FFN of one
token costs :func:`expert_ffn_flops` flops (three matrices of ``hidden x ffn``: gate, up,
down; two flops per multiply-add), and a slot that runs reads its expert's weights once::

    weight_us[g] = expert_bytes / (hbm_gbps[g] x hbm_efficiency x 1e3)
    token_us[g]  = 6 x hidden x ffn / (tflops[g] x flops_efficiency x 1e6)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from placer import constants
from placer.evaluate.traffic import Fabric
from placer.topology import LinkClass

if TYPE_CHECKING:
    from placer.model import ModelSpec
    from placer.topology import Topology

#: Bytes a link of 1 GB/s moves in one microsecond.
BYTES_PER_GBPS_US = 1e3
#: Flops a GPU of 1 TFLOPS runs in one microsecond.
FLOPS_PER_TFLOPS_US = 1e6
#: Microseconds per byte at 1 GB/s (the reciprocal: the same double as the literal 1e-3).
US_PER_BYTE_GBPS = 1 / BYTES_PER_GBPS_US


def expert_ffn_flops(hidden: int, ffn: int) -> int:
    """Flops of one token through one expert FFN of ``hidden x ffn`` (gate, up, down)."""
    return constants.EXPERT_FFN_FLOPS_FACTOR * hidden * ffn


def copy_us(payload: float, bandwidth: np.ndarray) -> float:
    """Microseconds of one copy of ``payload`` bytes at the largest finite positive entry
    of ``bandwidth`` (GB/s); 0 when there is none (no such link)."""
    usable = bandwidth[np.isfinite(bandwidth) & (bandwidth > 0)]
    return payload / float(usable.max()) * US_PER_BYTE_GBPS if usable.size else 0.0


@dataclass(frozen=True)
class CostModel:
    """What a copy, an expert and a token cost under one regime, on one cluster.

    Attributes
    ----------
    fabric: the topology's links at achieved speeds for ``mode`` (each pair's bandwidth
        and latency, each GPU's injection bandwidth and fixed phase cost per link class).
    mode: the all-to-all mode (``normal``, ``low_latency``, ``low_latency_rdma``).
    dtype: the experts' dtype.
    activation_bytes: bytes of one dispatch copy (``model.activation_bytes(dtype)``).
    combine_bytes: bytes of one combine copy (``model.combine_bytes()``, BF16 results).
    expert_bytes: bytes of one expert's weights (one layer) at ``dtype``.
    flops_per_token: :func:`expert_ffn_flops` of the model's expert.
    hbm_gbps: ``[G]`` float64 achieved HBM bandwidth (nominal x the compute calibration's
        ``hbm_efficiency``), GB/s.
    tflops: ``[G]`` float64 achieved TFLOPS at ``dtype`` (x ``flops_efficiency``).
    """

    fabric: Fabric
    mode: str
    dtype: str
    activation_bytes: float
    combine_bytes: float
    expert_bytes: float
    flops_per_token: float
    hbm_gbps: np.ndarray
    tflops: np.ndarray

    @classmethod
    def of(cls, topology: Topology, model: ModelSpec, mode: str = "normal",
           dtype: str | None = None) -> CostModel:
        """The costs of ``model`` on ``topology`` in ``mode`` (``dtype``: the experts',
        the model's default when None).

        Raises UsageError for ``low_latency_rdma`` on a GPU without a NIC.
        """
        dtype = dtype or model.default_dtype
        return cls(
            fabric=Fabric.from_topology(topology, mode),
            mode=mode,
            dtype=dtype,
            activation_bytes=float(model.activation_bytes(dtype)),
            combine_bytes=float(model.combine_bytes()),
            expert_bytes=float(model.expert_bytes(dtype)),
            flops_per_token=float(expert_ffn_flops(model.hidden_size,
                                                   model.moe_intermediate_size)),
            hbm_gbps=np.asarray(topology.hbm_gbps, dtype=np.float64) * topology.hbm_efficiency,
            tflops=topology.tflops(dtype) * topology.flops_efficiency,
        )

    @property
    def num_gpus(self) -> int:
        return self.fabric.num_gpus

    @property
    def bytes_per_copy(self) -> float:
        """Bytes a copy moves over both phases (dispatch then combine)."""
        return self.activation_bytes + self.combine_bytes

    @cached_property
    def intra(self) -> np.ndarray:
        """``[G, G]`` bool pairs whose copies travel inside a node (over its fabric)."""
        return np.asarray(self.fabric.link_class == LinkClass.INTRA_NODE)

    @cached_property
    def inter(self) -> np.ndarray:
        """``[G, G]`` bool pairs whose copies travel through the NICs."""
        return np.asarray(self.fabric.link_class == LinkClass.INTER_NODE)

    @cached_property
    def phase_us(self) -> np.ndarray:
        """``[G, 3]`` float64 fixed cost of one phase on each GPU's links of each class,
        microseconds (0 without a calibrated cost)."""
        if self.fabric.phase_us is None:
            return np.zeros((self.num_gpus, 3))
        return np.asarray(self.fabric.phase_us, dtype=np.float64)

    def peers_over(self, link_class: int) -> np.ndarray:
        """``[G]`` bool: each GPU has a peer its copies reach over ``link_class``."""
        return np.asarray((self.fabric.link_class == link_class).any(axis=1))

    def injection_over(self, link_class: int) -> np.ndarray:
        """``[G]`` float64 achieved injection bandwidth of each GPU's ``link_class``
        links, GB/s; 0 where the GPU has no peer over them."""
        out: np.ndarray = np.where(self.peers_over(link_class),
                                   self.fabric.injection_gbps[:, link_class], 0.0)
        return out

    def finite_injection_over(self, link_class: int) -> np.ndarray:
        """:meth:`injection_over` with unbounded links as 0 (for sums over classes)."""
        inj = self.injection_over(link_class)
        out: np.ndarray = np.where(np.isfinite(inj), inj, 0.0)
        return out

    @cached_property
    def weight_us(self) -> np.ndarray:
        """``[G]`` float64 microseconds a slot of each GPU spends reading its weights."""
        out: np.ndarray = self.expert_bytes / (self.hbm_gbps * BYTES_PER_GBPS_US)
        return out

    @cached_property
    def token_us(self) -> np.ndarray:
        """``[G]`` float64 microseconds of one token through one expert on each GPU."""
        out: np.ndarray = self.flops_per_token / (self.tflops * FLOPS_PER_TFLOPS_US)
        return out

    @cached_property
    def fastest_weight_us(self) -> float:
        """A slot's weight read at the fastest GPU's HBM (the floors' rate: the least of
        :attr:`weight_us`, so never above any GPU's own)."""
        return float(self.weight_us.min())

    @cached_property
    def fastest_token_us(self) -> float:
        """One token's expert FFN at the fastest GPU's FLOPS (the least of :attr:`token_us`)."""
        return float(self.token_us.min())
