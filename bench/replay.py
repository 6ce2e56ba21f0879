"""Serving over time: ``placer replay`` against vLLM's online EPLB, decisions charged.

1. **Quality, at the engine's own cadence.**  Drifting synthetic traces made by ``placer
   synth --skew S`` (request topics whose dominant topic switches in bursts, every 150
   steps on average; 1,000 decode steps of 128 tokens per GPU), four MoE layers each (two
   shallow, two deep), at the three skew presets ``S`` = real, mild, heavy (the same seed;
   heavy is sensitivity only, :mod:`bench.skews`), each row stating its trace's measured
   skew: the DeepSeek-V3 shape on 4 x DGX H100 (EP32, 32 redundant) and
   Qwen3-30B-A3B on 2 x DGX H100 (EP16, 16 redundant), under vLLM's dispatch.  For each
   of 3 intervals x 2 windows, vLLM's default policy (``eplb:...,async``, the reference
   EPLB, decided in :data:`placer.replay.policies.EPLB_MS_PER_LAYER` a layer) and
   placer's (``placer:...,async``, moves that pay within the interval, decided in
   :data:`PLACER_MS_PER_LAYER` a layer) at the same window and interval, both copying in
   the background one layer a step; a decision lands once its compute time has passed
   in serving time.  Targets per cadence: placer's mean step (copies included) at least
   5% below vLLM's, its p99 step at least 20% below, at most half of its GB; the verdict
   over ``async_share`` 0.25, 0.5 and 1.0.  The oracle (``oracle:interval=100``) is a
   bound: checked to be at or below every row's mean.
2. **Calibration.**  vLLM PR #43219's synchronous case (DeepSeek-R1, 32 GB200 in one
   NVLink domain, window 100, 32 redundant): placer's estimate of a synchronous
   rearrangement's stall, scaled from the trace's four layers to the model's 58, beside
   the published 0.91 s mean (0.65-1.70 s).
3. **Speed.**  1,000 decode steps of the DeepSeek-V3 shape, all 58 MoE layers, EP32, 128
   tokens per GPU (the four-layer trace's routing dealt to 58 layers, each with its own
   relabelling of experts within their groups), 3 policies, ``-j 2``: the command as a
   user runs it, wall and peak memory.  Target: under 60 s and 2 GB on 2 cores.

Every figure comes from the ``placer replay`` command (``--json``), run as a user runs it.
Calibration and speed use the real-skew DeepSeek-V3 trace.  While developing,
``PLACER_BENCH_REPLAY_SKEWS=real`` runs the quality rows at the named skews only,
``PLACER_BENCH_REPLAY_CASES=dsv3`` the named cases only (keys of :data:`CASES`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.latency import OUT, log
from bench.scale import timed
from bench.skews import REPORT_SOURCE, SKEW_LABELS, Measured, chosen_skews, measure

CACHE = OUT / "cache"
STEPS = 1000
#: ``placer synth`` arguments of every drifting trace but its ``--skew`` (same seed at
#: every skew).
SYNTH_ARGS = ["--clusters", "8", "--topics", "8", "--burst-every", "150",
              "--burst-share", "0.5", "--mix-period", "2000", "--request-steps", "150",
              "--seed", "1"]
#: name: (model, topology, layers, GPUs, redundant)
CASES = {
    "dsv3": ("deepseek-v3", "4x-dgx-h100", "3,4,59,60", 32, 32),
    "qwen3": ("qwen3-30b-a3b", "2x-dgx-h100", "0,1,46,47", 16, 16),
}
#: name: (steps, synth arguments)
TRACES = {"dsv3": (STEPS, SYNTH_ARGS), "qwen3": (STEPS, SYNTH_ARGS)}
INTERVALS = (100, 250, 500)
WINDOWS = (50, 200)
#: placer's decision time charged, ms per MoE layer, fixed so that runs repeat: the
#: engine-neutral policy's measured time on one quiet core (``python -m bench online``:
#: 0.19 s for DeepSeek-V3's 59 layers through vLLM's interface, 3.2 ms a layer), rounded
#: up; the bench reports beside it the time placer's policy measured deciding in this run.
PLACER_MS_PER_LAYER = 4
ORACLE = "oracle:interval=100"
SHARES = (0.25, 0.5, 1.0)
#: 32 GB200 in one NVLink domain (vLLM PR #43219's decode cluster: 8 trays of 4 GPUs
#: joined by multi-node NVLink), from the gb200-nvl72 preset's figures.
GB200_32 = """name: gb200-32
description: 32 x GB200 in one NVLink 5 domain (multi-node NVLink), 900 GB/s per GPU
gpu_types:
  gb200: {memory_gb: 186, hbm_gbps: 8000, bf16_tflops: 2500, fp8_tflops: 5000, mxfp4_tflops: 10000}
