"""The report's contents, built from placer's objects (pure: no files, no printing).

Two reports share these pieces:

- :func:`placement_report` (``placer report``): the verdict of each placement
  against the first, the settings and command line, the trace's statistics, then
  the placements side by side (metrics, placement maps, co-activation with GPU
  blocks, per-GPU load, the per-batch hot-shard tail);
- :func:`compare_report` (``placer compare --report``): the verdict of each
  scenario against its baseline, the scenario table and the what-if chart, the
  settings and command line, then the baseline and the best scenario side by side.

Each returns a :class:`Report` whose pictures are also available as PNG bytes
(for ``--png-dir``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from placer import constants
from placer.errors import UsageError
from placer.metrics import metric
from placer.placement import Placement, gpu_loads, hot_shard_ratio
from placer.report import charts, plots
from placer.report.html import Block, Picture, Section, SideBySide, Table, Text, render_html
from placer.report.mpl import figure_png, smallest_text_px
from placer.report.settings import compare_settings_rows, settings_section
from placer.report.verdicts import compare_judgements, placement_judgements, verdict_section

if TYPE_CHECKING:
    from placer.compare.scenarios import CompareSettings, Scenario
from placer.stats import ExpertStats
from placer.summary import TIME_FIGURES

#: Evaluator metrics shown in the placements table (labels, units and formats:
#: :mod:`placer.metrics`).
METRIC_KEYS = (
    "hot_shard_ratio_median", "hot_shard_ratio_worst", "batch_hot_shard_p50",
    "batch_hot_shard_p99", "vllm_balancedness", "sglang_balancedness", "trtllm_imbalance",
    "remote_copies_per_token_gpu", "remote_copies_per_token_node", "bytes_per_token_intra",
    "bytes_per_token_inter", *(f.key for f in TIME_FIGURES), "p99_over_p50",
    "expert_memory_gb", "kv_left_gb",
)


@dataclass(frozen=True)
class Report:
    """A finished report: sections for the HTML page, and its pictures as PNG.

    Attributes
    ----------
    title: page title.
    sections: in order.
    pictures: ``(file stem, PNG bytes)`` of every picture, for ``--png-dir``.
    subtitle: one line under the title (the inputs).
    """

    title: str
    sections: tuple[Section, ...]
    pictures: tuple[tuple[str, bytes], ...] = ()
    subtitle: str = ""

    def html(self, footer: str = "") -> str:
        """The self-contained HTML page."""
        return render_html(self.title, self.sections, subtitle=self.subtitle, footer=footer)


@dataclass
class Gallery:
    """Renders figures once and remembers them under unique file stems."""

    dpi: int
    pictures: list[tuple[str, bytes]] = field(default_factory=list)

    def add(self, stem: str, fig: Any, caption: str) -> Picture:
        png = figure_png(fig, self.dpi)
        smallest = smallest_text_px(fig, self.dpi)
        used = {s for s, _ in self.pictures}
        name, n = _file_stem(stem), 2
        while name in used:
            name, n = f"{_file_stem(stem)}-{n}", n + 1
        self.pictures.append((name, png))
        return Picture(png, caption, min_text_px=smallest if math.isfinite(smallest) else None)


# -- the trace ------------------------------------------------------------------------------
def trace_section(stats: ExpertStats, summary: dict[str, Any], gallery: Gallery) -> Section:
    """The statistics summary (``placer.stats.analysis.summarize``) and the expert load heatmap."""
    totals = summary.get("totals", {})
    overall = summary.get("overall", {})
    rows: list[tuple[str, str]] = [
        ("tokens", f"{int(totals.get('tokens', stats.total_tokens)):,}"),
        ("windows", str(totals.get("windows", stats.num_windows))),
        ("MoE layers", str(totals.get("layers", stats.num_layers))),
        ("experts per layer / top-k", f"{stats.num_experts} / {stats.top_k}"),
        ("format", str(totals.get("format") or "-")),
        ("synthetic", "yes" if totals.get("synthetic") else "no"),
    ]
    for key, label in (("max_over_mean", "expert max / mean load"), ("gini", "Gini of expert load"),
                       ("entropy", "normalized entropy of expert load")):
        stat = overall.get(key) or {}
        if stat.get("median") is not None:
            rows.append((f"{label}, median layer", f"{stat['median']:.3f}"))
            # low entropy is the skewed end; high max/mean and Gini are
            worst, at = ("min", "min_layer") if key == "entropy" else ("max", "max_layer")
            rows.append((f"{label}, worst layer", f"{stat[worst]:.3f} (layer {stat[at]})"))
    drift = overall.get("drift") or {}
    jac = (drift.get("hot_set_jaccard_mean") or {}).get("median")
    if jac is not None:
        rows.append((f"hot-set overlap between windows (Jaccard, top {drift['hot_set_size']})",
                     f"{jac:.3f}"))
    hottest = overall.get("hottest") or []
    if hottest:
        rows.append(("hottest experts (layer:expert share)", ", ".join(
            f"{h['layer']}:{h['expert']} {h['share']:.1%}" for h in hottest)))
    blocks: list[Block] = [Table(("figure", "value"), tuple(rows), caption="Routing statistics",
                                 numeric=())]
    for warning in summary.get("warnings", []):
        blocks.append(Text(f"warning: {warning}"))
    fig = plots.expert_load_heatmap(stats.mean_load, layer_ids=stats.layer_ids,
                                    title="Expert load (all windows)")
    blocks.append(gallery.add("expert-load", fig,
                              "Expert load per layer relative to the layer's mean, on a log"
                              " colour scale: bright cells are hot experts, dark ones cold."))
    return Section("Trace summary", tuple(blocks))


# -- placements side by side ------------------------------------------------------------------
def placements_sections(
    names: Sequence[str],
    placements: Sequence[Placement],
    evaluations: Sequence[Any],
    stats: ExpertStats,
    gallery: Gallery,
    *,
    node_of_gpu: Sequence[np.ndarray | None] | None = None,
    layer: int | None = None,
) -> list[Section]:
    """Metrics table, maps, co-activation, per-GPU load and tail for up to 4 placements.

    Parameters
    ----------
    names: one label per placement.
    placements: the placements (same model; their GPU counts may differ).
    evaluations: one ``placer.evaluate.Evaluation`` per placement (None to skip its figures).
    stats: the statistics the loads and co-activation come from (placement layers must exist).
    gallery: collects the rendered pictures.
    node_of_gpu: per placement, ``[G]`` node of each GPU (node boundaries drawn), or None.
    layer: absolute layer id drawn in the maps (``placer report --layer``); default the
        first placement's hottest layer.
    """
    if not placements:
        raise UsageError("no placement to report", where="--placement")
    if len(placements) > len(plots.SERIES_COLOURS):
        raise UsageError(f"at most {len(plots.SERIES_COLOURS)} placements fit side by side,"
                         f" got {len(placements)}", where="--placement")
    nodes = list(node_of_gpu) if node_of_gpu is not None else [None] * len(placements)
    loads = []
    for p in placements:
        layer_stats = stats.select_layers(p.layer_ids)
        loads.append((layer_stats, gpu_loads(p, layer_stats.mean_load)))
    first = placements[0]
    if layer is None:
        layer_row = int(np.argmax(hot_shard_ratio(loads[0][1])))
        layer = int(first.layer_ids[layer_row])
        which = f"Layer {layer}, the layer where the hot shard of {names[0]} is worst."
    else:
        which = f"Layer {layer}, as asked."
    sections = [_metrics_section(names, placements, evaluations),
                _maps_section(names, placements, loads, nodes, layer, which, gallery)]
    if stats.coact is not None:
        sections.append(_coact_section(names, placements, loads, nodes, layer, gallery))
    load_section = _load_section(names, placements, evaluations, loads, gallery)
    if load_section is not None:
        sections.append(load_section)
    tails = [(n, e.batch_hot_shard) for n, e in zip(names, evaluations, strict=True)
             if e is not None and np.size(getattr(e, "batch_hot_shard", [])) > 0]
    if tails:
        fig = charts.hot_shard_tail([t for _, t in tails], [n for n, _ in tails])
        sections.append(Section("Per-batch hot shard", (gallery.add(
            "hot-shard-tail", fig, "Hottest GPU over the mean GPU in each (batch, layer): the"
            " right-hand tail sets p99 latency."),)))
    return sections


_Loads = Sequence[tuple[ExpertStats, np.ndarray]]  # per placement: its layers' stats, GPU loads


def _maps_section(
    names: Sequence[str], placements: Sequence[Placement], loads: _Loads,
    nodes: Sequence[np.ndarray | None], layer: int, which: str, gallery: Gallery,
) -> Section:
    """Each placement's map of layer ``layer``, side by side (stacked when wide)."""
    maps = []
    wide = False
    for p, name, (layer_stats, _), node in zip(placements, names, loads, nodes, strict=True):
        row = p.layer_row(layer)
        fig = plots.placement_map(p.physical_to_logical[row], p.num_gpus,
                                  layer_stats.mean_load[row], node_of_gpu=node, layer_id=layer)
        wide = wide or fig.get_figwidth() > constants.REPORT_SIDE_BY_SIDE_MAX_IN
        maps.append(gallery.add(f"placement-map-{name}-layer{layer}", fig,
                                f"{name}: experts on each GPU in layer {layer}, coloured by the"
                                " slot's load (* = replicated expert)."))
    return Section(
        "Placement maps", (SideBySide(tuple(maps), tuple(names), stack=wide),), intro=which)


