"""DeepEP benchmark: placer's predicted dispatch and combine times against every row of
DeepEP's published V1 tables.

``python -m bench deepep``.  Needs nothing outside the repository: the published figures
live in ``placer.calibrate.deepep``.  Each row is evaluated as a user's command would be
(``AllToAllCase.evaluate`` calls ``placer.evaluate.evaluate``) on the ``dgx-h800`` preset
grown to the row's node count, with DeepEP-test-style routing (4096 tokens per rank and
top-4 node groups for the normal kernels, 128 tokens per rank and no group limit for the
low-latency ones), experts placed linearly, FP8 dispatch and BF16 combine.  The
"low-latency RDMA" rows are DeepEP's first (February 2025) table of the pure-RDMA
low-latency kernels, evaluated in mode ``low_latency_rdma``.

Published normal-kernel figures are bandwidths; the time behind each is DeepEP's own byte
count for that row (taken on the same routing) over the bandwidth
(``placer.calibrate.deepep.published_time_us``).  Columns: the published figure, the
time behind it, placer's prediction at nominal link speeds (before calibration) and with
the calibration in force (placer's defaults, or ``--topology``'s), and their ratios.
The target: every calibrated ratio within 0.85-1.15.
"""

from __future__ import annotations

from dataclasses import replace

from placer.calibrate.deepep import PUBLISHED, PUBLISHED_RDMA, published_time_us
from placer.topology import Calibration, load_topology

TOPOLOGY = "dgx-h800"
TARGET = (0.85, 1.15)


def table(topology_name: str = TOPOLOGY) -> list[dict[str, object]]:
    """One dict per published row: label, published figure and time, predictions, ratios."""
    calibrated = load_topology(topology_name)
    nominal = replace(calibrated, calibration=Calibration(source="nominal"))
    cache: dict[object, tuple[tuple[float, float], tuple[float, float], object]] = {}
    rows: list[dict[str, object]] = []
    for row in PUBLISHED + PUBLISHED_RDMA:
        case = row.case
        if case not in cache:
            cache[case] = (case.evaluate(nominal), case.evaluate(calibrated), case.topk_ids())
        before, after, ids = cache[case]
        col = 0 if row.phase == "dispatch" else 1
        published = published_time_us(row, ids)  # type: ignore[arg-type]
        rows.append({
            "row": row.label,
            "published": f"{row.figure:g} {row.unit}",
            "published_us": published,
            "nominal_us": before[col],
            "calibrated_us": after[col],
            "nominal_ratio": before[col] / published,
            "ratio": after[col] / published,
        })
    return rows


def run() -> str:
    rows = table()
    lines = [
        "## DeepEP published tables vs placer's predicted all-to-all time",
        "",
        f"Topology `{TOPOLOGY}` grown to each row's nodes; ratio = predicted / published time.",
        "",
        "| row | published | published us | nominal us | ratio | calibrated us | ratio |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['row']} | {r['published']} | {r['published_us']:.0f} |"
            f" {r['nominal_us']:.0f} | {r['nominal_ratio']:.3f} |"
            f" {r['calibrated_us']:.0f} | {r['ratio']:.3f} |"
        )
    ratios = [float(r["ratio"]) for r in rows]  # type: ignore[arg-type]
    nominal = [float(r["nominal_ratio"]) for r in rows]  # type: ignore[arg-type]
    inside = sum(TARGET[0] <= x <= TARGET[1] for x in ratios)
    lines += [
        "",
        f"Calibrated: {inside} of {len(ratios)} rows within {TARGET[0]}-{TARGET[1]}"
        f" (range {min(ratios):.3f}-{max(ratios):.3f}); nominal speeds:"
        f" {min(nominal):.3f}-{max(nominal):.3f}.",
        "",
    ]
    return "\n".join(lines)
