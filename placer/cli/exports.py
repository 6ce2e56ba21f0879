"""``--export FORMAT:FILE``: the engine files a command writes beside its output.

Shared by ``placer plan --export`` and the export command's checks; the writing itself is
the library's :func:`placer.engines.export_engine`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from placer.engines import engine_names, get_engine
from placer.errors import UsageError
from placer.regime import EXPORT_ENGINE


def parse_export_spec(spec: str, option: str = "--export") -> tuple[str, Path]:
    """``"FORMAT:FILE"`` -> ``(format, path)``; UsageError naming ``option`` otherwise."""
    fmt, sep, file = spec.partition(":")
    if not sep or not fmt or not file:
        raise UsageError(
            f"expected FORMAT:FILE, got {spec!r}",
            where=option,
            hint=f"for example sglang:plan.json; formats: {', '.join(engine_names())}",
        )
    get_engine(fmt).check_output(file, where=option)  # fail before any work
    return fmt, Path(file)


def export_implies_engine(params: dict[str, Any]) -> bool:
    """Whether a command line's ``--export`` names an engine's file (whose engine then
    outranks a configured ``engine``)."""
    return any(spec.partition(":")[0] in EXPORT_ENGINE for spec in params.get("export") or [])