def _coact_section(
    names: Sequence[str], placements: Sequence[Placement], loads: _Loads,
    nodes: Sequence[np.ndarray | None], layer: int, gallery: Gallery,
) -> Section:
    """Each placement's co-activation heatmap of layer ``layer`` with its GPU boundaries."""
    heat = []
    for p, name, (layer_stats, _), node in zip(placements, names, loads, nodes, strict=True):
        row = p.layer_row(layer)
        coact = _layer_coact(layer_stats, row)
        if coact is None:
            continue
        fig = plots.coactivation_heatmap(
            coact, p.physical_to_logical[row], p.num_gpus,
            load=layer_stats.mean_load[row], node_of_gpu=node, layer_id=layer)
        blocks = ("GPUs are the squares outlined on the diagonal"
                  if p.num_gpus > plots.COACT_FULL_GRID_MAX_GPUS
                  else "red lines separate the GPUs (the squares on the diagonal)")
        nodes_drawn = node is not None and len(set(np.asarray(node).tolist())) > 1
        heat.append(gallery.add(f"coactivation-{name}-layer{layer}", fig,
                                f"{name}: co-activation in layer {layer} over {p.num_gpus}"
                                f" GPUs; {blocks}"
                                + ("; white lines separate the nodes." if nodes_drawn
                                   else ".")))
    return Section("Co-activation and GPU boundaries", (SideBySide(tuple(heat), tuple(names)),))


