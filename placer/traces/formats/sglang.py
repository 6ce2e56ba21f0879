"""SGLang expert-distribution recorder dumps (``.pt``), read without torch.

SGLang (python/sglang/srt/eplb/expert_distribution.py) writes one of three layouts
with ``torch.save``; placer reads them with :func:`placer.io.ptfile.load_pt`:

``stat`` mode, one file from rank 0, ``expert_distribution_recorder_{time}.pt``::

    {"rank": 0,
     "logical_count": int32 [buffer_steps, num_hidden_layers, num_experts],  # summed over ranks
     "average_utilization_rate_over_window": float | None}

  Steps become windows.  Steps that are all zero (buffer slots never filled) are
  dropped; layers that are all zero (dense layers) are dropped.  Once the circular
  buffer has wrapped, its steps are not in time order: windows then are not either.
  The file does not say the top-k: pass ``top_k`` (``--top-k``).

``per_token`` mode, one file per rank, ``expert_distribution_recorder_{time}_{rank}.pt``::

    {"records": [{"forward_pass_id", "rank", "topk_ids_of_layer": int32
                  [num_hidden_layers, tokens, 8], ...}, ...],
     "last_physical_to_logical_map": [num_hidden_layers, num_physical_experts]}

  ``topk_ids_of_layer`` holds PHYSICAL expert ids (-1 padded; dense layers all -1);
  each is mapped to its logical expert with ``last_physical_to_logical_map`` (the
  map at dump time: if EPLB moved experts while recording, earlier records are
  mapped with the later map).  The step of a token is its record's
  ``forward_pass_id``; its source rank is the record's ``rank``.  Read every rank's
  file together to see all tokens.

``per_pass`` mode, the same files and map, each record holding the pass's counts
(``_DetailAccumulator`` with a counting gatherer)::

    {"forward_pass_id", "rank", "gatherer_key",
     "global_physical_count": int [num_hidden_layers, num_physical_experts]}

  Each physical slot's count goes to its logical expert through
  ``last_physical_to_logical_map`` (a logical expert's count is the sum over its
  replicas); layers that count nothing (dense layers) are dropped.  Each forward pass
  is a window at its ``forward_pass_id`` (merged pairwise past ``MAX_WINDOWS``); rank
  files read together add up pass by pass.  The file does not say the top-k: pass
  ``top_k`` (``--top-k``).

Detection: any torch zip archive (:func:`placer.io.ptfile.is_torch_archive`, by its
members: a real dump's keys may sit megabytes into ``data.pkl``), whatever its name; and
a folder holding ``expert_distribution_recorder_*.pt`` files, as the recorder writes them
(``SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR``), in any mode: it reads as those files, in
the order of their time stamp and rank (:func:`dump_files`).

Memory stays bounded whatever the number of records (docs/limits.md): per_pass counts
are mapped and accumulated a batch of passes at a time, per_token records go to the
accumulator in chunks of about ``constants.CHUNK_ROWS`` rows.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from placer import constants
from placer.errors import DataError, TraceError
from placer.io.ptfile import is_torch_archive, load_pt
from placer.traces.accumulate import Accumulator, TokenChunk, check_counts
from placer.traces.registry import register_format

FORMAT = "sglang"

#: Records of a per_pass dump mapped to logical experts at a time (bounds temporaries) ...
_PASS_BATCH = 1024
#: ... and at most this many bytes of their counts.
_PASS_BATCH_BYTES = 64 << 20

_DUMP_HINT = "dump with SGLang's expert distribution recorder (docs/engines.md)"


def load_dump(path: Path) -> dict[str, Any]:
    """The dump as a dict of numpy arrays and plain values; TraceError when unreadable."""
    try:
        dump = load_pt(path)
    except DataError as e:
        raise TraceError(e.message, where=e.where, hint=e.hint) from None
    if not isinstance(dump, dict):
        raise TraceError(
            f"expected a dict from SGLang's recorder, got {type(dump).__name__}",
            where=str(path), hint=_DUMP_HINT,
        )
    return dump


def read(path: Path, acc: Accumulator) -> None:
    """Accumulate one SGLang recorder dump (``stat``, ``per_token`` or ``per_pass`` mode)."""
    dump = load_dump(path)
    if "logical_count" in dump:
        _read_stat(path, dump, acc)
    elif "records" in dump and "last_physical_to_logical_map" in dump:
        records = dump["records"]
        if not isinstance(records, list):
            raise TraceError(
                "records must be a list", where=f"{path}: records", hint=_DUMP_HINT
            )
        if _per_pass(path, records):
            _read_per_pass(path, dump, acc)
        else:
            _read_per_token(path, dump, acc)
    else:
        raise TraceError(
            f"not an SGLang expert-distribution dump (keys: {', '.join(map(str, dump))})",
            where=str(path),
            hint="expected logical_count (stat mode), or records and"
            " last_physical_to_logical_map (per_token and per_pass modes)",
        )


def _per_pass(path: Path, records: list[Any]) -> bool:
    """Whether the records are per_pass ones (counts, no per-token ids)."""
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise TraceError(
                f"a record must be a dict, got {type(record).__name__}",
                where=f"{path}: records[{i}]", hint=_DUMP_HINT,
            )
        if "topk_ids_of_layer" in record:
            return False
        if "global_physical_count" not in record:
            raise TraceError(
                "the record has neither topk_ids_of_layer (per_token mode) nor"
                " global_physical_count (per_pass mode)",
                where=f"{path}: records[{i}]",
                hint="dump with --expert-distribution-recorder-mode per_token or per_pass",
            )
    return bool(records)


def _read_stat(path: Path, dump: dict[str, Any], acc: Accumulator) -> None:
    count = dump["logical_count"]
    where = f"{path}: logical_count"
    if not isinstance(count, np.ndarray) or count.ndim != 3:
        shape = getattr(count, "shape", None)
        raise TraceError(
            f"logical_count must be [steps, layers, experts], got shape {shape}", where=where,
            hint=_DUMP_HINT,
        )
    if not np.issubdtype(count.dtype, np.integer):
        raise TraceError(
            "logical_count must hold non-negative integer counts", where=where,
            hint=_DUMP_HINT,
        )
    if count.shape[1] > constants.MAX_LAYERS:
        raise TraceError(
            f"logical_count has {count.shape[1]} layers, more than placer handles"
            f" ({constants.MAX_LAYERS})", where=where, hint="limits: docs/limits.md",
        )
    count = check_counts(count, "logical_count", where)
    steps = np.flatnonzero(count.sum(axis=(1, 2)) > 0)
    layers = np.flatnonzero(count.sum(axis=(0, 2)) > 0)
    if steps.size == 0:
        raise TraceError(
            "logical_count is all zero: nothing was recorded", where=where,
            hint="dump after the recorder has seen forward passes",
        )
    acc.declare(where=where, num_experts=count.shape[2])
    load = count[steps][:, layers].astype(np.int64)
    load, starts = fold_windows(load, steps.astype(np.int64))
    acc.skip("empty recorder step", int(count.shape[0] - steps.size))
    acc.add_aggregate(load, layer_ids=layers.astype(np.int64), window_starts=starts, where=where)


def _physical_to_logical(path: Path, dump: dict[str, Any], acc: Accumulator) -> np.ndarray:
    """``last_physical_to_logical_map [layers, physical]``, checked and declared."""
    p2l = dump["last_physical_to_logical_map"]
    map_where = f"{path}: last_physical_to_logical_map"
    if not isinstance(p2l, np.ndarray) or p2l.ndim != 2 or p2l.size == 0:
        raise TraceError(
            "expected a [layers, physical experts] map", where=map_where, hint=_DUMP_HINT
        )
    if not np.issubdtype(p2l.dtype, np.integer) or int(p2l.min()) < 0:
        raise TraceError(
            "the map must hold logical expert ids >= 0", where=map_where, hint=_DUMP_HINT
        )
    if p2l.shape[0] > constants.MAX_LAYERS or p2l.shape[1] > 4 * constants.MAX_EXPERTS:
        raise TraceError(
            f"the map has shape {p2l.shape}: more layers or physical slots than placer"
            " handles", where=map_where, hint="limits: docs/limits.md",
        )
    acc.declare(where=map_where, num_experts=int(p2l.max()) + 1)
    return p2l.astype(np.int64)


def _read_per_pass(path: Path, dump: dict[str, Any], acc: Accumulator) -> None:
    p2l = _physical_to_logical(path, dump, acc)
    num_layers, num_physical = p2l.shape
    num_experts = int(p2l.max()) + 1
    records = dump["records"]
    where = f"{path}: records[*].global_physical_count"
    # Step 1: check every record; the layers that count something are the MoE layers
    used = np.zeros(num_layers, dtype=bool)
    steps = np.zeros(len(records), dtype=np.int64)
    for i, record in enumerate(records):
        rec_where = f"{path}: records[{i}]"
        used |= _pass_counts(record, rec_where, p2l.shape).any(axis=1)
        steps[i] = _int_field(record, "forward_pass_id", rec_where)
    layers = np.flatnonzero(used)
    if layers.size == 0:
        raise TraceError(
            "global_physical_count is all zero: nothing was recorded", where=where,
            hint="dump after the recorder has seen forward passes",
        )
    # Step 2: a logical expert's count is the sum over its replicas; passes in step order
    # (windows align to the first step, as if all came at once), a bounded batch at a time
    order = np.argsort(steps, kind="stable")
    p2l_moe = p2l[layers]
    width = max(num_physical, num_experts) * layers.size * 8
    batch = max(1, min(_PASS_BATCH, _PASS_BATCH_BYTES // width))
    layer_index = np.arange(layers.size)[None, :, None]
    for lo in range(0, len(records), batch):
        part = order[lo : lo + batch].tolist()
        phys = np.stack(
            [np.asarray(records[j]["global_physical_count"])[layers] for j in part]
        ).astype(np.int64)
        out = np.zeros((len(part), layers.size, num_experts), dtype=np.int64)
        np.add.at(out, (np.arange(len(part))[:, None, None], layer_index, p2l_moe[None]), phys)
        acc.add_step_counts(out, steps[part], layer_ids=layers, where=where)


def _pass_counts(record: dict[str, Any], where: str, shape: tuple[int, int]) -> np.ndarray:
    """``global_physical_count [layers, physical]`` of one per_pass record, checked."""
    counts = record["global_physical_count"]
    if not isinstance(counts, np.ndarray) or counts.shape != shape:
        got = getattr(counts, "shape", type(counts).__name__)
        raise TraceError(
            f"global_physical_count has shape {got}, expected {list(shape)} (layers and"
            " physical experts of last_physical_to_logical_map)",
            where=where, hint=_DUMP_HINT,
        )
    if not np.issubdtype(counts.dtype, np.integer) or (counts < 0).any():
        raise TraceError(
            "global_physical_count must hold counts >= 0", where=f"{where}.global_physical_count",
            hint="a count is how often tokens selected the slot; it cannot be negative",
        )
    if float(counts.sum(dtype=np.float64)) > constants.MAX_TOTAL_COUNT:
        raise TraceError(
            "global_physical_count adds up to more than placer counts (2^53 selections)",
            where=f"{where}.global_physical_count", hint="limits: docs/limits.md",
        )
    return counts


def _read_per_token(path: Path, dump: dict[str, Any], acc: Accumulator) -> None:
    p2l = _physical_to_logical(path, dump, acc)
    num_layers, num_physical = p2l.shape
    records = dump["records"]
    chunks = []  # (record index, record, topk ids [layers, tokens, 8]) of non-empty records
    for i, record in enumerate(records):
        topk = _record_topk(record, f"{path}: records[{i}]", num_layers, num_physical)
        if topk.shape[1]:
            chunks.append((i, record, topk))
    # MoE layers are those where some token selected an expert; dense rows stay -1.
    moe = (
        np.flatnonzero(np.any([(t >= 0).any(axis=(1, 2)) for _, _, t in chunks], axis=0))
        if chunks else np.zeros(0, dtype=np.int64)
    )
    if moe.size == 0:
        acc.skip("empty recorder file")
        return
    width = max(int((t[moe] >= 0).sum(axis=2).max()) for _, _, t in chunks)
    ids: list[np.ndarray] = []
    steps: list[np.ndarray] = []
    ranks: list[np.ndarray] = []
    rows = offset = 0

    def flush() -> None:
        # chunks of about CHUNK_ROWS rows: the accumulator's per-call cost is paid
        # rarely, and records that share one tensor do not multiply memory
        nonlocal rows, offset
        chunk = TokenChunk(
            topk_ids=np.ascontiguousarray(np.concatenate(ids)),
            step=np.concatenate(steps),
            rank=np.concatenate(ranks),
        )
        acc.add_tokens(chunk, moe, token_offset=offset, array="records[*].topk_ids_of_layer")
        offset += chunk.topk_ids.shape[0]
        ids.clear()
        steps.clear()
        ranks.clear()
        rows = 0

    for i, record, topk in chunks:
        where = f"{path}: records[{i}]"
        phys = topk[moe][:, :, :width]  # [layers, tokens, k]
        logical = np.where(phys >= 0, p2l[moe[:, None, None], np.maximum(phys, 0)], -1)
        tokens = logical.shape[1]
        ids.append(logical.transpose(1, 0, 2))
        steps.append(np.full(tokens, _int_field(record, "forward_pass_id", where), np.int64))
        ranks.append(np.full(tokens, _int_field(record, "rank", where), np.int64))
        rows += tokens * moe.size
        if rows >= constants.CHUNK_ROWS:
            flush()
    if ids:
        flush()


def _record_topk(record: Any, where: str, num_layers: int, num_physical: int) -> np.ndarray:
    """``topk_ids_of_layer [layers, tokens, 8]`` of one record, checked."""
    if not isinstance(record, dict) or "topk_ids_of_layer" not in record:
        raise TraceError(
            "a per_token record needs topk_ids_of_layer", where=where, hint=_DUMP_HINT
        )
    topk = record["topk_ids_of_layer"]
    if not isinstance(topk, np.ndarray) or topk.ndim != 3 or topk.shape[0] != num_layers:
        shape = getattr(topk, "shape", None)
        raise TraceError(
            f"topk_ids_of_layer has shape {shape}, expected [{num_layers}, tokens, k]"
            " (one row per layer of last_physical_to_logical_map)",
            where=where, hint=_DUMP_HINT,
        )
    if not np.issubdtype(topk.dtype, np.integer):
        raise TraceError(
            f"topk_ids_of_layer must be integers, got {topk.dtype}", where=where,
            hint=_DUMP_HINT,
        )
    if not 1 <= topk.shape[2] <= constants.MAX_TOP_K:
        raise TraceError(
            f"topk_ids_of_layer has {topk.shape[2]} ids per token; expected 1 to"
            f" {constants.MAX_TOP_K}", where=where, hint=_DUMP_HINT,
        )
    bad = (topk < -1) | (topk >= num_physical)
    if bad.any():
        layer, token, k = (int(x) for x in np.argwhere(bad)[0])
        raise TraceError(
            f"physical expert id {int(topk[layer, token, k])} is outside [0, {num_physical})",
            where=f"{where}.topk_ids_of_layer[{layer}, {token}, {k}]",
            hint="ids are physical slots of last_physical_to_logical_map; -1 marks none",
        )
    return topk


def _int_field(record: dict[str, Any], key: str, where: str) -> int:
    value = record.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 62:
        raise TraceError(
            f"{key} must be an integer >= 0, got {value!r:.40}", where=where, hint=_DUMP_HINT
        )
    return value


def fold_windows(load: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge adjacent windows pairwise until at most ``constants.MAX_WINDOWS`` remain.

    Parameters
    ----------
    load: ``[windows, layers, experts]`` counts.
    starts: ``[windows]`` first step of each window.

    Returns
    -------
    ``(load, starts)`` with windows summed in aligned pairs (the last may be single).
    """
    while load.shape[0] > constants.MAX_WINDOWS:
        w = load.shape[0]
        pairs = load[: w - w % 2].reshape(w // 2, 2, *load.shape[1:]).sum(axis=1)
        load = np.concatenate([pairs, load[w - w % 2 :]]) if w % 2 else pairs
        starts = starts[::2]
    return load, starts


def sniff(path: Path, head: bytes) -> bool:
    """A torch zip archive, told by its members (the pickle's keys may sit anywhere)."""
    return head[:4] == b"PK\x03\x04" and is_torch_archive(path)


#: The name SGLang's recorder gives its dumps: ``expert_distribution_recorder_{time}.pt``
#: (``stat``) or ``expert_distribution_recorder_{time}_{rank}.pt`` (``per_token``,
#: ``per_pass``).
DUMP_GLOB = "expert_distribution_recorder_*.pt"
_DUMP_NAME = re.compile(r"expert_distribution_recorder_(\d+(?:\.\d*)?)(?:_(\d+))?\.pt")


def dump_files(folder: Path) -> list[Path]:
    """The recorder dumps in ``folder`` (:data:`DUMP_GLOB`), by time stamp then rank."""
    def order(p: Path) -> tuple[float, int, str]:
        named = _DUMP_NAME.fullmatch(p.name)
        if named is None:
            return (math.inf, 0, p.name)
        return (float(named.group(1)), int(named.group(2) or 0), p.name)

    try:
        return sorted((p for p in folder.glob(DUMP_GLOB) if p.is_file()), key=order)
    except OSError:
        return []


register_format(
    FORMAT,
    extensions=(".pt",),
    sniff=sniff,
    read=read,
    description="SGLang expert distribution recorder dump (stat, per_token or per_pass .pt,"
    " or the folder of them; no torch needed)",
    files=dump_files,
)
