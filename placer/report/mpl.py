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


def text_sizes_px(fig: Any, dpi: float = constants.REPORT_DPI) -> list[tuple[str, float]]:
    """``(text, height in pixels)`` of every visible, non-empty text ``fig`` draws at ``dpi``.

    Titles, axis labels, tick labels, legends, colour-bar labels and texts in the
    cells all count; a font of ``s`` points is ``s * dpi / 72`` pixels tall.  The
    figure is laid out first (no pixels are rendered), so the tick labels are the
    ones a PNG would show.
    """
    from matplotlib.text import Text

    fig.draw_without_rendering()
    sizes = []
    for artist in fig.findobj(Text):
        if not artist.get_visible() or not artist.get_text().strip():
            continue
        axes = artist.axes
        if axes is not None and not axes.get_visible():
            continue
        if not _inside_figure(artist, fig):
            continue
        sizes.append((artist.get_text(), float(artist.get_fontsize()) * dpi / 72.0))
    return sizes


def smallest_text_px(fig: Any, dpi: float = constants.REPORT_DPI) -> float:
    """Height in pixels of the smallest text :func:`text_sizes_px` finds (inf when none)."""
    return min((px for _, px in text_sizes_px(fig, dpi)), default=float("inf"))


def _inside_figure(artist: Any, fig: Any) -> bool:
    """Whether the text's anchor lies on the figure (tick labels outside the view are not drawn)."""
    try:
        x, y = artist.get_transform().transform(artist.get_unitless_position())
    except (ValueError, TypeError):
        return True
    width, height = fig.bbox.width, fig.bbox.height
    return -1.0 <= x <= width + 1.0 and -1.0 <= y <= height + 1.0