def _load_section(
    names: Sequence[str], placements: Sequence[Placement], evaluations: Sequence[Any],
    loads: _Loads, gallery: Gallery,
) -> Section | None:
    """Per-GPU load bars: measured when every placement was evaluated, else expected;
    None when the placements' layer counts differ."""
    first = placements[0]
    measured = [_evaluated_gpu_load(e, p) for e, p in zip(evaluations, placements, strict=True)]
    if all(m is not None for m in measured):
        bars = [m for m in measured if m is not None]
        ids = _measured_ids(evaluations[0], first)
        what = "Tokens each GPU processed over the evaluated batches (dispatch policy applied)"
    else:
        bars, ids = [g for _, g in loads], first.layer_ids
        what = "Expected tokens per GPU (each expert's load split evenly over its replicas)"
    if not all(b.shape[0] == bars[0].shape[0] for b in bars):
        return None
    fig = plots.gpu_load_bars(bars, list(names), layer_ids=ids)
    split = len({b.shape[1] for b in bars}) > 1
    return Section("Per-GPU load", (gallery.add(
        "gpu-load", fig, f"{what}, over the mean, in the layers where the hot shard of"
        f" {names[0]} is worst"
        + ("; one column per placement, since their GPU counts differ." if split
           else "."),),))


def _layer_coact(stats: ExpertStats, row: int) -> np.ndarray | None:
    """``[E, E]`` co-activation of layer row ``row``, dense, or None when not collected or
    too large to draw (a heat map of that many experts would not be readable anyway)."""
    if stats.coact is None or not stats.coact.dense_fits():
        return None
    return stats.coact_dense(row)


def _evaluated_gpu_load(evaluation: Any, placement: Placement) -> np.ndarray | None:
    """``[layers, G]`` tokens per GPU measured by the evaluator, or None when absent."""
    load = getattr(evaluation, "gpu_load", None)
    if load is None:
        return None
    load = np.asarray(load, dtype=np.float64)
    if load.ndim != 2 or load.shape[1] != placement.num_gpus or load.shape[0] == 0:
        return None
    return load


