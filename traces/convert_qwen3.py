"""Convert the Qwen3-30B-A3B co-activation statistics to placer's aggregated ``.npz``.

Source: github doramirdor/mbolt, ``results/colibri-119/coactivation_qwen3-30b-a3b.json``
at commit e7e9dbf7 (MIT licence, see ``qwen3-30b-a3b.LICENSE``): 75,773 decode tokens
of Qwen3-30B-A3B (llama.cpp, IQ3_XXS GGUF) over Dolly and CodeAlpaca prompts.

Usage::

    .venv/bin/python traces/convert_qwen3.py SOURCE.json traces/qwen3-30b-a3b.npz

Output arrays (``np.savez_compressed``, no pickled objects):

- ``load`` int64 ``[48, 128]``: the source's ``heat`` (tokens that selected each expert);
- ``coact`` int32 ``[48, 128, 128]``: symmetric pair counts from ``pairs``, zero diagonal.
  PARTIAL: the source kept only pairs with count >= 5 and lift >= 1.5, at most 2,000 per
  layer, so every other entry is 0 whatever its true count (``coact_partial = True``);
- ``layer_ids`` int64 ``[48]`` = 0..47, ``top_k`` = 8, ``num_experts`` = 128,
  ``tokens`` = 75,773, ``model``, ``source``, ``synthetic`` = False, and the thresholds
  ``coact_partial``, ``coact_min_count``, ``coact_min_lift``, ``coact_max_pairs``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

SOURCE = "github.com/doramirdor/mbolt results/colibri-119 @ e7e9dbf7 (MIT)"
MIN_COUNT, MIN_LIFT, MAX_PAIRS = 5, 1.5, 2000


def convert(src: Path) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` built from the source JSON."""
    doc = json.loads(src.read_text())
    num_layers, num_experts, top_k = doc["n_layers"], doc["n_expert_per_layer"], doc["k"]
    load = np.zeros((num_layers, num_experts), dtype=np.int64)
    coact = np.zeros((num_layers, num_experts, num_experts), dtype=np.int32)
    for entry in doc["layers"]:
        row = int(entry["layer"])
        load[row] = entry["heat"]
        for i, j, count, _lift in entry["pairs"]:
            coact[row, i, j] = coact[row, j, i] = count
    tokens = int(doc["n_decode_tokens"])
    if not (load.sum(axis=1) == tokens * top_k).all():
        raise SystemExit("heat does not sum to tokens x top_k in every layer")
    return {
        "load": load,
        "coact": coact,
        "layer_ids": np.arange(num_layers, dtype=np.int64),
        "top_k": np.int64(top_k),
        "num_experts": np.int64(num_experts),
        "tokens": np.int64(tokens),
        "model": np.str_("qwen3-30b-a3b"),
        "source": np.str_(SOURCE),
        "synthetic": np.bool_(False),
        "coact_partial": np.bool_(True),
        "coact_min_count": np.int64(MIN_COUNT),
        "coact_min_lift": np.float64(MIN_LIFT),
        "coact_max_pairs": np.int64(MAX_PAIRS),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write(__doc__ or "")
        return 2
    arrays = convert(Path(argv[0]))
    out = Path(argv[1])
    tmp = out.with_name(out.name + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)  # type: ignore[arg-type]
    tmp.replace(out)
    print(f"wrote {out} ({out.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
