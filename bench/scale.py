"""Plans at scale: ``placer plan`` at a user's trace sizes, timed as a user runs it.

DeepSeek-V3 shape (58 MoE layers x 256 experts, top-8) on 4 x DGX H100 (EP32, 32
redundant), ``placer synth`` traces of 65,536, 409,600 and 1,000,000 tokens (group-limited
routing, 8 clusters, drift 0.02, steps of 4,096 tokens over 32 ranks, seed 1: the shape of
``bench/latency.py``'s trace), written under ``bench/out`` once and reused; and the
Kimi-K2 shape (60 x 384) on GB200 NVL72, the trace of ``bench/latency.py``.

Each plan is the command a user types, with default settings (``--json`` for the
figures), in a subprocess (:func:`timed`): wall seconds, CPU seconds of the command and
its worker processes, peak memory (the largest max RSS among them), the wall split by
the command's own ``timings`` (*read*: the trace into statistics and the judge's sample;
*plan*: problem, EPLB hint, layer search, to the last layer planned; *judge + summary*:
the solver's judge, EPLB's side-by-side, the summary with its floor), and what the
summary says it judged.  Targets: the 1,000,000-token plan in at most 30 s wall and 1 GB
peak on 2 cores, summary included; the cost growing sub-linearly in tokens.

The machine is shared: each row says the 1-minute load average before and after it, and
the CPU seconds (which the load does not inflate as much as the wall) beside the wall.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.latency import OUT, SYNTH, log, synth_trace

#: Targets of the largest DeepSeek-V3 plan: wall seconds and peak memory, MB.
TARGET_WALL_S = 30.0
TARGET_MEMORY_MB = 1024.0
#: Tokens of the DeepSeek-V3 traces, smallest first (the first is ``bench/latency.py``'s size).
SIZES = (65_536, 409_600, 1_000_000)
#: ``placer synth`` settings of the DeepSeek-V3 traces besides their size.
DEEPSEEK_SYNTH = {"num_groups": 8, "top_groups": 4, "zipf": 1.0, "clusters": 8, "drift": 0.02,
                  "tokens_per_step": 4096, "num_ranks": 32, "seed": 1}
DEEPSEEK_ARGS = ("-m", "deepseek-v3", "-t", "4x-dgx-h100", "-r", "32")
KIMI_ARGS = ("-m", "kimi-k2", "-t", "gb200-nvl72", "-r", "48")


@dataclass(frozen=True)
class Timed:
    """One command's run: wall and CPU seconds (the command and every process it waited
    for), peak memory MB (the largest max RSS among them), exit code, and the 1-minute
    load average before and after."""

    wall_s: float
    cpu_s: float
    peak_mb: float
    rc: int
    load: tuple[float, float]


def run() -> str:
    only = os.environ.get("PLACER_BENCH_SCALE_SIZES")  # e.g. "65536" while developing
    sizes = [int(s) for s in only.split(",")] if only else list(SIZES)
    rows = []
    for tokens in sizes:
        trace = synth_trace(OUT / f"scale-deepseek-v3-{tokens}.npz", "deepseek-v3",
                            num_tokens=tokens, **DEEPSEEK_SYNTH)
        label = f"DeepSeek-V3 shape, {tokens:,} tokens"
        rows.append((label, tokens, *_plan(trace, DEEPSEEK_ARGS, f"deepseek-v3-{tokens}")))
    if not only:
        name, model, overrides = SYNTH["kimi-k2"]
        trace = synth_trace(OUT / name, model, **overrides)
        rows.append(("Kimi-K2 shape, GB200 NVL72, 147,456 tokens", overrides["num_tokens"],
                     *_plan(trace, KIMI_ARGS, "kimi-k2")))
    return "\n".join(_table(rows)) + "\n"


def _command(trace: Path, args: tuple[str, ...], key: str) -> list[str]:
    return [sys.executable, "-m", "placer.cli.main", "plan", str(trace), *args,
            "-o", str(OUT / f"scale-{key}.json"), "--json"]


def _plan(trace: Path, args: tuple[str, ...],
          key: str) -> tuple[Timed, dict[str, Any], dict[str, float]]:
    """``placer plan TRACE ARGS -o bench/out/scale-KEY.json --json``, timed; its summary;
    then once more through :func:`critical_path`."""
    report = OUT / f"scale-{key}.summary.json"
    log(f"scale: placer plan {trace.name} ...")
    run = timed(_command(trace, args, key), report)
    try:
        doc = json.loads(report.read_text()) if run.rc == 0 else {}
    except (OSError, ValueError):
        doc = {}
    log(f"scale: placer plan {trace.name}, phases ...")
    return run, doc, critical_path(_command(trace, args, key))


#: Run as ``python -c PHASES placer ARGS``: ``placer`` with CPU seconds at the edges of its
#: phases (the main process, its main thread, and the child processes reaped), on stderr as
#: one ``phases: {...}`` JSON line.  The same command, the same code: the probe only wraps
#: the reading, the planner's judge and the summary to read the clocks.
PHASES = """
import json, resource, sys, time
import placer.cli.plan_cmd as plan_cmd, placer.planning.run as run
import placer.evaluate.judge as judge
marks = {}
def mark(name):
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    marks[name] = (time.perf_counter(), time.process_time(), time.thread_time(),
                   c.ru_utime + c.ru_stime)