def _measured_ids(evaluation: Any, placement: Placement) -> np.ndarray:
    """Absolute layer ids of the evaluator's per-layer arrays (the placement's when absent)."""
    ids = getattr(evaluation, "layer_ids", None)
    if ids is None or np.size(ids) == 0:
        return placement.layer_ids
    return np.asarray(ids, dtype=np.int64)


def _metrics_section(
    names: Sequence[str], placements: Sequence[Placement], evaluations: Sequence[Any]
) -> Section:
    header = ("figure", *names)
    rows: list[tuple[str, ...]] = [
        ("GPUs", *(str(p.num_gpus) for p in placements)),
        ("slots per GPU", *(str(p.slots_per_gpu) for p in placements)),
        ("redundant experts per layer", *(str(p.num_redundant) for p in placements)),
    ]
    for key in METRIC_KEYS:
        entry = metric(key)
        values = [_metric(e, key) for e in evaluations]
        if all(v is None for v in values):
            continue
        rows.append((f"{entry.label} ({entry.unit})", *(entry.cell(v) for v in values)))
    return Section("Placements", (Table(header, tuple(rows), caption="Evaluated figures"),))


def _metric(evaluation: Any, key: str) -> float | None:
    if evaluation is None:
        return None
    value = evaluation.metrics.get(key)
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


# -- the two reports --------------------------------------------------------------------------
def placement_report(
    stats: ExpertStats,
    summary: dict[str, Any],
    names: Sequence[str],
    placements: Sequence[Placement],
    evaluations: Sequence[Any],
    *,
    node_of_gpu: np.ndarray | None = None,
    layer: int | None = None,
    subtitle: str = "",
    dpi: int | None = None,
    settings: Sequence[tuple[str, str]] = (),
    command: str = "",
) -> Report:
    """``placer report``: verdicts, settings, statistics, then the placements side by side.

    Parameters
    ----------
    stats: the routing statistics the placements were evaluated on.
    summary: ``placer.stats.analysis.summarize(stats)``.
    names, placements, evaluations: one entry per placement (up to 4); the first is
        the baseline of the verdicts (put the deployed or EPLB placement first).
    node_of_gpu: ``[G]`` node of each GPU of the topology (all placements share it).
    layer: absolute layer id for the maps (default: the hottest).
    subtitle: line under the title.
    dpi: picture resolution (default ``constants.REPORT_DPI``).
    settings: ``(setting, value)`` rows of the evaluation
        (:func:`placer.report.settings.evaluation_settings_rows`).
    command: the command line that wrote the report
        (:func:`placer.report.settings.command_line`).
    """
    from placer import __version__

    gallery = Gallery(dpi or constants.REPORT_DPI)
    judged = placement_judgements(names, evaluations)
    sections = []
    if len(names) > 1:
        sections.append(verdict_section(judged, intro=f"Each placement against {names[0]} (the"
                                        " first given), on the estimated step p99 of the"
                                        " evaluated batches."))
    sections.append(settings_section(settings, command=command, version=__version__))
    sections.append(trace_section(stats, summary, gallery))
    sections += placements_sections(names, placements, evaluations, stats, gallery,
                                    node_of_gpu=[node_of_gpu] * len(placements), layer=layer)
    return Report("placer report", tuple(sections), tuple(gallery.pictures), subtitle)


