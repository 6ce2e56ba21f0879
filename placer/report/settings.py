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

    The dispatch policy, all-to-all mode and batch are the ones the evaluator
    used: with an engine and workload they come from the workload, and the row
    says so.
    """
    rows: list[tuple[str, str]] = [("model", settings.model or "-")]
    if scenarios:
        rows += [
            ("topologies", ", ".join(_unique(s.topology for s in scenarios))),
            ("redundant experts per layer", ", ".join(_unique(str(s.redundant)
                                                              for s in scenarios))),
            ("solvers", ", ".join(_unique(s.solver for s in scenarios))),
        ]
    target = settings.target
    if target is not None:
        rows += [
            ("engine and workload", target.describe()),
            ("dispatch policy", f"{target.policy} (from --engine {target.engine})"),
            ("all-to-all mode", f"{target.mode} (from --workload {target.phase})"),
            ("tokens per judged batch", f"{target.tokens} per GPU x the scenario's GPUs"),
        ]
    else:
        batch = settings.batch_tokens
        rows += [
            ("engine and workload", "none given (--policy, --mode and --batch-tokens apply)"),
            ("dispatch policy", settings.policy),
            ("all-to-all mode", settings.mode),
            ("tokens per judged batch", str(batch) if batch else "the trace's steps"),
        ]
    num_batches, total = settings.num_batches, settings.time_limit_s
    per_layer, reserve = settings.layer_time_limit_s, settings.kv_reserve_gb
    rows += [
        ("batches sampled (aggregated loads only)",
         str(num_batches or constants.DEFAULT_SAMPLED_BATCHES)),
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


def evaluation_settings_rows(params: EvalParams, *, model: str, topology: str,
                             default_dtype: str = "") -> list[tuple[str, str]]:
    """``(setting, value)`` rows of ``placer report``'s evaluation.

    Parameters
    ----------
    params: ``placer.evaluate.EvalParams`` the placements were evaluated with.
    model, topology: names of the model and topology.
    default_dtype: the model's dtype, shown when ``params.dtype`` is None.
    """
    batch, dtype = params.batch_tokens, params.dtype
    return [
        ("model", model),
        ("topology", topology),
        ("dispatch policy", str(params.policy)),
        ("all-to-all mode", str(params.mode)),
        ("tokens per judged batch", str(batch) if batch else "the trace's steps"),
        ("batches sampled (aggregated loads only)", str(params.num_batches)),
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
