"""``read_routing``: one or more trace files, of any registered format, into
:class:`~placer.stats.RoutingData` (each file streamed into one accumulator)."""


from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from placer import constants
from placer.errors import TraceError
from placer.stats import RoutingData
from placer.traces.accumulate import Accumulator, ReadOptions
from placer.traces.chunks import TokenSample
from placer.traces.registry import TraceFormat, detect_format, folder_files, get_format

PathLike = str | os.PathLike[str]
#: ``progress(bytes read, bytes in all)``, called as the files are read.
ReadProgress = Callable[[int, int], None]

def read_routing(
    path: PathLike | Sequence[PathLike],
    format: str | None = None,
    *,
    window_tokens: int | None = None,
    keep_tokens: bool = False,
    coact: bool = True,
    affinity: bool = True,
    layers: Sequence[int] | None = None,
    num_experts: int | None = None,
    top_k: int | None = None,
    progress: ReadProgress | None = None,
    keep_warmup: bool = False,
    sample: TokenSample | None = None,
    pair_tokens: int | None = None,
) -> RoutingData:
    """Read one or more traces (or aggregated load files) into statistics.

    Parameters
    ----------
    path: a file, or several read as one trace (rank files, dumps of one run); their
        tokens are distinct, loads add up, windows follow steps (or token order).  A
        folder an engine writes (TensorRT-LLM's statistics, SGLang's recorder dumps)
        reads as its files.
    format: a name from :func:`format_names`; default: detected per file from its name's
        ending and content.
    window_tokens: windows of this many consecutive tokens instead of the trace's steps.
    keep_tokens: also return the per-token :class:`~placer.stats.RoutingTrace`
        (per-token formats only; memory grows with the trace).
    coact: count same-layer co-activation and layer affinity (sparse
        :class:`~placer.stats.PairCounts`, dense ``[layers, E, E]`` and ``[layers - 1,
        E, E]`` on request); False is faster.
    layers: absolute layer ids to keep (rows of other layers are skipped and counted).
    num_experts, top_k: the model's, checked against the data and any header; inferred
        from the data when neither gives them.
    progress: called with ``(bytes read, bytes in all)`` as inputs of at least
        ``constants.PROGRESS_MIN_BYTES`` (all files together) are read; the caller draws it.
    keep_warmup: count the rows of warm-up passes too.  By default runs of
        ``constants.WARMUP_RUN_ROWS`` or more identical consecutive selections in one
        layer (from one request) are an engine's profiling or warm-up pass: they are
        left out with a warning.
    affinity, sample, pair_tokens: reading within bounds, as ``placer plan`` reads (no
        affinity, a bounded :class:`TokenSample` of tokens, pairs counted on a sample
        past ``pair_tokens`` tokens): see :class:`ReadOptions`.

    Per-token rows whose (request, token, layer) repeats are read, not refused: the
    n-th row of a (request, token, layer) belongs to the n-th occurrence of the token,
    with one warning that counts them.

    Returns
    -------
    RoutingData with ``stats`` (always) and ``trace`` (``keep_tokens``, ``sample``).

    Raises
    ------
    TraceError: unreadable, malformed or inconsistent input (names the file and line,
        or array and index).
    UsageError: bad arguments (unknown format, layer not in the trace, ...).
    """
    paths = [Path(path)] if isinstance(path, str | os.PathLike) else [Path(p) for p in path]
    options = ReadOptions(
        window_tokens=window_tokens, keep_tokens=keep_tokens, coact=coact, affinity=affinity,
        layers=None if layers is None else tuple(int(i) for i in layers),
        num_experts=num_experts, top_k=top_k, keep_warmup=keep_warmup, sample=sample,
        pair_tokens=pair_tokens,
    )
    given = [(p, get_format(format) if format else detect_format(p)) for p in paths]
    # a folder an engine fills with files (SGLang's recorder dumps) reads as those files
    files = [(f, fmt) for p, fmt in given for f in folder_files(p, fmt)]
    paths, fmts = [p for p, _ in files], [fmt for _, fmt in files]
    acc = _accumulate(paths, fmts, options, progress)
    if acc.only_warmup():
        # nothing but identical rows is the data itself (a synthetic or degenerate
        # trace), not a warm-up pass before it: read again, keeping them
        acc = _accumulate(paths, fmts, replace(options, keep_warmup=True), progress)
        acc.notes.append(
            "every routing row is in a run of identical selections, as in a warm-up pass;"
            " they were counted since the trace has nothing else"
        )
    return acc.result()


def _accumulate(paths: list[Path], fmts: list[TraceFormat], options: ReadOptions,
                progress: ReadProgress | None) -> Accumulator:
    """Stream every file into one accumulator (not yet ended), saying the bytes read to
    ``progress`` when the inputs are large."""
    acc = Accumulator(options)
    total = sum(_size(p) for p in paths)
    if progress is not None and total >= constants.PROGRESS_MIN_BYTES:
        done = [0]

        def advance(nbytes: int) -> None:
            done[0] += nbytes
            progress(done[0], total)

        acc.set_progress(advance)
    for p, fmt in zip(paths, fmts, strict=True):
        if not p.exists():
            if p.is_symlink():
                raise TraceError(
                    "the link leads nowhere (its target is missing, or links loop)",
                    where=str(p), hint="point the link at the trace file",
                )
            raise TraceError("file not found", where=str(p), hint="check the path")
        acc.begin_source(str(p), fmt.name)
        fmt.read(p, acc)
    return acc


def _size(p: Path) -> int:
    try:
        if p.is_dir():
            return sum(f.stat().st_size for f in p.iterdir() if f.is_file())
        return p.stat().st_size
    except OSError:
        return 0
