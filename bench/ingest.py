"""Trace ingestion speed and memory (``python -m bench ingest``).

Measures ``placer.traces.read_routing`` on:

1. a DeepSeek-V3-shaped synthetic trace (MoE layers 3..60, 256 experts, top-8, skewed
   routing, steps of 64 tokens) as NPZ, JSONL and JSONL.gz, with co-activation and
   layer affinity on (the default) and off;
2. a Mixtral-8x7B-shaped one (32 layers, 8 experts, top-2): short rows, the hard case
   for JSONL;
3. the real Mixtral-8x7B vLLM logs in ``shared/data/real/mixtral-8x7b`` when present;
4. peak memory of a separate process reading a ~2 GB JSONL trace (``resource.getrusage``
   ``ru_maxrss``), built by repeating one written block under new request labels.

Throughput is (token, expert) selections per second of CPU time (``process_time``) and
of wall-clock time; the machine is shared, so wall-clock figures swing with its load.
Generated files live in a temporary folder that is deleted afterwards.  Set
``PLACER_BENCH_INGEST_BYTES`` to change the size of the memory run (default 2e9).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from bench.__main__ import SHARED_DATA
from placer.traces import read_routing, write_jsonl_trace, write_npz_trace

#: Targets on the 2-core development machine, selections per second.
NPZ_TARGET = 10e6
JSONL_TARGET = 1e6
#: Peak memory target of the 2 GB JSONL read, bytes.
MEMORY_TARGET = 1e9


def skewed_ids(tokens: int, layers: int, experts: int, k: int, seed: int) -> np.ndarray:
    """``[tokens, layers, k]`` int16 top-k without replacement from per-layer Zipf-like
    expert popularity (Gumbel top-k on log-probabilities)."""
    rng = np.random.default_rng(seed)
    out = np.empty((tokens, layers, k), dtype=np.int16)
    ranks = np.arange(1, experts + 1)
    for layer in range(layers):
        logp = np.log(1.0 / ranks**1.1)[rng.permutation(experts)]
        for s in range(0, tokens, 4096):
            n = min(4096, tokens - s)
            g = logp - np.log(-np.log(rng.random((n, experts))))
            out[s : s + n, layer] = np.argpartition(-g, k, axis=1)[:, :k]
    return out


def timed(path: Path | list[Path], **kwargs: object) -> tuple[float, float, object]:
    """(CPU seconds, wall seconds, RoutingData) of one read."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c0, w0 = time.process_time(), time.perf_counter()
        data = read_routing(path, **kwargs)  # type: ignore[arg-type]
        return time.process_time() - c0, time.perf_counter() - w0, data


def rate(n: float, seconds: float) -> str:
    return f"{n / seconds / 1e6:.2f} M/s"


def verdict(value: float, target: float) -> str:
    if value >= target:
        return "meets"
    return f"misses ({value / target:.0%} of target)"


