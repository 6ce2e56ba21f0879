"""DeepSeek EPLB's output arrays, saved as ``.npz``.

``eplb.rebalance_experts`` returns three arrays; placer saves exactly these::

    phy2log: [L, P] int64   logical expert held by each physical slot
    log2phy: [L, E, X] int64  slots of each logical expert, -1 padded (X = R + 1)
    logcnt:  [L, E] int64   replica count of each logical expert

Rows are the model's MoE layers in order (row ``i`` is the ``i``-th MoE layer), the
layer axis EPLB is given.  Reading checks that the three arrays agree.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from placer.constants import MAX_LOAD_BYTES
from placer.engines.registry import (
    EngineFormat,
    EngineModel,
    build_placement,
    check_num_gpus,
    check_slot_row,
    register_engine,
)
from placer.errors import EngineFormatError, TraceError
from placer.io.ptfile import ZIP_READ_ERRORS, check_zip
from placer.placement import Placement
from placer.regime import SERVING_ENGINES

ENGINE = SERVING_ENGINES["eplb"].title
KEYS = ("phy2log", "log2phy", "logcnt")


def to_arrays(placement: Placement) -> dict[str, np.ndarray]:
    """``phy2log``, ``log2phy`` (width ``R + 1``, as EPLB sizes it) and ``logcnt``."""
    l2p = placement.logical_to_physical
    width = placement.num_redundant + 1
    log2phy = np.full((placement.num_layers, placement.num_experts, width), -1, dtype=np.int64)
    log2phy[:, :, : l2p.shape[2]] = l2p
    return {
        "phy2log": placement.physical_to_logical.astype(np.int64),
        "log2phy": log2phy,
        "logcnt": placement.replica_counts,
    }


def from_arrays(
    arrays: dict[str, np.ndarray], path: Path, model: EngineModel, num_gpus: int | None
) -> Placement:
    """Check the three arrays against each other and the model."""
    extra = sorted(set(arrays) - set(KEYS))
    missing = [k for k in KEYS if k not in arrays]
    if extra or missing:
        what = f"unexpected array {extra[0]!r}" if extra else f"missing array {missing[0]!r}"
        raise EngineFormatError(
            f"{what}: an EPLB file holds exactly phy2log, log2phy and logcnt", where=str(path)
        )
    phy2log, log2phy, logcnt = (arrays[k] for k in KEYS)
    for key in KEYS:
        if not np.issubdtype(arrays[key].dtype, np.integer):
            raise EngineFormatError(f"{key} must hold integers", where=f"{path}: {key}")
    num_layers = model.num_moe_layers
    if phy2log.ndim != 2 or phy2log.shape[0] != num_layers:
        raise EngineFormatError(
            f"phy2log has shape {phy2log.shape}; expected [{num_layers}, P]"
            f" (one row per MoE layer of {model.name})",
            where=f"{path}: phy2log",
        )
    num_slots = phy2log.shape[1]
    if logcnt.shape != (num_layers, model.num_experts):
        raise EngineFormatError(
            f"logcnt has shape {logcnt.shape}; expected [{num_layers}, {model.num_experts}]",
            where=f"{path}: logcnt",
        )
    if log2phy.ndim != 3 or log2phy.shape[:2] != (num_layers, model.num_experts):
        raise EngineFormatError(
            f"log2phy has shape {log2phy.shape}; expected [{num_layers}, {model.num_experts}, X]",
            where=f"{path}: log2phy",
        )
    for row in range(num_layers):
        where = f"{path}: phy2log[{row}]"
        check_slot_row(phy2log[row].tolist(), num_slots, model.num_experts, where, ENGINE)
        counts = np.bincount(phy2log[row], minlength=model.num_experts)
        if not np.array_equal(counts, logcnt[row]):
            expert = int(np.flatnonzero(counts != logcnt[row])[0])
            raise EngineFormatError(
                f"logcnt says expert {expert} has {int(logcnt[row, expert])} replicas but"
                f" phy2log gives it {int(counts[expert])}",
                where=f"{path}: logcnt[{row}]",
            )
        for expert in range(model.num_experts):
            listed = log2phy[row, expert]
            slots = sorted(int(s) for s in listed[listed >= 0])
            if slots != np.flatnonzero(phy2log[row] == expert).tolist():
                raise EngineFormatError(
                    f"log2phy lists slots {slots} for expert {expert}, which phy2log"
                    " does not match",
                    where=f"{path}: log2phy[{row}, {expert}]",
                )
    gpus = check_num_gpus(num_slots, num_gpus, path, ENGINE)
    return build_placement(phy2log.astype(np.int64), model, gpus, path, ENGINE)


def write(placement: Placement, path: Path, model: EngineModel) -> list[str]:
    arrays = to_arrays(placement)
    with path.open("wb") as f:
        np.savez_compressed(
            f, phy2log=arrays["phy2log"], log2phy=arrays["log2phy"], logcnt=arrays["logcnt"]
        )
    return [
        "import numpy as np; eplb = np.load('{path}')  # phy2log [L, P], log2phy, logcnt",
        f"# rows are the {placement.num_layers} MoE layers of {model.name} in order;"
        f" {placement.num_gpus} GPUs x {placement.slots_per_gpu} slots",
    ]


def read(path: Path, model: EngineModel, num_gpus: int | None) -> Placement:
    """The three arrays, each checked before it is read (no pickles, no compression bombs,
    at most ``MAX_LOAD_BYTES`` each), then :func:`from_arrays`."""
    from placer.traces.formats.npz import read_member

    where = str(path)
    try:
        with zipfile.ZipFile(path) as zf:
            check_zip(zf, where, EngineFormatError)
            names = [n[: -len(".npy")] for n in zf.namelist() if n.endswith(".npy")]
            arrays = {name: read_member(zf, name, where, MAX_LOAD_BYTES) for name in names}
    except TraceError as e:
        raise EngineFormatError(e.message, where=e.where, hint=e.hint) from None
    except ZIP_READ_ERRORS as e:
        raise EngineFormatError(
            f"not a readable .npz file ({e})", where=where,
            hint="the file may be damaged or incomplete; write it again",
        ) from None
    return from_arrays(arrays, path, model, num_gpus)


def sniff(path: Path) -> bool:
    if path.suffix != ".npz":
        return False
    try:
        with zipfile.ZipFile(path) as z:
            return "phy2log.npy" in z.namelist()
    except zipfile.BadZipFile:
        return False


FORMAT = register_engine(
    EngineFormat(name="eplb", engine=ENGINE, suffix=".npz", write=write, read=read, sniff=sniff)
)
