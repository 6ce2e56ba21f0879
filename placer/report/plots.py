"""The pictures of placer's reports, one function per picture.

Every function takes numpy arrays and labels (no placer objects, no files) and
returns a fresh ``matplotlib.figure.Figure`` drawn with the Agg backend; the
caller renders it (:func:`placer.report.figure_png`) or embeds it in a report.
Axes are named with their units: ``tokens``, ``load / mean``, ``GB``, ``µs``.

matplotlib is the optional ``placer[plots]`` extra: it is imported when a
function is called, and a missing install raises a :class:`PlacerError` with
the install hint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from placer import constants
from placer.errors import UsageError
from placer.report.mpl import new_figure

#: Colours of the compared series (placements, scenarios): colour-blind safe.
SERIES_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7")

#: Colour map of the heatmaps (perceptually uniform, readable in grey).
HEATMAP_CMAP = "viridis"

#: Smallest font drawn, points: 7 pt is 9.7 px at ``constants.REPORT_DPI`` (100), still
#: 8 px when a browser shrinks the picture to 82 % of its width.
MIN_FONT_PT = 7.0

#: Colour-bar ticks of the log-scaled load heatmap, ``load / mean``.
LOG_LOAD_TICKS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)

#: Above this many GPUs the co-activation map outlines only the GPU blocks on its
#: diagonal: full-length boundary lines would cover the data.
COACT_FULL_GRID_MAX_GPUS = 16


# -- expert load --------------------------------------------------------------------
def expert_load_heatmap(
    load: np.ndarray,
    *,
    layer_ids: Sequence[int] | np.ndarray | None = None,
    title: str = "Expert load",
) -> Any:
    """Heatmap of expert load, layers x experts, relative to each layer's mean, log colour scale.

    Routing load is heavy-tailed: a few experts carry several times the mean and
    most sit a little under it, so a linear scale leaves almost every cell dark.
    The colours follow ``log(load / mean)``: the mean is the middle of the scale,
    twice and half the mean are equally far from it.  Cells below the scale's
    floor (the 1st percentile of the loaded cells, and never-routed experts) take
    the darkest colour.

    Parameters
    ----------
    load: ``[layers, experts]`` tokens routed to each logical expert.
    layer_ids: ``[layers]`` absolute layer index of each row (default ``0..L-1``).
    title: figure title.

    Returns
    -------
    Figure with one image axes (x: logical expert, y: layer) and a colour bar in
    ``load / layer mean`` on a log scale (1.0 is a perfectly even layer).
    """
    from matplotlib.colors import LogNorm

    load = _array(load, 2, "load")
    num_layers, num_experts = load.shape
    ids = _layer_ids(layer_ids, num_layers)
    rel = _relative(load)
    low, high = _log_range(rel)
    fig = new_figure(min(4.0 + num_experts * 0.04, 13.0), min(2.2 + num_layers * 0.12, 9.0))
    ax = fig.add_subplot()
    image = ax.imshow(rel, aspect="auto", cmap=HEATMAP_CMAP, interpolation="nearest",
                      norm=LogNorm(vmin=low, vmax=high, clip=True))
    ax.set_xlabel("logical expert (id)")
    ax.set_ylabel("layer (absolute index)")
    ticks = _tick_positions(num_layers, 16)
    ax.set_yticks(ticks, [str(ids[i]) for i in ticks])
    ax.set_title(title)
    bar = fig.colorbar(image, ax=ax)
    shown = [t for t in LOG_LOAD_TICKS if low <= t <= high]
    bar.set_ticks(shown, labels=[f"{t:g}" for t in shown])
    bar.ax.minorticks_off()
    bar.set_label("load / layer mean (log scale)")
    return fig


def _log_range(rel: np.ndarray) -> tuple[float, float]:
    """``(floor, top)`` of a log colour scale of ``load / mean`` values, 1.0 inside.

    The floor is the 1st percentile of the positive values (at most 1/2, at
    least 1/64); the top is the largest value (at least 2).
    """
    positive = rel[np.isfinite(rel) & (rel > 0)]
    if positive.size == 0:
        return 0.5, 2.0
    floor = float(np.clip(np.percentile(positive, 1), 1 / 64, 0.5))
    return floor, max(2.0, float(positive.max()))


# -- per-GPU load, several placements -------------------------------------------------
def gpu_load_bars(
    gpu_loads: Sequence[np.ndarray],
    labels: Sequence[str],
    *,
    layer_ids: Sequence[int] | np.ndarray | None = None,
    layers: Sequence[int] | None = None,
    max_panels: int = constants.GPU_LOAD_MAX_PANELS,
) -> Any:
    """Per-GPU load bars, one panel per layer, for several placements.

    Placements on the same number of GPUs share each panel (one bar per placement
    and GPU, each panel's legend giving every placement's max / mean).  Placements
    on different numbers of GPUs are never drawn on one rank axis (8 bars would
    be squeezed under 72): each gets its own column of panels, titled with its
    name, its GPU count and its max / mean, and the rows share the y axis.

    Parameters
    ----------
    gpu_loads: one ``[layers, G]`` array per placement, expected tokens per GPU
        (``placer.placement.gpu_loads``); the number of GPUs may differ.
    labels: one name per placement.
    layer_ids: ``[layers]`` absolute layer index of each row (default ``0..L-1``).
    layers: layer *rows* to draw; default the rows where the first placement's hot
        shard is worst, drawn in layer order: ``max_panels`` of them, half as many
        when the placements have different GPU counts (each layer is then a row
        of panels).
    max_panels: most layers drawn when ``layers`` is not given.

    Returns
    -------
    Figure with one axes per (layer, GPU count); x: GPU (rank), y: ``load / mean``
    (the dashed line at 1.0 is a perfectly even layer).
    """
    loads = [_array(g, 2, f"gpu_loads[{i}]") for i, g in enumerate(gpu_loads)]
    check_series(loads, labels, "gpu_loads")
    num_layers = loads[0].shape[0]
    if any(g.shape[0] != num_layers for g in loads):
        raise UsageError("every gpu_loads array needs the same number of layers", where="gpu_loads")
    ids = _layer_ids(layer_ids, num_layers)
    one_axis = len({g.shape[1] for g in loads}) == 1
    if layers is None:
        most = max(1, max_panels if one_axis else max_panels // 2)
        rows = sorted(np.argsort(-_hot_shard(loads[0]), kind="stable")[:most].tolist())
    else:
        rows = [int(r) for r in layers]
        for r in rows:
            if not 0 <= r < num_layers:
                raise UsageError(f"layer row {r} is outside [0, {num_layers})", where="layers")
    rel = [_relative(g[rows]) for g in loads]
    if one_axis:
        fig = _shared_rank_panels(rel, labels, [ids[r] for r in rows])
    else:
        fig = _rank_panel_columns(rel, labels, [ids[r] for r in rows])
    fig.suptitle(f"Per-GPU load in the layers where the hot shard of {labels[0]} is worst"
                 if layers is None else "Per-GPU load by layer")
    return fig


def _shared_rank_panels(rel: list[np.ndarray], labels: Sequence[str], ids: list[int]) -> Any:
    """Placements on the same GPUs: grouped bars, two panels per row."""
    num_gpus = rel[0].shape[1]
    cols = 1 if len(ids) == 1 else 2
    nrows = -(-len(ids) // cols)
    fig = new_figure(min(5.0 + num_gpus * 0.25 * cols, 14.0), 0.8 + 2.8 * nrows)
    axes = fig.subplots(nrows, cols, squeeze=False)
    bar_width = 0.8 / len(rel)
    for panel, layer in enumerate(ids):
        ax = axes[panel // cols][panel % cols]
        top = 1.0
        for s, values in enumerate(rel):
            x = np.arange(num_gpus) + (s - (len(rel) - 1) / 2) * bar_width
            ratio = float(values[panel].max()) if num_gpus else 1.0
            top = max(top, ratio)
            ax.bar(x, values[panel], width=bar_width, color=SERIES_COLOURS[s],
                   label=f"{labels[s]}: max/mean {ratio:.2f}")
        _even_line_and_labels(ax, num_gpus)
        ax.set_ylim(0, top * (1.2 + 0.14 * len(rel)))  # room for the legend above the bars
        ax.set_title(f"layer {layer}", fontsize="medium")
        ax.legend(loc="upper right", fontsize="small", framealpha=0.85)
    for panel in range(len(ids), nrows * cols):
        axes[panel // cols][panel % cols].set_visible(False)
    return fig


def _rank_panel_columns(rel: list[np.ndarray], labels: Sequence[str], ids: list[int]) -> Any:
    """Placements on different GPU counts: one column of panels each, rows share y."""
    cols = len(rel)
    width = min(4.0 + sum(min(max(v.shape[1], 8), 72) * 0.09 + 1.5 for v in rel), 14.0)
    fig = new_figure(width, 0.8 + 2.9 * len(ids))
    axes = fig.subplots(len(ids), cols, squeeze=False, sharey="row")
    for panel, layer in enumerate(ids):
        for s, values in enumerate(rel):
            ax = axes[panel][s]
            num_gpus = values.shape[1]
            ratio = float(values[panel].max()) if num_gpus else 1.0
            ax.bar(np.arange(num_gpus), values[panel], width=0.8, color=SERIES_COLOURS[s])
            _even_line_and_labels(ax, num_gpus)
            ax.set_title(f"layer {layer} · {labels[s]}\n{num_gpus} GPUs, max/mean {ratio:.2f}",
                         fontsize="medium")
    return fig


def _even_line_and_labels(ax: Any, num_gpus: int) -> None:
    ax.axhline(1.0, color="0.3", linestyle="--", linewidth=0.8)
    ax.set_xlabel("GPU (rank)")
    ax.set_ylabel("load / mean")
    ticks = _tick_positions(num_gpus, 16)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlim(-0.6, num_gpus - 0.4)


# -- co-activation with the placement's GPU blocks ---------------------------------
def coactivation_heatmap(
    coact: np.ndarray,
    physical_to_logical: np.ndarray,
    num_gpus: int,
    *,
    load: np.ndarray | None = None,
    node_of_gpu: np.ndarray | None = None,
    layer_id: int | None = None,
    title: str | None = None,
) -> Any:
    """Co-activation of one layer, slots ordered by GPU, with GPU boundaries drawn.

    Each row and column is one slot (a replica appears once per copy); slots are
    grouped by GPU so each GPU is a contiguous block on the diagonal, and ordered
    by load within a GPU. Mass inside the diagonal blocks is co-activation the
    placement keeps on one GPU (one dispatch copy instead of two).

    Boundaries are thin and translucent so they do not hide the data: up to
    ``COACT_FULL_GRID_MAX_GPUS`` GPUs, full-length red lines between GPUs; beyond,
    only the GPU blocks on the diagonal are outlined.  Node boundaries are white
    lines (when there are at most as many nodes as that bound).

    Parameters
    ----------
    coact: ``[E, E]`` tokens selecting both experts i and j (symmetric).
    physical_to_logical: ``[P]`` logical expert of each slot, ``P % num_gpus == 0``.
    num_gpus: ``G``.
    load: ``[E]`` tokens per expert, orders slots within a GPU (default: the
        co-activation row sums).
    node_of_gpu: ``[G]`` node of each GPU; node boundaries are drawn in white.
    layer_id: absolute layer index, for the title.
    title: figure title (default names the layer and the same-GPU share).

    Returns
    -------
    Figure with one image axes (x and y: GPU, slots ordered by load within it)
    and a colour bar in ``tokens`` (selecting both experts).
    """
    coact = _array(coact, 2, "coact")
    p2l = _array(physical_to_logical, 1, "physical_to_logical").astype(np.int64)
    num_experts = coact.shape[0]
    _check_layer_placement(p2l, num_gpus, num_experts, coact.shape, "coact")
    if load is None:
        load = coact.sum(axis=1)
    load = _array(load, 1, "load")
    slots = p2l.size // num_gpus
    order = _slot_order(p2l, num_gpus, load)
    experts = p2l[order]
    matrix = coact[np.ix_(experts, experts)]
    share = same_gpu_share(coact, p2l, num_gpus)
    fig = new_figure(8.0, 7.0)
    ax = fig.add_subplot()
    from matplotlib.colors import PowerNorm

    vmax = float(matrix.max()) if matrix.size and matrix.max() > 0 else 1.0
    image = ax.imshow(matrix, cmap=HEATMAP_CMAP, interpolation="nearest",
                      norm=PowerNorm(gamma=0.5, vmin=0.0, vmax=vmax))
    nodes = None if node_of_gpu is None else np.asarray(node_of_gpu, dtype=np.int64)
    _draw_gpu_blocks(ax, num_gpus, slots, nodes)
    ticks = _tick_positions(num_gpus, 16)
    centres = [t * slots + (slots - 1) / 2 for t in ticks]
    ax.set_xticks(centres, [str(t) for t in ticks])
    ax.set_yticks(centres, [str(t) for t in ticks])
    ax.set_xlabel("GPU (its slots ordered by load)")
    ax.set_ylabel("GPU (its slots ordered by load)")
    where = f"layer {layer_id}" if layer_id is not None else "one layer"
    ax.set_title(title or f"Co-activation, {where}: {share:.0%} of co-selected pairs on one GPU")
    bar = fig.colorbar(image, ax=ax, shrink=0.85)
    bar.set_label("tokens (selecting both experts)")
    return fig


def _draw_gpu_blocks(ax: Any, num_gpus: int, slots: int, nodes: np.ndarray | None) -> None:
    """GPU and node boundaries of a slot x slot map, light enough to leave the data visible."""
    from matplotlib.patches import Rectangle

    full_grid = num_gpus <= COACT_FULL_GRID_MAX_GPUS
    num_nodes = 1 if nodes is None else len(set(nodes.tolist()))
    for g in range(1, num_gpus):
        edge = g * slots - 0.5
        if nodes is not None and nodes[g] != nodes[g - 1] and num_nodes <= COACT_FULL_GRID_MAX_GPUS:
            style: dict[str, Any] = {"color": "white", "linewidth": 1.2, "alpha": 0.9}
        elif full_grid:
            style = {"color": "#ff4d4d", "linewidth": 0.6, "alpha": 0.6}
        else:
            continue
        ax.axhline(edge, **style)
        ax.axvline(edge, **style)
    if not full_grid:
        for g in range(num_gpus):
            corner = g * slots - 0.5
            ax.add_patch(Rectangle((corner, corner), slots, slots, fill=False,
                                   edgecolor="#ff4d4d", linewidth=0.6, alpha=0.8))


def same_gpu_share(coact: np.ndarray, physical_to_logical: np.ndarray, num_gpus: int) -> float:
    """Share of co-activation mass whose two experts share a GPU (any replica).

    Parameters
    ----------
    coact: ``[E, E]`` symmetric pair counts, tokens.
    physical_to_logical: ``[P]`` one layer's slots.
    num_gpus: ``G``.

    Returns
    -------
    ``sum(coact[i, j] for pairs on one GPU) / sum(coact[i, j])`` over ``i < j``;
    0.0 when there is no co-activation.
    """
    coact = np.asarray(coact, dtype=np.float64)
    p2l = np.asarray(physical_to_logical, dtype=np.int64)
    num_experts = coact.shape[0]
    mask = np.zeros((num_experts, num_gpus), dtype=bool)
    mask[p2l, np.arange(p2l.size) // (p2l.size // num_gpus)] = True
    together = (mask.astype(np.int64) @ mask.T.astype(np.int64)) > 0
    upper = np.triu(np.ones_like(together), k=1)
    total = float((coact * upper).sum())
    if total <= 0:
        return 0.0
    return float((coact * upper * together).sum()) / total


# -- placement map --------------------------------------------------------------------
def placement_map(
    physical_to_logical: np.ndarray,
    num_gpus: int,
    load: np.ndarray,
    *,
    node_of_gpu: np.ndarray | None = None,
    layer_id: int | None = None,
    title: str | None = None,
) -> Any:
    """Which expert each slot holds, GPU x slot, coloured by the slot's load.

    A slot's load is its expert's load divided by the expert's replica count
    (the even split the engines' round-robin dispatch gives). Expert ids are
    written in the cells (replicated experts carry a ``*``) at 9 pt down to
    ``MIN_FONT_PT``, the largest size that fits a cell; the figure grows with the
    slots and GPUs (up to 14 x 12 inches) to make room.  With more than
    ``constants.PLACEMENT_MAP_MAX_LABELS`` slots, or cells too small for
    ``MIN_FONT_PT``, the ids are left out and the title says so.

    Parameters
    ----------
    physical_to_logical: ``[P]`` logical expert of each slot, one layer.
    num_gpus: ``G``; GPU g holds slots ``g*S .. g*S+S-1``.
    load: ``[E]`` tokens per logical expert in this layer.
    node_of_gpu: ``[G]`` node of each GPU; node boundaries are drawn.
    layer_id: absolute layer index, for the title.
    title: figure title (default names the layer and its hot-shard ratio).

    Returns
    -------
    Figure with one image axes (x: slot on GPU, y: GPU rank) and a colour bar in
    ``slot load / mean slot load``.
    """
    p2l = _array(physical_to_logical, 1, "physical_to_logical").astype(np.int64)
    load = _array(load, 1, "load")
    _check_layer_placement(p2l, num_gpus, load.size, None, "load")
    slots = p2l.size // num_gpus
    counts = np.bincount(p2l, minlength=load.size).astype(np.float64)
    slot_load = load[p2l] / counts[p2l]
    mean = slot_load.mean() if slot_load.size and slot_load.mean() > 0 else 1.0
    grid = (slot_load / mean).reshape(num_gpus, slots)
    gpu_rel = grid.sum(axis=1) / max(grid.sum(axis=1).mean(), 1e-12)
    fig = new_figure(min(max(2.8 + slots * 0.4, 6.5), 14.0), min(1.6 + num_gpus * 0.36, 12.0))
    ax = fig.add_subplot()
    image = ax.imshow(grid, aspect="auto", cmap=HEATMAP_CMAP, interpolation="nearest",
                      vmin=0.0, vmax=max(2.0, float(grid.max()) if grid.size else 2.0))
    if node_of_gpu is not None:
        nodes = np.asarray(node_of_gpu, dtype=np.int64)
        for g in range(1, num_gpus):
            if nodes[g] != nodes[g - 1]:
                ax.axhline(g - 0.5, color="white", linewidth=2.0)
    ax.set_xlabel("slot on GPU")
    ax.set_ylabel("GPU (rank)")
    ax.set_xticks(_tick_positions(slots, 24))
    gpu_ticks = _tick_positions(num_gpus, 32)
    ax.set_yticks(gpu_ticks, [str(t) for t in gpu_ticks])
    where = f"layer {layer_id}" if layer_id is not None else "one layer"
    ax.set_title(title or f"Placement map, {where}: hottest GPU {gpu_rel.max():.2f} x mean")
    bar = fig.colorbar(image, ax=ax)
    bar.set_label("slot load / mean slot load")
    labels = [f"{int(e)}{'*' if counts[e] > 1 else ''}" for e in p2l]
    size = _cell_font_size(fig, ax, slots, num_gpus, max((len(t) for t in labels), default=1))
    if p2l.size > constants.PLACEMENT_MAP_MAX_LABELS or size is None:
        ax.set_title(f"{ax.get_title()}\n(expert ids not printed: {p2l.size} slots are too"
                     f" many to label at {MIN_FONT_PT:g} pt)", fontsize="medium")
        return fig
    for g in range(num_gpus):
        for s in range(slots):
            colour = "black" if grid[g, s] > 1.2 else "white"
            ax.text(s, g, labels[g * slots + s], ha="center", va="center", fontsize=size,
                    color=colour)
    return fig


def _cell_font_size(fig: Any, ax: Any, cols: int, rows: int, chars: int) -> float | None:
    """The largest font (9 pt down to ``MIN_FONT_PT``) whose ``chars``-long label fits in
    one cell of ``ax``'s ``rows x cols`` grid once the figure is laid out; None if none does."""
    fig.draw_without_rendering()
    box = ax.get_window_extent()
    to_pt = 72.0 / fig.dpi
    cell_w, cell_h = box.width * to_pt / max(cols, 1), box.height * to_pt / max(rows, 1)
    for size in (9.0, 8.0, MIN_FONT_PT):
        # a digit is about 0.62 em wide in DejaVu Sans; keep a line's height free vertically
        if chars * 0.62 * size + 2.0 <= cell_w and 1.15 * size <= cell_h:
            return size
    return None


# -- what-if ------------------------------------------------------------------------------
def _array(values: Any, ndim: int, name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != ndim:
        raise UsageError(f"{name} must have {ndim} dimensions, got shape {arr.shape}", where=name)
    return arr


def _layer_ids(layer_ids: Sequence[int] | np.ndarray | None, num_layers: int) -> list[int]:
    if layer_ids is None:
        return list(range(num_layers))
    ids = [int(i) for i in np.asarray(layer_ids).ravel()]
    if len(ids) != num_layers:
        raise UsageError(f"{len(ids)} layer ids for {num_layers} layers", where="layer_ids")
    return ids


def _relative(values: np.ndarray) -> np.ndarray:
    """Each row divided by its mean (rows with no load stay 0)."""
    mean = values.mean(axis=-1, keepdims=True)
    return np.divide(values, mean, out=np.zeros_like(values), where=mean > 0)


def _hot_shard(gpu_load: np.ndarray) -> np.ndarray:
    rel = _relative(gpu_load)
    return rel.max(axis=-1) if rel.shape[-1] else np.ones(rel.shape[0])


def _tick_positions(count: int, most: int) -> list[int]:
    """At most ``most`` evenly spaced integer ticks in ``0..count-1``."""
    step = max(1, -(-count // most))
    return list(range(0, count, step))


def check_series(series: Sequence[np.ndarray], labels: Sequence[str], name: str) -> None:
    if not 1 <= len(series) <= len(SERIES_COLOURS):
        raise UsageError(f"{name} needs 1 to {len(SERIES_COLOURS)} series, got {len(series)}",
                         where=name)
    if len(labels) != len(series):
        raise UsageError(f"{len(labels)} labels for {len(series)} series", where="labels")


def _check_layer_placement(
    p2l: np.ndarray, num_gpus: int, num_experts: int, coact_shape: tuple[int, ...] | None,
    name: str,
) -> None:
    if coact_shape is not None and coact_shape != (num_experts, num_experts):
        raise UsageError(f"coact must be square, got shape {coact_shape}", where="coact")
    if num_gpus <= 0 or p2l.size % num_gpus:
        raise UsageError(f"{p2l.size} slots do not split evenly over {num_gpus} GPUs",
                         where="num_gpus")
    if p2l.size and (p2l.min() < 0 or p2l.max() >= num_experts):
        raise UsageError(f"physical_to_logical holds ids outside [0, {num_experts})",
                         where="physical_to_logical")


def _slot_order(p2l: np.ndarray, num_gpus: int, load: np.ndarray) -> np.ndarray:
    """``[P]`` slot indices grouped by GPU, each GPU's slots by descending expert load."""
    slots = p2l.size // num_gpus
    order = []
    for g in range(num_gpus):
        own = np.arange(g * slots, (g + 1) * slots)
        order.extend(own[np.argsort(-load[p2l[own]], kind="stable")].tolist())
    return np.asarray(order, dtype=np.int64)
