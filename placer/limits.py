"""What a run may allocate: the memory this process can still have, and the check that
refuses work too large for it before any of it is done.

Work whose arrays grow with a product of sizes the user chose (sampled batches of
``--tokens-per-gpu`` x GPUs tokens, a synthetic trace's chunks of tokens x layers x top-k,
a topology's GPU x GPU matrices) estimates its memory from those sizes first and calls
:func:`check_allocation`: past what the machine has free, it stops at once with the
figures and a hint instead of failing minutes later with a ``MemoryError`` (or the kernel's
OOM killer).

What "free" is: the least of the memory the kernel can still hand out (``MemAvailable``
of ``/proc/meminfo``, ``os.sysconf`` elsewhere), what the process's cgroup allows beyond
what it uses, and what its address-space limit (``ulimit -v``) leaves beyond what is
mapped; ``PLACER_MEMORY_LIMIT`` (bytes, or with a unit: ``512M``, ``4G``, ``1.5GiB``)
states the bound instead.  docs/limits.md, "Memory".

Example::

    check_allocation((num_batches, batch_tokens, top_k), "the sampled batches",
                     hint="a smaller --tokens-per-gpu", itemsize=8 * 6)
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from placer.errors import PlacerError, UsageError

__all__ = ["ENV", "check_allocation", "check_disk", "format_bytes", "free_memory",
           "parse_bytes"]

#: The variable that states the memory bound instead of what the machine has free.
ENV = "PLACER_MEMORY_LIMIT"

#: Allocations below this are not checked (reading the machine's figures costs more).
UNCHECKED_BYTES = 32 << 20

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6,
          "mib": 1 << 20, "g": 1 << 30, "gb": 10**9, "gib": 1 << 30, "t": 1 << 40,
          "tb": 10**12, "tib": 1 << 40}


def parse_bytes(text: str) -> int:
    """``"4G"`` -> 4 GiB; ``"512M"``, ``"1.5GiB"``, ``"2000000000"``, ``"3GB"`` (1e9)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise UsageError(f"cannot read {ENV}={text!r} as a number of bytes", where=ENV,
                         hint=f"write it as bytes or with a unit, e.g. {ENV}=4G or 512M")
    return int(float(match.group(1)) * _UNITS[unit])


def format_bytes(n: float) -> str:
    """``7.5 GiB``, ``240 MiB``, ``12 KiB``: one decimal past 10 of the unit, none below."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.1f} {unit}" if value < 10 else f"{value:,.0f} {unit}"
    return f"{int(n)} bytes"


def _read_kib(path: str, key: str) -> int | None:
    """The ``key: N kB`` figure of a /proc file, in bytes (None where there is none)."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_left() -> int | None:
    """What the process's cgroup (v2) allows beyond what it uses, if it sets a bound."""
    try:
        entry = Path("/proc/self/cgroup").read_text().strip().splitlines()[0]
        folder = Path("/sys/fs/cgroup") / entry.split("::", 1)[1].lstrip("/")
        limit = (folder / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return int(limit) - int((folder / "memory.current").read_text())
    except (OSError, ValueError, IndexError):
        return None


def _address_space_left() -> int | None:
    """What ``ulimit -v`` (RLIMIT_AS) leaves beyond what the process has mapped."""
    try:
        import resource
    except ImportError:  # not on Unix
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    mapped = _read_kib("/proc/self/status", "VmSize")
    return None if mapped is None else soft - mapped


def free_memory() -> tuple[int, str]:
    """``(bytes, what they are)``: the memory this process can still allocate, and the
    words that say where the figure comes from (``free``, ``left under ulimit -v``,
    ``PLACER_MEMORY_LIMIT=4G``)."""
    stated = os.environ.get(ENV, "").strip()
    if stated:
        return parse_bytes(stated), f"allowed by {ENV}={stated}"
    found: list[tuple[int, str]] = []
    available = _read_kib("/proc/meminfo", "MemAvailable")
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            available = None
    if available is not None:
        found.append((available, "free"))
    cgroup = _cgroup_left()
    if cgroup is not None:
        found.append((max(cgroup, 0), "left in this cgroup's memory.max"))
    address = _address_space_left()
    if address is not None:
        found.append((max(address, 0), "left under the address-space limit (ulimit -v)"))
    if not found:
        return 1 << 62, "free"
    return min(found)


def _size(shape_or_bytes: int | Sequence[int], itemsize: int) -> int:
    if isinstance(shape_or_bytes, int):
        return shape_or_bytes
    return math.prod(int(n) for n in shape_or_bytes) * itemsize


def check_allocation(shape_or_bytes: int | Sequence[int], what: str,
                     hint: str | Callable[[int], str], *,
                     itemsize: int = 8, where: str | None = None,
                     error: type[PlacerError] = UsageError) -> None:
    """Raise ``error`` (a UsageError, exit 2, by default) when ``shape_or_bytes`` (bytes,
    or an array shape of ``itemsize``-byte elements) is more than the process can still
    allocate (:func:`free_memory`).

    ``what`` names the work in the message (``"the (993, 993, 16, 64) knapsack table"``);
    ``hint`` says what to make smaller (``"a smaller --redundant"``), or is called with the
    bytes free to say it (the largest value that fits); ``where`` is the option or file the
    size comes from."""
    need = _size(shape_or_bytes, itemsize)
    if need < UNCHECKED_BYTES:
        return
    free, source = free_memory()
    if need <= free:
        return
    raise error(f"needs {format_bytes(need)} of memory for {what}, more than the"
                f" {format_bytes(free)} {source}", where=where,
                hint=f"{hint(free) if callable(hint) else hint} (or run where more memory is"
                     " free; docs/limits.md)")


def check_disk(need: int, folder: str | Path, what: str, hint: str, *,
               where: str | None = None) -> None:
    """Raise a UsageError when ``need`` bytes are more than the file system of ``folder``
    has free (``PLACER_MEMORY_LIMIT`` does not bound the disk)."""
    if need < UNCHECKED_BYTES:
        return
    try:
        stat = os.statvfs(folder)
    except (OSError, AttributeError):
        return
    free = stat.f_bavail * stat.f_frsize
    if need > free:
        raise UsageError(f"needs about {format_bytes(need)} of disk for {what}, more than"
                         f" the {format_bytes(free)} free in {folder}", where=where,
                         hint=f"{hint} (or write to a disk with more room)")
