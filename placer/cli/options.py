"""Every option that two or more commands take, declared once: one factory per option.

A factory fixes the option's names, value type, metavar, completion, range and help, so
``--topology`` reads and completes the same in every command that has it, and one option
name means one thing across commands.  A command says only what differs in its use
(``many=True`` where it takes the option several times, ``purpose`` where the value
serves a command-specific end, ``default`` where a value must stay unset so that a
scenario file or a placement can give it).  Options of a single command stay with that
command.  ``tests/test_cli_options.py`` fails when an option shared by two commands is
declared outside this module.

Where a default comes from (the command line, else ``PLACER_*``, else ``placer.toml``,
else the built-in) is settled in :mod:`placer.cli.command` for every option at once.

Example::

    def plan(topology: str | None = topology_option(), seed: int = seed_option(), ...):
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import typer

from placer import constants
from placer.errors import UsageError
from placer.regime import (
    DEFAULT_ENGINE,
    DEFAULT_TOKENS_PER_GPU,
    DEFAULT_WORKLOAD,
    ENGINE_POLICY,
    ENGINES,
    MODES,
    POLICIES,
    WORKLOADS,
)

#: ``--layer-time-limit`` when not given: wall seconds per layer of a search.
DEFAULT_LAYER_SECONDS = 10.0
#: ``--solver`` of ``placer plan`` when not given.
DEFAULT_SOLVER = "cpsat"
#: ``--dpi`` when not given.
DEFAULT_DPI = constants.REPORT_DPI
#: Kinds of the rebalancing policies ``placer replay --rebalance`` takes (``KIND:...``).
REBALANCE_KINDS = ("static", "eplb", "placer", "oracle")


def complete(values: Sequence[str] | Callable[[], Sequence[str]]) -> Callable[[str], list[str]]:
    """Shell completion of an option's value: the ``values`` (or what ``values()``
    returns when asked) that start with what was typed."""
    def completion(incomplete: str) -> list[str]:
        known = values() if callable(values) else values
        return [v for v in known if v.startswith(incomplete)]
    return completion


def _topology_names() -> list[str]:
    from placer.topology import preset_names

    return list(preset_names())


def _model_names() -> list[str]:
    from placer.model import model_names

    return list(model_names())


def _solver_names() -> list[str]:
    from placer.planning.solvers import solver_names

    return list(solver_names())


def _engine_formats() -> list[str]:
    from placer.engines import engine_names

    return list(engine_names())


# -- the cluster and the model --------------------------------------------------------------


def _preset_help(what: str, purpose: str, many: bool, recorded: bool) -> str:
    """The help of an option that takes a preset name or a YAML file."""
    words = f"{what} preset name or YAML file"
    if purpose:
        words += f": {purpose}"
    if many:
        words += "; repeat to compare"
    if recorded:
        words += " (default: the one the placements record)"
    return words + "."


def topology_option(purpose: str = "", *, many: bool = False, recorded: bool = False,
                    required: bool = False) -> Any:
    """``--topology``/``-t``: a cluster preset or topology YAML.

    ``purpose`` says what the cluster is to the command; ``many``: repeatable (a list);
    ``recorded``: the placements' own topology is the default."""
    default: Any = ... if required else ([] if many else None)
    return typer.Option(default, "--topology", "-t", metavar="NAME|FILE",
                        autocompletion=complete(_topology_names), show_default=False,
                        help=_preset_help("Topology", purpose, many, recorded))


def model_option(purpose: str = "", *, recorded: bool = False, required: bool = False) -> Any:
    """``--model``/``-m``: a model preset, Hugging Face id or model YAML.

    ``recorded``: the placements' own model is the default."""
    return typer.Option(... if required else None, "--model", "-m", metavar="NAME|FILE",
                        autocompletion=complete(_model_names), show_default=False,
                        help=_preset_help("Model", purpose, False, recorded))


def dtype_option() -> Any:
    """``--dtype``: the expert weights' dtype (the memory budget, the GEMM time)."""
    return typer.Option(None, "--dtype", metavar="DTYPE", callback=_known_dtype,
                        autocompletion=complete(constants.DTYPES),
                        help=f"Expert weight dtype: {', '.join(constants.DTYPES)} (default: the"
                        " model's).", show_default=False)


