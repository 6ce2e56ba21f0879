"""The regime every judging command resolves from its flags, and the line it prints.

``plan``, ``evaluate``, ``compare``, ``report`` and ``replay`` take ``--engine``,
``--workload``, ``--tokens-per-gpu``, ``--seed`` and the expert overrides ``--dispatch``
and ``--mode`` (declared once, in :mod:`placer.cli.options`); each builds one
:class:`~placer.regime.Regime` with :func:`resolve_regime` and prints :func:`judged_as`
(the same words in every command), so that one placement on one trace is judged the
same way whichever command judges it.  Defaults come from the command line, else
``PLACER_*`` variables or ``placer.toml`` (:mod:`placer.cli.config`), else the regime a
placement file records (``placer plan`` writes the one it judged under, :func:`recorded`;
``evaluate`` and ``report`` pass it), else vLLM decode at 128 tokens per GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from placer.errors import UsageError
from placer.regime import DEFAULT_ENGINE, DEFAULT_WORKLOAD, EXPORT_ENGINE, Regime


def resolve_regime(
    engine: str | None, workload: str | None, tokens_per_gpu: int | None = None,
    dispatch: str | None = None, mode: str | None = None, seed: int = 0,
    export_formats: list[str] | tuple[str, ...] = (),
    record: tuple[str, Mapping[str, Any]] | None = None,
) -> tuple[Regime, str]:
    """The regime of the flags (and of ``--export``), and where it came from in words.

    The engine is ``--engine``, else the one engine the exports are for (``vllm-ascend``
    counts as ``vllm``), else the default.  An ``--engine`` that none of the exports is
    for is a UsageError.  ``record``: ``(file, regime section)`` of a placement file, the
    default of every flag left unset (the words say which came from it and which flag
    overrode it).
    """
    if record is not None:
        return _from_record(record, engine, workload, tokens_per_gpu, dispatch, mode, seed)
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


#: The flags a placement's recorded regime stands in for, by the record's keys.
_RECORDED = (("engine", "--engine"), ("workload", "--workload"),
             ("tokens_per_gpu", "--tokens-per-gpu"), ("dispatch", "--dispatch"),
             ("mode", "--mode"))


def recorded(regime: Regime) -> dict[str, Any]:
    """The regime as a placement file records it (what ``plan`` judged under)."""
    return {"engine": regime.engine, "workload": regime.workload,
            "tokens_per_gpu": regime.tokens, "dispatch": regime.dispatch_override,
            "mode": regime.all_to_all_override}


def _from_record(record: tuple[str, Mapping[str, Any]], engine: str | None,
                 workload: str | None, tokens_per_gpu: int | None, dispatch: str | None,
                 mode: str | None, seed: int) -> tuple[Regime, str]:
    """The flags over the placement's recorded regime, and the words that say so."""
    source, values = record
    given: dict[str, Any] = {"engine": engine, "workload": workload,
                             "tokens_per_gpu": tokens_per_gpu, "dispatch": dispatch,
                             "mode": mode}
    chosen: dict[str, Any] = {key: given[key] if given[key] is not None else values.get(key)
              for key, _ in _RECORDED}
    taken = [key for key, _ in _RECORDED if given[key] is None and values.get(key) is not None]
    overridden = [f"{flag} {given[key]} over its {values[key]}" for key, flag in _RECORDED
                  if given[key] is not None and values.get(key) is not None
                  and given[key] != values[key]]
    regime = Regime(chosen["engine"] or DEFAULT_ENGINE, chosen["workload"] or DEFAULT_WORKLOAD,
                    chosen["tokens_per_gpu"], chosen["dispatch"], chosen["mode"], seed)
    words = []
    if taken:
        names = [k.replace("_", " ").replace("tokens per gpu", "tokens per GPU") for k in taken]
        verb = "record" if source.endswith(" placements") else "records"
        words.append(f"{', '.join(names)} as {source} {verb}")
    if overridden:
        words.append("; ".join(overridden))
    words += [f"--{key} {given[key]}" for key in ("dispatch", "mode")
              if given[key] is not None and values.get(key) is None]
    words.append("set with --engine/--workload")
    return regime, "; ".join(words)


def placements_record(placements: list[Any], paths: list[Any]
                      ) -> tuple[tuple[str, Mapping[str, Any]] | None, str]:
    """The regime the placements record, for :func:`resolve_regime`'s ``record``: the
    first file's when every file that records one records the same; else None and a
    note that names the files that disagree."""
    records = [(str(path), pl.meta.get("regime")) for pl, path in zip(placements, paths,
                                                                      strict=True)]
    records = [(path, r) for path, r in records if isinstance(r, Mapping) and r]
    if not records:
        return None, ""
    first = records[0]
    differ = [path for path, r in records[1:] if dict(r) != dict(first[1])]
    if differ:
        return None, (f"{first[0]} and {differ[0]} record different regimes: judged under"
                      " the flags' (pass --engine/--workload/--tokens-per-gpu)")
    if len(records) == 1:
        return first, ""
    return (f"the {len(records)} placements" if len(records) == len(placements)
            else first[0], first[1]), ""


def placements_regime(placements: list[Any], paths: list[Any], engine: str | None,
                      workload: str | None, tokens_per_gpu: int | None, dispatch: str | None,
                      mode: str | None, seed: int) -> tuple[Regime, str]:
    """:func:`resolve_regime` with the placements' recorded regime as the default."""
    record, disagree = placements_record(placements, paths)
    regime, note = resolve_regime(engine, workload, tokens_per_gpu, dispatch, mode, seed,
                                  record=record)
    return regime, "; ".join(n for n in (disagree, note) if n)
