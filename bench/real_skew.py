"""The skew of measured routing: ``python -m bench real_skew``.

Computes, for each measured dataset it can read, the per-layer range and median of the
four skew figures of :mod:`placer.stats.skew` (Gini, CV, max/mean, top-1% share), writes
them to ``placer/data/real_skew.json`` (what ``placer stats`` and ``placer plan`` place a
trace against) and returns them as a table.  Only figures are stored, never the data.

Datasets: the bundled Qwen3-30B-A3B statistics (``traces/qwen3-30b-a3b.npz``, always);
where the benchmarks' data folder is present, gpt-oss-20b's aggregated load and
Mixtral-8x7B's per-token vLLM logs (GSM8K and HumanEval together).  Without that folder
the file keeps the datasets it already holds that cannot be recomputed, and says so.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from bench.__main__ import SHARED_DATA
from placer.io.fileio import write_text_atomic
from placer.stats.skew import FIGURES, skew_of

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "placer" / "data" / "real_skew.json"
REAL = SHARED_DATA / "real"


def _qwen3() -> tuple[dict, np.ndarray]:
    data = np.load(REPO / "traces" / "qwen3-30b-a3b.npz")
    return {"name": "qwen3-30b-a3b", "model": "qwen3-30b-a3b",
            "tokens": int(np.asarray(data["tokens"]).sum()),
            "what": "decode, llama.cpp (3-bit GGUF), Dolly and CodeAlpaca prompts",
            "source": "github doramirdor/mbolt results/colibri-119 (bundled as"
                      " traces/qwen3-30b-a3b.npz)"}, data["load"]


def _gpt_oss() -> tuple[dict, np.ndarray] | None:
    path = REAL / "gpt-oss-20b" / "load_coact.npz"
    if not path.exists():
        return None
    return {"name": "gpt-oss-20b", "model": "gpt-oss-20b", "tokens": 872_749,
            "what": "prefill, Hugging Face transformers, 500 text rows up to 4,096 tokens",
            "source": "github radna0/cuda-norm data/20b_expert_usage.parquet"}, \
        np.load(path)["load"]


def _mixtral() -> tuple[dict, np.ndarray] | None:
    folder = REAL / "mixtral-8x7b"
    files = sorted(folder.glob("*_routing.jsonl")) if folder.exists() else []
    if not files:
        return None
    counts: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(8, dtype=np.int64))
    rows = 0
    for path in files:
        with path.open(encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                rows += 1
                for e in row["experts"]:
                    counts[int(row["layer"])][int(e)] += 1
    load = np.stack([counts[k] for k in sorted(counts)])
    return {"name": "mixtral-8x7b", "model": "mixtral-8x7b", "tokens": rows // len(counts),
            "what": "decode, vLLM FP8, 2 GSM8K and 2 HumanEval problems",
            "source": "github Mario928/speculative-moe routing_data_collected"}, load


def _entry(info: dict, load: np.ndarray) -> dict:
    skew = skew_of(load)
    figures = {}
    for name in FIGURES:
        values = getattr(skew, name)
        values = values[np.isfinite(values)]
        figures[name] = [round(float(values.min()), 4), round(float(np.median(values)), 4),
                         round(float(values.max()), 4)]
    return {**info, "num_experts": skew.num_experts, "layers": int(load.shape[0]),
            "figures": figures}


def run() -> str:
    found = [d for d in (_qwen3(), _gpt_oss(), _mixtral()) if d is not None]
    entries = {e["name"]: e for e in (_entry(*d) for d in found)}
    kept = []
    if OUT.exists():  # datasets this machine cannot read stay as they were measured
        kept = [d for d in json.loads(OUT.read_text(encoding="utf-8"))["datasets"]
                if d["name"] not in entries]
    datasets = sorted([*entries.values(), *kept], key=lambda d: -d["num_experts"])
    doc = {"format": "placer-real-skew", "version": 1,
           "about": "per-layer skew of measured routing: [min, median, max] over layers of"
                    " each figure (placer.stats.skew); regenerate with"
                    " `python -m bench real_skew`",
           "datasets": datasets}
    text = json.dumps(doc, indent=1)
    # one line per figure: [min, median, max]
    text = re.sub(r"\[\s+([-0-9.e]+),\s+([-0-9.e]+),\s+([-0-9.e]+)\s+\]", r"[\1, \2, \3]", text)
    write_text_atomic(OUT, text + "\n")
    lines = ["## real_skew: the skew of measured routing", "",
             "| dataset | experts | layers | Gini min / median / max | CV | max/mean"
             " | top-1% share | recomputed |", "|---|---:|---:|---|---|---|---|---|"]
    for d in datasets:
        f = d["figures"]
        cells = [" / ".join(f"{v:.2f}" for v in f[name]) for name in FIGURES]
        lines.append(f"| {d['name']} | {d['num_experts']} | {d['layers']} | "
                     + " | ".join(cells) + f" | {'yes' if d['name'] in entries else 'no'} |")
    if not SHARED_DATA.exists():
        lines += ["", f"({SHARED_DATA} is absent: only the bundled dataset was recomputed)"]
    return "\n".join(lines) + "\n"