def _known_dtype(ctx: typer.Context, param: Any, value: str | None) -> str | None:
    """Refuse an unknown ``--dtype`` when it is given, not only where a model reads it (a
    command without ``--model`` would otherwise drop it unseen)."""
    if value is not None and value not in constants.DTYPES:
        error: Any = typer.BadParameter(f"unknown dtype {value!r}", ctx=ctx, param=param)
        error.placer_hint = f"one of {', '.join(constants.DTYPES)}"  # what the hint offers
        raise error
    return value


def kv_reserve_gb_option() -> Any:
    """``--kv-reserve-gb``: memory per GPU kept for the KV cache."""
    return typer.Option(None, "--kv-reserve-gb", min=0, metavar="GB",
                        help="Memory per GPU kept for the KV cache, GB.", show_default=False)


def num_gpus_option(*, ep_size: bool = False) -> Any:
    """``--num-gpus``/``-g``: GPUs without a topology (``ep_size``: also ``--ep-size``, the
    engines' word, for the GPUs an engine file serves)."""
    names = ("--ep-size", "--num-gpus", "-g") if ep_size else ("--num-gpus", "-g")
    words = ("EP size the engine serves with (needed unless the file or --topology says)."
             if ep_size else "GPUs on one node, when there is no --topology.")
    return typer.Option(None, *names, min=1, max=constants.MAX_GPUS, metavar="N", help=words,
                        show_default=False)


def redundant_option(form: str = "one") -> Any:
    """``--redundant``/``-r``: redundant experts per layer (``R = P - E``).

    ``form``: ``"one"`` (a count), ``"auto"`` (a count or ``auto``), ``"sweep"`` (a
    list, ranges or ``auto``)."""
    if form == "one":
        return typer.Option(0, "--redundant", "-r", min=0,
                            help="Redundant experts per layer (R = P - E).")
    if form == "auto":
        return typer.Option(
            None, "--redundant", "-r", metavar="R|auto", show_default=False,
            help="Redundant experts per layer (R = P - E), or auto: the count whose EPLB plan"
            " the evaluator times fastest under --engine/--workload within the memory budget"
            " (fewest slots among the equally fast); excludes --slots-per-gpu.")
    if form == "sweep":
        return typer.Option(
            None, "--redundant", "-r", metavar="R[,R...]|A..B|auto", show_default=False,
            help="Redundant experts per layer (R = P - E): a list or ranges (0,16,32 or"
            " 0..64; values that do not split evenly over a topology's GPUs are skipped"
            " there), or auto (the slot counts placer plan --redundant auto tries, as far as"
            " memory holds). Default: the fewest that split evenly.")
    raise ValueError(f"unknown form {form!r}")


def slots_per_gpu_option(*, sweep: bool = False) -> Any:
    """``--slots-per-gpu``/``-S``: expert slots on each GPU (``sweep``: a list or range)."""
    if sweep:
        return typer.Option(
            None, "--slots-per-gpu", "-S", metavar="S[,S...]|A..B", show_default=False,
            help="Slots per GPU instead of --redundant (e.g. 8..12): R = S x GPUs - experts"
            " on each topology.")
    return typer.Option(None, "--slots-per-gpu", "-S", min=1, show_default=False,
                        help="Slots per GPU instead of --redundant; default ceil(E / G), no"
                        " replicas.")


# -- planning -------------------------------------------------------------------------------


def solver_option(*, many: bool = False) -> Any:
    """``--solver``/``-s``: the placement solver (``many``: several, compared)."""
    if many:
        return typer.Option(
            [], "--solver", "-s", metavar="NAME[,NAME...]", autocompletion=complete(_solver_names),
            help="Solver(s), comma-separated or repeated (e.g. eplb,cpsat). Default eplb.",
            show_default=False)
    return typer.Option(DEFAULT_SOLVER, "--solver", "-s", metavar="NAME",
                        autocompletion=complete(_solver_names),
                        help=f"One of: {', '.join(_solver_names())}.")


def time_limit_option() -> Any:
    """``--time-limit``: the whole plan's search budget."""
    return typer.Option(
        None, "--time-limit", min=0.001, metavar="SECONDS", show_default=False,
        help="The whole plan's search budget (in compare: each scenario's), split evenly over"
        " the layers (each at most --layer-time-limit). Counted as deterministic work, sized"
        " so a quiet 2-core machine takes about that many seconds: the same inputs and --seed"
        " give the same plan on any machine, with any --jobs or --ray. The wall clock only"
        " caps a layer at 10x its share (at least 5 s); a plan it stopped warns that it is not"
        f" reproducible. Small plans stop earlier. Default {constants.DEFAULT_PLAN_SECONDS:g}.")