nodes:
  - name: nvl
    gpus: 32
    gpu_type: gb200
    fabric: {kind: nvswitch, gbps: 900, latency_us: 1.5}
    nic_gbps: 50
"""


def run() -> str:
    only = os.environ.get("PLACER_BENCH_REPLAY_ONLY", "")  # "quality" or "speed"
    out = ["## replay: placer's online policy against vLLM's, decisions charged", ""]
    if only in ("", "quality"):
        out += _quality()
    if only in ("", "calibration"):
        out += ["", *_calibration()]
    if only in ("", "speed"):
        out += ["", *_speed()]
    return "\n".join(out) + "\n"


def synth_command(key: str, skew: str, path: Path, steps: int = STEPS) -> list[str]:
    """The ``placer synth`` command line of case ``key``'s drifting trace at ``skew``."""
    model, topology, layers, gpus, _ = CASES[key]
    return [sys.executable, "-m", "placer.cli.main", "synth", str(path), "-m", model,
            "--layers", layers, "-t", topology, "--tokens", str(steps * gpus * 128),
            "--tokens-per-step", str(gpus * 128), "--skew", skew, "--json", "-q",
            *TRACES[key][1]]


def _trace(key: str, skew: str = "real") -> Path:
    """The four-layer drifting trace of a case at ``skew`` (made once, kept in
    bench/out/cache, with what ``placer synth --json`` said of it beside it)."""
    steps = TRACES[key][0]
    path = CACHE / f"{key}-{skew}-drift-{steps}.npz"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        log(f"replay: synthesizing {path.name} (once) ...")
        done = subprocess.run(synth_command(key, skew, path, steps), check=True,
                              capture_output=True, text=True)
        path.with_suffix(".json").write_text(done.stdout)
    return path


def trace_skew(path: Path) -> Measured:
    """The skew of a trace: from ``placer synth --json``'s record beside it, else read."""
    record = path.with_suffix(".json")
    if record.exists():
        skew = json.loads(record.read_text())["skew"]
        m = skew["median"]
        return Measured(gini=m["gini"], cv=m["cv"], max_over_mean=m["max_over_mean"],
                        cls=skew["class"])
    import warnings

    from placer.traces import read_routing

    with warnings.catch_warnings():  # synthetic, some experts never routed: said elsewhere
        warnings.simplefilter("ignore")
        stats = read_routing(str(path), coact=False).stats
    return measure(stats.load, stats.layer_ids)


