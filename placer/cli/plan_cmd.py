"""``placer plan``: fit a placement to a trace and write placement JSON.

The command is thin: read the trace (keeping per-token routing for the replay within
bounds: the whole trace when it is small, else a sample of whole batches per window), the
model and the topology; plan and summarize with
:func:`placer.planning.run.plan_routing` (build the problem, solve it, solve EPLB once for
the side-by-side); write the placement (:func:`placer.placement.document.write_placement`) and
print the summary (``--json``: its ``to_dict()``).

``--engine`` (implied by ``--export`` when it names one engine), ``--workload``,
``--tokens-per-gpu`` and the overrides ``--dispatch``/``--mode`` make the
:class:`placer.regime.Regime` the solver plans for (``SolveParams.regime``) and the
summary judges under (:mod:`placer.cli.regime`, the flags every judging command shares).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from placer import constants
from placer.cli.command import examples, given, placer_command
from placer.cli.common import as_flags, handle_errors, judge_sample_for, print_json, read_trace
from placer.cli.exports import export_implies_engine
from placer.cli.options import (
    DEFAULT_LAYER_SECONDS,
    allow_model_mismatch_option,
    dispatch_option,
    dtype_option,
    engine_option,
    fit_option,
    format_option,
    jobs_option,
    json_option,
    keep_warmup_option,
    kv_reserve_gb_option,
    layer_time_limit_option,
    mode_option,
    model_option,
    num_experts_option,
    num_gpus_option,
    output_option,
    quiet_option,
    ray_option,
    redundant_option,
    seed_option,
    slots_per_gpu_option,
    solver_option,
    time_limit_option,
    tokens_per_gpu_option,
    top_k_option,
    topology_option,
    workload_option,
)
from placer.cli.outputs import check_output
from placer.cli.progress import phases, progress
from placer.cli.regime import recorded, resolve_regime
from placer.cli.summary import summary_rows
from placer.errors import UsageError
from placer.io.fileio import all_or_nothing, check_not_inputs, is_stream
from placer.placement.document import read_placement, write_placement
from placer.planning.build import ProblemSpec
from placer.planning.run import PlanRun, plan_routing
from placer.problem import SolveParams
from placer.stats.windows import parse_window_range
from placer.summary import PlanSummary

if TYPE_CHECKING:
    from placer.model import ModelSpec
    from placer.topology import Topology

EXAMPLES = examples(
    "placer plan traces/qwen3-30b-a3b.npz -m qwen3-30b-a3b -t 2x-dgx-h100 -r 16 -o plan.json",
    "placer plan dumps/*.pt -m deepseek-v3 -t 4x-dgx-h100 -r auto -o plan.json"
    " --export sglang:plan.sglang.json",
    "placer plan new.npz -m deepseek-v3 -t 4x-dgx-h100 -r 32 --current deployed.json"
    " --max-moves 64 -o next.json",
    note="Solvers, knobs and the summary: docs/planner.md; re-planning: docs/placement.md.",
)

def plan(
    trace: list[Path] = typer.Argument(
        ..., metavar="TRACE", show_default=False,
        help="Routing trace or load statistics file(s), read by placer.traces.",
    ),
    output: Path = output_option("Placement JSON"),
    topology: str | None = topology_option(),
    model: str | None = model_option("checks layers and the memory budget"),
    solver: str = solver_option(),
    redundant: str | None = redundant_option("auto"),
    slots_per_gpu: int | None = slots_per_gpu_option(),
    num_gpus: int | None = num_gpus_option(),
    fit: str | None = fit_option("to fit (default: all)"),
    trace_format: str | None = format_option(),
    dtype: str | None = dtype_option(),
    kv_reserve_gb: float | None = kv_reserve_gb_option(),
    seed: int = seed_option(),
    time_limit: float | None = time_limit_option(),
    layer_time_limit: float | None = layer_time_limit_option(),
    jobs: int | None = jobs_option("Layers solved", default=None),
    current: Path | None = typer.Option(
        None, "--current", metavar="FILE",
        help="Deployed placement JSON: plan few weight moves from it.",
    ),
    max_moves: int | None = typer.Option(
        None, "--max-moves", min=0, metavar="N",
        help="With --current: at most N weight moves in all (a hard budget).",
        show_default=False,
    ),
    max_move_gb: float | None = typer.Option(
        None, "--max-move-gb", min=0.0, metavar="GB",
        help="With --current: at most this many GB of expert weights to copy.",
        show_default=False,
    ),
    move_tolerance: float = typer.Option(
        constants.MOVE_TOLERANCE, "--move-tolerance", min=0.0, max=0.999, metavar="SHARE",
        help="With --current and no budget: the fewest moves whose estimated time is within"
        " this share of the best re-plan's (0 moves when the deployed placement is).",
    ),
    sweep_moves: bool = typer.Option(
        False, "--sweep-moves",
        help="With --current: print the move frontier (budget -> estimated time).",
    ),
    ray: str | None = ray_option("Solve the layers"),
    quiet: bool = quiet_option(),
    balance_tolerance: float | None = typer.Option(
        None, "--balance-tolerance", min=0, max=1, metavar="SHARE",
        help="cpsat: hot-shard slack (over a perfect split) that traffic and moves may use"
        " (default 0.005).", show_default=False,
    ),
    traffic_first: bool | None = typer.Option(
        None, "--traffic-first",
        help="cpsat: measure --balance-tolerance from EPLB's hot shard (which may then be"
        " exceeded by that much) to buy co-location; default: never above EPLB's hot shard.",
        show_default=False,
    ),
    traffic_weight: float | None = typer.Option(
        None, "--traffic-weight", min=0, metavar="WEIGHT",
        help="cpsat: weight of remote copies (co-location) in the second pass (default 1).",
        show_default=False,
    ),
    migration_weight: float | None = typer.Option(
        None, "--migration-weight", min=0, metavar="WEIGHT",
        help="cpsat: weight of weight moves from --current (default"
        f" {constants.DEFAULT_MIGRATION_WEIGHT:g}).", show_default=False,
    ),
    robust: str | None = typer.Option(
        None, "--robust", metavar="max|cvar|std|mean",
        help="cpsat: balance the worst window (max, default), the mean of the worst windows"
        " (cvar, share: --option cvar_fraction=F), mean plus spread (std) or the summed load"
        " (mean).", show_default=False,
    ),
    noise_batch_tokens: int | None = typer.Option(
        None, "--noise-batch-tokens", "--batch-tokens", min=1, metavar="TOKENS",
        help="cpsat: plan for the hot shard of batches of this many tokens (adds per-batch"
        " load noise; small decode batches favour evenly spread replicas).",
        show_default=False,
    ),
    option: list[str] = typer.Option(
        [], "--option", metavar="KEY=VALUE",
        help="A solver's own setting (repeatable), e.g. cpsat's patience=20;"
        " docs/planner.md lists them.",
    ),
    json_out: bool = json_option("the summary"),
    top_k: int | None = top_k_option(),
    num_experts: int | None = num_experts_option(),
    keep_warmup: bool = keep_warmup_option(),
    allow_model_mismatch: bool = allow_model_mismatch_option(),
    export: list[str] = typer.Option(
        [], "--export", "-x", metavar="FORMAT:FILE",
        help="Also write the placement for a serving engine (repeatable), e.g. sglang:plan.json;"
        " needs --model.",
    ),
    engine: str | None = engine_option(exports=True),
    workload: str | None = workload_option(),
    tokens_per_gpu: int | None = tokens_per_gpu_option(),
    dispatch: str | None = dispatch_option(),
    mode: str | None = mode_option(),
) -> None:
    """Plan an expert placement from a routing trace and write it as placement JSON."""
    from placer.cli.exports import parse_export_spec
    from placer.engines import export_engine, get_engine

    exports = [parse_export_spec(spec) for spec in export]
    _check_paths(output, exports, [trace, current, topology, model])
    _check_flags(exports, model, solver)
    target, target_note = resolve_regime(engine, workload, tokens_per_gpu, dispatch, mode,
                                         seed, [fmt for fmt, _ in exports])
    if current is None:
        _check_no_budget(max_moves, max_move_gb, sweep_moves)
    params = SolveParams(
        time_limit_s=layer_time_limit or DEFAULT_LAYER_SECONDS,
        total_time_limit_s=time_limit or constants.DEFAULT_PLAN_SECONDS,
        max_moves=max_moves, max_move_gb=max_move_gb, move_tolerance=move_tolerance,
        seed=seed, jobs=jobs or os.cpu_count() or 1, ray=ray, regime=target,
        distinct=any(not get_engine(fmt).duplicates for fmt, _ in exports),
        options=solver_options(option, {
            "--balance-tolerance": ("balance_tolerance", balance_tolerance),
            "--traffic-first": ("traffic_first", traffic_first),
            "--traffic-weight": ("traffic_weight", traffic_weight),
            "--migration-weight": ("migration_weight", migration_weight),
            "--robust": ("robust", robust),
            "--noise-batch-tokens": ("batch_tokens", noise_batch_tokens),
        }),
    )
    fit_range = parse_window_range(fit) if fit is not None else None

    model_spec = _load_model(model)
    topo = _load_topology(topology)
    # per-token routing for the judge and pairs within bounds (the cost grows with the
    # log of the trace's length past them); no layer affinity: planning reads none
    from placer.traces import PLAN_PAIR_TOKENS

    sample = (judge_sample_for(target.batch_tokens(num_gpus or topo.num_gpus), seed)
              if model_spec is not None and topo is not None else None)
    reading = time.perf_counter()
    routing = read_trace(trace, trace_format, model=model_spec, top_k=top_k,
                         num_experts=num_experts, keep_warmup=keep_warmup,
                         allow_model_mismatch=allow_model_mismatch, sample=sample,
                         affinity=False, pair_tokens=PLAN_PAIR_TOKENS)
    read_s = time.perf_counter() - reading
    current_placement = read_placement(current) if current is not None else None
    auto = redundant is not None and redundant.strip().lower() == "auto"
    if auto:
        _check_auto(model_spec, topo, slots_per_gpu)
    spec = ProblemSpec(
        model=model_spec, topology=topo, num_gpus=num_gpus, slots_per_gpu=slots_per_gpu,
        redundant=None if auto else _redundant_count(redundant), dtype=dtype,
        kv_reserve_gb=kv_reserve_gb, fit=fit_range,
        current=current_placement,
    )
    run = plan_routing(
        routing, spec, solver, params, auto=auto,
        progress=progress("layers planned", enabled=not (quiet or json_out)),
        phase=phases(enabled=not (quiet or json_out)),
    )
    result, summary = run.result, run.summary
    with all_or_nothing():  # the placement and the engine files land together, or none
        write_placement(
            output, result.placement,
            model_name=model_spec.name if model_spec is not None
            else routing.stats.provenance.model,
            top_k=model_spec.top_k if model_spec is not None else (routing.stats.top_k or None),
            topology=topo, solver=result.record(), metrics=run.metrics,
            regime=recorded(target),
        )
        exported = [export_engine(result.placement, fmt, path, model=model_spec)
                    for fmt, path in exports if model_spec is not None]  # _check_flags
    if json_out:
        print_json(_json_doc(run, summary, str(output), target_note, exported, read_s))
        return
    lines = summary_rows(summary, output=str(output), regime_note=target_note,
                         frontier=sweep_moves)
    if run.auto is not None:
        lines += ["", run.auto.reason, "candidates (redundant: EPLB's µs per step, as above): "
                  + ", ".join(f"{o.redundant}: {o.step_us:.1f}" for o in run.auto.options)]
    for item in exported:
        lines += ["", *item.lines()]
    sys.stdout.write(as_flags("\n".join(lines)) + "\n")  # the summary's words, as flags


def _json_doc(run: PlanRun, summary: PlanSummary, output: str, regime_note: str,
              exported: list[Any], read_s: float) -> dict[str, Any]:
    """The ``--json`` document: where the placement was written, the summary (with where
    its regime came from), the automatic redundancy and the engine files when there are,
    and where the time went (``timings``: reading the trace, planning to the last layer,
    what follows it)."""
    doc = {"output": output, **summary.to_dict()}
    doc["regime"]["note"] = regime_note
    if run.auto is not None:
        doc["redundant_auto"] = run.auto.to_dict()
    if exported:
        doc["exports"] = [item.to_dict() for item in exported]
    doc["timings"] = {key: round(value, 3) for key, value in
                      {"read_s": read_s, **run.timings}.items()}
    return doc


def _check_flags(exports: list[tuple[str, Path]], model: str | None, solver: str) -> None:
    """Engine files need ``--model``; ``--solver`` names a solver."""
    if exports and model is None:
        raise UsageError(
            "engine files need the model's layer layout", where="--export",
            hint="pass --model with the served model",
        )
    from placer.planning.solvers import solver_names

    names = solver_names()
    if solver not in names:
        raise UsageError(
            f"unknown solver {solver!r}", where="--solver",
            hint=f"choose one of: {', '.join(names)}",
        )


def _check_no_budget(max_moves: int | None, max_move_gb: float | None,
                     sweep_moves: bool) -> None:
    """Without ``--current`` no flag may budget weight moves."""
    for flag, value in (("--max-moves", max_moves), ("--max-move-gb", max_move_gb),
                        ("--sweep-moves", sweep_moves or None)):
        if value is not None:
            raise UsageError(f"{flag} budgets weight moves from a deployed placement",
                             where=flag, hint="pass --current DEPLOYED.json")


def _check_paths(output: Path, exports: list[tuple[str, Path]], inputs: list[Any]) -> None:
    """Every output can be written and none is an input (before any work)."""
    outputs = [("--output", output), *(("--export", path) for _, path in exports)]
    for option, path in outputs:
        check_output(path, where=option)
    files = [Path(p).resolve() for _, p in outputs if not is_stream(p)]
    if len(set(files)) < len(files):
        raise UsageError("two outputs name the same file", where="--export",
                         hint="give --output and every --export a file of its own")
    flat: list[Any] = []
    for item in inputs:
        flat.extend(item if isinstance(item, list | tuple) else [item])
    sources = [str(p) for p in flat if p is not None and Path(str(p)).exists()]
    check_not_inputs(outputs, sources)


def _redundant_count(text: str | None) -> int | None:
    """``--redundant`` as a count (``auto`` is handled by the caller)."""
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise UsageError(
            f"expected a number of redundant experts or auto, got {text!r}",
            where="--redundant", hint="for example --redundant 32, or --redundant auto",
        ) from None
    if value < 0:
        raise UsageError(f"expected redundant experts >= 0, got {value}", where="--redundant",
                         hint="give a count >= 0 (the nearest valid one is 0), or auto")
    return value


def _check_auto(
    model: ModelSpec | None, topology: Topology | None, slots_per_gpu: int | None
) -> None:
    """``--redundant auto`` chooses the slots per GPU and needs the model and the cluster."""
    if slots_per_gpu is not None:
        raise UsageError("--redundant auto chooses the slots per GPU itself",
                         where="--slots-per-gpu", hint="drop --slots-per-gpu")
    if model is None or topology is None:
        raise UsageError(
            "--redundant auto times candidates with the evaluator, which needs the model and"
            " the cluster", where="--redundant", hint="pass --model and --topology",
        )


def solver_options(items: list[str], flags: dict[str, tuple[str, Any]]) -> dict[str, Any]:
    """The solver's options: ``--option KEY=VALUE`` strings, and the flags that set one
    option each (``flag -> (option, value or None when not given)``); the solver checks
    names and values (a solver without options refuses any)."""
    out: dict[str, Any] = _parse_options(items)
    for flag, (name, value) in flags.items():
        if value is None:
            continue
        if name in out:
            raise UsageError(f"{flag} and --option {name}= set the same option", where=flag,
                             hint="give it once")
        out[name] = value
    return out


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


def _load_model(name: str | None) -> ModelSpec | None:
    if name is None:
        return None
    from placer.model import load_model

    return load_model(name)


def _load_topology(name: str | None) -> Topology | None:
    if name is None:
        return None
    from placer.topology import load_topology

    return load_topology(name)


def register(app: typer.Typer) -> None:
    """Add ``placer plan`` to ``app``."""
    # a configured topology yields to --num-gpus, a configured engine to --export's
    command = placer_command(topology=given("num_gpus"), engine=export_implies_engine)
    app.command("plan", cls=command, epilog=EXAMPLES)(handle_errors(plan))