def layer_time_limit_option() -> Any:
    """``--layer-time-limit``: the most search budget of one layer."""
    return typer.Option(
        None, "--layer-time-limit", min=0.001, metavar="SECONDS", show_default=False,
        help="The most search budget of one layer for search-based solvers, in the same"
        " deterministic seconds as --time-limit (the search normally stops earlier)."
        f" Default {DEFAULT_LAYER_SECONDS:g}.")


def jobs_option(what: str, *, default: int | None = 1) -> Any:
    """``--jobs``/``-j``: parallel processes; ``what`` runs in each."""
    said = "" if default is not None else " (default: every core)"
    return typer.Option(default, "--jobs", "-j", min=1, metavar="N",
                        help=f"{what} in parallel processes{said}.",
                        show_default=default is not None)


def ray_option(what: str) -> Any:
    """``--ray``: run ``what`` on Ray."""
    return typer.Option(
        None, "--ray", metavar="ADDRESS", show_default=False,
        help=f"{what} on Ray: 'local' starts an instance here, else a cluster's address"
        " (auto, ray://head:10001). Needs pip install 'placer[ray]'.")


def seed_option(*, default: int | None = 0) -> Any:
    """``--seed``: sampled batches, random dispatch, SGLang's tables, solvers, synthetic
    traces (``default=None`` where a scenario file's seed must win)."""
    return typer.Option(default, "--seed", min=0, max=constants.MAX_SEED, metavar="N",
                        show_default=default is not None,
                        help="Random seed of sampling, random dispatch, solvers and synthetic"
                        " traces: same seed, same result.")


# -- the regime -----------------------------------------------------------------------------


def engine_option(*, exports: bool = False) -> Any:
    """``--engine``/``-e``: the serving engine (its dispatch rule)."""
    implied = " the engine of --export when it names one, else" if exports else ""
    rules = "; ".join(f"{engine}: {rule}" for engine, rule in ENGINE_POLICY.items())
    return typer.Option(
        None, "--engine", "-e", metavar="ENGINE", autocompletion=complete(ENGINES),
        help=f"Serving engine ({', '.join(ENGINES)}): fixes the dispatch policy judged (and"
        f" planned) under ({rules}). Default:{implied} {DEFAULT_ENGINE}.", show_default=False,
    )


def workload_option() -> Any:
    """``--workload``: decode or prefill (the all-to-all kernels and the batch)."""
    return typer.Option(
        None, "--workload", metavar="|".join(WORKLOADS), autocompletion=complete(WORKLOADS),
        help=f"Batch regime ({', '.join(WORKLOADS)}): decode uses low-latency all-to-all and"
        " small batches (memory-bound experts), prefill normal all-to-all and large ones."
        f" Default: {DEFAULT_WORKLOAD}.", show_default=False,
    )


def tokens_per_gpu_option() -> Any:
    """``--tokens-per-gpu``: the batch of one EP rank per step."""
    defaults = ", ".join(f"{n} for {w}" for w, n in DEFAULT_TOKENS_PER_GPU.items())
    return typer.Option(
        None, "--tokens-per-gpu", min=1, metavar="TOKENS",
        help=f"Tokens each EP rank dispatches per step (default: {defaults}).",
        show_default=False,
    )


def dispatch_option() -> Any:
    """``--dispatch``: the expert override of the engine's dispatch rule."""
    return typer.Option(
        None, "--dispatch", metavar="POLICY", autocompletion=complete(POLICIES),
        help=f"Dispatch policy instead of the engine's ({', '.join(POLICIES)}); for"
        " what-ifs.", show_default=False,
    )


def mode_option() -> Any:
    """``--mode``: the expert override of the workload's all-to-all kernels."""
    return typer.Option(
        None, "--mode", metavar="MODE", autocompletion=complete(MODES),
        help=f"All-to-all mode instead of the workload's ({', '.join(MODES)}); for"
        " what-ifs.", show_default=False,
    )