def _speed_rows(folder: Path) -> tuple[list[str], dict[tuple[str, str], float]]:
    """Table rows, and CPU-time rates with co-activation on by (shape, format)."""
    rows = []
    best: dict[tuple[str, str], float] = {}
    shapes = [
        ("DeepSeek-V3 shape (58 x 256, top-8)", 12_000, 58, 256, 8, np.arange(3, 61)),
        ("Mixtral shape (32 x 8, top-2)", 60_000, 32, 8, 2, np.arange(32)),
    ]
    for label, tokens, layers, experts, k, layer_ids in shapes:
        ids = skewed_ids(tokens, layers, experts, k, seed=1)
        weights = np.random.default_rng(2).random(ids.shape).astype(np.float32)
        step = np.arange(tokens) // 64
        meta = {"model": label, "num_experts": experts}
        files = {
            "npz": folder / f"{k}.npz",
            "jsonl": folder / f"{k}.jsonl",
            "jsonl.gz": folder / f"{k}.jsonl.gz",
        }
        c0, w0 = time.process_time(), time.perf_counter()
        write_npz_trace(files["npz"], ids, layer_ids=layer_ids, step=step, topk_weights=weights,
                        meta=meta)
        npz_write = time.process_time() - c0, time.perf_counter() - w0
        c0, w0 = time.process_time(), time.perf_counter()
        write_jsonl_trace(files["jsonl"], ids, layer_ids=layer_ids, step=step,
                          topk_weights=weights, meta=meta)
        jsonl_write = time.process_time() - c0, time.perf_counter() - w0
        write_jsonl_trace(files["jsonl.gz"], ids, layer_ids=layer_ids, step=step,
                          topk_weights=weights, meta=meta)
        sel = ids.size
        for fmt, path in files.items():
            for coact in (True, False):
                cpu, wall, data = timed(path, coact=coact)
                stats = data.stats  # type: ignore[attr-defined]
                assert stats.mean_load.sum() == sel
                size = path.stat().st_size / 1e6
                rows.append(
                    f"| {label} | {fmt} | {'on' if coact else 'off'} | {size:.0f} MB |"
                    f" {sel / 1e6:.1f} M | {cpu:.2f} s | {rate(sel, cpu)} | {rate(sel, wall)} |"
                )
                if coact:
                    best[(label.split(" (")[0], fmt)] = sel / cpu
        rows.append(
            f"| {label} | write npz / jsonl | | | {sel / 1e6:.1f} M |"
            f" {npz_write[0]:.2f} / {jsonl_write[0]:.2f} s |"
            f" {rate(sel, npz_write[0])} / {rate(sel, jsonl_write[0])} |"
            f" {rate(sel, npz_write[1])} / {rate(sel, jsonl_write[1])} |"
        )
    return rows, best


def _real_rows() -> list[str]:
    folder = SHARED_DATA / "real" / "mixtral-8x7b"
    files = sorted(folder.glob("*.jsonl")) if folder.is_dir() else []
    if not files:
        return [f"(real Mixtral logs not found under {folder}; skipped)"]
    cpu, wall, data = timed(files, keep_tokens=True)
    s = data.stats  # type: ignore[attr-defined]
    sel = int(s.mean_load.sum())
    return [
        f"Real Mixtral-8x7B vLLM logs ({', '.join(f.name for f in files)}):"
        f" {s.provenance.rows_read} rows, {s.total_tokens} tokens, {s.num_layers} layers x"
        f" {s.num_experts} experts, top-{s.top_k}, {s.num_windows} windows;"
        f" read with keep_tokens in {cpu:.2f} s CPU / {wall:.2f} s wall"
        f" ({rate(sel, cpu)} CPU); rows skipped: {s.provenance.skipped_total}."
    ]


_CHILD = """
import json, resource, sys, time, warnings


def hwm_kb():
    # peak RSS of this process image; ru_maxrss on Linux also counts the parent's RSS
    # at fork, which exec does not reset
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


import numpy
import placer.traces
base = hwm_kb()
warnings.simplefilter("ignore")
c0, w0 = time.process_time(), time.perf_counter()
data = placer.traces.read_routing(sys.argv[1])
cpu, wall = time.process_time() - c0, time.perf_counter() - w0
s = data.stats
print(json.dumps({"base_kb": base, "peak_kb": hwm_kb(),
                  "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "cpu": cpu, "wall": wall, "rows": s.provenance.rows_read,
                  "tokens": s.total_tokens, "selections": int(s.mean_load.sum())}))
"""


