"""Files the README's commands read that the repository does not bundle: an engine's
recorder dumps, statistics folders and measured timings, small but shaped as the real
ones (DeepSeek-V3: 61 hidden layers, MoE layers 3-60, 256 experts, top-8)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from safetensors_fixture import write_safetensors

from placer.ptfile import save_pt

REPO = Path(__file__).resolve().parent.parent
HIDDEN_LAYERS, FIRST_MOE, EXPERTS, TOP_K = 61, 3, 256, 8


def _choices(rng: np.random.Generator, tokens: int) -> np.ndarray:
    """``[tokens, TOP_K]`` distinct experts per token, skewed (a few hot experts)."""
    weights = 1.0 / np.arange(1, EXPERTS + 1) ** 0.8
    keys = np.log(weights)[None, :] + rng.gumbel(size=(tokens, EXPERTS))
    return np.argsort(-keys, axis=1)[:, :TOP_K]


def sglang_dumps(folder: Path, ranks: int = 2, passes: int = 2, tokens: int = 32) -> None:
    """SGLang per_token recorder dumps, one file per rank, as
    ``expert_distribution_recorder_{time}_{rank}.pt`` (no redundant experts: the
    physical-to-logical map is the identity)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    p2l = np.tile(np.arange(EXPERTS, dtype=np.int64), (HIDDEN_LAYERS, 1))
    for rank in range(ranks):
        records = []
        for step in range(passes):
            topk = np.full((HIDDEN_LAYERS, tokens, TOP_K), -1, dtype=np.int32)
            for layer in range(FIRST_MOE, HIDDEN_LAYERS):
                topk[layer] = _choices(rng, tokens)
            records.append({
                "forward_pass_id": step, "rank": rank, "gatherer_key": "primary",
                "input_ids": list(range(tokens)), "positions": list(range(tokens)),
                "extend_seq_lens": [tokens], "forward_mode": 1, "topk_ids_of_layer": topk,
                "misc_objects": [],
                "global_physical_count": np.zeros((HIDDEN_LAYERS, EXPERTS), dtype=np.int32),
            })
        save_pt({"records": records, "last_physical_to_logical_map": p2l},
                folder / f"expert_distribution_recorder_1700000000.5_{rank}.pt")


def trtllm_statistics(folder: Path, ranks: int = 2, iterations: tuple[int, ...] = (100, 101),
                      tokens: int = 64) -> None:
    """TensorRT-LLM expert statistics (``EXPERT_STATISTIC_PATH``): ``meta_info.json`` and
    ``rank{r}.safetensors`` keyed ``"{iteration}_{layer}"``, counts over the experts."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "meta_info.json").write_text(
        json.dumps({"num_experts": EXPERTS, "num_experts_per_token": TOP_K}))
    rng = np.random.default_rng(8)
    for rank in range(ranks):
        tensors = {}
        for it in iterations:
            for layer in range(FIRST_MOE, HIDDEN_LAYERS):
                picks = _choices(rng, tokens).ravel()
                tensors[f"{it}_{layer}"] = np.bincount(picks, minlength=EXPERTS)
        write_safetensors(folder / f"rank{rank}.safetensors", tensors)


def timings(path: Path) -> None:
    """A timings CSV as ``placer calibrate`` reads it: DeepEP's published rows (the
    measurements a cluster's own run would give, in the same format)."""
    shutil.copyfile(REPO / "bench" / "data" / "deepep_v1.csv", path)


def readme_workdir(folder: Path) -> Path:
    """A working directory holding every input the README's commands name."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "traces").symlink_to(REPO / "traces", target_is_directory=True)
    sglang_dumps(folder / "dumps")
    trtllm_statistics(folder / "stats")
    timings(folder / "timings.csv")
    return folder
