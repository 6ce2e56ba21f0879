"""The replay's page and picture: every policy's step time and hot shard over the replay.

:func:`replay_timeseries` draws, one line per policy, the step time (rebalancing
included) and the hot-shard ratio over the steps, each averaged over a short moving
window so that drift shows through the per-step noise, with a mark at every rebalance;
:func:`replay_report` lays out the verdict, the tables, the picture and the settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from placer import constants
from placer.report.html import Code, Section, Table, Text
from placer.report.mpl import new_figure
from placer.report.plots import SERIES_COLOURS
from placer.report.sections import Gallery, Report
from placer.report.settings import settings_section

if TYPE_CHECKING:
    from placer.replay.result import ReplayResult

#: Colours past :data:`SERIES_COLOURS` (colour-blind safe first, then distinct hues).
MORE_COLOURS = ("#D55E00", "#56B4E9", "#F0E442", "#000000", "#999999", "#882255")
#: Steps averaged per point of the pictures' lines (at most; fewer on short replays).
SMOOTH_STEPS = 25


def _smooth(values: np.ndarray, width: int) -> np.ndarray:
    """Moving mean of ``values`` over ``width`` steps (NaN ignored), same length."""
    finite = np.isfinite(values)
    filled = np.where(finite, values, 0.0)
    kernel = np.ones(width)
    total = np.convolve(filled, kernel, mode="same")
    count = np.convolve(finite.astype(float), kernel, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def replay_timeseries(step_us: Sequence[np.ndarray], hot_shard: Sequence[np.ndarray],
                      labels: Sequence[str], marks: Sequence[Sequence[int]], *,
                      title: str = "Serving over time") -> Any:
    """Step time (µs) and hot-shard ratio per step, one line per policy, with a tick at
    each of a policy's rebalances.

    Parameters
    ----------
    step_us, hot_shard: ``[steps]`` per policy.
    labels: one per policy.
    marks: the steps each policy rebalanced at.
    """
    colours = (*SERIES_COLOURS, *MORE_COLOURS)
    steps = max((len(s) for s in step_us), default=0)
    width = max(1, min(SMOOTH_STEPS, steps // 40 or 1))
    fig = new_figure(9.0, 5.6)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    x = np.arange(steps)
    for i, (series, hot, label, ticks) in enumerate(zip(step_us, hot_shard, labels, marks,
                                                         strict=True)):
        colour = colours[i % len(colours)]
        line = _smooth(np.asarray(series, dtype=np.float64), width)
        top.plot(x[: line.size], line, color=colour, linewidth=1.2, label=label)
        bottom.plot(x[: len(hot)], _smooth(np.asarray(hot, dtype=np.float64), width),
                    color=colour, linewidth=1.0)
        if len(ticks):
            top.plot(list(ticks), line[np.clip(list(ticks), 0, line.size - 1)], linestyle="",
                     marker="|", markersize=9, color=colour)
    finite = [v for s in step_us for v in np.asarray(s, dtype=np.float64) if np.isfinite(v)]
    if finite and max(finite) > 20 * max(min(finite), 1e-9):
        top.set_yscale("log")  # stalls are orders of magnitude above serving steps
    top.set_ylabel(f"step time, µs ({width}-step mean)")
    top.set_title(title, fontsize=10)
    top.legend(fontsize=7.5, loc="upper left", ncols=2, frameon=False)
    bottom.set_ylabel("hot shard, max / mean")
    bottom.set_xlabel("step")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    return fig


def replay_report(result: ReplayResult, *, dpi: int | None = None, command: str = "",
                  deploy: Sequence[tuple[str, str]] = (), notes: Sequence[str] = ()) -> Report:
    """The replay's page: the verdict, the policy and segment tables, the picture, what
    to paste into each engine (``deploy``: ``(engine, flags)``), notes and settings."""
    from placer import __version__
    from placer.replay.result import policy_cells, segment_cells

    gallery = Gallery(dpi or constants.REPORT_DPI)
    policies = result.policies
    fig = replay_timeseries([p.step_us for p in policies], [p.hot_shard for p in policies],
                            [p.label for p in policies],
                            [[r.step for r in p.rebalances] for p in policies])
    picture = gallery.add("replay", fig, "Step time (rebalancing included) and hot-shard"
                          " ratio over the replay, one line per policy; ticks: rebalances.")
    blocks: list[Any] = [_as_table(policy_cells(result), "Policies over the whole replay"),
                         _as_table(segment_cells(result), "Mean step time per segment"),
                         picture]
    if deploy:
        blocks.append(Text("To run the recommended policy, as each engine takes it:"))
        blocks += [Code(f"# {engine}\n{flags}") for engine, flags in deploy]
    blocks += [Text(n) for n in notes]
    info = result.info
    keys = ("trace", "model", "topology", "steps", "tokens", "layers", "slots_per_gpu",
            "redundant", "dtype")
    rows: list[tuple[str, str]] = [(key, str(info[key])) for key in keys if key in info]
    rows += [(f"regime: {k}", str(v)) for k, v in info.get("regime", {}).items()]
    verdict = (Text(result.verdict()), Text(result.share_verdict()))
    sections = [Section("Verdict", verdict), Section("Replay", tuple(blocks)),
                settings_section(rows, command=command, version=__version__)]
    return Report("placer replay", tuple(sections), tuple(gallery.pictures),
                  subtitle=f"{info.get('trace', '')} · {info.get('model', '')} ·"
                  f" {info.get('topology', '')}")


def _as_table(cells: list[list[str]], caption: str) -> Table:
    """Cells (the header first) as an HTML table."""
    return Table(tuple(cells[0]), tuple(tuple(row) for row in cells[1:]), caption=caption)