#: The option that meant the dispatch rule in plan, evaluate, compare and report and the
#: rebalancing policies in replay; now ``--dispatch`` and ``--rebalance``.
RETIRED_POLICY = "--policy"


def retired_policy(args: Sequence[str], options: Sequence[str]) -> UsageError | None:
    """The usage error of a command line that says ``--policy`` (None when it does not),
    for a command with ``options``: its hint is what to type instead, for each value
    given (:func:`policy_hint`)."""
    values = []
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == RETIRED_POLICY:
            values.append(args[i + 1] if i + 1 < len(args) else "")
        elif arg.startswith(RETIRED_POLICY + "="):
            values.append(arg.split("=", 1)[1])
    if not values:
        return None
    return UsageError("no such option: the dispatch rule is --dispatch, replay's rebalancing"
                      " policies --rebalance", where=RETIRED_POLICY,
                      hint=policy_hint(values, options))


def policy_hint(values: Sequence[str], options: Sequence[str]) -> str:
    """What to type instead of ``--policy VALUE`` (each of ``values``) in a command with
    ``options``: ``--dispatch`` for a dispatch rule, ``--rebalance`` for a rebalancing
    policy, and which commands take it when this one does not."""
    words = []
    for value in values:
        if value in POLICIES:
            words.append(("--dispatch", value))
        elif value.split(":", 1)[0] in REBALANCE_KINDS:
            words.append(("--rebalance", value))
        else:
            return (f"--dispatch POLICY names the dispatch rule ({', '.join(POLICIES)});"
                    " --rebalance SPEC a rebalancing policy of placer replay")
    said = " ".join(f"{option} {value}" for option, value in words)
    missing = sorted({option for option, _ in words} - set(options))
    if not missing:
        return f"use {said}"
    takes = {"--dispatch": "placer plan|evaluate|compare|report|replay", "--rebalance":
             "placer replay"}
    return f"{missing[0]} is an option of another command: {takes[missing[0]]} ... {said}"


def rebalance_option() -> Any:
    """``--rebalance``/``-P``: the rebalancing policies a replay compares."""
    return typer.Option(
        [], "--rebalance", "-P", metavar="SPEC", show_default=False,
        help="Rebalancing policy (repeatable): static:FILE|default, eplb:window=W,interval=I"
        "[,redundant=R][,async], placer:window=W,interval=I[,max-moves=M], oracle:interval=I."
        " Default: the engine's layout, its online EPLB, placer at that cadence, the oracle.")


# -- reading traces -------------------------------------------------------------------------


def format_option(of: str = "trace") -> Any:
    """``--format``/``-f``: the format of the file a command reads or writes.

    ``of``: ``"trace"`` (a routing trace read, detected by default), ``"engine"`` (an
    engine's placement file written: required), ``"engine-read"`` (one read: detected by
    default), ``"synth"`` (a synthetic trace written: from the file's name by default)."""
    if of == "trace":
        return typer.Option(None, "--format", "-f", metavar="FORMAT", show_default=False,
                            help="Trace format (default: detected from the file name and"
                            " content).")
    if of in ("engine", "engine-read"):
        said = " (default: detected)" if of == "engine-read" else ""
        return typer.Option(None if said else ..., "--format", "-f", metavar="FORMAT",
                            autocompletion=complete(_engine_formats), show_default=False,
                            help=f"Engine format: {', '.join(_engine_formats())}{said}.")
    if of == "synth":
        return typer.Option(None, "--format", "-f", metavar="npz|jsonl", show_default=False,
                            autocompletion=complete(("npz", "jsonl")),
                            help="Trace format: npz or jsonl (default: from OUTPUT's name).")
    raise ValueError(f"unknown file kind {of!r}")


def top_k_option(*, generated: bool = False) -> Any:
    """``--top-k``: experts each token selects (``generated``: of a synthetic trace; else
    for inputs that do not record it, such as SGLang stat dumps or bare load files)."""
    words = ("Experts each token selects per layer." if generated else
             "Experts each token selects per layer, for inputs that do not record it"
             " (default: the model's, else the file's).")
    most = constants.SYNTH_MAX_TOP_K if generated else constants.MAX_TOP_K
    return typer.Option(None, "--top-k", min=1, max=most, help=words, show_default=False)


