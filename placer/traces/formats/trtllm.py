"""TensorRT-LLM expert statistics (``EXPERT_STATISTIC_PATH``), read without torch.

With ``EXPERT_STATISTIC_ITER_RANGE=START-STOP`` set, TensorRT-LLM
(``ExpertStatistic`` in tensorrt_llm/_torch/expert_statistic.py, fed by the
fused-MoE modules) writes into ``EXPERT_STATISTIC_PATH``::

    meta_info.json          {"num_experts": N, "num_experts_per_token": k}   (rank 0)
    rank{r}.safetensors     "{iter}_{layer}" -> int64 bincount [N] of that rank's tokens

``layer`` is the absolute layer id.  ``N`` is the number of routed experts, or the
number of slots when the MoE load balancer was on (counts are then per slot).
placer sums the rank files, makes each iteration a window, and maps slot counts back
to experts with the load balancer's ``initial_global_assignments`` when the folder
holds a YAML that gives them: the load-balancer file itself, or the extra LLM API
options YAML whose ``moe_config.load_balancer`` is that mapping inline or the path of
the file (copy yours next to the statistics).  Pass the folder (or its
``meta_info.json``) as the trace.  Without such a YAML, a ``num_experts`` in
``meta_info.json`` above the declared expert count (``num_experts=``,
``--num-experts``) means the load balancer was on: the error says so.

The ``.safetensors`` files are parsed here (an 8-byte little-endian header length, a
JSON header of ``{name: {dtype, shape, data_offsets}}``, then raw bytes), so neither
torch nor the ``safetensors`` package is needed.

Limits (docs/limits.md): ``meta_info.json`` and the YAML files are read whole up to
``constants.MAX_DOCUMENT_BYTES`` (YAML aliases expanded within
``constants.MAX_YAML_NODES``); tensor shapes are checked against the bytes that hold them
in exact arithmetic; counts must be whole, finite and ``>= 0`` (NaN float counts and
negative integer counts are refused), and the load they make within
``constants.MAX_LOAD_BYTES``.
"""

from __future__ import annotations

import math
import re
import struct
from pathlib import Path

import numpy as np

from placer import constants
from placer.errors import TraceError
from placer.io.yaml_schema import decode_text, load_json, parse_yaml, read_document
from placer.traces.accumulate import Accumulator, check_counts
from placer.traces.formats.sglang import fold_windows
from placer.traces.registry import register_format

FORMAT = "trtllm"
META = "meta_info.json"

