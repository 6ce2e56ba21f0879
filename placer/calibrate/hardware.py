"""Whether measured timings describe the cluster they calibrate.

A fit finds the efficiencies and phase costs that make the topology's *nominal* links
reproduce the timings, so timings of other hardware give figures that describe neither
machine: H800 timings (NVLink ~160 GB/s) on an H100 topology (450 GB/s) fit NVLink at
0.30 of nominal, and every plan on that overlay believes in H100s that run like H800s.
Two checks, said as warnings (:func:`hardware_warnings`):

- the GPU the timings declare, a ``# gpu: NAME`` comment line of the CSV
  (:func:`declared_gpu`; ``bench/gpu_microbench.py`` writes it, and
  ``bench/data/deepep_v1.csv`` declares ``h800-sxm``), against the topology's GPU types;
- each fitted link efficiency against :data:`MIN_PLAUSIBLE_EFFICIENCY`: all-to-all kernels
  reach 0.83-0.90 of nominal on DeepEP's published tables, so a fit far below that says
  the links are not the ones the topology names (or the timings measured something else).
"""

from __future__ import annotations

import re
import warnings
from typing import TYPE_CHECKING

import numpy as np

from placer.errors import PlacerWarning

if TYPE_CHECKING:
    from placer.calibrate.fit import FitResult
    from placer.topology import Topology

#: A fitted link efficiency below this is implausible: the links measured are not the
#: topology's (DeepEP's kernels reach 0.83-0.90 of nominal bandwidth).
MIN_PLAUSIBLE_EFFICIENCY = 0.5
#: The comment key naming the GPU type the timings were measured on.
GPU_KEY = "gpu"

_DECLARATION = re.compile(r"#\s*([a-z_]+)\s*:\s*(\S.*?)\s*$", re.IGNORECASE)


def declared_gpu(text: str) -> str | None:
    """The GPU type a timings CSV declares in a ``# gpu: NAME`` comment line (lower case),
    or None.

    >>> declared_gpu("# measured on the lab cluster\\n# gpu: H800-SXM\\nbenchmark,...\\n")
    'h800-sxm'
    """
    for line in text.lstrip("\ufeff").splitlines():
        found = _DECLARATION.match(line.strip())
        if found and found.group(1).lower() == GPU_KEY:
            return found.group(2).lower()
    return None


def hardware_warnings(result: FitResult, topology: Topology, gpu: str | None = None,
                      source: str = "the timings CSV") -> list[str]:
    """What says the timings (``source``, declaring ``gpu``) are not of ``topology``'s
    hardware: another GPU type, or a fitted link efficiency below
    :data:`MIN_PLAUSIBLE_EFFICIENCY`; empty when nothing does."""
    out = []
    types = sorted({t.name.lower() for t in topology.gpu_type_of_gpu})
    if gpu is not None and gpu not in types:
        out.append(
            f"{source} declares gpu {gpu}, but {topology.name}'s GPUs are {', '.join(types)}:"
            f" the fitted figures describe {gpu}'s links on {topology.name}'s nominal speeds,"
            " which is neither machine; calibrate a `topology` of the measured GPUs"
            f" (one with {gpu} GPUs), or measure on this cluster"
        )
    for p in result.parameters:
        key, _, field = p.name.partition(".")
        if field != "efficiency" or key == "compute" or not p.fitted:
            continue
        if p.value < MIN_PLAUSIBLE_EFFICIENCY:
            nominal = _nominal_gbps(topology, key)
            speed = f" of {nominal:g} GB/s per GPU" if nominal else ""
            out.append(
                f"{p.name} {p.value:.4f}: the timings run {key} at {p.value:.0%} of its"
                f" nominal speed{speed} on {topology.name}, far below what its links give"
                f" (all-to-all kernels reach 0.83-0.90): the timings are probably of other"
                " hardware than the topology describes"
            )
    return out


def warn_hardware(result: FitResult, topology: Topology, gpu: str | None = None,
                  source: str = "the timings CSV") -> None:
    """Each of :func:`hardware_warnings` as a :class:`~placer.errors.PlacerWarning`."""
    for message in hardware_warnings(result, topology, gpu, source):
        warnings.warn(message, PlacerWarning, stacklevel=2)


def _nominal_gbps(topology: Topology, key: str) -> float:
    """The slowest nominal GB/s per GPU of link technology ``key`` in ``topology`` (0 when
    no GPU uses it)."""
    used = np.asarray(topology.link_kind) == key
    if not used.any():
        return 0.0
    return float(np.asarray(topology.injection_gbps)[used].min())
