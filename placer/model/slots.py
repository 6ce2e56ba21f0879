"""Slots per GPU: the fewest that hold every expert of a layer once.

Engines give every GPU the same number of slots ``S``, and ``G * S >= E`` so every logical
expert has a replica: ``S >= ceil(E / G)``.  Redundant experts ``R = G * S - E`` follow.
"""

from __future__ import annotations


def fewest_slots_per_gpu(num_experts: int, num_gpus: int) -> int:
    """``ceil(E / G)``: the fewest slots per GPU that hold every expert once.

    >>> fewest_slots_per_gpu(256, 32), fewest_slots_per_gpu(128, 6)
    (8, 22)
    """
    return -(-num_experts // num_gpus)
