"""``read_routing``: one or more trace files, of any registered format, into
:class:`~placer.stats.RoutingData` (each file streamed into one accumulator)."""


from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from placer import constants
from placer.errors import TraceError
from placer.stats import RoutingData
from placer.traces.accumulate import Accumulator, ReadOptions
from placer.traces.registry import TraceFormat, detect_format, folder_files, get_format

PathLike = str | os.PathLike[str]

def read_routing(
    path: PathLike | Sequence[PathLike],
    format: str | None = None,
    *,
    window_tokens: int | None = None,
    keep_tokens: bool = False,
    coact: bool = True,
    layers: Sequence[int] | None = None,
    num_experts: int | None = None,
    top_k: int | None = None,
    progress: bool = False,
    keep_warmup: bool = False,
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
    progress: draw a progress bar on stderr for large inputs.
    keep_warmup: count the rows of warm-up passes too.  By default runs of
        ``constants.WARMUP_RUN_ROWS`` or more identical consecutive selections in one
        layer (from one request) are an engine's profiling or warm-up pass: they are
        left out with a warning.

    Per-token rows whose (request, token, layer) repeats are read, not refused: the
    n-th row of a (request, token, layer) belongs to the n-th occurrence of the token,
    with one warning that counts them.

    Returns
    -------
    RoutingData with ``stats`` (always) and ``trace`` (``keep_tokens`` only).

    Raises
    ------
    TraceError: unreadable, malformed or inconsistent input (names the file and line,
        or array and index).
    UsageError: bad arguments (unknown format, layer not in the trace, ...).
    """
    paths = [Path(path)] if isinstance(path, str | os.PathLike) else [Path(p) for p in path]
    options = ReadOptions(
        window_tokens=window_tokens,
        keep_tokens=keep_tokens,
        coact=coact,
        layers=None if layers is None else tuple(int(i) for i in layers),
        num_experts=num_experts,
        top_k=top_k,
        progress=progress,
        keep_warmup=keep_warmup,
    )
    given = [(p, get_format(format) if format else detect_format(p)) for p in paths]
    # a folder an engine fills with files (SGLang's recorder dumps) reads as those files
    files = [(f, fmt) for p, fmt in given for f in folder_files(p, fmt)]
    paths, fmts = [p for p, _ in files], [fmt for _, fmt in files]
    acc = _accumulate(paths, fmts, options)
    if acc.only_warmup():
        # nothing but identical rows is the data itself (a synthetic or degenerate
        # trace), not a warm-up pass before it: read again, keeping them
        acc = _accumulate(paths, fmts, replace(options, keep_warmup=True))
        acc.notes.append(
            "every routing row is in a run of identical selections, as in a warm-up pass;"
            " they were counted since the trace has nothing else"
        )
    return acc.result()


def _accumulate(paths: list[Path], fmts: list[TraceFormat], options: ReadOptions) -> Accumulator:
    """Stream every file into one accumulator (not yet ended)."""
    acc = Accumulator(options)
    total = sum(_size(p) for p in paths)
    bar = (
        _progress_bar(total)
        if options.progress and total >= constants.PROGRESS_MIN_BYTES
        else None
    )
    try:
        if bar is not None:
            prog, task = bar
            prog.start()
            acc.set_progress(lambda n: prog.advance(task, n))
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
    finally:
        if bar is not None:
            bar[0].stop()
    return acc


def _size(p: Path) -> int:
    try:
        if p.is_dir():
            return sum(f.stat().st_size for f in p.iterdir() if f.is_file())
        return p.stat().st_size
    except OSError:
        return 0


def _progress_bar(total: int) -> tuple[Any, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    prog = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=Console(file=sys.stderr),
        transient=True,
    )
    task = prog.add_task("reading trace", total=total)
    return prog, task
