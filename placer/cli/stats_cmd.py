"""``placer stats`` and ``placer synth``: describe a routing trace, or make one.

Thin: ``placer.traces`` reads, ``placer.stats.analysis`` computes, ``placer.traces.synth``
generates; this module parses options and renders tables (``--json`` for machines).
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import typer
from rich import box
from rich.console import Console
from rich.table import Table

from placer import constants
from placer.cli.command import PlacerCommand, examples, given, placer_command
from placer.cli.common import (
    as_flags,
    handle_errors,
    out,
    print_json,
    read_trace,
)
from placer.cli.options import (
    format_option,
    json_option,
    keep_warmup_option,
    layer_option,
    model_option,
    num_experts_option,
    quiet_option,
    seed_option,
    top_k_option,
    topology_option,
    window_tokens_option,
)
from placer.cli.outputs import check_output
from placer.errors import PlacerWarning, UsageError
from placer.stats import format_ranges
from placer.traces.synth.skew import SKEW_PRESETS

STATS_EXAMPLES = examples(
    "placer stats traces/qwen3-30b-a3b.npz --layer 0 --layer 24 --top 3",
    "placer stats run.jsonl.gz --window-tokens 4096 --json > stats.json",
    "placer stats dumps/*.pt --top-k 8",
    note="Formats and figures: docs/stats.md and docs/traces.md.",
)
SYNTH_EXAMPLES = examples(
    "placer synth trace.npz --model deepseek-v3 --tokens 50000 --zipf 1.2 --seed 1",
    "placer synth small.jsonl.gz --layers 4 --experts 64 --top-k 8 --clusters 4 --drift 0.5",
    "placer synth shifts.npz --model deepseek-v3 --topology 4x-dgx-h100 --topics 8 "
    "--burst-every 64 --mix-period 512",
    note="The generator's knobs: docs/stats.md.",
)


def register(app: typer.Typer) -> None:
    """Add ``placer stats`` and ``placer synth`` to ``app``."""
    app.command("stats", cls=PlacerCommand, no_args_is_help=True,
                epilog=STATS_EXAMPLES)(stats)
    # a configured topology yields to --ranks
    app.command("synth", cls=placer_command(topology=given("ranks")), no_args_is_help=True,
                epilog=SYNTH_EXAMPLES)(synth)


# -- placer stats -------------------------------------------------------------------------


@handle_errors
def stats(
    traces: list[Path] = typer.Argument(
        ..., metavar="TRACE",
        help="Trace or statistics file(s): .jsonl[.gz], .npz, SGLang .pt, TensorRT-LLM dir.",
    ),
    format: str | None = format_option(),
    json_out: bool = json_option("every figure"),
    layer: list[int] | None = layer_option(many=True),
    window_tokens: int | None = window_tokens_option(),
    top: int = typer.Option(5, "--top", min=1, help="Hot experts and pairs listed per layer."),
    top_k: int | None = top_k_option(),
    num_experts: int | None = num_experts_option(),
    keep_warmup: bool = keep_warmup_option(),

) -> None:
    """Summarize expert load skew, hot experts, co-activated pairs and drift of a trace."""
    from placer.stats.analysis import summarize
    from placer.stats.skew import skew_report
    if top < 1:
        raise UsageError(f"expected --top >= 1, got {top}", where="--top",
                         hint="give a value >= 1; the nearest valid one is 1")
    if window_tokens is not None and window_tokens < 1:
        raise UsageError(
            f"expected --window-tokens >= 1, got {window_tokens}", where="--window-tokens",
            hint="give a value >= 1; the nearest valid one is 1",
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PlacerWarning)
        routing = read_trace(traces, format, top_k=top_k, num_experts=num_experts,
                             window_tokens=window_tokens, keep_warmup=keep_warmup)
    messages = [str(w.message) for w in caught if issubclass(w.category, PlacerWarning)]
    for w in caught:
        if not issubclass(w.category, PlacerWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    layers = None
    if layer:
        present = {int(i) for i in routing.stats.layer_ids}
        missing = [i for i in layer if i not in present]
        if missing:
            raise UsageError(
                f"layer {missing[0]} is not in the trace",
                where="--layer",
                hint=f"layers present: {format_ranges(sorted(present))}",
            )
        layers = list(dict.fromkeys(layer))
    summary = summarize(routing.stats, top=top, layers=layers)
    rows = (np.flatnonzero(np.isin(routing.stats.layer_ids, layers)) if layers
            else np.arange(routing.stats.num_layers))
    summary["skew"] = skew_report(routing.stats.load[:, rows], routing.stats.layer_ids[rows])
    # The reader's warnings and the summary's overlap: say each once.
    for message in dict.fromkeys(messages + summary["warnings"]):
        sys.stderr.write(f"warning: {as_flags(message)}\n")
    if json_out:
        print_json(summary)
    else:
        render_summary(summary)


def render_summary(summary: dict[str, Any]) -> None:
    """Print the tables of ``placer stats`` on stdout."""
    t = summary["totals"]
    skipped = ", ".join(f"{n} {why}" for why, n in t["rows_skipped"].items()) or "none"
    out.print(
        f"{', '.join(t['sources']) or '-'} ({t['format'] or '?'}"
        f"{', synthetic' if t['synthetic'] else ''}): model {t['model'] or '?'}, "
        f"{t['layers']} layers x {t['experts']} experts, top-{t['top_k']}, "
        f"{t['windows']} window(s)"
    )
    out.print(
        f"tokens {t['tokens']:,}  selections {t['selections']:,}  rows read {t['rows_read']:,}"
        f"  rows skipped {t['rows_skipped_total']:,} ({skipped})"
    )
    out.print()
    _print_table(_layer_table(summary["layers"]))
    _print_table(_overall_table(summary["overall"]))
    if "skew" in summary:
        _print_skew(summary["skew"])
    if summary["overall"]["affinity"]:
        _print_table(_affinity_table(summary["overall"]["affinity"]))


#: What each skew class tells a user of placer's figures.
_SKEW_MEANING = {
    "mild": "milder than measured routing: a static plan gains less here than on it",
    "real": "within measured routing's range",
    "heavy": "heavier than measured routing: a static plan gains more here than on it",
}


def _print_skew(skew: dict[str, Any]) -> None:
    """The trace's skew against measured routing (:func:`placer.stats.skew.skew_report`)."""
    m = skew["median"]
    names = ", ".join(r["name"] for r in skew["measured"] if r["comparable"])
    low, high = skew["real_gini_medians"]
    out.print(
        f"skew, median layer: Gini {_num(m['gini'], 3)}, CV {_num(m['cv'])}, max/mean"
        f" {_num(m['max_over_mean'])}, top-1% share {_pct(m['top_share'])}:"
        f" {skew['class']} ({_SKEW_MEANING[skew['class']]}; measured median-layer Gini"
        f" {low:.3f}-{high:.3f}: {names})")
    tab = _table("measured routing (placer/data/real_skew.json), median layer")
    for name in ("dataset", "experts", "tokens", "Gini", "CV", "max/mean", "top-1% share",
                 "what"):
        tab.add_column(name, justify="left" if name in ("dataset", "what") else "right")
    for r in skew["measured"]:
        f = r["median"]
        note = "" if r["comparable"] else " (too few experts to compare)"
        tab.add_row(r["name"], str(r["num_experts"]), f"{r['tokens']:,}",
                    _num(f["gini"], 3), _num(f["cv"]), _num(f["max_over_mean"]),
                    _pct(f["top_share"]), r["what"] + note)
    _print_table(tab)