def wrap(owner, attr, name):
    f = getattr(owner, attr)
    def g(*a, **k):
        mark(name + ' start'); out = f(*a, **k); mark(name + ' end'); return out
    setattr(owner, attr, g)
wrap(plan_cmd, 'read_trace', 'read')
wrap(judge.LayerJudge, 'prefetch', 'judge')
wrap(run, 'summarize_plan', 'summary')
from placer.cli.main import main
sys.argv = sys.argv[1:]
try:
    main()
finally:
    mark('end')
    print('phases: ' + json.dumps(marks), file=sys.stderr)
"""


def critical_path(command: list[str]) -> dict[str, float]:
    """Seconds each phase of ``command`` (``python -m placer.cli.main plan ...``, as
    :func:`timed` runs it) would take on idle
    cores, from the CPU seconds it spends (:data:`PHASES`): start (Python, imports) as its
    CPU; read as its busier thread (the NPZ is inflated in a second one); the layer search,
    the planner's judge and the summary each as the longer of this process's CPU and half
    of everything's (the search runs its layers in two worker processes, the judge and the
    summary fork one child beside this one; the search's budget is deterministic work, so
    its CPU seconds do not depend on the load); the rest as its CPU.  An estimate: the
    machine is shared, and the CPU seconds are what the load inflates least."""
    args = command[command.index("placer.cli.main") + 1:]  # plan TRACE ...
    probe = [sys.executable, "-c", PHASES, "placer", *args]
    wall = time.perf_counter()
    done = subprocess.run(probe, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - wall
    line = next((x for x in done.stderr.splitlines() if x.startswith("phases: ")), None)
    if done.returncode != 0 or line is None:
        log(f"critical path failed: {done.stderr[-400:]}")
        return {}
    m = {k: tuple(v) for k, v in json.loads(line[len("phases: "):]).items()}
    startup = m["read start"][1]  # CPU to the read (imports, arguments)

    def span(a: str, b: str) -> tuple[float, float, float, float]:
        return tuple(m[b][i] - m[a][i] for i in range(4))  # type: ignore[return-value]

    read = span("read start", "read end")
    plan = span("read end", "judge start")
    judge = span("judge start", "judge end")
    summary = span("summary start", "summary end")
    rest = span("judge end", "summary start")[1] + span("summary end", "end")[1]
    out = {
        "start": startup,
        "read": max(read[2], read[1] - read[2]),
        "plan": max(plan[1], (plan[1] + plan[3]) / 2),
        "judge": max(judge[1], (judge[1] + judge[3]) / 2),
        "summary": max(summary[1], (summary[1] + summary[3]) / 2),
        "rest": rest,
    }
    out["total"] = sum(out.values())
    out["measured_wall"] = wall
    return out


def timed(command: list[str], stdout: Path | None = None) -> Timed:
    """Run ``command`` from a fresh Python parent (so earlier commands' figures stay
    out), its stdout to ``stdout`` (None: dropped): see :class:`Timed`."""
    probe = (
        "import os, resource, subprocess, sys, time\n"
        "out = open(sys.argv[1], 'w') if sys.argv[1] else subprocess.DEVNULL\n"
        "load = os.getloadavg()[0]\n"
        "t = time.perf_counter()\n"
        "rc = subprocess.run(sys.argv[2:], stdout=out).returncode\n"
        "wall = time.perf_counter() - t\n"
        "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "print(wall, u.ru_utime + u.ru_stime, u.ru_maxrss, rc, load, os.getloadavg()[0])\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(stdout or ""), *command],
                          capture_output=True, text=True, check=False)
    try:
        wall, cpu, peak, rc, before, after = done.stdout.split()
    except ValueError:
        log(f"timing failed: {done.stderr[-400:]}")
        return Timed(float("nan"), float("nan"), float("nan"), done.returncode or 1,
                     (float("nan"), float("nan")))
    if int(rc) != 0:
        log(f"exit {rc}: {done.stderr[-400:]}")
    return Timed(float(wall), float(cpu), int(peak) / 1024.0, int(rc),
                 (float(before), float(after)))


Row = tuple[str, int, Timed, dict[str, Any], dict[str, float]]


def _table(rows: list[Row]) -> list[str]:
    lines = [
        "## scale: plans at a user's scale", "",
        f"Machine: {os.cpu_count()} cores, shared (load: the 1-minute load average before"
        " and after each run). One run each of `placer plan TRACE ARGS -o OUT --json`, default"
        " settings, in a subprocess: wall and CPU seconds of the command and its worker"
        " processes, peak memory (the largest max RSS among them), the wall split by the"
        " command's `timings`: read, plan (to the last layer planned), judge + summary (the"
        " solver's judge, EPLB's side-by-side, the summary with its floor); the rest is"
        " Python's start and writing. Judged: what the summary says it replayed. Idle"
        " 2 cores: the wall the same command would take with both cores to itself,"
        " estimated from a second run's CPU seconds by phase (`bench.scale.critical_path`:"
        " start, read, plan, judge, summary).", "",
        "| trace | wall s | CPU s | read s | plan s | judge + summary s | peak MB | load |"
        " idle 2 cores, s | judged on |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for label, _, run, doc, path in rows:
        t = doc.get("timings", {})
        lines.append(
            f"| {label} | {run.wall_s:.1f} | {run.cpu_s:.1f} | {t.get('read_s', float('nan')):.1f}"
            f" | {t.get('planning_s', float('nan')):.1f}"
            f" | {t.get('after_planning_s', float('nan')):.1f} | {run.peak_mb:,.0f}"
            f" | {run.load[0]:.1f} -> {run.load[1]:.1f}"
            f" | {path.get('total', float('nan')):.1f} | {_judged(doc, run.rc)} |")
    lines += ["", *_verdict([r for r in rows if r[0].startswith("DeepSeek")])]
    return lines


def _judged(doc: dict[str, Any], rc: int) -> str:
    """``16 batches, 65,536 of 1,000,000 tokens (sample: 1 per window)`` from the summary."""
    judged = doc.get("judged")
    if not judged:
        return f"exit {rc}" if rc else "-"
    text = f"{judged['num_batches']} batches, {judged['num_tokens']:,}"
    if judged.get("of_tokens", 0) > judged["num_tokens"]:
        text += f" of {judged['of_tokens']:,}"
    text += " tokens"
    sample = judged.get("sample")
    if sample:
        text += f" (sample, {sample['per_window']} batch per window)"
    elif judged["source"] != "trace":
        text += " (sampled from the statistics)"
    return text


def _verdict(rows: list[Row]) -> list[str]:
    """The targets of the largest DeepSeek-V3 plan, and how the cost grows."""
    if not rows:
        return []
    _, tokens, run, _, path = rows[-1]
    idle = path.get("total", float("nan"))
    wall_ok = run.rc == 0 and run.wall_s <= TARGET_WALL_S
    idle_ok = run.rc == 0 and idle <= TARGET_WALL_S
    memory_ok = run.rc == 0 and run.peak_mb <= TARGET_MEMORY_MB
    out = [f"{tokens:,} tokens: wall {run.wall_s:.1f} s here (target <= {TARGET_WALL_S:.0f} s:"
           f" {'met' if wall_ok else '**not met**'}), {idle:.1f} s estimated on 2 idle cores"
           f" ({'met' if idle_ok else '**not met**'}: "
           + ", ".join(f"{k} {path.get(k, float('nan')):.1f}"
                       for k in ("start", "read", "plan", "judge", "summary", "rest"))
           + f"), peak {run.peak_mb:,.0f} MB (target <= {TARGET_MEMORY_MB:,.0f} MB:"
           f" {'met' if memory_ok else '**not met**'})."]
    if len(rows) > 1:
        _, small, first, _, _ = rows[0]
        grew = run.cpu_s / first.cpu_s if first.cpu_s > 0 else float("nan")
        out.append(f"Cost growth from {small:,} to {tokens:,} tokens ({tokens / small:.1f}x):"
                   f" CPU x{grew:.2f}, peak memory x{run.peak_mb / first.peak_mb:.2f}"
                   f" (sub-linear: {'yes' if grew < tokens / small else '**no**'}).")
    return out


if __name__ == "__main__":
    print(run())