def _replay(trace: Path, args: list[str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "placer.cli.main", "replay", str(trace),
                           *args, "--json", "-q"], capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"placer replay failed: {done.stderr[-800:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _pairs() -> list[tuple[str, str]]:
    """``(eplb, placer)`` at each cadence, both as vLLM runs them (in the background)."""
    return [(f"eplb:window={w},interval={i},async",
             f"placer:window={w},interval={i},horizon={i},async,decide-ms={PLACER_MS_PER_LAYER}")
            for i in INTERVALS for w in WINDOWS]


CASE_LABELS = (("DeepSeek-V3 shape, 4 x DGX H100", "dsv3"),
               ("Qwen3-30B-A3B, 2 x DGX H100", "qwen3"))


def _quality() -> list[str]:
    skews = chosen_skews("PLACER_BENCH_REPLAY_SKEWS")
    lines = ["### Quality: placer's policy against vLLM's at the same cadence", "",
             f"{STEPS} decode steps, 128 tokens per GPU, vLLM's dispatch; both policies copy in"
             " the background one layer a step, their decisions landing once their compute"
             f" time has passed (EPLB 0.6 ms a layer, placer {PLACER_MS_PER_LAYER} ms a layer);"
             " copies at the topology's async_share (1.0) and re-timed at 0.25 and 0.5."
             " Placer moves what pays within the interval (`horizon` = interval). Each case"
             f" at the skews {', '.join(skews)} (`placer synth --skew`, same seed; heavy:"
             " sensitivity only), each row with its trace's measured skew (median layer's"
             f" Gini / CV / max÷mean, class). Sources: {REPORT_SOURCE}.", "",
             "| case | skew | Gini / CV / max÷mean | window | interval | vLLM mean µs |"
             " placer mean µs | mean (<= -5%) | vLLM p99 µs | placer p99 µs | p99 (<= -20%) |"
             " GB placer / vLLM (<= 0.5) | skipped placer / vLLM |"
             " mean at share 0.25 / 0.5 / 1.0 |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    notes: list[str] = []
    scaling: list[str] = []
    cases = {c.strip() for c in os.environ.get("PLACER_BENCH_REPLAY_CASES", "").split(",")
             if c.strip()}
    for skew in skews:
        for label, key in CASE_LABELS:
            if cases and key not in cases:
                continue
            rows, case_notes, summary = _quality_case(label, key, skew)
            lines += rows
            notes += case_notes
            scaling.append(summary)
    return [*lines, "", *notes, "", "How it scales with skew (over the six cadences):", "",
            "| case | skew | Gini | mean change | p99 change | GB placer / vLLM |",
            "|---|---|---:|---|---|---|", *scaling]


def _quality_case(label: str, key: str, skew: str) -> tuple[list[str], list[str], str]:
    """One case at one skew: its table rows, its note lines, its scaling line."""
    model, topology, _, _, redundant = CASES[key]
    trace = _trace(key, skew)
    measured = trace_skew(trace)
    args = ["-m", model, "-t", topology, "-r", str(redundant), "--engine", "vllm",
            "-P", "static:default"]
    for eplb, placer in _pairs():
        args += ["-P", eplb, "-P", placer]
    first = INTERVALS[0]
    measured_policy = f"placer:window={WINDOWS[0]},interval={first},horizon={first},async"
    args += ["-P", measured_policy, "-P", ORACLE, "-j", "2"]
    log(f"replay: {label}, {skew} skew ...")
    doc = _replay(trace, args)
    rows = {p["policy"]: p for p in doc["policies"]}
    shares = {s["async_share"]: s for s in doc["by_async_share"]}
    lines, means, p99s, gbs = [], [], [], []
    for eplb, placer in _pairs():
        e, m = rows[eplb]["figures"], rows[placer]["figures"]
        mean = m["step_mean_us"] / e["step_mean_us"] - 1
        p99 = m["step_p99_us"] / e["step_p99_us"] - 1
        gb = m["gb_moved"] / e["gb_moved"] if e["gb_moved"] else float("nan")
        means.append(mean)
        p99s.append(p99)
        gbs.append(gb)
        by_share = " / ".join(
            f"{shares[s]['step_mean_us'][placer] / shares[s]['step_mean_us'][eplb] - 1:+.1%}"
            for s in SHARES)
        window, interval = parse_cadence(eplb)
        lines.append(
            f"| {label} | {SKEW_LABELS[skew]} | {measured.cell()} | {window} | {interval} |"
            f" {e['step_mean_us']:,.1f} | {m['step_mean_us']:,.1f} |"
            f" {mean:+.1%} {_verdict(mean <= -0.05)} |"
            f" {e['step_p99_us']:,.1f} | {m['step_p99_us']:,.1f} |"
            f" {p99:+.1%} {_verdict(p99 <= -0.20)} | {gb:.2f} {_verdict(gb <= 0.5)} |"
            f" {m['skipped']:.0f} / {e['skipped']:.0f} | {by_share} |")
    oracle = rows[ORACLE]["figures"]["step_mean_us"]
    above = [name for name, p in rows.items()
             if name != ORACLE and p["figures"]["step_mean_us"] < oracle]
    seconds = [d["seconds"] for d in rows[measured_policy]["decisions"]]
    per_layer = [1e3 * x / int(doc["layers"]) for x in seconds]
    notes = [f"- {label}, {skew} skew{' (sensitivity)' if skew == 'heavy' else ''}:"
             f" {doc['verdict']}",
             f"  {doc['share_verdict']}",
             f"  placer's decisions measured (`{measured_policy}`, {len(seconds)} decisions):"
             f" {min(per_layer, default=0):.1f}-{max(per_layer, default=0):.1f} ms a"
             f" layer (charged: {PLACER_MS_PER_LAYER})",
             f"  oracle {oracle:,.1f} µs: "
             + ("at or below every row" if not above else f"**above** {', '.join(above)}")]
    summary = (f"| {label} | {SKEW_LABELS[skew]} | {measured.gini:.2f} |"
               f" {min(means):+.1%} to {max(means):+.1%} | {min(p99s):+.1%} to {max(p99s):+.1%}"
               f" | {min(gbs):.2f}-{max(gbs):.2f} |")
    return lines, notes, summary


def parse_cadence(policy: str) -> tuple[int, int]:
    """``(window, interval)`` of a written online policy."""
    keys = dict(item.split("=") for item in policy.split(":", 1)[1].split(",") if "=" in item)
    return int(keys["window"]), int(keys["interval"])


def _calibration() -> list[str]:
    """vLLM PR #43219's synchronous rearrangement, as placer estimates it."""
    topology = CACHE / "gb200-32.yaml"
    CACHE.mkdir(parents=True, exist_ok=True)
    topology.write_text(GB200_32)
    trace = _trace("dsv3")
    policy = "eplb:window=100,interval=200"
    log("replay: calibration, synchronous EPLB on 32 GB200 ...")
    doc = _replay(trace, ["-m", "deepseek-v3", "-t", str(topology), "-r", "32", "--engine",
                          "vllm", "--dtype", "mxfp4", "-P", policy])
    (row,) = doc["policies"]
    layers, model_layers = int(doc["layers"]), 58
    moved = [r for r in row["rebalances"] if r["layers"]]
    if not moved:
        return ["### Calibration", "", "(no rebalance moved weights)"]
    per_layer_copy = sum(r["copy_s"] / r["layers"] for r in moved) / len(moved)
    host = _rebalance_costs()
    decide = row["decisions"][0]["seconds"] / layers
    stall = host["host_ms"] / 1e3 + model_layers * (decide + host["layer_ms"] / 1e3
                                                    + per_layer_copy)
    return ["### Calibration: vLLM PR #43219's synchronous rearrangement", "",
            "DeepSeek-V3 shape (DeepSeek-R1's), 32 GB200 in one NVLink domain, MXFP4 experts"
            " (NVFP4 in the PR), 32 redundant, window 100; the four-layer trace's"
            f" rebalances ({len(moved)}) scaled to {model_layers} layers.", "",
            "| figure | published | placer's estimate |", "|---|---:|---:|",
            f"| stall per rearrangement, s | 0.91 mean (0.65-1.70) | {stall:.2f} |",
            f"| of which host work, s | - | {host['host_ms'] / 1e3:.3f} |",
            f"| of which deciding (EPLB), s | - | {model_layers * decide:.3f} |",
            f"| of which per-layer work, s | - | {model_layers * host['layer_ms'] / 1e3:.3f} |",
            f"| of which copies, s | - | {model_layers * per_layer_copy:.3f} |",
            f"| copy of one layer, ms (what async_share multiplies) | - |"
            f" {per_layer_copy * 1e3:.2f} |"]


def _rebalance_costs() -> dict[str, float]:
    from placer.topology import load_topology

    costs = load_topology("4x-dgx-h100").calibration.rebalance_costs
    return {"host_ms": costs.host_ms, "layer_ms": costs.layer_ms,
            "async_share": costs.async_share}


def _verdict(ok: bool) -> str:
    return "pass" if ok else "**miss**"


def _widened(source: Path) -> Path:
    """The four-layer DeepSeek-V3 trace dealt to all 58 MoE layers: layer ``i`` takes the
    routing of layer ``i mod 4`` with its experts relabelled within their groups (groups
    permuted too), so layers differ but keep group-limited routing."""
    from placer.model import load_model

    path = CACHE / f"{source.stem}-58layers.npz"
    if path.exists():
        return path
    log("replay: dealing the trace to 58 layers (once) ...")
    spec = load_model("deepseek-v3")
    layer_ids = np.asarray(spec.all_moe_layer_ids, dtype=np.int64)
    with np.load(source) as z:
        ids, step, rank = z["topk_ids"], z["step"], z["rank"]
    experts, groups = spec.num_experts, spec.num_groups
    size = experts // groups
    rng = np.random.default_rng(0)
    out = np.empty((ids.shape[0], layer_ids.size, ids.shape[2]), dtype=np.int16)
    for i in range(layer_ids.size):
        group = rng.permutation(groups)
        within = np.argsort(rng.random((groups, size)), axis=1)
        relabel = (group[:, None] * size + within).reshape(-1).astype(np.int16)
        out[:, i] = relabel[ids[:, i % ids.shape[1]]]
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, topk_ids=out, step=step, rank=rank, layer_ids=layer_ids,
             num_experts=np.int64(experts), top_k=np.int64(ids.shape[2]),
             model=np.array("deepseek-v3"), synthetic=np.bool_(True))
    tmp.replace(path)
    return path


def _speed() -> list[str]:
    trace = _widened(_trace("dsv3"))
    policies = ["static:default", "eplb:window=200,interval=250,async",
                f"placer:window=200,interval=250,horizon=250,async,"
                f"decide-ms={PLACER_MS_PER_LAYER}"]
    command = [sys.executable, "-m", "placer.cli.main", "replay", str(trace), "-m",
               "deepseek-v3", "-t", "4x-dgx-h100", "-r", "32", "-j", "2", "-q"]
    for p in policies:
        command += ["-P", p]
    log("replay: speed, 1,000 steps x 58 layers x 3 policies ...")
    run = timed(command)
    wall, peak, rc = run.wall_s, run.peak_mb, run.rc
    ok = rc == 0 and wall < 60 and peak < 2048
    return ["### Speed: 1,000 decode steps, DeepSeek-V3 shape (58 layers, EP32, 128 tokens"
            " per GPU), 3 policies, `-j 2`", "",
            f"Machine: {os.cpu_count()} cores. Policies: {', '.join(policies)}.", "",
            "| replay | wall s | peak memory MB | target | verdict |", "|---|---:|---:|---|---|",
            f"| `placer replay` (the command) | {wall:.1f} | {peak:,.0f} | < 60 s, < 2 GB |"
            f" {'pass' if ok else '**miss**' if rc == 0 else f'exit {rc}'} |"]


if __name__ == "__main__":
    print(run())