def _print_table(table: Table) -> None:
    """Print at the table's natural width, wider than the terminal if need be (no wrapping)."""
    natural = out.measure(table, options=out.options.update(max_width=10_000)).maximum
    if natural <= out.width:
        out.print(table)
    else:
        Console(width=natural, highlight=False, soft_wrap=True).print(table)


def _table(title: str) -> Table:
    return Table(
        title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False, expand=False
    )


def _layer_table(layers: list[dict[str, Any]]) -> Table:
    tab = _table("per layer (load summed over windows)")
    for name in ("layer", "tokens", "max/mean", "Gini", "entropy"):
        tab.add_column(name, justify="right")
    tab.add_column("hottest experts (share)")
    tab.add_column("top pair (tokens, lift)")
    for name in ("hot-set J mean/min", "load TV mean/max"):
        tab.add_column(name, justify="right")
    for x in layers:
        hot = " ".join(f"{h['expert']}:{_pct(h['share'])}" for h in x["hottest"][:3])
        pair = "-"
        if x["pairs"]:
            p = x["pairs"][0]
            pair = f"{p['experts'][0]}+{p['experts'][1]} ({p['count']:,}, {_num(p['lift'])})"
        d = x["drift"]
        tab.add_row(
            str(x["layer"]),
            f"{x['tokens']:,.0f}",
            _num(x["max_over_mean"]),
            _num(x["gini"], 3),
            _num(x["entropy"], 3),
            hot,
            pair,
            f"{_num(d['hot_set_jaccard_mean'])}/{_num(d['hot_set_jaccard_min'])}" if d else "-",
            f"{_num(d['load_tv_mean'], 3)}/{_num(d['load_tv_max'], 3)}" if d else "-",
        )
    return tab


