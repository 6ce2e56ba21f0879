"""The *Settings* section every report opens with: what was run, and how to run it again.

A figure means little without the settings it was judged under: the dispatch
policy and all-to-all mode change the hot shard and the step time, the seed
changes the sampled batches, the time limit changes what a search-based solver
finds.  Each report therefore states them, with the placer version and the
command line that wrote it (shell-quoted, ready to paste).

- :func:`command_line`: ``sys.argv`` as one shell line;
- :func:`compare_settings_rows`: the rows of a ``placer compare`` study
  (``placer.compare.CompareSettings``);
- :func:`evaluation_settings_rows`: the rows of ``placer report``
  (``placer.evaluate.EvalParams``);
- :func:`settings_section`: the section itself.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from placer import constants
from placer.regime import Regime
from placer.report.html import Code, Section, Table, Text

if TYPE_CHECKING:
    from placer.compare.scenarios import CompareSettings, Scenario
    from placer.evaluate import EvalParams

#: Caption of the settings table.
SETTINGS_CAPTION = "Settings (the command line under the table runs this report again)"


def command_line(argv: Sequence[str] | None = None) -> str:
    """``argv`` (default ``sys.argv``) as one shell-quoted line starting with ``placer``.

    The program path is shortened to its name (``/venv/bin/placer`` -> ``placer``;
    ``python -m placer`` stays ``python -m placer``), so the line reads the same
    on every machine.
    """
    args = list(sys.argv if argv is None else argv)
    if not args:
        return "placer"
    program = Path(args[0]).name
    head = "python -m placer" if program in ("__main__.py", "-m", "-c") else program or "placer"
    return " ".join([head, *(shlex.quote(a) for a in args[1:])])


def compare_settings_rows(
    settings: CompareSettings, scenarios: Sequence[Scenario] = ()
) -> list[tuple[str, str]]:
    """``(setting, value)`` rows of a compare study.

    Parameters
    ----------
    settings: the study's settings.
    scenarios: ``placer.compare.Scenario`` of the study, summarized in one row each
        for topologies, redundancy levels and solvers.

    The regime rows (:func:`regime_rows`) are the ones every command judges under.
    """
    rows: list[tuple[str, str]] = [("model", settings.model or "-")]
    if scenarios:
        rows += [
            ("topologies", ", ".join(_unique(s.topology for s in scenarios))),
            ("redundant experts per layer", ", ".join(_unique(str(s.redundant)
                                                              for s in scenarios))),
            ("solvers", ", ".join(_unique(s.solver for s in scenarios))),
        ]
    regime = settings.regime
    total = settings.time_limit_s
    per_layer, reserve = settings.layer_time_limit_s, settings.kv_reserve_gb
    rows += [
        *regime_rows(regime),
        ("judged on", "held-out windows" if settings.holdout
         else "every window (the windows the solvers saw)"),
        ("expert weight dtype", settings.dtype or "the model's"),
        ("KV cache reserve per GPU",
         f"{reserve:g} GB" if reserve is not None else "capacity default"),
        ("time limit per scenario (whole plan)",
         f"{total if total is not None else constants.DEFAULT_PLAN_SECONDS:g} s"),
        ("time limit per layer (search-based solvers)",
         f"{per_layer:g} s" if per_layer is not None else "solver default"),
        ("seed (solvers and sampling)", str(settings.seed)),
    ]
    return rows


def regime_rows(regime: Regime) -> list[tuple[str, str]]:
    """``(setting, value)`` rows of the regime placements are judged under."""
    policy = (f"{regime.dispatch} (--dispatch)" if regime.dispatch_override
              else f"{regime.dispatch} (from --engine {regime.engine})")
    mode = (f"{regime.all_to_all} (--mode)" if regime.all_to_all_override
            else f"{regime.all_to_all} (from --workload {regime.workload})")
    return [
        ("judged as", regime.describe()),
        ("dispatch policy", policy),
        ("all-to-all mode", mode),
        ("tokens per judged batch", f"{regime.tokens} per GPU x the GPUs"),
    ]


def evaluation_settings_rows(regime: Regime, params: EvalParams, *, model: str,
                             topology: str, default_dtype: str = "") -> list[tuple[str, str]]:
    """``(setting, value)`` rows of ``placer report``'s evaluation.

    Parameters
    ----------
    regime: what the placements were judged under.
    params: ``placer.evaluate.EvalParams`` the placements were evaluated with.
    model, topology: names of the model and topology.
    default_dtype: the model's dtype, shown when ``params.dtype`` is None.
    """
    dtype = params.dtype
    how = (f"{params.num_batches} sampled batches of {params.batch_tokens} tokens"
           if params.sample else f"per-token replay, batches of {params.batch_tokens} tokens")
    return [
        ("model", model),
        ("topology", topology),
        *regime_rows(regime),
        ("batches", how),
        ("expert weight dtype", dtype or (f"{default_dtype} (the model's)" if default_dtype
                                          else "the model's")),
        ("seed (sampling)", str(params.seed)),
    ]


def settings_section(rows: Sequence[tuple[str, str]], *, command: str = "",
                     version: str = "") -> Section:
    """The *Settings* section: ``rows``, then the placer version and the command line."""
    body = list(rows)
    if version:
        body.append(("placer version", version))
    blocks: list[Any] = [Table(("setting", "value"), tuple(body), caption=SETTINGS_CAPTION,
                               numeric=())]
    if command:
        blocks += [Text("Command line:"), Code(command)]
    return Section("Settings", tuple(blocks))


def _unique(values: Any) -> list[str]:
    out: list[str] = []
    for v in values:
        if v not in out:
            out.append(v)
    return out
