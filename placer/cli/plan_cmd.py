"""``placer plan``: fit a placement to a trace and write placement JSON.

The command is thin: read the trace, the model and the topology, build the problem
(:func:`placer.planning.build_problem`), solve it (:func:`placer.problem.solve`),
write the placement (:func:`placer.placement_io.write_placement`), and print a
summary.  The summary is a plain dict (:func:`plan_summary`, printed as is with
``--json``) rendered to text by :func:`render_summary`; both are small so that
other solvers can add sections.  Any solver other than ``eplb`` gets a side-by-side
against EPLB on the same problem (:func:`versus_eplb`): hot-shard ratio, remote copies
per token (GPU and node), weight moves from ``--current``, solve time and gap.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import typer

from placer import constants
from placer.cli.common import (
    handle_errors,
    num_experts_option,
    print_json,
    read_trace,
    top_k_option,
)
from placer.errors import DataError, UsageError
from placer.placement import Placement, gpu_loads, hot_shard_ratio
from placer.placement_io import read_placement, write_placement
from placer.planning import build_problem
from placer.problem import PlacementProblem, SolveParams, SolveResult, solve, solver_names
from placer.stats import ExpertStats, format_ranges

#: Solver used when ``--solver`` is not given.
DEFAULT_SOLVER = "cpsat"


def basic_metrics(placement: Placement, stats: ExpertStats) -> dict[str, float]:
    """Hot-shard ratio (max / mean GPU load per layer) of the load summed over windows.

    Returns ``{"hot_shard_ratio_median", "hot_shard_ratio_worst", "hottest_gpu_load"}``;
    the last is the worst layer's hottest GPU load in tokens.
    """
    loads = gpu_loads(placement, stats.mean_load)  # [L, G]
    ratio = hot_shard_ratio(loads)
    return {
        "hot_shard_ratio_median": float(np.median(ratio)),
        "hot_shard_ratio_worst": float(ratio.max()),
        "hottest_gpu_load": float(loads.max()),
    }


def plan_summary(
    problem: PlacementProblem,
    result: SolveResult,
    metrics: dict[str, float],
    output: Path,
) -> dict[str, Any]:
    """What ``placer plan`` reports: output path, problem size, solver and metrics."""
    stats = problem.stats
    return {
        "output": str(output),
        "problem": {
            "model": getattr(problem.model, "name", None),
            "topology": getattr(problem.topology, "name", None),
            "num_experts": stats.num_experts,
            "layers": format_ranges(stats.layer_ids),
            "num_layers": stats.num_layers,
            "num_windows": stats.num_windows,
            "num_gpus": problem.num_gpus,
            "num_nodes": problem.num_nodes,
            "slots_per_gpu": problem.slots_per_gpu,
            "num_physical_experts": problem.num_physical,
            "num_redundant": problem.num_redundant,
        },
        "solver": {
            "name": result.solver,
            "status": result.status,
            "objective": result.objective,
            "bound": result.bound,
            "gap": result.gap,
            "seconds": round(result.seconds, 3),
        },
        "metrics": metrics,
    }


def render_summary(summary: dict[str, Any]) -> list[str]:
    """Text lines of a plan summary (no colour, fit for a terminal or a log)."""
    p, s, m = summary["problem"], summary["solver"], summary["metrics"]
    model = p["model"] or "model"
    where = f"{p['topology']}: " if p["topology"] else ""
    solver = f"{s['name']} ({s['status']}, {s['seconds']:.2f} s"
    if s["bound"] is not None and s["gap"] is not None:
        solver += f", bound {s['bound']:.6g}, gap {100 * s['gap']:.2f}%"
    solver += ")"
    return [
        f"placement    {summary['output']}",
        f"model        {model}: {p['num_experts']} experts, layers {p['layers']},"
        f" {p['num_windows']} windows fitted",
        f"cluster      {where}{p['num_gpus']} GPUs on {p['num_nodes']}"
        f" node{'s' if p['num_nodes'] > 1 else ''},"
        f" {p['slots_per_gpu']} slots per GPU ({p['num_physical_experts']} physical,"
        f" {p['num_redundant']} redundant)",
        f"solver       {solver}",
        f"hot shard    max/mean GPU load: median {m['hot_shard_ratio_median']:.4f},"
        f" worst {m['hot_shard_ratio_worst']:.4f}"
        f" (hottest GPU {m['hottest_gpu_load']:.6g} tokens)",
    ]


def remote_figures(
    problem: PlacementProblem, placement: Placement, stats: ExpertStats | None = None
) -> dict[str, Any]:
    """Remote GPUs and nodes per token (normal mode, uniform source rank, mean over layers),
    the bracket the statistics prove, and how they were obtained.

    ``stats`` (default ``problem.stats``) must hold loads and pair counts over the same
    tokens: pass every window of the trace, as ``--fit`` statistics keep the pair counts
    of all windows (:func:`placer.evaluate.remote_copy_bounds`).  The estimate is

    - the closed form (``expected_remote_copies``) when it is exact: top-k <= 2 with every
      pair counted (:func:`placer.evaluate.static.pairwise_is_exact`), where it equals the
      bracket's lower end; no bracket is shown then;
    - otherwise the evaluator's sampled batches when the model and topology are known,
      drawn from the same statistics (all windows summed), and brought into the bracket
      when the sampled routing (loads matched, pairs only approximately, sampling noise)
      falls outside it (the summary says so);
    - otherwise none: the pairwise closed form is then not an estimate (top-k > 2 counts
      a triple on one GPU as three saved copies; partial pair counts miss pairs), only the
      bracket is shown.

    Returns ``{"remote_gpus_per_token", "remote_nodes_per_token",
    "remote_gpus_per_token_bounds", "remote_nodes_per_token_bounds",
    "remote_copies_from"}``; node figures are None on one node, the others None when not
    known.  Every estimate lies in its bracket, every bracket in ``[0, G - 1]``
    (``[0, N - 1]``).
    """
    from placer.evaluate.static import (
        expected_remote_copies,
        pairwise_is_exact,
        remote_copy_bounds,
    )

    stats = problem.stats if stats is None else stats
    out: dict[str, Any] = {
        "remote_gpus_per_token": None, "remote_nodes_per_token": None,
        "remote_gpus_per_token_bounds": None, "remote_nodes_per_token_bounds": None,
        "remote_copies_from": "no co-activation counts",
    }
    if stats.coact is None:
        return out
    multi = problem.num_nodes > 1
    nodes = _nodes_of(problem)
    windows = ""
    if stats.num_windows != problem.stats.num_windows:
        windows = f", all {stats.num_windows} windows (pair counts cover the whole trace)"
    try:
        bounds = remote_copy_bounds(placement, stats, nodes).mean(axis=0)  # [gpu|node, lo|hi]
        if pairwise_is_exact(stats):
            remote = expected_remote_copies(placement, stats, nodes).mean(axis=0)
            # exact means equal to the lower bound; counts no routing can have are not
            if np.allclose(remote, bounds[:, 0], rtol=1e-9, atol=1e-12):
                out["remote_gpus_per_token"] = float(bounds[0, 0])
                out["remote_nodes_per_token"] = float(bounds[1, 0]) if multi else None
                out["remote_copies_from"] = (
                    f"evaluator, closed form (exact: top-{stats.top_k}, every pair"
                    f" counted){windows}")
                return out
    except DataError as exc:
        out["remote_copies_from"] = f"not shown: {exc.message}"
        return out
    out["remote_gpus_per_token_bounds"] = _outward(bounds[0], problem.num_gpus - 1)
    if multi:
        out["remote_nodes_per_token_bounds"] = _outward(bounds[1], problem.num_nodes - 1)
    if problem.topology is None or problem.model is None:
        out["remote_copies_from"] = (
            f"bounds only (top-{stats.top_k}"
            + ("" if stats.top_k > 2 else ", pairs missing from the counts")
            + ": the pairwise closed form is not an estimate here; with --model and"
            " --topology the evaluator samples one)" + windows)
        return out
    sampled = _sampled_remote(problem, placement, stats)
    how = "evaluator, sampled batches" + windows
    moved = []
    for column, label, value in ((0, "GPUs", sampled[0]), (1, "nodes", sampled[1])):
        if column == 1 and not multi:
            continue
        low, high = out[("remote_gpus_per_token_bounds", "remote_nodes_per_token_bounds")
                        [column]]
        inside = min(max(value, low), high)
        if inside != value:
            moved.append(f"{label} {value:.3f} sampled")
        out[("remote_gpus_per_token", "remote_nodes_per_token")[column]] = inside
    if moved:
        how += f"; brought into the bounds ({', '.join(moved)})"
    out["remote_copies_from"] = how
    return out


def _sampled_remote(
    problem: PlacementProblem, placement: Placement, stats: ExpertStats
) -> tuple[float, float]:
    """Remote GPUs and nodes per token from the evaluator's sampled batches, every window
    of ``stats`` summed into one (the loads the bracket is proven for), with the
    ``random`` policy (each selection picks a replica uniformly and independently, the
    bracket's assumption; ``round_robin`` agrees only in expectation over list orders).
    ``PLAN_VERSUS_BATCHES`` batches of up to ``PLAN_VERSUS_BATCH_TOKENS``, no more tokens
    than the statistics hold."""
    from dataclasses import replace

    from placer.evaluate import EvalParams, evaluate

    whole = replace(
        stats, load=stats.load.sum(axis=0, keepdims=True),
        tokens=stats.tokens.sum(keepdims=True),
        window_starts=None if stats.window_starts is None else stats.window_starts[:1],
    )
    total = max(int(stats.total_tokens), 1)
    batches = min(constants.PLAN_VERSUS_BATCHES, total)
    metrics = evaluate(
        placement, whole, problem.topology, problem.model,
        EvalParams(policy="random", num_batches=batches,
                   batch_tokens=min(constants.PLAN_VERSUS_BATCH_TOKENS, total // batches)),
    ).metrics
    return metrics["remote_copies_per_token_gpu"], metrics["remote_copies_per_token_node"]


def _outward(span: np.ndarray, others: int) -> list[float]:
    """``[lower, upper]`` rounded outward to 6 decimals (rounding never narrows it), and
    never past ``[0, others]`` (``G - 1`` or ``N - 1``, which the bounds respect up to
    floating-point noise)."""
    low = max(float(np.floor(span[0] * 1e6) / 1e6), 0.0)
    return [low, min(max(float(np.ceil(span[1] * 1e6) / 1e6), low), float(others))]


def _nodes_of(problem: PlacementProblem) -> Any:
    """The topology, or what the closed forms read of one (``node_of_gpu``) without it."""
    from types import SimpleNamespace

    return problem.topology or SimpleNamespace(node_of_gpu=problem.node_of_gpu)


def _side_metrics(
    problem: PlacementProblem, result: SolveResult, gap: float | None,
    stats: ExpertStats | None = None,
) -> dict[str, Any]:
    """One column of the side-by-side: figures of ``result`` on ``problem``'s statistics
    (remote copies on ``stats``, see :func:`remote_figures`)."""
    basic = basic_metrics(result.placement, problem.stats)
    remote = remote_figures(problem, result.placement, stats)
    moves = None
    if problem.current is not None:
        moves = float(result.placement.moves_from(problem.current))
    return {
        "hot_shard_ratio_median": basic["hot_shard_ratio_median"],
        "hot_shard_ratio_worst": basic["hot_shard_ratio_worst"],
        **remote,
        "moves": moves,
        "seconds": round(result.seconds, 3),
        "gap": gap,
    }


def versus_eplb(
    problem: PlacementProblem, result: SolveResult, baseline: SolveResult,
    stats: ExpertStats | None = None,
) -> dict[str, Any]:
    """Side-by-side of ``result`` and EPLB's ``baseline`` on the same problem.

    Remote copies (normal mode, uniform source rank, mean over layers) and their bracket
    come from :func:`remote_figures` on ``stats`` (default ``problem.stats``; ``placer
    plan`` passes every window of the trace, where loads and pair counts agree); None
    without co-activation counts.  ``winners`` counts the layers where the planner's
    search beat its EPLB hint.
    """
    winners = result.details.get("winners") if isinstance(result.details, dict) else None
    return {
        "columns": [result.solver, baseline.solver],
        result.solver: _side_metrics(problem, result, result.gap, stats),
        baseline.solver: _side_metrics(problem, baseline, None, stats),
        "winners": winners,
    }


def render_versus(versus: dict[str, Any]) -> list[str]:
    """Text table of :func:`versus_eplb` (``-`` where a figure does not apply)."""
    mine, theirs = versus["columns"]
    rows = [
        ("hot shard, median layer", "hot_shard_ratio_median", "{:.4f}"),
        ("hot shard, worst layer", "hot_shard_ratio_worst", "{:.4f}"),
        ("remote GPUs per token", "remote_gpus_per_token", "{:.3f}"),
        ("remote nodes per token", "remote_nodes_per_token", "{:.3f}"),
        ("weight moves", "moves", "{:.0f}"),
        ("solve time, s", "seconds", "{:.2f}"),
        ("gap to bound", "gap", "{:.2%}"),
    ]
    lines = [f"{'':24}{mine:>12}{theirs:>12}"]
    for label, key, fmt in rows:
        cells = []
        for name in (mine, theirs):
            value = versus[name][key]
            cells.append("-" if value is None else fmt.format(value))
        lines.append(f"{label:24}{cells[0]:>12}{cells[1]:>12}")
    for label, key in (("remote GPUs, bounds", "remote_gpus_per_token_bounds"),
                       ("remote nodes, bounds", "remote_nodes_per_token_bounds")):
        spans = [versus[name].get(key) for name in (mine, theirs)]
        if any(span is not None for span in spans):
            cells = [" -" if span is None else f" {_span(span)}" for span in spans]
            lines.append(f"{label:24}{cells[0]:>12}{cells[1]:>12}")
    sources = [versus[name]["remote_copies_from"] for name in (mine, theirs)]
    if sources[0] == sources[1]:
        lines.append(f"remote copies: {sources[0]}")
    else:
        lines += [f"remote copies, {name}: {how}" for name, how in zip((mine, theirs), sources,
                                                                       strict=True)]
    if any(versus[name].get("remote_gpus_per_token_bounds") for name in (mine, theirs)):
        lines.append("bounds: any routing with these loads and pair counts"
                     " (docs/evaluate.md)")
    winners = versus.get("winners")
    if winners:
        lines.append(
            f"layers won: {mine} {winners.get('cpsat', 0)}, kept {theirs}'s plan"
            f" {winners.get('eplb', 0)}"
        )
    return lines


def _span(span: list[float]) -> str:
    """``lower-upper`` at 3 decimals, rounded outward: the printed bracket still holds the
    estimate printed at 3 decimals."""
    return f"{np.floor(span[0] * 1e3) / 1e3:.3f}-{np.ceil(span[1] * 1e3) / 1e3:.3f}"


def plan(
    trace: list[Path] = typer.Argument(
        ..., help="Routing trace or load statistics file(s), read by placer.traces.",
        show_default=False,
    ),
    output: Path = typer.Option(
        ..., "--output", "-o", help="Placement JSON to write (atomically).", show_default=False
    ),
    topology: str | None = typer.Option(
        None, "--topology", "-t", help="Topology preset name or YAML file."
    ),
    model: str | None = typer.Option(
        None, "--model", "-m",
        help="Model preset name or YAML file; checks layers and the memory budget.",
    ),
    solver: str = typer.Option(
        DEFAULT_SOLVER, "--solver", "-s", help=f"One of: {', '.join(solver_names())}."
    ),
    redundant: int | None = typer.Option(
        None, "--redundant", "-r",
        help="Redundant experts per layer (R = P - E); excludes --slots-per-gpu.",
    ),
    slots_per_gpu: int | None = typer.Option(
        None, "--slots-per-gpu", "-S", help="Slots per GPU; default ceil(E / G), no replicas."
    ),
    num_gpus: int | None = typer.Option(
        None, "--num-gpus", "-g", help="GPUs on one node, when there is no --topology."
    ),
    fit: str | None = typer.Option(
        None, "--fit", help="Windows to fit, START:STOP (default: all)."
    ),
    trace_format: str | None = typer.Option(
        None, "--format", "-f", help="Trace format (default: detected)."
    ),
    dtype: str | None = typer.Option(
        None, "--dtype", help="Expert weight dtype for the memory budget (default: the model's)."
    ),
    kv_reserve_gb: float | None = typer.Option(
        None, "--kv-reserve-gb", help="Memory per GPU kept for the KV cache, GB."
    ),
    seed: int = typer.Option(0, "--seed", help="Random seed of search-based solvers."),
    time_limit: float = typer.Option(
        10.0, "--time-limit", help="Seconds per layer for search-based solvers."
    ),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Layers solved in parallel."),
    current: Path | None = typer.Option(
        None, "--current", help="Deployed placement JSON: plan few weight moves from it."
    ),
    balance_tolerance: float = typer.Option(
        0.005, "--balance-tolerance",
        help="Hot-shard slack (over a perfect split) that traffic and moves may use.",
    ),
    traffic_first: bool = typer.Option(
        False, "--traffic-first",
        help="Measure --balance-tolerance from EPLB's hot shard (which may then be exceeded"
        " by that much) to buy co-location; default: never above EPLB's hot shard.",
    ),
    traffic_weight: float = typer.Option(
        1.0, "--traffic-weight", help="Weight of remote copies (co-location) in the second pass."
    ),
    migration_weight: float = typer.Option(
        constants.DEFAULT_MIGRATION_WEIGHT, "--migration-weight",
        help="Weight of weight moves from --current."
    ),
    robust: str = typer.Option(
        "max", "--robust",
        help="Balance the worst window (max), the mean of the worst windows (cvar, share:"
        " --option cvar_fraction=F) or the summed load (mean).",
    ),
    batch_tokens: int | None = typer.Option(
        None, "--batch-tokens",
        help="Plan for the hot shard of batches of this many tokens (adds per-batch load"
        " noise; small decode batches favour evenly spread replicas).",
    ),
    option: list[str] = typer.Option(
        [], "--option", metavar="KEY=VALUE",
        help="Solver-specific setting (repeatable), e.g. cpsat's patience=20.",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    top_k: int | None = top_k_option(),
    num_experts: int | None = num_experts_option(),
    export: list[str] = typer.Option(
        [], "--export", "-x", metavar="FORMAT:FILE",
        help="Also write the placement for a serving engine (repeatable), e.g. sglang:plan.json;"
        " needs --model.",
    ),
) -> None:
    """Plan an expert placement from a routing trace and write it as placement JSON."""
    from placer.cli.engines_cmd import export_to, parse_export_spec, render_export

    exports = [parse_export_spec(spec) for spec in export]
    if exports and model is None:
        raise UsageError(
            "engine files need the model's layer layout", where="--export",
            hint="pass --model with the served model",
        )
    names = solver_names()
    if solver not in names:
        raise UsageError(
            f"unknown solver {solver!r}", where="--solver",
            hint=f"choose one of: {', '.join(names)}",
        )
    params = SolveParams(
        time_limit_s=time_limit, seed=seed, jobs=jobs, balance_tolerance=balance_tolerance,
        traffic_weight=traffic_weight, migration_weight=migration_weight, robust=robust,
        traffic_first=traffic_first, batch_tokens=batch_tokens, options=_parse_options(option),
    )

    model_spec = _load_model(model)
    routing = read_trace(trace, trace_format, model=model_spec, top_k=top_k,
                         num_experts=num_experts)
    topo = _load_topology(topology)
    problem = build_problem(
        routing, model=model_spec, topology=topo, num_gpus=num_gpus,
        slots_per_gpu=slots_per_gpu, redundant=redundant, dtype=dtype,
        kv_reserve_gb=kv_reserve_gb, fit=fit,
        current=read_placement(current) if current is not None else None,
    )
    result = solve(problem, solver, params)
    metrics = basic_metrics(result.placement, problem.stats)
    write_placement(
        output, result.placement,
        model_name=getattr(model_spec, "name", None) or routing.stats.provenance.model,
        top_k=model_spec.top_k if model_spec is not None else (routing.stats.top_k or None),
        topology=topo, solver=result, metrics=metrics,
    )
    summary = plan_summary(problem, result, metrics, output)
    if solver != "eplb":
        summary["versus"] = versus_eplb(problem, result, solve(problem, "eplb", params),
                                         routing.stats)
    exported = [export_to(result.placement, fmt, path, model_spec) for fmt, path in exports]
    if exported:
        summary["exports"] = exported
    if json_out:
        print_json(summary)
    else:
        lines = render_summary(summary)
        if "versus" in summary:
            lines += ["", *render_versus(summary["versus"])]
        for item in exported:
            lines += ["", *render_export(item)]
        sys.stdout.write("\n".join(lines) + "\n")


def _parse_options(items: list[str]) -> dict[str, str]:
    """``["patience=20", ...]`` -> ``{"patience": "20"}``; the solver checks keys and values."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(
                f"expected KEY=VALUE, got {item!r}", where="--option",
                hint="for example --option patience=20",
            )
        out[key.strip()] = value.strip()
    return out


def _load_model(name: str | None) -> Any:
    if name is None:
        return None
    from placer.models import load_model

    return load_model(name)


def _load_topology(name: str | None) -> Any:
    if name is None:
        return None
    from placer.topology import load_topology

    return load_topology(name)


def register(app: typer.Typer) -> None:
    """Add ``placer plan`` to ``app``."""
    app.command("plan")(handle_errors(plan))