def _overall_table(overall: dict[str, Any]) -> Table:
    tab = _table("over layers")
    for name in ("figure", "median", "mean", "min (layer)", "max (layer)"):
        tab.add_column(name, justify="left" if name == "figure" else "right")
    rows = [("max/mean load", overall["max_over_mean"], 2),
            ("Gini", overall["gini"], 3),
            ("CV (std/mean load)", overall["cv"], 2),
            ("top-1% experts' share", overall["top_share"], 3),
            ("normalized entropy", overall["entropy"], 3)]
    drift = overall["drift"]
    if drift:
        rows += [
            (f"hot-set Jaccard, mean (top {drift['hot_set_size']})",
             drift["hot_set_jaccard_mean"], 2),
            ("hot-set Jaccard, min", drift["hot_set_jaccard_min"], 2),
            ("load TV, mean", drift["load_tv_mean"], 3),
            ("load TV, max", drift["load_tv_max"], 3),
        ]
    for name, s, digits in rows:
        tab.add_row(
            name,
            _num(s["median"], digits),
            _num(s["mean"], digits),
            f"{_num(s['min'], digits)} ({s['min_layer']})" if s["min"] is not None else "-",
            f"{_num(s['max'], digits)} ({s['max_layer']})" if s["max"] is not None else "-",
        )
    hot = ", ".join(
        f"L{h['layer']}:{h['expert']} ({_pct(h['share'])})" for h in overall["hottest"]
    )
    tab.caption = f"hottest experts of any layer: {hot}"
    tab.caption_justify = "left"
    return tab


def _affinity_table(pairs: list[dict[str, Any]]) -> Table:
    tab = _table("strongest cross-layer pairs (expert in layer -> expert in next layer)")
    for name in ("layer", "expert", "next layer", "expert ", "tokens", "lift"):
        tab.add_column(name, justify="right")
    for p in pairs:
        tab.add_row(
            str(p["layer"]), str(p["experts"][0]), str(p["next_layer"]), str(p["experts"][1]),
            f"{p['count']:,}", _num(p["lift"]),
        )
    return tab


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"




# -- placer synth -------------------------------------------------------------------------