def _memory_row(folder: Path, target_bytes: int) -> tuple[list[str], float]:
    """Build a ~target_bytes JSONL by repeating one block under new request labels."""
    tokens = 3000
    ids = skewed_ids(tokens, 58, 256, 8, seed=3)
    weights = np.random.default_rng(4).random(ids.shape).astype(np.float32)
    block_path = folder / "block.jsonl"
    write_jsonl_trace(block_path, ids, layer_ids=np.arange(3, 61), step=np.arange(tokens) // 64,
                      topk_weights=weights, request=np.full(tokens, "q"),
                      meta={"model": "DeepSeek-V3 shape", "num_experts": 256})
    header, block = block_path.read_bytes().split(b"\n", 1)
    block_path.unlink()
    big = folder / "big.jsonl"
    copies = max(1, round(target_bytes / len(block)))
    with open(big, "wb") as f:
        f.write(header + b"\n")
        for i in range(copies):
            f.write(block.replace(b'"request": "q"', f'"request": "c{i:04d}"'.encode()))
    size = big.stat().st_size
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(big)], capture_output=True,
                          text=True, check=False)
    big.unlink()
    if proc.returncode != 0:
        return [f"memory run failed: {proc.stderr.strip()[-500:]}"], float("inf")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    peak = r["peak_kb"] * 1024
    rows = [
        "| file | rows | tokens | selections | peak RSS | of which imports | CPU | wall |"
        " throughput (CPU / wall) |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {size / 1e9:.2f} GB JSONL (DeepSeek-V3 shape) | {r['rows'] / 1e6:.1f} M |"
        f" {r['tokens'] / 1e3:.0f} k | {r['selections'] / 1e6:.0f} M | {peak / 1e6:.0f} MB |"
        f" {r['base_kb'] * 1024 / 1e6:.0f} MB | {r['cpu']:.0f} s | {r['wall']:.0f} s |"
        f" {rate(r['selections'], r['cpu'])} / {rate(r['selections'], r['wall'])} |",
    ]
    rows.append("")
    rows.append(
        "Peak RSS is the reading process's high-water mark (VmHWM);"
        f" resource.getrusage ru_maxrss says {r['maxrss_kb'] * 1024 / 1e6:.0f} MB because on"
        " Linux it keeps the parent's resident size at fork across exec."
    )
    return rows, peak


def run() -> str:
    target_bytes = int(float(os.environ.get("PLACER_BENCH_INGEST_BYTES", "2e9")))
    out = ["## ingest", ""]
    out.append(
        f"Machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start"
        " (shared with other work: wall-clock rates swing with it; CPU-time rates less);"
        f" Python {sys.version.split()[0]}, NumPy {np.__version__}, one thread (no BLAS)."
    )
    out.append("")
    with tempfile.TemporaryDirectory(prefix="placer-bench-ingest-") as tmp:
        folder = Path(tmp)
        speed, best = _speed_rows(folder)
        out += [
            "| trace | format | co-activation + affinity | file | selections | CPU |"
            " selections/s (CPU) | selections/s (wall) |",
            "|---|---|---|---|---|---|---|---|",
            *speed,
            "",
        ]
        parts = []
        for fmt, target in (("npz", NPZ_TARGET), ("jsonl", JSONL_TARGET)):
            for shape in ("DeepSeek-V3 shape", "Mixtral shape"):
                r = best.get((shape, fmt), 0.0)
                parts.append(f"{fmt.upper()} {shape} {r / 1e6:.2f} M/s:"
                             f" {verdict(r, target)}")
        out.append(
            f"Targets with co-activation on (CPU time): NPZ >= {NPZ_TARGET / 1e6:.0f} M/s,"
            f" JSONL >= {JSONL_TARGET / 1e6:.0f} M/s. " + "; ".join(parts) + "."
        )
        out.append("")
        out += _real_rows()
        out.append("")
        mem, peak = _memory_row(folder, target_bytes)
        out += mem
        out.append("")
        out.append(
            f"Peak memory target < {MEMORY_TARGET / 1e9:.0f} GB for a 2 GB JSONL:"
            f" {verdict(MEMORY_TARGET / max(peak, 1), 1.0) if peak > MEMORY_TARGET else 'meets'}"
            f" ({peak / 1e6:.0f} MB)."
        )
    return "\n".join(out) + "\n"
