"""The report's pictures as files, and the resolution they are drawn at."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from placer import constants
from placer.errors import UsageError
from placer.io.fileio import atomic_path


def check_dpi(dpi: int) -> None:
    """Raise UsageError unless ``dpi`` is within ``constants.REPORT_DPI_RANGE``."""
    low, high = constants.REPORT_DPI_RANGE
    if not low <= dpi <= high:
        raise UsageError(f"expected --dpi between {low} and {high}, got {dpi}", where="--dpi",
                         hint=f"give a value from {low} to {high}; the nearest valid one is"
                         f" {min(max(dpi, low), high)}")


def write_pictures(pictures: Sequence[tuple[str, bytes]], folder: Path) -> list[Path]:
    """Each ``(stem, PNG bytes)`` as ``folder/<stem>.png``, atomically; the paths written."""
    written = []
    for stem, png in pictures:
        path = Path(folder) / f"{stem}.png"
        with atomic_path(path) as tmp:
            tmp.write_bytes(png)
        written.append(path)
    return written
