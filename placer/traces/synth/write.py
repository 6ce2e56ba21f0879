"""Writing a synthetic trace with placer's own trace writers (NPZ or JSONL)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from placer.errors import UsageError
from placer.stats.skew import skew_report
from placer.traces.formats.jsonl.write import write_jsonl_trace
from placer.traces.formats.npz import write_npz_trace
from placer.traces.synth.generate import SynthChunk, synthesize
from placer.traces.synth.params import SynthParams

__all__ = ["write_synth"]


def write_synth(
    path: str | Path,
    params: SynthParams,
    *,
    format: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Generate ``params`` and write it with placer's trace writers.

    Parameters
    ----------
    path: output file; ``.npz`` or ``.jsonl`` / ``.jsonl.gz`` (or ``format``).
    format: ``"npz"`` or ``"jsonl"``; default from the file name.
    progress: called with ``(tokens done, tokens total)`` after each chunk.

    Returns
    -------
    ``{"path", "format", "tokens", "layers", "experts", "top_k", "seconds", "skew"}``;
    ``skew``: the written loads' skew against measured routing
    (:func:`placer.stats.skew.skew_report`, without the measured datasets' list).
    """
    fmt = format or _format_of(path)
    t0 = time.perf_counter()
    load = np.zeros((params.num_layers, params.num_experts), dtype=np.int64)

    def chunks() -> Iterator[SynthChunk]:
        for chunk in synthesize(params):
            for row in range(params.num_layers):
                ids = chunk.topk_ids[:, row, :].ravel().astype(np.int64)
                load[row] += np.bincount(ids, minlength=params.num_experts)
            yield chunk
            if progress is not None:
                progress(chunk.start + chunk.topk_ids.shape[0], params.num_tokens)

    writer = write_npz_trace if fmt == "npz" else write_jsonl_trace
    writer(
        path,
        (
            {"topk_ids": c.topk_ids, "step": c.step, "rank": c.rank, "topk_weights": c.topk_weights}
            for c in chunks()
        ),
        layer_ids=np.asarray(params.layer_ids, dtype=np.int64),
        meta=params.header(),
    )
    return {
        "path": str(path),
        "format": fmt,
        "tokens": params.num_tokens,
        "layers": params.num_layers,
        "experts": params.num_experts,
        "top_k": params.top_k,
        "seconds": time.perf_counter() - t0,
        "skew": {k: v for k, v in skew_report(load, np.asarray(params.layer_ids)).items()
                 if k != "measured"},
    }


def _format_of(path: str | Path) -> str:
    name = str(path).lower()
    if name.endswith(".npz"):
        return "npz"
    if name.endswith((".jsonl", ".jsonl.gz")):
        return "jsonl"
    raise UsageError(
        f"cannot tell the trace format of {path}",
        where="OUTPUT",
        hint="name the output .npz, .jsonl or .jsonl.gz, or pass `format` npz|jsonl",
    )
