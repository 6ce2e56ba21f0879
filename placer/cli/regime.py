"""The regime every judging command resolves from its flags, and the line it prints.

``plan``, ``evaluate``, ``compare``, ``report`` and ``replay`` take ``--engine``,
``--workload``, ``--tokens-per-gpu``, ``--seed`` and the expert overrides ``--dispatch``
and ``--mode`` (declared once, in :mod:`placer.cli.options`); each builds one
:class:`~placer.regime.Regime` with :func:`resolve_regime` and prints :func:`judged_as`
(the same words in every command), so that one placement on one trace is judged the
same way whichever command judges it.  Defaults come from the command line, else
``PLACER_*`` variables or ``placer.toml`` (:mod:`placer.cli.config`), else vLLM decode at
128 tokens per GPU.
"""

from __future__ import annotations

from placer.errors import UsageError
from placer.regime import DEFAULT_ENGINE, DEFAULT_WORKLOAD, EXPORT_ENGINE, Regime


def resolve_regime(
    engine: str | None, workload: str | None, tokens_per_gpu: int | None = None,
    dispatch: str | None = None, mode: str | None = None, seed: int = 0,
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
    regime = Regime(chosen, workload or DEFAULT_WORKLOAD, tokens_per_gpu, dispatch, mode, seed)
    overrides = [f"--{name} {value}" for name, value in (("dispatch", dispatch), ("mode", mode))
                 if value is not None]
    words = [w for w in (said, ", ".join(overrides)) if w]
    note = "; ".join([*words, "set with --engine/--workload"])
    return regime, note


def judged_as(regime: Regime, note: str = "", batch: str | None = None) -> str:
    """The ``judged as`` line every judging command prints (``batch``: what a batch is,
    when not the regime's tokens per GPU)."""
    return f"judged as    {regime.describe(batch)}" + (f"; {note}" if note else "")
