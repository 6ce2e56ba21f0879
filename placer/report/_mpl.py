"""Lazy access to matplotlib, the optional ``placer[plots]`` extra.

matplotlib is imported only when a picture is drawn, always with the
non-interactive Agg backend, so ``import placer`` stays light and works on a
machine without a display or without matplotlib at all.
"""

from __future__ import annotations

import importlib
import io
from typing import Any

from placer import constants
from placer.errors import PlacerError

#: Hint shown when matplotlib is missing.
INSTALL_HINT = "pip install 'placer[plots]'"


def require_matplotlib() -> Any:
    """Return the ``matplotlib`` module, configured for the Agg backend.

    Raises
    ------
    PlacerError
        When matplotlib is not installed, with an install hint.
    """
    try:
        mpl = importlib.import_module("matplotlib")
    except ModuleNotFoundError as e:
        raise PlacerError(
            "pictures need matplotlib, which is not installed", hint=INSTALL_HINT
        ) from e
    mpl.use("Agg", force=False)
    return mpl


def new_figure(width_in: float, height_in: float) -> Any:
    """A fresh ``matplotlib.figure.Figure`` (not registered with pyplot; no global state).

    Parameters
    ----------
    width_in, height_in: size in inches.
    """
    require_matplotlib()
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in), layout="constrained")


def figure_png(fig: Any, dpi: int = constants.REPORT_DPI) -> bytes:
    """Render ``fig`` to PNG bytes at ``dpi`` dots per inch, without metadata."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return buf.getvalue()
