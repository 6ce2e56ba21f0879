"""Tuning source: the cpsat defaults that matter, checked on traces fitted to measured loads.

The rule (docs/performance.md, "Tuning and reporting sources"): the settings the planner's
defaults are chosen on come from one source, the figures the benchmarks report from
another.  This section is the tuning side.  Its traces come from ``placer synth --from
FILE`` (:mod:`placer.traces.synth.fitted`: each layer's law fitted to a measured file's
per-expert loads and pair counts, a generator built differently from the popularity model
of ``placer synth --skew``), fitted to the measured load files:

- the bundled Qwen3-30B-A3B statistics (``traces/qwen3-30b-a3b.npz``, always), planned
  on 2 x DGX H100 with 16 redundant experts (EP16), 8 of its 48 layers (every sixth);
- gpt-oss-20b's aggregated loads and pairs where the benchmarks' data folder holds them,
  planned on one DGX H100 with 5 slots per GPU, all 24 layers.

Each trace: 16 steps of 128 tokens per GPU, drift 0.02 ranks a step, seed 2 (the reported
traces use seed 1); fitted on windows 0:12 and judged on 12:16 under SGLang's and vLLM's
dispatch, as ``bench latency`` judges (``compare_engines``).  The settings: the default,
and one change at a time of the options the defaults were tuned on (``balance_tolerance``,
``traffic_weight``, ``robust``).  The score of a setting is the geometric mean over rows of
cpsat's held-out step p99 over EPLB's; a default is kept when no alternative beats it by
more than :data:`KEEP_WITHIN`.  ``bench latency`` and ``bench replay`` never read these
traces; this section never reads theirs.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.__main__ import SHARED_DATA
from bench.latency import OUT, Row, compare_engines, h100_node, log, read
from bench.skews import TUNING_SOURCE, measure

REPO = Path(__file__).resolve().parent.parent
CACHE = OUT / "tuning"
#: The engines each setting is judged under (one static, one round-robin dispatch).
ENGINES = ("sglang", "vllm")
#: Steps of each fitted trace, fitted steps, seed and drift.
STEPS, FIT, SEED, DRIFT = 16, (0, 12), 2, 0.02
#: The settings compared: name -> cpsat options (None: the defaults).
SETTINGS: dict[str, dict[str, Any] | None] = {
    "default": None,
    "balance_tolerance=0.02": {"balance_tolerance": 0.02},
    "traffic_weight=0": {"traffic_weight": 0.0},
    "robust=cvar": {"robust": "cvar"},
    "robust=mean": {"robust": "mean"},
}
#: A default is kept unless an alternative's score is lower by more than this share.
KEEP_WITHIN = 0.005


@dataclass(frozen=True)
class Source:
    """One fitted configuration: the measured file, the model and cluster it is planned
    for, and the layers read (None: every layer)."""

    key: str
    label: str
    file: Path
    model: str
    topology: Callable[[], Any]
    gpus: int
    slots_per_gpu: int | None = None
    redundant: int | None = None
    layers: tuple[int, ...] | None = None


def sources() -> list[Source]:
    """The measured load files present: the bundled Qwen3 statistics, always; gpt-oss-20b's
    where the data folder holds them."""
    from placer.topology import load_topology

    out = [Source("qwen3-2n", "Qwen3-30B-A3B 2x-dgx-h100 16x9, fitted",
                  REPO / "traces" / "qwen3-30b-a3b.npz", "qwen3-30b-a3b",
                  lambda: load_topology("2x-dgx-h100"), 16, redundant=16,
                  layers=tuple(range(0, 48, 6)))]
    gpt_oss = SHARED_DATA / "real" / "gpt-oss-20b" / "load_coact.npz"
    if gpt_oss.exists():
        out.append(Source("gpt-oss-8x5", "gpt-oss-20b 8x5, fitted", gpt_oss, "gpt-oss-20b",
                          lambda: h100_node(8), 8, slots_per_gpu=5))
    return out


def fitted_command(source: Source, path: Path) -> list[str]:
    """The ``placer synth --from`` command line of ``source``'s fitted trace."""
    per_step = 128 * source.gpus
    return [sys.executable, "-m", "placer.cli.main", "synth", str(path), "--from",
            str(source.file), "-m", source.model, "--tokens", str(STEPS * per_step),
            "--tokens-per-step", str(per_step), "--ranks", str(source.gpus),
            "--drift", str(DRIFT), "--seed", str(SEED), "-q"]