@handle_errors
def synth(
    output: Path = typer.Argument(
        ..., metavar="OUTPUT", help="Trace to write: .npz, .jsonl or .jsonl.gz."
    ),
    model: str | None = model_option("layers, experts, top-k and groups of the trace"),
    tokens: int = typer.Option(100_000, "--tokens", "-n", min=1, help="Tokens to generate."),
    layers: str | None = typer.Option(
        None, "--layers", metavar="N|IDS",
        help="MoE layers: a count N (ids 0..N-1), or ids like '3-60' or '0,2,4'."
    ),
    experts: int | None = typer.Option(None, "--experts", min=2, max=constants.SYNTH_MAX_EXPERTS,
                                        help="Experts per layer."),
    top_k: int | None = top_k_option(generated=True),
    groups: int | None = typer.Option(
        None, "--groups", min=1, help="Expert groups for group-limited routing (1: none)."
    ),
    top_groups: int | None = typer.Option(
        None, "--top-groups", min=1, help="Groups a token may use (DeepSeek-V3: 4 of 8)."
    ),
    skew: str | None = typer.Option(
        None, "--skew", metavar="|".join(SKEW_PRESETS),
        autocompletion=lambda incomplete: [p for p in SKEW_PRESETS if p.startswith(incomplete)],
        help="Per-layer skew of measured routing (real, the default without --zipf), or a"
             " milder or heavier spread: each layer's load reaches a Gini drawn from the"
             " preset (docs/traces.md, 'Synthetic traces').",
    ),
    zipf: str | None = typer.Option(
        None, "--zipf", metavar="A[,A...]",
        help="Zipf exponent of expert popularity instead of --skew; one, or one per layer"
             " (a,b,..)."
    ),
    source: Path | None = typer.Option(
        None, "--from", metavar="FILE",
        help="Fit the tokens to a measured file's per-layer loads and pair counts (any"
             " trace or load file placer reads) instead of the popularity model.",
    ),
    clusters: int = typer.Option(0, "--clusters", min=0, help="Co-activation clusters per layer."),
    cluster_boost: float = typer.Option(
        4.0, "--cluster-boost", min=0, metavar="FACTOR",
        help="Weight multiplier of a token's own cluster."
    ),
    drift: float = typer.Option(
        0.0, "--drift", min=0, metavar="RANKS", help="Popularity ranks rotated per step."
    ),
    topics: int = typer.Option(
        0, "--topics", min=0, help="Request topics, each with its own expert popularity (0: none)."
    ),
    topic_overlap: str | None = typer.Option(
        None, "--topic-overlap", metavar="O[,O...]",
        help="Share of popularity common to all topics, 0-1; one, or one per layer "
             "(default: 0.7 at the first layer to 0.3 at the last).",
    ),
    burst_every: float = typer.Option(
        0.0, "--burst-every", min=0, metavar="STEPS",
        help="Mean steps between switches of the dominant topic (0: none).",
    ),
    burst_share: float = typer.Option(
        0.5, "--burst-share", min=0, max=1, metavar="SHARE",
        help="Share of new requests on the dominant topic."
    ),
    mix_period: float = typer.Option(
        0.0, "--mix-period", min=0, metavar="STEPS",
        help="Steps of one slow cycle of the topic mix (0: constant).",
    ),
    request_steps: float = typer.Option(
        64.0, "--request-steps", min=1, metavar="STEPS",
        help="Mean steps a request lasts, keeping its topic.",
    ),
    tokens_per_step: int = typer.Option(256, "--tokens-per-step", min=1, help="Tokens per step."),
    ranks: int | None = typer.Option(
        None, "--ranks", min=0,
        help="DP source ranks, dealt round-robin per token (default: the GPUs of --topology; "
             "without it none are recorded and each step's tokens are dealt over the GPUs "
             "planned for).",
    ),
    topology: str | None = topology_option("the cluster the trace is for, one source rank per GPU"),
    weights: bool = typer.Option(False, "--weights", help="Also write topk_weights."),
    seed: int = seed_option(),
    format: str | None = format_option("synth"),
    json_out: bool = json_option("what was written"),
    quiet: bool = quiet_option(notes=True),
) -> None:
    """Write a synthetic per-token routing trace (skew, clusters, topics, drift, groups)."""
    from placer.traces.synth import SynthParams, params_for_model, write_synth
    from placer.traces.synth.skew import with_skew

    check_output(output, where="OUTPUT")
    num_ranks, note = _source_ranks(ranks, topology)
    if format is not None and format not in ("npz", "jsonl"):
        raise UsageError(f"unknown output format {format!r}", where="--format",
                         hint="use npz or jsonl")
    if skew is not None and skew not in SKEW_PRESETS:
        raise UsageError(f"unknown skew preset {skew!r}", where="--skew",
                         hint=f"use one of {', '.join(SKEW_PRESETS)}, e.g. --skew real")
    if skew is not None and zipf is not None:
        raise UsageError("--skew and --zipf both set the popularity's skew", where="--zipf",
                         hint="give one: --skew real (measured routing's spread) or --zipf 1.0")
    if source is not None:
        _synth_from(source, output, tokens=tokens, tokens_per_step=tokens_per_step,
                    num_ranks=num_ranks, drift=drift, seed=seed, model=model, format=format,
                    json_out=json_out, quiet=quiet,
                    others={"--layers": layers, "--experts": experts, "--top-k": top_k,
                            "--groups": groups, "--top-groups": top_groups, "--skew": skew,
                            "--zipf": zipf, "--clusters": clusters or None,
                            "--topics": topics or None, "--weights": weights or None})
        if note and not quiet:
            sys.stderr.write(f"note: {note}\n")
        return
    layer_ids = None if layers is None else parse_layers(layers)
    zipf_value: float | tuple[float, ...] = 1.0 if zipf is None else _parse_zipf(zipf)
    explicit: dict[str, Any] = {
        "layer_ids": layer_ids,
        "num_experts": experts,
        "top_k": top_k,
        "num_groups": groups,
        "top_groups": top_groups,
    }
    common: dict[str, Any] = {
        "num_tokens": tokens,
        "zipf": zipf_value,
        "clusters": clusters,
        "cluster_boost": cluster_boost,
        "drift": drift,
        "topics": topics,
        "topic_overlap": None if topic_overlap is None else _parse_numbers(
            topic_overlap, "--topic-overlap", "0.5", "0.7,0.5,0.3", what="topic overlap(s)"),
        "burst_every": burst_every,
        "burst_share": burst_share,
        "mix_period": mix_period,
        "request_steps": request_steps,
        "tokens_per_step": tokens_per_step,
        "num_ranks": num_ranks,
        "weights": weights,
        "seed": seed,
    }
    if model is not None:
        from placer.model import load_model

        params = params_for_model(load_model(model), **explicit, **common)
    else:
        given = {k: v for k, v in explicit.items() if v is not None}
        if groups is not None and top_groups is None:
            given["top_groups"] = groups
        params = SynthParams(**given, **common)
    preset = skew if skew is not None else ("real" if zipf is None else None)
    if preset is not None:
        params = with_skew(params, preset)
    result = write_synth(output, params, format=format,
                         progress=None if quiet else _progress_line())
    _wrote(result, seed, preset, json_out)
    if note and not quiet:
        sys.stderr.write(f"note: {note}\n")


