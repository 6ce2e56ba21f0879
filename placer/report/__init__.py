"""Pictures and the self-contained HTML report.

- :mod:`placer.report.plots`: one function per picture, arrays in, a
  matplotlib ``Figure`` out (matplotlib is the optional ``placer[plots]`` extra,
  imported on first use with the Agg backend).
- :mod:`placer.report.html`: :func:`render_html` builds one HTML file with the
  pictures embedded as base64 PNG (no network needed).
- :mod:`placer.report.sections`: the report's sections built from placer's
  objects (statistics, placements, evaluations, comparison rows);
  :mod:`placer.report.settings` (what was run, the command line) and
  :mod:`placer.report.verdicts` (each row against its baseline, in one line) are
  two of them.
"""

from placer.report.charts import hot_shard_tail, whatif_chart
from placer.report.html import Code, Picture, Section, SideBySide, Table, Text, render_html
from placer.report.mpl import figure_png, require_matplotlib, smallest_text_px, text_sizes_px
from placer.report.plots import (
    coactivation_heatmap,
    expert_load_heatmap,
    gpu_load_bars,
    placement_map,
    same_gpu_share,
)

__all__ = [
    "Code",
    "Picture",
    "Section",
    "SideBySide",
    "Table",
    "Text",
    "coactivation_heatmap",
    "expert_load_heatmap",
    "figure_png",
    "gpu_load_bars",
    "hot_shard_tail",
    "placement_map",
    "render_html",
    "require_matplotlib",
    "same_gpu_share",
    "smallest_text_px",
    "text_sizes_px",
    "whatif_chart",
]
