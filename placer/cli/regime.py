"""The regime flags every judging command shares, with the same defaults, and its line.

``plan``, ``evaluate``, ``compare``, ``report`` and ``replay`` take ``--engine``,
``--workload``, ``--tokens-per-gpu``, ``--seed`` and the expert overrides ``--policy`` and
``--mode``; each builds one :class:`~placer.regime.Regime` with :func:`resolve_regime` and
prints :func:`judged_as` (the same words in every command), so that one placement on one
trace is judged the same way whichever command judges it.  Defaults come from the
command line, else ``PLACER_*`` variables or ``placer.toml`` (:mod:`placer.cli.config`),
else vLLM decode at 128 tokens per GPU.
"""

from __future__ import annotations

from typing import Any

import typer

from placer.errors import UsageError
from placer.regime import (
    DEFAULT_ENGINE,
    DEFAULT_TOKENS_PER_GPU,
    DEFAULT_WORKLOAD,
    ENGINES,
    MODES,
    PHASES,
    POLICIES,
    Regime,
)

#: Export format -> the engine whose dispatch it implies (``eplb`` files imply none).
EXPORT_ENGINE = {"sglang": "sglang", "trtllm": "trtllm", "vllm": "vllm", "vllm-ascend": "vllm"}

_TOKEN_DEFAULTS = ", ".join(f"{n} for {p}" for p, n in DEFAULT_TOKENS_PER_GPU.items())


def _complete(values: tuple[str, ...]) -> Any:
    def complete(incomplete: str) -> list[str]:
        return [v for v in values if v.startswith(incomplete)]
    return complete


def engine_option(*, exports: bool = False) -> Any:
    """``--engine``: the serving engine (its dispatch policy)."""
    implied = " the engine of --export when it names one, else" if exports else ""
    return typer.Option(
        None, "--engine", "-e", metavar="ENGINE", autocompletion=_complete(ENGINES),
        help=f"Serving engine ({', '.join(ENGINES)}): fixes the dispatch policy judged (and"
        f" planned) under (sglang: static dispatch; vllm, trtllm: round-robin). Default:"
        f"{implied} {DEFAULT_ENGINE}.", show_default=False,
    )


def workload_option() -> Any:
    """``--workload``: decode or prefill (the all-to-all kernels and the batch)."""
    return typer.Option(
        None, "--workload", metavar="|".join(PHASES), autocompletion=_complete(PHASES),
        help=f"Batch regime ({', '.join(PHASES)}): decode uses low-latency all-to-all and"
        " small batches (memory-bound experts), prefill normal all-to-all and large ones."
        f" Default: {DEFAULT_WORKLOAD}.", show_default=False,
    )


def tokens_per_gpu_option() -> Any:
    """``--tokens-per-gpu``: the batch of one EP rank per step."""
    return typer.Option(
        None, "--tokens-per-gpu", min=1, metavar="TOKENS",
        help=f"Tokens each EP rank dispatches per step (default: {_TOKEN_DEFAULTS}).",
        show_default=False,
    )


def policy_option() -> Any:
    """``--policy``: the expert override of the engine's dispatch."""
    return typer.Option(
        None, "--policy", metavar="POLICY", autocompletion=_complete(POLICIES),
        help=f"Dispatch policy instead of the engine's ({', '.join(POLICIES)}); for what-ifs.",
        show_default=False,
    )


def mode_option() -> Any:
    """``--mode``: the expert override of the workload's all-to-all kernels."""
    return typer.Option(
        None, "--mode", metavar="MODE", autocompletion=_complete(MODES),
        help=f"All-to-all mode instead of the workload's ({', '.join(MODES)}); for what-ifs.",
        show_default=False,
    )


def seed_option() -> Any:
    """``--seed``: sampled batches, the random policy, SGLang's tables (and solvers)."""
    return typer.Option(0, "--seed", help="Seed of sampling, random dispatch and solvers.")


def resolve_regime(
    engine: str | None, workload: str | None, tokens_per_gpu: int | None = None,
    policy: str | None = None, mode: str | None = None, seed: int = 0,
    export_formats: list[str] | tuple[str, ...] = (),
) -> tuple[Regime, str]:
    """The regime of the flags (and of ``--export``), and where it came from in words.

    The engine is ``--engine``, else the one engine the exports are for (``vllm-ascend``
    counts as ``vllm``), else the default.  An ``--engine`` that none of the exports is
    for is a UsageError.
    """
    implied = sorted({EXPORT_ENGINE[f] for f in export_formats if f in EXPORT_ENGINE})
    if engine is not None and implied and engine not in implied:
        formats = ", ".join(f for f in export_formats if f in EXPORT_ENGINE)
        raise UsageError(
            f"--engine {engine} contradicts --export {formats} (an engine file for"
            f" {' and '.join(implied)})", where="--engine",
            hint=f"drop --engine (the export implies {' or '.join(implied)}), or export"
            f" for {engine}",
        )
    if engine is not None:
        chosen, said = engine, "engine from --engine"
    elif len(implied) == 1:
        chosen = implied[0]
        fmt = next(f for f in export_formats if EXPORT_ENGINE.get(f) == chosen)
        said = f"engine from --export {fmt}"
    else:
        chosen = DEFAULT_ENGINE
        said = ("default engine (exports for " + ", ".join(implied) + ": choose with --engine)"
                if implied else "")
    regime = Regime(chosen, workload or DEFAULT_WORKLOAD, tokens_per_gpu, policy, mode, seed)
    overrides = [f"--{name} {value}" for name, value in (("policy", policy), ("mode", mode))
                 if value is not None]
    words = [w for w in (said, ", ".join(overrides)) if w]
    note = "; ".join([*words, "set with --engine/--workload"])
    return regime, note


def judged_as(regime: Regime, note: str = "", batch: str | None = None) -> str:
    """The ``judged as`` line every judging command prints (``batch``: what a batch is,
    when not the regime's tokens per GPU)."""
    return f"judged as    {regime.describe(batch)}" + (f"; {note}" if note else "")