#: A synthetic trace whose median-layer Gini is further than this from measured
#: routing's range is warned about (unless a skew preset was asked for by name).
FAR_FROM_MEASURED = 0.15


def _wrote(result: dict[str, Any], seed: int, preset: str | None, json_out: bool) -> None:
    """What ``placer synth`` wrote, its skew, and a warning when that skew is far from
    measured routing's."""
    skew = result["skew"]
    gini = skew["median"]["gini"]
    low, high = skew["real_gini_medians"]
    far = gini is not None and not low - FAR_FROM_MEASURED <= gini <= high + FAR_FROM_MEASURED
    if far and preset is None:  # a preset asked for is a sensitivity run, said in its line
        sys.stderr.write(
            f"warning: the trace's median-layer Gini {gini:.3f} is far from measured routing's"
            f" ({low:.3f}-{high:.3f}): a plan's gain over EPLB follows skew, so figures on it"
            " say little about real traffic (--skew real, or --skew mild|heavy for a"
            " sensitivity run)\n")
    if json_out:
        print_json(result)
        return
    made = f"preset {preset}, " if preset else ""
    out.print(
        f"wrote {result['path']} ({result['format']}): {result['tokens']:,} tokens x "
        f"{result['layers']} layers x {result['experts']} experts, top-{result['top_k']}, "
        f"seed {seed}, in {result['seconds']:.1f} s"
    )
    out.print(f"skew: {made}median layer Gini {_num(gini, 3)}, CV {_num(skew['median']['cv'])},"
              f" max/mean {_num(skew['median']['max_over_mean'])}: {skew['class']}"
              f" (measured routing {low:.3f}-{high:.3f})")


