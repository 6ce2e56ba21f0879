"""``placer replay``: serving over time under rebalancing policies, side by side.

Thin: resolve the regime (the flags every judging command shares), open the trace's steps,
replay them (:func:`placer.replay.replay`), print the tables and the verdict (or JSON),
and write the HTML report and pictures when asked.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from placer.cli.command import PlacerCommand, examples
from placer.cli.common import err, handle_errors, print_json, write_pictures
from placer.cli.options import (
    dispatch_option,
    dpi_option,
    dtype_option,
    engine_option,
    format_option,
    jobs_option,
    json_option,
    mode_option,
    model_option,
    png_dir_option,
    quiet_option,
    ray_option,
    rebalance_option,
    redundant_option,
    report_option,
    seed_option,
    tokens_per_gpu_option,
    topology_option,
    workload_option,
)
from placer.cli.progress import progress
from placer.cli.regime import judged_as, resolve_regime
from placer.errors import UsageError

EXAMPLES = examples(
    "placer replay traces/synthetic-dsv3-drift.npz -m deepseek-v3 -t 4x-dgx-h100 -r 32",
    "placer replay trace.npz -m deepseek-v3 -t 4x-dgx-h100 -r 32 --engine sglang"
    " --rebalance static:plan.json --rebalance eplb:window=200,interval=100"
    " --rebalance placer:window=200,interval=25,max-moves=256 --rebalance oracle:interval=25",
    "placer replay trace.npz -m deepseek-v3 -t 4x-dgx-h100 -r 32 --rebalance eplb:window=100,"
    "interval=100,async --sweep interval=50,100,200 --sweep window=100,400 --report r.html",
    note="Policies, what is modelled and from which engine sources: docs/replay.md.",
)


def default_policies(engine: str) -> list[str]:
    """What ``placer replay`` compares when no ``--rebalance`` is given: the engines' default
    layout, the engine's own online EPLB with its defaults, placer's online re-plan at the
    same cadence, and foresight."""
    from placer.replay import ENGINE_DEFAULTS, parse_policy

    eplb = ENGINE_DEFAULTS[engine]
    spec = parse_policy(eplb)
    cadence = f"window={spec.window},interval={spec.interval}"  # type: ignore[union-attr]
    return ["static:default", eplb, f"placer:{cadence}",
            f"oracle:interval={spec.interval}"]  # type: ignore[union-attr]


def replay_cmd(
    trace: list[Path] = typer.Argument(
        ..., metavar="TRACE", show_default=False,
        help="Per-token routing trace (NPZ streamed; JSONL and engine dumps read whole).",
    ),
    model: str | None = model_option(),
    topology: str | None = topology_option(),
    rebalance: list[str] = rebalance_option(),
    sweep: list[str] = typer.Option(
        [], "--sweep", metavar="KEY=A,B,...",
        help="Replay every eplb policy with these values instead (interval, window,"
        " redundant; repeatable: their product).", show_default=False),
    redundant: int = redundant_option(),
    engine: str | None = engine_option(),
    workload: str | None = workload_option(),
    tokens_per_gpu: int | None = tokens_per_gpu_option(),
    dispatch: str | None = dispatch_option(),
    mode: str | None = mode_option(),
    seed: int = seed_option(),
    dtype: str | None = dtype_option(),
    initial: Path | None = typer.Option(
        None, "--initial", metavar="FILE",
        help="Placement the online policies start from (default: the engines' layout).",
        show_default=False),
    trace_steps: bool = typer.Option(
        False, "--trace-steps", help="Steps are the trace's own (its step field), not"
        " tokens-per-gpu x GPUs tokens."),
    segments: int = typer.Option(4, "--segments", min=1, help="Parts the figures are also"
                                 " given for."),
    trace_format: str | None = format_option(),
    jobs: int = jobs_option("Policies replayed"),
    ray: str | None = ray_option("Replay the policies"),
    json_out: bool = json_option("the results"),
    report: Path | None = report_option(),
    png_dir: Path | None = png_dir_option(),
    dpi: int = dpi_option(),
    quiet: bool = quiet_option(),
) -> None:
    """Replay a trace step by step under rebalancing policies (static, the engines' online
    EPLB, placer online, foresight) with migration cost, and say which to run."""
    from placer.replay import parse_policy
    from placer.replay.policies import parse_sweep, swept

    regime, note = resolve_regime(engine, workload, tokens_per_gpu, dispatch, mode, seed)
    if model is None or topology is None:
        missing = "--model" if model is None else "--topology"
        raise UsageError(f"{missing} is needed to replay", where=missing,
                         hint="pass --model and --topology (or set them in placer.toml)")
    specs = rebalance or default_policies(regime.engine)
    policies = swept([parse_policy(s, where="--rebalance") for s in specs], parse_sweep(sweep))
    if report is not None or png_dir is not None:
        from placer.report import require_matplotlib
        from placer.report.files import check_dpi

        require_matplotlib()
        check_dpi(dpi)
    result, setting_notes = _run(trace, policies, model, topology, regime, redundant, dtype,
                                 initial, trace_steps, segments, trace_format, jobs, ray, quiet)
    deploy = _deploy(result, regime.engine) if sweep or any(
        p.label.startswith("eplb") for p in result.policies) else []
    batch = "the trace's own steps" if trace_steps else None
    if json_out:
        print_json({**result.to_dict(), "judged_as": regime.describe(batch),
                    "notes": setting_notes, "deploy": dict(deploy)})
    else:
        _print(result, regime, note, setting_notes, deploy, batch)
    if report is not None or png_dir is not None:
        _write_report(result, report, png_dir, dpi, deploy, setting_notes, quiet)


def _run(trace: list[Path], policies: list[Any], model: str, topology: str, regime: Any,
         redundant: int, dtype: str | None, initial: Path | None, trace_steps: bool,
         segments: int, trace_format: str | None, jobs: int, ray: str | None,
         quiet: bool) -> tuple[Any, list[str]]:
    """Load the inputs, replay, and the notes a user should read."""
    from placer.model import load_model
    from placer.replay import ReplayParams, open_steps, replay
    from placer.replay.policies import OnlinePolicy, OraclePolicy
    from placer.replay.timeline import Setting, static_placement
    from placer.topology import load_topology

    model_spec = load_model(model)
    topo = load_topology(topology)
    source = open_steps(trace, num_gpus=topo.num_gpus,
                        batch_tokens=regime.batch_tokens(topo.num_gpus),
                        trace_steps=trace_steps, trace_format=trace_format,
                        num_experts=model_spec.num_experts)
    params = ReplayParams(regime, redundant, dtype, segments, jobs, ray)
    start = None
    if initial is not None:
        slots = (model_spec.num_experts + redundant) // topo.num_gpus
        start = static_placement(initial, Setting(topo, model_spec, regime, slots,
                                                  dtype or model_spec.default_dtype,
                                                  source.layer_ids))
    notes = []
    for p in policies:
        if isinstance(p, OnlinePolicy) and p.first >= source.num_steps:
            notes.append(f"{p.label} first rebalances at step {p.first}: never within these"
                         f" {source.num_steps} steps")
        elif isinstance(p, OraclePolicy) and p.interval >= source.num_steps:
            notes.append(f"{p.label} fits one placement on all {source.num_steps} steps")
    if not quiet:
        err.print(f"replaying {source.num_steps:,} steps x {len(policies)} policies",
                  highlight=False)
    with progress("steps replayed", enabled=not quiet) as report:
        result = replay(source, policies, model_spec, topo, params, initial=start,
                        progress=report)
    return result, notes


def _deploy(result: Any, engine: str) -> list[tuple[str, str]]:
    """The best eplb setting as each engine takes it."""
    from placer.replay.deploy import engine_flags
    from placer.replay.policies import OnlinePolicy, parse_policy

    best = result.best("eplb")
    if best is None:
        return []
    info = result.info
    policy = parse_policy(best.label)
    if not isinstance(policy, OnlinePolicy):
        return []
    flags = engine_flags(policy, redundant=int(info["redundant"]),
                         num_experts=int(info["num_experts"]), num_gpus=int(info["num_gpus"]),
                         num_layers=int(info["layers"]))
    names = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
    order = [engine, *(e for e in names if e != engine)]
    return [(f"{names[e]} ({best.label})", flags[e]) for e in order]


def _print(result: Any, regime: Any, note: str, notes: list[str],
           deploy: list[tuple[str, str]], batch: str | None) -> None:
    from placer.replay.result import segment_table, table

    info = result.info
    lines = [f"replayed     {info['trace']}: {info['steps']:,} steps,"
             f" {info['tokens']:,} tokens, {info['layers']} layers; {info['model']}"
             f" ({info['dtype']}) on {info['topology']}, {info['slots_per_gpu']} slots per"
             f" GPU ({info['redundant']} redundant)",
             judged_as(regime, note, batch), "", *table(result), "", "mean step time per segment"
             " (µs, rebalancing included)", *segment_table(result), "", result.verdict()]
    if deploy:
        lines += ["the best engine setting, as each engine takes it:"]
        lines += [f"  {engine}: {flags}" for engine, flags in deploy]
    lines += [f"note: {n}" for n in notes]
    sys.stdout.write("\n".join(lines) + "\n")


def _write_report(result: Any, report: Path | None, png_dir: Path | None, dpi: int,
                  deploy: list[tuple[str, str]], notes: list[str], quiet: bool) -> None:
    from placer import __version__
    from placer.cli.common import write_text_atomic
    from placer.report.replay import replay_report
    from placer.report.settings import command_line

    built = replay_report(result, dpi=dpi, command=command_line(), deploy=deploy, notes=notes)
    if report is not None:
        write_text_atomic(report, built.html(footer=f"placer {__version__}"))
        if not quiet:
            err.print(f"wrote {report}", highlight=False)
    if png_dir is not None:
        write_pictures(built.pictures, png_dir, quiet)


def register(app: typer.Typer) -> None:
    """Add ``placer replay`` to ``app``."""
    app.command("replay", cls=PlacerCommand, epilog=EXAMPLES)(handle_errors(replay_cmd))
