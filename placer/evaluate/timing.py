"""Time of one layer's all-to-all phases and expert FFNs, per batch and GPU.

Communication (one phase: dispatch, or combine with the transposed copies)::

    bytes[g, h]  = copies[g, h] * payload
    send_c[g]    = sum of bytes[g, h] over peers h whose link class is c (1 intra, 2 inter)
    recv_c[g]    = sum of bytes[h, g] over the same peers
    link_c[g]    = max(send_c[g], recv_c[g]) / injection_gbps[g, c] / 1e3 + phase_us[g, c]
                   (0 when g exchanges nothing over class c)
    pair[g]      = max over h of max(bytes[g, h], bytes[h, g]) / bandwidth_gbps[g, h] / 1e3
    latency[g]   = max over peers h exchanging at least one copy with g of latency_us[g, h]
    comm_us[g]   = max(link_1[g], link_2[g], pair[g]) + latency[g]

Bandwidths are *achieved* rates (nominal times the calibrated efficiency of the link
technology, :mod:`placer.topology.calibration`) and ``phase_us`` is the calibrated fixed
cost of a phase on that technology.  Link classes run in parallel (NVLink and the NIC
are separate links), sending and receiving use separate directions, and messages to all
peers are in flight at once, so the slowest of these bounds sets the time and one
latency is paid per phase.

Compute: a GPU runs each of its slots that received tokens; one slot costs
``max(weight_us, tokens x token_us)`` at its GPU's rates (weights read once; the per-token
expert FFN), both from :class:`placer.evaluate.costs.CostModel`.
"""

from __future__ import annotations

import numpy as np

from placer.evaluate.costs import BYTES_PER_GBPS_US
from placer.evaluate.traffic import Fabric

#: Link classes that cross a link: ``LinkClass.INTRA_NODE`` and ``LinkClass.INTER_NODE``.
INTRA_NODE, INTER_NODE = 1, 2


def comm_time_us(copies: np.ndarray, payload_bytes: float, fabric: Fabric) -> np.ndarray:
    """``[batches, G]`` float64 time of one all-to-all phase, microseconds.

    Parameters
    ----------
    copies: ``[batches, G, G]`` copies sent from g to h in this phase (diagonal ignored).
    payload_bytes: bytes per copy.
    """
    num_gpus = fabric.num_gpus
    copies = copies.copy()
    diag = np.arange(num_gpus)
    copies[:, diag, diag] = 0
    sent_bytes = copies.astype(np.float64) * float(payload_bytes)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(sent_bytes > 0, sent_bytes / fabric.bandwidth_gbps[None], 0.0)
    busiest = np.maximum(ratio.max(axis=2), ratio.max(axis=1)) / BYTES_PER_GBPS_US  # [B, G]
    phase_us = fabric.phase_us
    for link_class in (INTRA_NODE, INTER_NODE):
        mask = (fabric.link_class == link_class).astype(np.float64)
        send = (sent_bytes * mask[None]).sum(axis=2)
        recv = (sent_bytes * mask[None]).sum(axis=1)
        volume = np.maximum(send, recv)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(volume > 0, volume / fabric.injection_gbps[None, :, link_class], 0.0)
        t /= BYTES_PER_GBPS_US
        if phase_us is not None:
            t += np.where(volume > 0, phase_us[None, :, link_class], 0.0)
        busiest = np.maximum(busiest, t)
    active = (copies > 0) | (copies.transpose(0, 2, 1) > 0)
    latency = np.where(active, fabric.latency_us[None], 0.0).max(axis=2)
    result: np.ndarray = busiest + latency
    return result


def compute_time_us(
    slot_load: np.ndarray,
    slots_per_gpu: int,
    weight_us: np.ndarray,
    token_us: np.ndarray,
) -> np.ndarray:
    """``[batches, G]`` float64 expert FFN time of each GPU, microseconds.

    Parameters
    ----------
    slot_load: ``[batches, P]`` tokens processed by each slot.
    weight_us: ``[G]`` a slot's weight read on each GPU
        (:attr:`~placer.evaluate.costs.CostModel.weight_us`).
    token_us: ``[G]`` one token through one expert on each GPU
        (:attr:`~placer.evaluate.costs.CostModel.token_us`).
    """
    num_batches, num_slots = slot_load.shape
    gpu = np.arange(num_slots) // slots_per_gpu
    cost = np.where(slot_load > 0,
                    np.maximum(weight_us[gpu][None], slot_load * token_us[gpu][None]), 0.0)
    out: np.ndarray = cost.reshape(num_batches, -1, slots_per_gpu).sum(axis=2)
    return out