def _synth_from(source: Path, output: Path, *, tokens: int, tokens_per_step: int,
                num_ranks: int, drift: float, seed: int, model: str | None,
                format: str | None, json_out: bool, quiet: bool,
                others: dict[str, Any]) -> None:
    """``placer synth --from FILE``: tokens fitted to a measured file's statistics."""
    from placer.traces import read_routing
    from placer.traces.synth.fitted import fit_law
    from placer.traces.synth.write import write_fitted

    given = [flag for flag, value in others.items() if value is not None]
    if given:
        raise UsageError(
            f"{given[0]} shapes the popularity model, which --from replaces", where=given[0],
            hint="--from takes layers, experts, top-k, loads and pairs from the file; keep"
                 " --tokens, --tokens-per-step, --ranks/--topology, --drift and --seed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlacerWarning)
        stats = read_routing(source).stats
    if not quiet:
        sys.stderr.write(f"synth: fitting {stats.num_layers} layers to {source} ...\n")
    law = fit_law(stats, seed=seed)
    name = model or stats.provenance.model
    result = write_fitted(output, law, source=str(source), model=name, num_tokens=tokens,
                          tokens_per_step=tokens_per_step, num_ranks=num_ranks, drift=drift,
                          seed=seed, format=format, progress=None if quiet else _progress_line())
    _wrote(result, seed, None, json_out)
    if not json_out:
        out.print(f"fitted to {source}: every expert's share of the selections within"
                  f" {100 * result['fit_error']:.2f}% of the file's on the fit's own tokens"
                  f"{'' if law.affinity is not None else '; the file has no pair counts'}")


def _source_ranks(ranks: int | None, topology: str | None) -> tuple[int, str]:
    """The source ranks ``placer synth`` records, and a note when none are given."""
    if topology is None:
        if ranks is None:
            return 0, ("no --ranks or --topology: the trace records no source ranks; "
                       "placer deals each step's tokens round-robin over the GPUs of the "
                       "cluster it plans or judges for")
        return ranks, ""
    from placer.topology import load_topology

    topo = load_topology(topology)
    if ranks is not None and ranks != topo.num_gpus:
        raise UsageError(
            f"{ranks} source ranks contradict --topology {topology}, which has "
            f"{topo.num_gpus} GPUs", where="--ranks",
            hint="give one of them: --topology records one source rank per GPU")
    return topo.num_gpus, ""


#: Seconds between progress lines when stderr is not a terminal (a batch job's log).
PROGRESS_LINE_S = 2.0


def _progress_line() -> Callable[[int, int], None]:
    """A progress callback: one stderr line rewritten in place on a terminal; elsewhere a
    line every :data:`PROGRESS_LINE_S` seconds (and one at the end of a run that printed
    any: a short run prints none)."""
    tty = sys.stderr.isatty()
    last = [time.monotonic()]
    printed = [False]

    def show(done: int, total: int) -> None:
        text = f"synth: {done:,} / {total:,} tokens ({100 * done / total:.0f}%)"
        if tty:
            sys.stderr.write(f"\r{text}{chr(10) if done >= total else ''}")
        elif time.monotonic() - last[0] >= PROGRESS_LINE_S or (done >= total and printed[0]):
            sys.stderr.write(text + "\n")
            last[0] = time.monotonic()
            printed[0] = True
        sys.stderr.flush()

    return show


def parse_layers(spec: str) -> tuple[int, ...]:
    """``"58"`` -> ids 0..57; ``"3-60"`` -> 3..60; ``"0,2,5-7"`` -> 0, 2, 5, 6, 7; at most
    ``MAX_LAYERS`` layers, ids up to ``MAX_LAYER_ID`` (checked before they are listed)."""
    text = spec.strip()
    try:
        spans = [(0, int(text) - 1)] if text.isdigit() else [
            (int(lo), int(hi) if sep else int(lo))
            for lo, sep, hi in (part.strip().partition("-") for part in text.split(","))]
        if not text.isdigit() and any(hi < lo for lo, hi in spans):
            raise ValueError(spec)
    except ValueError:
        raise UsageError(f"cannot read layers {spec!r}", where="--layers",
                         hint="give a count (58), a range (3-60) or a list (0,2,5-7)") from None
    count, most = sum(hi - lo + 1 for lo, hi in spans), constants.MAX_LAYERS
    if count > most or max(hi for _, hi in spans) > constants.MAX_LAYER_ID:
        raise UsageError(f"layers {spec!r} are more than placer handles ({most:,} layers, ids"
                         f" up to {constants.MAX_LAYER_ID:,})", where="--layers",
                         hint="give at most 4,096 layers, e.g. --layers 58 (ids 0-57) or 3-60")
    return tuple(i for lo, hi in spans for i in range(lo, hi + 1))


def _parse_zipf(spec: str) -> float | tuple[float, ...]:
    return _parse_numbers(spec, "--zipf", "1.2", "0.8,1.0,1.2", what="Zipf exponent(s)")


def _parse_numbers(spec: str, option: str, one: str, several: str,
                   what: str = "numbers") -> float | tuple[float, ...]:
    """``"1.2"`` -> 1.2; ``"0.8,1.0"`` -> (0.8, 1.0): one value, or one per layer."""
    try:
        values = tuple(float(v) for v in spec.split(","))
        if not all(math.isfinite(v) for v in values):
            raise ValueError(spec)
    except ValueError:
        raise UsageError(
            f"cannot read {what} {spec!r}",
            where=option,
            hint=f"give one number ({one}) or one per layer ({several})",
        ) from None
    return values[0] if len(values) == 1 else values
