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
from placer.cli.common import check_trace_header, err, handle_errors, print_json, write_pictures
from placer.cli.options import (
    allow_model_mismatch_option,
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
    same cadence (from the same first step, in the background where the engine copies in
    the background), and foresight."""
    from placer.replay import ENGINE_DEFAULTS, parse_policy
    from placer.replay.policies import OnlinePolicy

    eplb = ENGINE_DEFAULTS[engine]
    spec = parse_policy(eplb)
    assert isinstance(spec, OnlinePolicy)
    cadence = f"window={spec.window},interval={spec.interval}"
    if spec.first != spec.interval:
        cadence += f",first={spec.first}"
    if spec.asynchronous:  # decided and copied as the engine does
        cadence += ",async" + (f",layers={spec.layers}" if spec.layers != 1 else "")
    return ["static:default", eplb, f"placer:{cadence}", f"oracle:interval={spec.interval}"]


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
    allow_model_mismatch: bool = allow_model_mismatch_option(),
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
    from placer.model import load_model
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
        from placer.cli.outputs import check_output, check_output_folder
        from placer.report import require_matplotlib
        from placer.report.files import check_dpi

        if report is not None:
            check_output(report, where="--report")
        if png_dir is not None:
            check_output_folder(png_dir, where="--png-dir")
        require_matplotlib()
        check_dpi(dpi)
    check_trace_header(trace, trace_format, load_model(model), allow_model_mismatch)
    result, setting_notes = _run(trace, policies, model, topology, regime, redundant, dtype,
                                 initial, trace_steps, segments, trace_format, jobs, ray, quiet,
                                 allow_model_mismatch)
    from placer.replay.payback import paybacks, too_short

    short = too_short(result, int(result.info["steps"]))
    if short is not None:
        setting_notes.append(short)
    deploy = _deploy(result, regime.engine)
    batch = "the trace's own steps" if trace_steps else None
    if json_out:
        best = result.best()
        recommended = None if best is None else {"kind": best.kind, "policy": best.label}
        print_json({**result.to_dict(), "judged_as": regime.describe(batch),
                    "notes": setting_notes, "recommended": recommended,
                    "payback": [p.to_dict() for p in paybacks(result)],
                    "deploy": dict(deploy)})
    else:
        _print(result, regime, note, setting_notes, deploy, batch)
    if report is not None or png_dir is not None:
        _write_report(result, report, png_dir, dpi, deploy, setting_notes, quiet)


def _run(trace: list[Path], policies: list[Any], model: str, topology: str, regime: Any,
         redundant: int, dtype: str | None, initial: Path | None, trace_steps: bool,
         segments: int, trace_format: str | None, jobs: int, ray: str | None,
         quiet: bool, allow_model_mismatch: bool = False) -> tuple[Any, list[str]]:
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
                        num_experts=model_spec.num_experts, model=model_spec,
                        allow_model_mismatch=allow_model_mismatch)
    params = ReplayParams(regime, redundant, dtype, segments, jobs, ray)
    start = None
    if initial is not None:
        slots = (model_spec.num_experts + redundant) // topo.num_gpus
        start = static_placement(initial, Setting(topo, model_spec, regime, slots,
                                                  dtype or model_spec.default_dtype,
                                                  source.layer_ids))
    notes = _decision_notes(policies, source.num_layers, len(model_spec.all_moe_layer_ids))
    if source.dealt_ranks:
        from placer.evaluate.batches import dealt_note

        notes.append(dealt_note(source.dealt_ranks, topo.num_gpus)
                     + " (recorded on fewer ranks than this cluster has: docs/traces.md)")
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


def _decision_notes(policies: list[Any], layers: int, model_layers: int) -> list[str]:
    """What decision time each online policy is charged, and how a trace of fewer layers
    than the model stands for the whole model."""
    from placer.replay.policies import OnlinePolicy

    online = [p for p in policies if isinstance(p, OnlinePolicy)]
    if not online:
        return []
    sources: dict[str, list[str]] = {}
    for p in online:
        sources.setdefault(p.decision_source, []).append(p.label)
    notes = ["decision time: " + "; ".join(
        f"{source} for {', '.join(labels) if len(labels) < 3 else f'{len(labels)} policies'}"
        for source, labels in sources.items())
        + "; asynchronous, a decision lands at the first step that starts once that much"
        " serving has passed; synchronous, serving stops for it"]
    if layers < model_layers:
        notes.append(
            f"the trace holds {layers} of the model's {model_layers} MoE layers: step times"
            f" and decision times (decide s) are those of these {layers} layers; for the whole"
            f" model both scale by {model_layers}/{layers} (x{model_layers / layers:.1f}), so"
            " a decision takes as many steps; the whole model's copies would span"
            f" x{model_layers / layers:.1f} as many steps")
    return notes


#: The kinds of policy a verdict can recommend, in the words the verdict uses.
_KIND_WORDS = {"static": "a static placement (no online rebalancing)",
               "eplb": "the engine's online EPLB", "placer": "placer's online policy"}


def _deploy(result: Any, engine: str) -> list[tuple[str, str]]:
    """What to run for the recommended policy, as each engine takes it: the eplb flags
    when the engine's online EPLB wins; placer's vLLM launch line when placer's policy
    wins (SGLang and TensorRT-LLM have no policy interface: their best eplb setting); no
    flags when a static placement wins (each engine serves the plan without EPLB)."""
    from placer.replay.deploy import engine_flags, placer_launch
    from placer.replay.policies import OnlinePolicy, parse_policy

    best = result.best()
    if best is None or best.kind == "static":
        return []
    info = result.info
    names = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
    order = [engine, *(e for e in names if e != engine)]
    eplb = result.best("eplb")
    flags: dict[str, str] = {}
    eplb_policy = parse_policy(eplb.label) if eplb is not None else None
    if isinstance(eplb_policy, OnlinePolicy):
        flags = engine_flags(eplb_policy, redundant=int(info["redundant"]),
                             num_experts=int(info["num_experts"]),
                             num_gpus=int(info["num_gpus"]), num_layers=int(info["layers"]))
    policy = parse_policy(best.label)
    if best.kind == "eplb":
        return [(f"{names[e]} ({best.label})", flags[e]) for e in order if e in flags]
    if best.kind != "placer" or not isinstance(policy, OnlinePolicy):
        return []
    rows = [(f"vLLM ({best.label})", placer_launch(
        policy, topology=str(info["topology"]), model=str(info["model"]),
        redundant=int(info["redundant"])))]
    for e in (e for e in order if e != "vllm"):
        if e in flags and eplb is not None:
            rows.append((f"{names[e]} (no policy interface for placer's: the best engine"
                         f" setting, {eplb.label})", flags[e]))
    return rows


def _print(result: Any, regime: Any, note: str, notes: list[str],
           deploy: list[tuple[str, str]], batch: str | None) -> None:
    from placer.replay.result import segment_table, table

    info = result.info
    lines = [f"replayed     {info['trace']}: {info['steps']:,} steps,"
             f" {info['tokens']:,} tokens, {info['layers']} layers; {info['model']}"
             f" ({info['dtype']}) on {info['topology']}, {info['slots_per_gpu']} slots per"
             f" GPU ({info['redundant']} redundant)",
             judged_as(regime, note, batch), "", *table(result), "", "mean step time per segment"
             " (µs, rebalancing included)", *segment_table(result), "", result.verdict(),
             result.share_verdict()]
    best = result.best()
    if best is not None:
        lines.append(f"recommended: {_KIND_WORDS.get(best.kind, best.kind)} ({best.label})")
    if deploy:
        lines += ["to run it, as each engine takes it:"]
        lines += [f"  {engine}: {flags}" for engine, flags in deploy]
    elif best is not None and best.kind == "static":
        lines += ["to run it: serve the placement with online EPLB off (no --enable-eplb on"
                  " vLLM or SGLang; layer_updates_per_iter 0 on TensorRT-LLM)"]
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