def num_experts_option() -> Any:
    """``--num-experts``: declared expert count, checked against the data."""
    return typer.Option(
        None, "--num-experts", min=1, max=constants.MAX_EXPERTS, show_default=False,
        help="Experts per layer, checked against the data (default: the model's, else"
        " inferred).")


def keep_warmup_option() -> Any:
    """``--keep-warmup``: count the rows of warm-up passes, which are left out by default."""
    return typer.Option(
        False, "--keep-warmup",
        help="Count runs of identical selections (an engine's warm-up or profiling pass),"
        " which are left out by default with a warning.",
    )


def allow_model_mismatch_option() -> Any:
    """``--allow-model-mismatch``: read a trace that declares another model as ``--model``'s."""
    return typer.Option(
        False, "--allow-model-mismatch",
        help="Use a trace that declares another model than --model (a warning naming both,"
        " instead of an error); its experts and layers must still be the model's.",
    )


def window_tokens_option() -> Any:
    """``--window-tokens``: windows of a fixed token count instead of the trace's steps."""
    return typer.Option(None, "--window-tokens", min=1, metavar="TOKENS", show_default=False,
                        help="Cut the trace into windows of this many consecutive tokens"
                        " (default: its steps).")


def fit_option(purpose: str) -> Any:
    """``--fit``: windows a placement is (or was) fitted on."""
    return typer.Option(None, "--fit", metavar="START:STOP", show_default=False,
                        help=f"Windows {purpose}.")


def eval_option() -> Any:
    """``--eval``: windows a placement is judged on."""
    return typer.Option(
        None, "--eval", metavar="START:STOP", show_default=False,
        help="Windows to judge on (default: the held-out part of the default split, as"
        " placer compare; every window of a one-window trace).")


def layer_option(*, many: bool = False) -> Any:
    """``--layer``/``-l``: an absolute layer id (``many``: repeatable, a list)."""
    if many:
        return typer.Option(None, "--layer", "-l", min=0, max=constants.MAX_LAYER_ID,
                            metavar="ID", show_default=False,
                            help="Absolute layer id to show (repeatable; default all).")
    return typer.Option(None, "--layer", "-l", min=0, max=constants.MAX_LAYER_ID, metavar="ID",
                        show_default=False,
                        help="Absolute layer id drawn in the maps (default: the hottest).")


def placement_option(purpose: str) -> Any:
    """``--placement``/``-p``: placement JSON files (repeatable)."""
    return typer.Option(..., "--placement", "-p", metavar="FILE", show_default=False,
                        help=f"Placement JSON (placer plan's output); {purpose}.")


# -- what a command writes ------------------------------------------------------------------


def output_option(what: str, *, required: bool = True) -> Any:
    """``--output``/``-o``: the file a command writes (atomically)."""
    return typer.Option(... if required else None, "--output", "-o", metavar="FILE",
                        help=f"{what} to write (atomically).", show_default=False)


def name_option(what: str, *, many: bool = False) -> Any:
    """``--name``: the name shown for what a command writes (``many``: one per input)."""
    return typer.Option([] if many else None, "--name", metavar="NAME", help=what,
                        show_default=False)


def json_option(what: str = "the result") -> Any:
    """``--json``: the result as JSON on stdout (the text answer otherwise)."""
    return typer.Option(False, "--json", help=f"Print {what} as JSON on stdout.")


def quiet_option(*, notes: bool = False) -> Any:
    """``--quiet``/``-q``: no progress (``notes``: nor notes) on stderr."""
    what = "progress or notes" if notes else "progress"
    return typer.Option(False, "--quiet", "-q",
                        help=f"No {what} on stderr (warnings and errors stay).")


def report_option() -> Any:
    """``--report``: a self-contained HTML report."""
    return typer.Option(None, "--report", metavar="FILE", show_default=False,
                        help="Write a self-contained HTML report here.")


def png_dir_option() -> Any:
    """``--png-dir``: the report's pictures as PNG files."""
    return typer.Option(None, "--png-dir", metavar="DIR", show_default=False,
                        help="Also write each picture as PNG in this folder.")


def dpi_option() -> Any:
    """``--dpi``: the pictures' resolution."""
    low, high = constants.REPORT_DPI_RANGE
    return typer.Option(DEFAULT_DPI, "--dpi", min=low, max=high, metavar="N",
                        help="Resolution of the pictures, dots per inch.")