#: numpy dtype of each safetensors dtype name that counts can have.
_SAFETENSORS_DTYPES = {
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
    "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1",
    "F64": "<f8", "F32": "<f4",
}
_KEY = re.compile(r"^(\d+)_(\d+)$")
_RANK_FILE = re.compile(r"^rank(\d+)\.safetensors$")


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """All tensors of a ``.safetensors`` file as numpy arrays (integer and float dtypes).

    Raises
    ------
    TraceError: the header or a tensor's bytes do not follow the format.
    """
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TraceError(
            f"cannot read the file ({e.strerror or e})", where=str(path),
            hint="check that it exists and is readable",
        ) from None
    if len(data) < 8:
        raise TraceError(
            "too short for a safetensors file", where=str(path), hint=_DAMAGED_HINT
        )
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > len(data) - 8 or header_len > constants.MAX_DOCUMENT_BYTES:
        raise TraceError(
            f"header length {header_len} runs past the end of the file", where=str(path),
            hint=_DAMAGED_HINT,
        )
    header = load_json(data[8 : 8 + header_len], str(path), TraceError, hint=_DAMAGED_HINT)
    if not isinstance(header, dict):
        raise TraceError(
            "the safetensors header is not an object", where=str(path), hint=_DAMAGED_HINT
        )
    body = memoryview(data)[8 + header_len :]
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}: {name:.60}"
        try:
            dtype = np.dtype(_SAFETENSORS_DTYPES[info["dtype"]])
            shape = tuple(int(n) for n in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise TraceError(
                f"unsupported or malformed tensor entry {info!r:.80}", where=where,
                hint=f"counts are integer or float tensors ({', '.join(_SAFETENSORS_DTYPES)})",
            ) from None
        if any(n < 0 for n in shape) or len(shape) > 8:
            raise TraceError(
                f"tensor shape {shape!s:.60} is not a shape", where=where, hint=_DAMAGED_HINT
            )
        count = math.prod(shape)  # exact: a shape that overflows int64 cannot match below
        if not 0 <= begin <= end <= len(body) or end - begin != count * dtype.itemsize:
            raise TraceError(
                f"data_offsets [{begin}, {end}) do not hold {shape!s:.60} {info['dtype']}",
                where=where, hint=_DAMAGED_HINT,
            )
        out[name] = np.frombuffer(body[begin:end], dtype=dtype).reshape(shape).astype(
            dtype.newbyteorder("=")
        )
    return out


_DAMAGED_HINT = "the file may be damaged or incomplete; record the statistics again"


def read_load_balancer(path: Path) -> dict[int, np.ndarray]:
    """``initial_global_assignments`` (layer -> slots) of a TensorRT-LLM load-balancer
    YAML, or of an extra LLM API options YAML through ``moe_config.load_balancer`` (the
    mapping inline, or the path of the load-balancer file, relative to the YAML)."""
    found = _balancer_source(path)
    if found is None:
        raise TraceError(
            "no initial_global_assignments mapping",
            where=str(path),
            hint="give the load-balancer YAML, or the LLM API options YAML whose"
            " moe_config.load_balancer holds it",
        )
    mapping, where, _ = found
    assignments = mapping.get("initial_global_assignments")
    where = f"{where}.initial_global_assignments" if where != str(path) else where
    if not isinstance(assignments, dict):
        raise TraceError(
            "no initial_global_assignments mapping",
            where=where,
            hint="the statistics count slots: placer needs the layer -> slots lists they"
            " were recorded with",
        )
    out = {}
    for layer, slots in assignments.items():
        if (
            not isinstance(layer, int) or isinstance(layer, bool) or not isinstance(slots, list)
            or not slots or not all(
                isinstance(e, int) and not isinstance(e, bool)
                and 0 <= e < constants.MAX_EXPERTS for e in slots
            )
        ):
            raise TraceError(
                f"initial_global_assignments[{layer!r:.20}] must be a list of expert ids",
                where=where,
                hint=f"each layer lists the expert of every slot, ids 0 to"
                f" {constants.MAX_EXPERTS - 1}",
            )
        out[layer] = np.asarray(slots, dtype=np.int64)
    return out


def _load_yaml(path: Path) -> object:
    """A YAML file's plain value, read with placer's limits (aliases, nesting, size)."""
    text = decode_text(read_document(path, TraceError, what="YAML file"), str(path), TraceError)
    return parse_yaml(text, str(path), TraceError).data


def _balancer_source(path: Path) -> tuple[dict[object, object], str, Path] | None:
    """The load-balancer mapping a YAML gives: ``(mapping, where, file it is in)``.

    The file is the load-balancer YAML itself (``initial_global_assignments`` at the
    top), or an extra LLM API options YAML whose ``moe_config.load_balancer`` is the
    mapping or a path to the file.  None when it gives no load balancer.
    """
    doc = _load_yaml(path)
    if not isinstance(doc, dict):
        return None
    if "initial_global_assignments" in doc:
        return doc, str(path), path
    moe = doc.get("moe_config")
    balancer = moe.get("load_balancer") if isinstance(moe, dict) else None
    where = f"{path}: moe_config.load_balancer"
    if isinstance(balancer, dict):
        return balancer, where, path
    if isinstance(balancer, str):
        target = Path(balancer) if Path(balancer).is_absolute() else path.parent / balancer
        if not target.is_file():
            raise TraceError(
                f"the load-balancer file {balancer} is not there",
                where=where,
                hint="copy it next to meta_info.json and name it there, or write its"
                " mapping inline under moe_config.load_balancer",
            )
        doc = _load_yaml(target)
        if isinstance(doc, dict) and "initial_global_assignments" in doc:
            return doc, str(target), target
        raise TraceError(
            "no initial_global_assignments mapping",
            where=str(target),
            hint=f"{path} names it as moe_config.load_balancer",
        )
    return None


def read(path: Path, acc: Accumulator) -> None:
    """Accumulate a statistics folder, given as its ``meta_info.json`` or the folder."""
    path = _meta_path(path)
    folder = path.parent
    meta, num_counts = _read_meta(path)
    counts = _sum_rank_files(_rank_files(folder), num_counts, acc)
    load, iters, layers = _iteration_load(counts, num_counts, folder)
    balancer = _find_load_balancer(folder)
    if balancer is not None:
        load = _slots_to_experts(load, layers, *balancer)
    else:
        _check_not_slots(path, num_counts, acc)
    acc.declare(
        where=str(path),
        num_experts=load.shape[2],
        top_k=meta.get("num_experts_per_token"),
    )
    load, starts = fold_windows(load, np.asarray(iters, dtype=np.int64))
    acc.add_aggregate(load, layer_ids=np.asarray(layers, dtype=np.int64), window_starts=starts,
                      where=str(folder))


def _meta_path(path: Path) -> Path:
    """The ``meta_info.json`` a path names (itself, or the one in the folder it is)."""
    if not path.is_dir():
        return path
    meta = path / META
    if not meta.is_file():
        raise TraceError(
            f"no {META} in the folder", where=str(path),
            hint="pass TensorRT-LLM's EXPERT_STATISTIC_PATH folder"
            " (rank 0 writes meta_info.json there)",
        )
    return meta


def _read_meta(path: Path) -> tuple[dict[str, object], int]:
    """``meta_info.json`` as a dict, and the number of counts per row (its ``num_experts``)."""
    meta = load_json(
        read_document(path, TraceError, what="meta_info.json"), str(path), TraceError,
        hint="TensorRT-LLM writes {\"num_experts\": N, \"num_experts_per_token\": k}",
    )
    if not isinstance(meta, dict) or "num_experts" not in meta:
        raise TraceError(
            "meta_info.json needs num_experts and num_experts_per_token", where=str(path),
            hint="TensorRT-LLM writes {\"num_experts\": N, \"num_experts_per_token\": k}",
        )
    num_counts = meta["num_experts"]
    if not isinstance(num_counts, int) or isinstance(num_counts, bool) or num_counts <= 0:
        raise TraceError(
            f"num_experts must be a positive integer, got {num_counts!r:.40}",
            where=f"{path}: num_experts", hint="the routed experts (or slots) counted",
        )
    if num_counts > 4 * constants.MAX_EXPERTS:
        raise TraceError(
            f"num_experts {num_counts} is more than placer handles", where=f"{path}: num_experts",
            hint="limits: docs/limits.md",
        )
    return meta, num_counts


def _rank_files(folder: Path) -> list[Path]:
    """The folder's ``rank{r}.safetensors`` files, by rank."""
    rank_files = sorted(
        (p for p in folder.iterdir() if _RANK_FILE.match(p.name)),
        key=lambda p: int(_RANK_FILE.match(p.name).group(1)),  # type: ignore[union-attr]
    )
    if not rank_files:
        raise TraceError(
            "no rank{r}.safetensors beside meta_info.json",
            where=str(folder),
            hint="TensorRT-LLM writes them when EXPERT_STATISTIC_ITER_RANGE covers iterations"
            " that ran",
        )
    return rank_files


def _sum_rank_files(
    rank_files: list[Path], num_counts: int, acc: Accumulator
) -> dict[tuple[int, int], np.ndarray]:
    """The counts of every ``(iteration, layer)``, summed over the rank files."""
    counts: dict[tuple[int, int], np.ndarray] = {}
    total = 0.0
    for rank_file in rank_files:
        for key, array in read_safetensors(rank_file).items():
            cell = _cell(key, array, num_counts, rank_file)
            # NaN, negative and fractional counts are refused before any conversion
            array = check_counts(array, key, str(rank_file))
            total += float(array.sum(dtype=np.float64))
            if total > constants.MAX_TOTAL_COUNT:
                raise TraceError(
                    "the counts add up to more than placer counts (2^53 selections)",
                    where=str(rank_file), hint="limits: docs/limits.md",
                )
            counts[cell] = counts.get(cell, 0) + array
        acc.advance(rank_file.stat().st_size)
    if not counts:
        raise TraceError(
            "the rank files hold no counts", where=str(rank_files[0].parent),
            hint="TensorRT-LLM writes them when EXPERT_STATISTIC_ITER_RANGE covers iterations"
            " that ran",
        )
    return counts


def _cell(key: str, array: np.ndarray, num_counts: int, rank_file: Path) -> tuple[int, int]:
    """The ``(iteration, layer)`` a tensor's key ``{iter}_{layer}`` names."""
    match = _KEY.match(key)
    if match is None:
        raise TraceError(
            f"key {key!r:.60} is not '{{iter}}_{{layer}}'", where=str(rank_file),
            hint="TensorRT-LLM names each count '{iter}_{layer}'",
        )
    if array.shape != (num_counts,):
        raise TraceError(
            f"{key} has shape {array.shape}, expected [{num_counts}] (num_experts in"
            " meta_info.json)",
            where=str(rank_file), hint="the rank files and meta_info.json must be of"
            " one run",
        )
    cell = (int(match.group(1)), int(match.group(2)))
    if cell[1] > constants.MAX_LAYER_ID or cell[0] >= 1 << 62:
        raise TraceError(
            f"key {key:.60} names layer {cell[1]} or iteration {cell[0]}, beyond"
            " placer's range", where=str(rank_file), hint="limits: docs/limits.md",
        )
    return cell


def _iteration_load(
    counts: dict[tuple[int, int], np.ndarray], num_counts: int, folder: Path
) -> tuple[np.ndarray, list[int], list[int]]:
    """``[iters, layers, num_counts]`` int64 counts, with the iterations and layers, sorted."""
    iters = sorted({i for i, _ in counts})
    layers = sorted({lay for _, lay in counts})
    need = len(iters) * len(layers) * num_counts * 8
    if len(layers) > constants.MAX_LAYERS or need > constants.MAX_LOAD_BYTES:
        raise TraceError(
            f"{len(iters)} iterations x {len(layers)} layers x {num_counts} experts of counts"
            f" take {need >> 20:,} MiB, more than placer's"
            f" {constants.MAX_LOAD_BYTES >> 20} MiB", where=str(folder),
            hint="record fewer iterations (EXPERT_STATISTIC_ITER_RANGE); limits:"
            " docs/limits.md",
        )
    load = np.zeros((len(iters), len(layers), num_counts), dtype=np.int64)
    for (it, layer), array in counts.items():
        load[iters.index(it), layers.index(layer)] = array
    return load, iters, layers


def _check_not_slots(path: Path, num_counts: int, acc: Accumulator) -> None:
    """Counts of more slots than the model has experts, and no YAML to map them back."""
    declared = acc.options.num_experts
    if declared is not None and num_counts > declared:
        raise TraceError(
            f"meta_info.json counts {num_counts} experts but the model has {declared}:"
            " TensorRT-LLM's MoE load balancer was on, so these are its slots",
            where=f"{path}: num_experts",
            hint="copy the YAML that moe_config.load_balancer named (or the extra LLM API"
            " options YAML that holds it inline) next to meta_info.json, so slots map"
            " back to experts",
        )


def _find_load_balancer(folder: Path) -> tuple[Path, dict[int, np.ndarray]] | None:
    """The load balancer the folder's YAML files give (one, or several naming one file)."""
    found: dict[Path, Path] = {}  # file holding the mapping -> YAML that gave it
    for p in sorted(folder.iterdir()):
        if p.suffix not in (".yaml", ".yml") or not p.is_file():
            continue
        text = read_document(p, TraceError, what="YAML file").decode("utf-8", "replace")
        if "initial_global_assignments" not in text and "load_balancer" not in text:
            continue
        source = _balancer_source(p)
        if source is not None:
            found.setdefault(source[2].resolve(), p)
    if len(found) > 1:
        names = ", ".join(sorted(p.name for p in found.values()))
        raise TraceError(
            f"{len(found)} YAML files in the folder give a load balancer ({names})",
            where=str(folder),
            hint="keep only the one the statistics were recorded with",
        )
    if not found:
        return None
    path = next(iter(found.values()))
    return path, read_load_balancer(path)


def _slots_to_experts(
    load: np.ndarray, layers: list[int], path: Path, assignments: dict[int, np.ndarray]
) -> np.ndarray:
    """Slot counts ``[iters, layers, slots]`` -> expert counts ``[iters, layers, experts]``."""
    num_slots = load.shape[2]
    missing = [layer for layer in layers if layer not in assignments]
    if missing:
        raise TraceError(
            f"layer {missing[0]} of the statistics has no initial_global_assignments entry",
            where=str(path), hint="use the load-balancer YAML the statistics were recorded with",
        )
    num_experts = 1 + max(int(assignments[layer].max()) for layer in layers)
    out = np.zeros((*load.shape[:2], num_experts), dtype=np.int64)
    for row, layer in enumerate(layers):
        slots = assignments[layer]
        if slots.shape != (num_slots,) or int(slots.min()) < 0:
            raise TraceError(
                f"initial_global_assignments[{layer}] has {slots.size} slots but the statistics"
                f" count {num_slots}",
                where=str(path),
                hint="use the load-balancer YAML the statistics were recorded with",
            )
        for slot, expert in enumerate(slots.tolist()):
            out[:, row, expert] += load[:, row, slot]
    return out


def sniff(path: Path, head: bytes) -> bool:
    """The ``meta_info.json`` of a statistics folder, or a folder that holds one."""
    if path.is_dir():
        try:
            return (path / META).is_file() and any(
                _RANK_FILE.match(p.name) for p in path.iterdir()
            )
        except OSError:
            return False
    return path.name == META and b"num_experts_per_token" in head


register_format(
    FORMAT,
    extensions=(META,),
    sniff=sniff,
    read=read,
    description="TensorRT-LLM expert statistics folder (EXPERT_STATISTIC_PATH)",
)