def compare_report(
    outcomes: Sequence[Any],
    stats: ExpertStats,
    summary: dict[str, Any],
    *,
    description: str = "",
    node_of_gpu: dict[str, np.ndarray] | None = None,
    subtitle: str = "",
    dpi: int | None = None,
    settings: CompareSettings | None = None,
    scenarios: Sequence[Scenario] = (),
    command: str = "",
    recommendation: Sequence[str] = (),
    warnings: Sequence[str] = (),
) -> Report:
    """``placer compare --report``: the recommendation, verdicts, the table and what-if
    chart, settings, then baseline vs best.

    Parameters
    ----------
    outcomes: ``placer.compare.ScenarioOutcome`` in scenario order.
    stats: the statistics the scenarios were judged on.
    summary: ``placer.stats.analysis.summarize`` of the whole trace.
    description: how the data was split (fitted / judged windows).
    node_of_gpu: topology argument -> ``[G]`` node of each GPU, for node boundaries.
    subtitle: line under the title.
    dpi: picture resolution (default ``constants.REPORT_DPI``).
    settings: the study's ``placer.compare.CompareSettings``; None leaves the settings
        table to the version and command line.
    scenarios: the study's ``placer.compare.Scenario`` (topologies, redundancy, solvers).
    command: the command line that wrote the report
        (:func:`placer.report.settings.command_line`).
    recommendation, warnings: the ``recommended:`` line and the ``warning:`` texts the
        terminal shows, opening the page.

    Each scenario's verdict is against its row's baseline (``CompareRow.baseline``,
    else the first scenario that ran on its topology).  The pictures compare the
    *baseline*, the first scenario that ran, with the *best*, the one with the
    lowest estimated MoE-layer p99 (ties: the earlier); when they are the same,
    only it is drawn.
    """
    gallery = Gallery(dpi or constants.REPORT_DPI)
    rows = [o.row for o in outcomes]
    blocks, p99 = _scenario_blocks(rows, gallery)
    intro = description or ""
    from placer import __version__

    rows_of_settings = compare_settings_rows(settings, scenarios) if settings is not None else []
    if description:
        rows_of_settings.append(("windows", description))
    said = (*recommendation, *(f"warning: {w}" for w in warnings))
    sections = [Section("Recommendation", tuple(Text(t) for t in said))] if said else []
    sections += [
        verdict_section(compare_judgements(rows), intro="Each scenario against its baseline"
                        " (the EPLB scenario at the same redundancy on the same topology, else"
                        " that topology's first EPLB scenario; the table names it), on the"
                        " estimated step p99 of the judged batches."),
        Section("Scenarios", tuple(blocks), intro=intro),
        settings_section(rows_of_settings, command=command, version=__version__),
        trace_section(stats, summary, gallery),
    ]

    ran = [i for i, o in enumerate(outcomes) if o.row.ok and o.placement is not None]
    if ran:
        baseline = ran[0]
        finite = [i for i in ran if np.isfinite(p99[i])]
        best = min(finite, key=lambda i: (p99[i], i)) if finite else baseline
        chosen = [baseline] if best == baseline else [baseline, best]
        names = [("baseline: " if i == baseline else "lowest p99: ") + rows[i].scenario
                 for i in chosen]
        nodes = [None if node_of_gpu is None else node_of_gpu.get(rows[i].topology)
                 for i in chosen]
        sections += placements_sections(
            names, [outcomes[i].placement for i in chosen],
            [outcomes[i].evaluation for i in chosen], stats, gallery, node_of_gpu=nodes)
    title = "placer compare"
    return Report(title, tuple(sections), tuple(gallery.pictures), subtitle)


def _scenario_blocks(rows: Sequence[Any], gallery: Gallery) -> tuple[list[Block], np.ndarray]:
    """The scenarios table, its status notes and the what-if chart; with ``p99: [rows]``
    float64, µs, each row's estimated MoE-layer p99 (NaN where there is none)."""
    from placer.compare import TABLE_COLUMNS, status_notes, table_cells

    short, notes = status_notes(rows)
    cells = tuple((*table_cells(r)[:-1], status) for r, status in zip(rows, short, strict=True))
    table = Table(tuple(c.header for c in TABLE_COLUMNS), cells,
                  caption="Scenarios (units in the headers; B/tok: bytes per token and layer)")
    p99 = np.array([r.moe_layer_p99_us if r.moe_layer_p99_us is not None else np.nan
                    for r in rows], dtype=np.float64)
    kv = np.array([r.kv_left_gb if r.kv_left_gb is not None and r.ok else np.nan for r in rows],
                  dtype=np.float64)
    missing = [_short_status(r.status) for r in rows]
    fig = charts.whatif_chart([r.scenario for r in rows], p99, kv, notes=missing)
    whatif = gallery.add("what-if", fig, "Estimated MoE-layer p99 time and KV-cache memory left"
                         " per GPU, per scenario (shorter time and longer memory bars are better).")
    blocks: list[Block] = [table]
    blocks += [Text(f"[{i}] {reason}") for i, reason in enumerate(notes, 1)]
    blocks.append(whatif)
    return blocks, p99


def _short_status(status: str) -> str:
    if status.startswith("does not fit"):
        return "does not fit"
    if status.startswith("error"):
        return "error"
    return "no result"


def _file_stem(text: str) -> str:
    out = "".join(c if c.isalnum() or c in "-_." else "-" for c in text.lower())
    while "--" in out:
        out = out.replace("--", "-")
    return out.strip("-") or "picture"
