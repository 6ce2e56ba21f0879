"""Writing a synthetic trace with placer's own trace writers (NPZ or JSONL)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from placer.errors import Param, UsageError
from placer.limits import check_disk
from placer.stats.skew import skew_report
from placer.traces.formats.jsonl.write import write_jsonl_trace
from placer.traces.formats.npz import write_npz_trace
from placer.traces.synth.fitted import FittedLaw, synthesize_from
from placer.traces.synth.fitted import header as fitted_header
from placer.traces.synth.generate import SynthChunk, synthesize
from placer.traces.synth.params import SynthParams

__all__ = ["write_fitted", "write_synth"]


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
    load = np.zeros((params.num_layers, params.num_experts), dtype=np.int64)
    return _write(path, format, synthesize(params), np.asarray(params.layer_ids, dtype=np.int64),
                  params.header(), params.num_tokens, params.top_k, load, progress)


def write_fitted(
    path: str | Path,
    law: FittedLaw,
    *,
    source: str,
    model: str | None,
    num_tokens: int,
    tokens_per_step: int,
    num_ranks: int = 0,
    drift: float = 0.0,
    seed: int = 0,
    format: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Generate tokens of a fitted law (:mod:`placer.traces.synth.fitted`) and write them
    as :func:`write_synth` does; the result also holds ``fit_error`` (the largest share of
    an expert's selections the fit missed by, on its own tokens)."""
    chunks = synthesize_from(law, num_tokens=num_tokens, tokens_per_step=tokens_per_step,
                             num_ranks=num_ranks, drift=drift, seed=seed)
    meta = fitted_header(law, source, model=model, num_tokens=num_tokens,
                         tokens_per_step=tokens_per_step, num_ranks=num_ranks, drift=drift,
                         seed=seed)
    load = np.zeros((law.layer_ids.size, law.num_experts), dtype=np.int64)
    result = _write(path, format, chunks, law.layer_ids, meta, num_tokens, law.top_k, load,
                    progress)
    return {**result, "fit_error": law.fit_error()}


def _write(path: str | Path, format: str | None, generated: Iterator[SynthChunk],
           layer_ids: np.ndarray, meta: dict[str, Any], num_tokens: int, top_k: int,
           load: np.ndarray, progress: Callable[[int, int], None] | None) -> dict[str, Any]:
    """Write ``generated`` with placer's trace writers, counting ``load`` on the way."""
    fmt = format or _format_of(path)
    t0 = time.perf_counter()
    num_layers, num_experts = load.shape
    check_disk(_disk_bytes(fmt, str(path), num_tokens, num_layers, top_k),
               Path(path).parent, f"{num_tokens:,} tokens x {num_layers:,} layers x top-{top_k}"
               f" ({fmt})", "fewer `tokens` or `layers`", where=Param("tokens"))

    def chunks() -> Iterator[SynthChunk]:
        for chunk in generated:
            for row in range(num_layers):
                ids = chunk.topk_ids[:, row, :].ravel().astype(np.int64)
                load[row] += np.bincount(ids, minlength=num_experts)
            yield chunk
            if progress is not None:
                progress(chunk.start + chunk.topk_ids.shape[0], num_tokens)

    writer = write_npz_trace if fmt == "npz" else write_jsonl_trace
    writer(
        path,
        (
            {"topk_ids": c.topk_ids, "step": c.step, "rank": c.rank, "topk_weights": c.topk_weights}
            for c in chunks()
        ),
        layer_ids=layer_ids,
        meta=meta,
    )
    return {
        "path": str(path),
        "format": fmt,
        "tokens": num_tokens,
        "layers": num_layers,
        "experts": num_experts,
        "top_k": top_k,
        "seconds": time.perf_counter() - t0,
        "skew": {k: v for k, v in skew_report(load, layer_ids).items() if k != "measured"},
    }


def _disk_bytes(fmt: str, path: str, tokens: int, layers: int, top_k: int) -> int:
    """The least disk a trace of this size takes while it is written: NPZ spools its raw
    arrays (2 bytes a selection, 16 a token) before it packs them; a JSONL row is about
    ``40 + 5 k`` characters, gzip about an eighth of that."""
    if fmt == "npz":
        return tokens * (layers * top_k * 2 + 16)
    text = tokens * layers * (40 + 5 * top_k)
    return text // 8 if path.lower().endswith(".gz") else text


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