def fitted_trace(source: Source) -> Path:
    """``source``'s fitted trace, made once (kept in bench/out/tuning)."""
    path = CACHE / f"{source.key}-fitted.npz"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        log(f"tuning: placer synth --from {source.file.name} ...")
        subprocess.run(fitted_command(source, path), check=True, capture_output=True)
    return path


def score(rows: Sequence[Row]) -> float:
    """Geometric mean over ``rows`` of cpsat's step p99 over EPLB's."""
    return math.exp(sum(math.log(r.cpsat_step_p99 / r.eplb_step_p99) for r in rows)
                    / len(rows))


def verdict(scores: dict[str, float], within: float = KEEP_WITHIN) -> str:
    """Whether the default holds: kept unless some setting scores lower by more than
    ``within`` (as a share of the default's score)."""
    best = min(scores, key=scores.__getitem__)
    gap = 1 - scores[best] / scores["default"]
    if best == "default" or gap <= within:
        return (f"the defaults hold: no alternative beats them by more than {within:.1%}"
                f" (best: {best}, {gap:+.2%})")
    return (f"**{best} beats the defaults by {gap:.2%}** on the tuning source: a candidate"
            " for the planner's owner, to be confirmed on the reported source")


def run() -> str:
    from placer.model import load_model

    jobs = os.cpu_count() or 1
    lines = ["## tuning: the cpsat defaults on the tuning source", "",
             f"Source: {TUNING_SOURCE}. Traces: `placer synth --from FILE` (16 steps of 128"
             f" tokens per GPU, drift {DRIFT}, seed {SEED}), fitted on windows 0:12 and judged"
             " on 12:16 as `bench latency` judges; cpsat with the default budgets, one"
             " option changed at a time. Score: geometric mean over rows of cpsat's held-out"
             " step p99 over EPLB's (lower is better).", ""]
    by_setting: dict[str, list[Row]] = {name: [] for name in SETTINGS}
    notes = []
    for source in sources():
        routing = read(fitted_trace(source), source.model, keep_tokens=True,
                       layers=source.layers)
        m = measure(routing.stats.load, routing.stats.layer_ids)
        layers = ("every layer" if source.layers is None
                  else "layers " + ",".join(map(str, source.layers)))
        notes.append(f"- {source.label}: fitted to {source.file.name} ({layers});"
                     f" skew {m.cell()}")
        for name, options in SETTINGS.items():
            log(f"tuning: {source.label}, {name} ...")
            by_setting[name] += compare_engines(
                source.key, source.label, routing, load_model(source.model),
                source.topology(), slots_per_gpu=source.slots_per_gpu,
                redundant=source.redundant, fit=FIT, engines=ENGINES, jobs=jobs,
                options=options)
    lines += render(by_setting)
    scores = {name: score(rows) for name, rows in by_setting.items() if rows}
    lines += ["", *notes, "", f"Verdict: {verdict(scores)}."]
    return "\n".join(lines) + "\n"


def render(by_setting: dict[str, list[Row]]) -> list[str]:
    """One line per setting: each row's change against EPLB, and the score."""
    first = next(iter(by_setting.values()))
    heads = [f"{r.config} {r.engine}" for r in first]
    lines = ["| setting | " + " | ".join(heads) + " | score |",
             "|---|" + "---:|" * (len(heads) + 1)]
    for name, rows in by_setting.items():
        cells = [f"{r.change:+.2%}" for r in rows]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {score(rows):.4f} |")
    return lines


if __name__ == "__main__":
    print(run())
