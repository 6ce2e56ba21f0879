"""Bad, hostile and edge-case inputs for placer's readers, each with the command that reads it.

Each :class:`Case` builds its files in a folder of its own and says which ``placer``
command line reads them, the exit code it must end with (1: bad data, 2: bad usage) and
a piece of text the error must hold, so a case fails when the input is refused for the
wrong reason.  Cases marked ``bomb`` are small files that used to ask for gigabytes (or
never end): ``tests/test_hostile_inputs.py`` runs every case in a process limited to
1 GiB of address space.  Cases marked ``accepted`` are read with a warning (exit 0).

The limits they run into are in ``placer.constants`` and ``docs/limits.md``.
"""

from __future__ import annotations

import collections
import gzip
import io
import json
import os
import pickle
import struct
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from placer.io.ptfile import _Global, _PendingStorage, _TorchPickler, save_pt

#: Builds a case's files in the given folder and returns the placer arguments.
Builder = Callable[[Path], list[str]]


@dataclass(frozen=True)
class Case:
    """One input and what reading it must do.

    Attributes
    ----------
    name: the test id.
    build: writes the files into a folder and returns ``placer``'s arguments.
    code: the exit code (1 data error, 2 usage error, 0 for ``accepted`` cases).
    contains: text the error (or, when accepted, the warnings) must hold.
    bomb: the input used to take gigabytes of memory or not end.

    Every refused case must carry a ``hint:`` line: there is no exception.
    """

    name: str
    build: Builder
    code: int = 1
    contains: str = ""
    bomb: bool = False


CASES: list[Case] = []


def case(name: str, *, code: int = 1, contains: str = "", bomb: bool = False
         ) -> Callable[[Builder], Builder]:
    """Register the decorated builder as a case."""

    def register(build: Builder) -> Builder:
        CASES.append(Case(name, build, code, contains, bomb))
        return build

    return register


def many(cases: Iterable[tuple[str, Builder, int, str]], *, bomb: bool = False) -> None:
    """Register ``(name, build, code, contains)`` cases made in a loop."""
    for name, build, code, contains in cases:
        CASES.append(Case(name, build, code, contains, bomb))


# -- helpers ---------------------------------------------------------------------------------
def write(path: Path, data: bytes | str) -> Path:
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def jsonl(rows: Iterable[dict[str, Any] | str]) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def stats(path: Path, *extra: str) -> list[str]:
    return ["stats", str(path), *extra]


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def npz_bytes(arrays: dict[str, np.ndarray], *, compress: bool = False) -> bytes:
    buf = io.BytesIO()
    (np.savez_compressed if compress else np.savez)(buf, **arrays)  # type: ignore[operator]
    return buf.getvalue()


def npy_member(header: str, body: bytes = b"") -> bytes:
    """A .npy file with a hand-written header (version 1.0)."""
    text = header.encode("latin1")
    pad = 64 - (10 + len(text) + 1) % 64
    text += b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + body


def zip_of(members: dict[str, bytes], *, compress: bool = False) -> bytes:
    buf = io.BytesIO()
    mode = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(buf, "w", mode) as zf:
        for name, data in members.items():
            zf.writestr(name, data, compresslevel=9 if compress else None)
    return buf.getvalue()


def zeros_deflated(nbytes: int) -> bytes:
    """The deflate stream of ``nbytes`` zero bytes (~1000x smaller), built in pieces."""
    import zlib

    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    piece = bytes(1 << 20)
    out = [z.compress(piece) for _ in range(nbytes >> 20)]
    return b"".join(out) + z.compress(bytes(nbytes & ((1 << 20) - 1))) + z.flush()


def bomb_zip(name: str, header: str, body_bytes: int, extra: dict[str, bytes]) -> bytes:
    """A zip whose member ``name`` is a .npy of ``body_bytes`` zeros (deflated)."""
    import zlib

    head = npy_member(header)
    data = head + bytes(0)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for key, value in extra.items():
            zf.writestr(key, value)
        # a real deflated member: header bytes then zeros, with its true size and CRC
        info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_DEFLATED
        with zf.open(info, "w", force_zip64=True) as f:
            f.write(data)
            piece = bytes(1 << 20)
            for _ in range(body_bytes >> 20):
                f.write(piece)
    del zlib
    return buf.getvalue()


class _Tensor:
    """A tensor for :func:`pt_bytes` with any size and stride over a storage."""

    def __init__(self, storage: _PendingStorage, size: tuple[int, ...], stride: tuple[int, ...],
                 offset: int = 0):
        self.storage, self.size, self.stride, self.offset = storage, size, stride, offset

    def __reduce__(self) -> Any:
        return (_Global("torch._utils", "_rebuild_tensor_v2"),
                (self.storage, self.offset, self.size, self.stride, False,
                 collections.OrderedDict()))


def pt_bytes(build: Callable[[Callable[[np.ndarray], _PendingStorage]], Any]) -> bytes:
    """A torch.save zip whose object ``build(storage)`` makes; ``storage(array)`` adds a
    storage of the array's elements (tensors over it are :class:`_Tensor`)."""
    buffer = io.BytesIO()
    pickler = _TorchPickler(buffer)
    names = {"int32": "IntStorage", "int64": "LongStorage", "float32": "FloatStorage",
             "uint16": "BFloat16Storage"}

    def storage(a: np.ndarray) -> _PendingStorage:
        key = str(len(pickler.storages))
        pickler.storages.append((key, np.ascontiguousarray(a).tobytes()))
        return _PendingStorage(key, pickler._global("torch", names[a.dtype.name]), int(a.size))

    pickler.dump(build(storage))
    return pt_zip(buffer.getvalue(), dict(pickler.storages))


def pt_zip(pickled: bytes, storages: dict[str, bytes]) -> bytes:
    members = {"archive/data.pkl": pickled, "archive/byteorder": b"little",
               "archive/version": b"3\n"}
    members.update({f"archive/data/{k}": v for k, v in storages.items()})
    return zip_of(members)


def pt(path: Path, obj: Any) -> Path:
    save_pt(obj, path)
    return path


def safetensors(tensors: dict[str, tuple[str, list[int], bytes]], header: Any = None) -> bytes:
    """A .safetensors file: name -> (dtype, shape, raw bytes); ``header`` replaces the
    generated header when given."""
    meta: dict[str, Any] = {}
    body = b""
    for name, (dtype, shape, raw) in tensors.items():
        offsets = [len(body), len(body) + len(raw)]
        meta[name] = {"dtype": dtype, "shape": shape, "data_offsets": offsets}
        body += raw
    text = json.dumps(meta if header is None else header).encode()
    return struct.pack("<Q", len(text)) + text + body


def trtllm(folder: Path, tensors: dict[str, tuple[str, list[int], bytes]], *,
           meta: str | bytes = '{"num_experts": 4, "num_experts_per_token": 2}',
           header: Any = None, extra: dict[str, str | bytes] | None = None) -> list[str]:
    """A TensorRT-LLM statistics folder read by ``placer stats``."""
    stat = folder / "stat"
    stat.mkdir()
    write(stat / "meta_info.json", meta)
    write(stat / "rank0.safetensors", safetensors(tensors, header))
    for name, text in (extra or {}).items():
        write(stat / name, text)
    return stats(stat)


GOOD_COUNTS = ("I64", [4], np.array([5, 3, 2, 1], "<i8").tobytes())

TOPOLOGY = """\
name: t
gpu_types:
  h100: {memory_gb: 80, hbm_gbps: 3350, bf16_tflops: 989, fp8_tflops: 1979}
nodes:
  - name: node0
    gpus: 8
    gpu_type: h100
    fabric: {kind: nvswitch, gbps: 450}
"""

MODEL = """\
name: m
num_hidden_layers: 4
num_experts: 8
top_k: 2
hidden_size: 1024
moe_intermediate_size: 512
non_expert_params: 1000000
"""

HF = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
      "num_hidden_layers": 4, "num_experts": 8, "num_experts_per_tok": 2,
      "hidden_size": 1024, "moe_intermediate_size": 512, "intermediate_size": 2048,
      "vocab_size": 1000, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128}

LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 10) + "]\n"
    for i in range(8)
)

GOOD_ROW = {"layer": 0, "experts": [0, 1]}


# -- JSONL traces ------------------------------------------------------------------------------
def _jsonl_case(text: str | bytes, *extra: str) -> Builder:
    def build(d: Path) -> list[str]:
        return stats(write(d / "t.jsonl", text), *extra)
    return build


many([
    ("jsonl-empty", _jsonl_case(""), 1, "empty"),
    ("jsonl-blank-lines-only", _jsonl_case("\n\n   \n\t\n"), 1, "cannot tell"),
    ("jsonl-blank-lines-as-jsonl", _jsonl_case("\n\n   \n\t\n", "--format", "jsonl"), 1,
     "empty"),
    ("jsonl-expert-32768", _jsonl_case(jsonl([{"layer": 0, "experts": [32768, 1]}])), 1,
     "more than placer handles"),
    ("jsonl-expert-past-header", _jsonl_case(jsonl([
        {"format": "placer-trace", "num_experts": 8}, {"layer": 0, "experts": [32767, 1]}])),
     1, "out of range"),
    ("jsonl-expert-2^70", _jsonl_case(jsonl([{"layer": 0, "experts": [2**70, 1]}])), 1,
     "64-bit"),
    ("jsonl-expert-19-digits", _jsonl_case(jsonl([{"layer": 0, "experts": [10**18 * 9, 1]}])),
     1, "more than placer handles"),
    ("jsonl-layer-2^63", _jsonl_case(jsonl([{"layer": 2**63, "experts": [0, 1]}])), 1, "64-bit"),
    ("jsonl-layer-negative", _jsonl_case(jsonl([{"layer": -1, "experts": [0, 1]}])), 1,
     "out of range"),
    ("jsonl-layer-past-max", _jsonl_case(jsonl([{"layer": 1 << 20, "experts": [0, 1]}])), 1,
     "out of range"),
    ("jsonl-expert-negative", _jsonl_case(jsonl([{"layer": 0, "experts": [-5, 1]}])), 1,
     "negative"),
    ("jsonl-expert-string", _jsonl_case(jsonl([{"layer": 0, "experts": ["3", 1]}])), 1,
     "integer expert ids"),
    ("jsonl-experts-not-list", _jsonl_case(jsonl([{"layer": 0, "experts": 3}])), 1,
     "list of integer"),
    ("jsonl-experts-empty", _jsonl_case(jsonl([{"layer": 0, "experts": []}])), 1,
     "at least one expert"),
    ("jsonl-expert-twice", _jsonl_case(jsonl([{"layer": 0, "experts": [1, 1]}])), 1, "twice"),
    ("jsonl-row-300-wide", _jsonl_case(jsonl([{"layer": 0, "experts": list(range(300))}])), 1,
     "more than placer handles"),
    ("jsonl-k-changes", _jsonl_case(jsonl([GOOD_ROW, {"layer": 0, "experts": [0, 1, 2]}])), 1,
     "earlier rows"),
    ("jsonl-weights-nan", _jsonl_case(
        '{"layer": 0, "experts": [0, 1], "weights": [NaN, 0.5]}\n'), 1, "finite"),
    ("jsonl-weights-infinity", _jsonl_case(
        '{"layer": 0, "experts": [0, 1], "weights": [Infinity, 0.5]}\n'), 1, "finite"),
    ("jsonl-weights-length", _jsonl_case(
        jsonl([{"layer": 0, "experts": [0, 1], "weights": [1.0]}])), 1, "weights"),
    ("jsonl-token-negative", _jsonl_case(jsonl([{"layer": 0, "experts": [0, 1], "token": -1}])),
     1, "token"),
    ("jsonl-token-2^40", _jsonl_case(jsonl([{"layer": 0, "experts": [0, 1], "token": 2**40}])),
     1, "token id"),
    ("jsonl-step-2^64", _jsonl_case(jsonl([{"layer": 0, "experts": [0, 1], "step": 2**64}])), 1,
     "step"),
    ("jsonl-rank-string", _jsonl_case(jsonl([{"layer": 0, "experts": [0, 1], "rank": "x"}])),
     1, "rank"),
    ("jsonl-request-list", _jsonl_case(
        jsonl([{"layer": 0, "experts": [0, 1], "request": [1]}])), 1, "request"),
    ("jsonl-malformed", _jsonl_case('{"layer": 0, "experts": [0, 1]\n'), 1, "malformed JSON"),
    ("jsonl-array-line", _jsonl_case(jsonl([GOOD_ROW, "[1, 2]"])), 1, "JSON object"),
    ("jsonl-nested-50000", _jsonl_case(
        '{"layer": 0, "experts": [0, 1]}\n{"layer": 0, "experts": [0, 1], "x": '
        + deep(50000) + "}\n"), 1, "nests too deeply"),
    ("jsonl-header-40000-experts", _jsonl_case(jsonl([
        {"format": "placer-trace", "num_experts": 40000}, GOOD_ROW])), 1,
     "more than placer handles"),
    ("jsonl-header-top-k-above-experts", _jsonl_case(jsonl([
        {"format": "placer-trace", "num_experts": 4, "top_k": 9}, GOOD_ROW])), 1,
     "more than num_experts"),
    ("jsonl-header-top-k-zero", _jsonl_case(jsonl([
        {"format": "placer-trace", "top_k": 0}, GOOD_ROW])), 1, "positive integer"),
    ("jsonl-header-top-k-huge", _jsonl_case(jsonl([
        {"format": "placer-trace", "top_k": 10**30}, GOOD_ROW])), 1, "more than placer handles"),
    ("jsonl-header-version-2", _jsonl_case(jsonl([
        {"format": "placer-trace", "version": 2}, GOOD_ROW])), 1, "version"),
    ("jsonl-header-synthetic-yes", _jsonl_case(jsonl([
        {"format": "placer-trace", "synthetic": "yes"}, GOOD_ROW])), 1, "synthetic"),
    ("jsonl-header-layers-10^9", _jsonl_case(jsonl([
        {"format": "placer-trace", "num_layers": 10**9}, GOOD_ROW])), 1,
     "more than placer handles"),
    ("jsonl-not-utf8", _jsonl_case(b'{"layer": 0, "experts": [0, 1]}\n{"layer": 0, "ex\xff\xfe'
                                   b'perts": [0, 1]}\n'), 1, "malformed JSON"),
    ("jsonl-nul-bytes", _jsonl_case(b'{"layer": 0, "experts": [0, 1]}\n\x00\x00\x00\n'), 1,
     "malformed JSON"),
    ("jsonl-only-meta-objects", _jsonl_case(jsonl([{"type": "meta"}, {"type": "meta"}])), 1,
     "no routing rows"),
    ("jsonl-missing-experts", _jsonl_case(jsonl([{"layer": 0}])), 1, "missing field"),
    ("jsonl-top-k-flag-above-row", _jsonl_case(jsonl([GOOD_ROW]), "--top-k", "9"), 1,
     "top_k is 9"),
    ("jsonl-num-experts-flag-past-max", _jsonl_case(jsonl([GOOD_ROW]), "--num-experts",
                                                    "40000"), 2, "from 1 to 32768"),
    ("jsonl-top-k-flag-past-experts", _jsonl_case(jsonl([GOOD_ROW]), "--top-k", "3",
                                                  "--num-experts", "2"), 2, "top_k"),
])


@case("jsonl-long-line", contains="longer than")
def _long_line(d: Path) -> list[str]:
    return stats(write(d / "t.jsonl", jsonl([GOOD_ROW]) + " " * (2 << 20) + "\n"))


@case("jsonl-no-newline-2MiB", contains="longer than")
def _no_newline(d: Path) -> list[str]:
    return stats(write(d / "t.jsonl", '{"layer": 0, "experts": [' + "1, " * (700_000) + "2]}"))


@case("jsonl-dev-zero", contains="longer than", bomb=True)
def _dev_zero(d: Path) -> list[str]:
    return stats(Path("/dev/zero"), "--format", "jsonl")


@case("trace-dev-zero-detected", contains="cannot tell the trace format")
def _dev_zero_detect(d: Path) -> list[str]:
    return stats(Path("/dev/zero"))


@case("jsonl-gzip-blank-bomb", code=0, contains="one window only", bomb=True)
def _gzip_bomb(d: Path) -> list[str]:
    """Inflates 1,000 times: read as a stream in bounded memory, so it is read (what a
    gzip trace may inflate to is capped in bytes, ``MAX_INFLATED_BYTES``)."""
    data = gzip.compress(b'{"layer": 0, "experts": [0, 1]}\n' + b"\n" * (80 << 20), 9, mtime=0)
    return stats(write(d / "t.jsonl.gz", data))


@case("jsonl-gzip-truncated", contains="gzip")
def _gzip_cut(d: Path) -> list[str]:
    rows = jsonl({"layer": i % 4, "experts": [i % 7, 7], "token": i // 4} for i in range(4000))
    data = gzip.compress(rows.encode(), mtime=0)
    return stats(write(d / "t.jsonl.gz", data[: len(data) // 2]))


@case("jsonl-gzip-corrupt", contains="cannot read")
def _gzip_corrupt(d: Path) -> list[str]:
    rows = jsonl({"layer": i % 4, "experts": [i % 7, 7], "token": i // 4} for i in range(4000))
    data = bytearray(gzip.compress(rows.encode(), mtime=0))
    data[len(data) // 2 : len(data) // 2 + 64] = b"\xff" * 64
    return stats(write(d / "t.jsonl.gz", bytes(data)))


@case("jsonl-load-budget-17-layers", contains="more than placer's", bomb=True)
def _load_budget(d: Path) -> list[str]:
    # 17 layers x 32768 experts x 64 windows of int64: 272 MiB of load
    return stats(write(d / "t.jsonl", jsonl(
        {"layer": i, "experts": [32767, 0], "step": i} for i in range(17))))


@case("jsonl-4097-layers", contains="layers", bomb=True)
def _many_layers(d: Path) -> list[str]:
    return stats(write(d / "t.jsonl", jsonl({"layer": i, "experts": [0, 1]} for i in range(4097))))


@case("trace-symlink-loop", contains="link")
def _loop(d: Path) -> list[str]:
    os.symlink(d / "b.jsonl", d / "a.jsonl")
    os.symlink(d / "a.jsonl", d / "b.jsonl")
    return stats(d / "a.jsonl")


@case("trace-symlink-loop-with-format", contains="link")
def _loop_format(d: Path) -> list[str]:
    os.symlink(d / "b.jsonl", d / "a.jsonl")
    os.symlink(d / "a.jsonl", d / "b.jsonl")
    return stats(d / "a.jsonl", "--format", "jsonl")


@case("trace-broken-symlink", contains="")
def _broken(d: Path) -> list[str]:
    os.symlink(d / "nowhere.jsonl", d / "a.jsonl")
    return stats(d / "a.jsonl")


@case("trace-missing", contains="not found")
def _missing(d: Path) -> list[str]:
    return stats(d / "missing.jsonl")


@case("trace-folder", contains="folder")
def _folder(d: Path) -> list[str]:
    (d / "dir").mkdir()
    return stats(d / "dir")


@case("trace-unknown-format-flag", code=2, contains="format")
def _unknown_format(d: Path) -> list[str]:
    return stats(write(d / "t.jsonl", jsonl([GOOD_ROW])), "--format", "nope")


@case("jsonl-coact-stray-id", code=0, contains="8190 of 8192 (layer, expert) pairs")
def _coact_budget(d: Path) -> list[str]:
    return stats(write(d / "t.jsonl", jsonl([{"layer": 0, "experts": [8191, 1]}])))


@case("jsonl-id-32767-accepted", code=0, contains="32766 of 32768 (layer, expert)", bomb=True)
def _coact_budget_max(d: Path) -> list[str]:
    return stats(write(d / "t.jsonl", jsonl([{"layer": 0, "experts": [32767, 1]}] * 3)))


# -- per-token NPZ traces ---------------------------------------------------------------------
def _ids(*shape: int) -> np.ndarray:
    return (np.arange(int(np.prod(shape))) % 4).reshape(shape).astype(np.int16)


def _npz_case(**arrays: Any) -> Builder:
    def build(d: Path) -> list[str]:
        members = {k: np.asarray(v) for k, v in arrays.items()}
        return stats(write(d / "t.npz", npz_bytes(members)))
    return build


GOOD_IDS = np.stack([np.arange(6) % 3, np.arange(6) % 3 + 3], axis=1).reshape(6, 1, 2)
many([
    ("npz-k-zero", _npz_case(topk_ids=np.zeros((5, 2, 0), np.int16)), 1, "k = 0"),
    ("npz-two-dims", _npz_case(topk_ids=np.zeros((5, 2), np.int16)), 1, "shape"),
    ("npz-float-ids", _npz_case(topk_ids=np.zeros((5, 1, 2), np.float32)), 1, "dtype"),
    ("npz-no-layers", _npz_case(topk_ids=np.zeros((5, 0, 2), np.int16)), 1, "layers"),
    ("npz-5000-layers", _npz_case(topk_ids=np.zeros((1, 5000, 1), np.int16)), 1, "layers"),
    ("npz-k-300", _npz_case(topk_ids=np.zeros((1, 1, 300), np.int16)), 1, "k = 300"),
    ("npz-expert-40000", _npz_case(topk_ids=np.full((2, 1, 2), 40000, np.int32)), 1,
     "more than placer handles"),
    ("npz-expert-negative", _npz_case(topk_ids=np.full((2, 1, 2), -7, np.int32)), 1,
     "negative"),
    ("npz-layer-ids-repeat", _npz_case(topk_ids=_ids(4, 2, 1), layer_ids=np.array([3, 3])), 1,
     "distinct"),
    ("npz-layer-ids-shape", _npz_case(topk_ids=_ids(4, 2, 1), layer_ids=np.array([3])), 1,
     "layer_ids"),
    ("npz-step-shape", _npz_case(topk_ids=GOOD_IDS, step=np.arange(3)), 1, "step"),
    ("npz-step-negative", _npz_case(topk_ids=GOOD_IDS, step=np.full(6, -5)), 1, "step"),
    ("npz-step-uint64", _npz_case(topk_ids=GOOD_IDS, step=np.full(6, 2**64 - 1, np.uint64)), 1,
     "64-bit"),
    ("npz-weights-shape", _npz_case(topk_ids=GOOD_IDS, topk_weights=np.ones((6, 1, 3))), 1,
     "topk_weights"),
    ("npz-meta-experts-zero", _npz_case(topk_ids=GOOD_IDS, num_experts=np.array(0)), 1,
     "positive integer"),
    ("npz-meta-top-k-300", _npz_case(topk_ids=GOOD_IDS, top_k=np.array(300)), 1,
     "more than placer handles"),
    ("npz-meta-top-k-above-experts", _npz_case(topk_ids=GOOD_IDS, top_k=np.array(9),
                                                num_experts=np.array(6)), 1, "num_experts"),
    ("npz-meta-model-2MiB", _npz_case(topk_ids=GOOD_IDS, model=np.zeros(1 << 18)), 1,
     "more than placer reads"),
    ("npz-object-array", lambda d: stats(write(d / "t.npz", zip_of({
        "topk_ids.npy": npy_member("{'descr': '|O', 'fortran_order': False, 'shape': (1, 1, 1), }",
                                   pickle.dumps(np.array([1], dtype=object)))}))), 1, "objects"),
    ("npz-fortran", _npz_case(topk_ids=np.asfortranarray(_ids(4, 2, 2))), 1, "Fortran"),
])


@case("npz-declares-10^12-tokens", contains="truncated", bomb=True)
def _npz_declares(d: Path) -> list[str]:
    member = npy_member("{'descr': '<i2', 'fortran_order': False, "
                        "'shape': (1000000000000, 1, 1), }", b"\x00\x00" * 8)
    return stats(write(d / "t.npz", zip_of({"topk_ids.npy": member})))


@case("npz-zip-bomb", contains="inflates", bomb=True)
def _npz_bomb(d: Path) -> list[str]:
    data = bomb_zip("topk_ids.npy", "{'descr': '<i2', 'fortran_order': False, "
                    "'shape': (41943040, 1, 1), }", 80 << 20, {})
    return stats(write(d / "t.npz", data))


@case("npz-not-a-zip", contains="")
def _npz_garbage(d: Path) -> list[str]:
    return stats(write(d / "t.npz", b"PK\x03\x04" + os.urandom(200)), "--format", "npz")


@case("npz-truncated-zip", contains="")
def _npz_cut(d: Path) -> list[str]:
    data = npz_bytes({"topk_ids": _ids(400, 2, 2)})
    return stats(write(d / "t.npz", data[: len(data) // 2]), "--format", "npz")


@case("npz-bad-crc", contains="")
def _npz_crc(d: Path) -> list[str]:
    data = bytearray(npz_bytes({"topk_ids": GOOD_IDS}))
    i = data.index(b"NUMPY") + 200
    data[i] ^= 0x01  # a byte of topk_ids' data: the member fails its CRC
    return stats(write(d / "t.npz", bytes(data)))


@case("npz-bad-deflate", contains="")
def _npz_deflate(d: Path) -> list[str]:
    data = bytearray(npz_bytes({"topk_ids": _ids(3000, 2, 2)}, compress=True))
    mid = len(data) // 3
    data[mid : mid + 40] = b"\xff" * 40
    return stats(write(d / "t.npz", bytes(data)))


@case("npz-negative-shape", contains="")
def _npz_negative(d: Path) -> list[str]:
    member = npy_member("{'descr': '<i2', 'fortran_order': False, 'shape': (-5, 1, 1), }")
    return stats(write(d / "t.npz", zip_of({"topk_ids.npy": member})))


# -- aggregated load files --------------------------------------------------------------------
def _file_case(name: str, data: str | bytes, *extra: str) -> Builder:
    def build(d: Path) -> list[str]:
        return stats(write(d / name, data), *extra)
    return build


many([
    ("csv-expert-99999999", _file_case("l.csv", "layer,expert,load\n0,99999999,5\n"), 1,
     "expert"),
    ("csv-layer-2^40", _file_case("l.csv", f"layer,expert,load\n{2**40},1,5\n"), 1, "layer"),
    ("csv-load-1e300", _file_case("l.csv", "layer,expert,load\n0,1,1e300\n"), 1, "load"),
    ("csv-load-inf", _file_case("l.csv", "layer,expert,load\n0,1,inf\n"), 1, "whole number"),
    ("csv-load-nan", _file_case("l.csv", "layer,expert,load\n0,1,nan\n"), 1, "whole number"),
    ("csv-load-negative", _file_case("l.csv", "layer,expert,load\n0,1,-3\n"), 1, ">= 0"),
    ("csv-load-near-2^62", _file_case(
        "l.csv", f"layer,expert,load\n0,0,{2**62}\n0,1,{2**62}\n", "--top-k", "1"), 1,
     "load"),
    ("csv-total-past-2^53", _file_case(
        "l.csv", "layer,expert,load\n" + "".join(f"0,{i},{2**52}\n" for i in range(3)),
        "--top-k", "1"), 1, "2^53"),
    ("csv-duplicate-cell", _file_case("l.csv", "layer,expert,load\n0,1,5\n0,1,6\n"), 1, "twice"),
    ("csv-missing-column", _file_case("l.csv", "layer,load\n0,5\n", "--format", "load-csv"), 1,
     "missing column"),
    ("csv-missing-column-detected", _file_case("l.csv", "layer,load\n0,5\n"), 1,
     "cannot tell"),
    ("csv-unknown-column", _file_case("l.csv", "layer,expert,load,x\n0,1,5,3\n"), 1,
     "unknown column"),
    ("csv-field-count", _file_case("l.csv", "layer,expert,load\n0,1\n"), 1, "fields"),
    ("csv-header-only", _file_case("l.csv", "layer,expert,load\n"), 1, "no rows"),
    ("csv-not-utf8", _file_case("l.csv", b"layer,expert,load\n0,1,5\n0,\xff\xfe,5\n"), 1,
     "UTF-8"),
    ("csv-huge-field", _file_case("l.csv", "layer,expert,load\n0,1,\"" + "9" * 200_000 + "\"\n"),
     1, "CSV"),
    ("csv-fraction", _file_case("l.csv", "layer,expert,load\n0,1,1.5\n"), 1, "whole number"),
    ("csv-top-k-above-experts", _file_case("l.csv", "layer,expert,load\n0,0,5\n0,1,5\n",
                                           "--top-k", "3"), 1, "top_k 3"),
    ("json-nested-100000", _file_case("l.json", '{"load": ' + deep(100_000) + "}"), 1, "nests"),
    ("json-nan-load", _file_case("l.json", '{"load": [[NaN, 1]], "top_k": 1}'), 1, "JSON"),
    ("json-int-beyond-int64", _file_case("l.json", f'{{"load": [[1, {10**30}]], "top_k": 1}}'),
     1, "64-bit"),
    ("json-5000-digits", _file_case("l.json", f'{{"load": [[1, {"9" * 5000}]], "top_k": 1}}'),
     1, "JSON"),
    ("json-ragged", _file_case("l.json", '{"load": [[1, 2], [3]], "top_k": 1}'), 1, "array"),
    ("json-strings", _file_case("l.json", '{"load": [["a", "b"]], "top_k": 1}'), 1, "numeric"),
    ("json-unknown-entry", _file_case("l.json", '{"load": [[1, 2]], "top_k": 1, "x": 1}'), 1,
     "unknown entries"),
    ("json-coact-asymmetric", _file_case(
        "l.json", '{"load": [[1, 1]], "coact": [[[0, 1], [0, 0]]], "top_k": 2}'), 1,
     "symmetric"),
    ("json-coact-shape", _file_case("l.json", '{"load": [[1, 1]], "coact": [[1]], "top_k": 2}'),
     1, "coact has shape"),
    ("json-top-k-above-experts", _file_case("l.json", '{"load": [[4, 4, 4, 4]], "top_k": 9}'),
     1, "top_k 9"),
    ("json-not-utf8", _file_case("l.json", b'{"load": [[1, 2]], "top_k": 1, "\xff": 1}'), 1,
     "UTF-8"),
    ("json-float-1e300", _file_case("l.json", '{"load": [[1e300, 1]], "top_k": 1}'), 1, "load"),
    ("json-negative", _file_case("l.json", '{"load": [[[1, -2]]], "top_k": 1}'), 1, ">= 0"),
    ("json-top-k-string", _file_case("l.json", '{"load": [[1, 2]], "top_k": "2"}'), 1,
     "positive integer"),
    ("json-experts-40000", _file_case("l.json", '{"load": [[1, 2]], "top_k": 1,'
                                      ' "num_experts": 40000}'), 1, "more than placer handles"),
    ("npy-object", _file_case("l.npy", npy_member(
        "{'descr': '|O', 'fortran_order': False, 'shape': (2, 2), }")), 1, ""),
    ("npy-1d", _file_case("l.npy", (lambda b: (np.save(b, np.arange(4)), b.getvalue())[1])(
        io.BytesIO())), 1, "shape"),
    ("npy-nan", _file_case("l.npy", (lambda b: (np.save(b, np.array([[np.nan, 1.0]])),
                                                b.getvalue())[1])(io.BytesIO()), "--top-k", "1"),
     1, "whole count"),
    ("npy-4d", _file_case("l.npy", (lambda b: (np.save(b, np.ones((1, 1, 1, 1))),
                                               b.getvalue())[1])(io.BytesIO())), 1, "shape"),
    ("load-npz-negative", _npz_case(load=np.array([[1, -1]])), 1, ">= 0"),
    ("load-npz-layer-ids-negative", _npz_case(load=np.ones((2, 2), np.int64),
                                              layer_ids=np.array([-1, 0])), 1, "layer"),
    ("load-npz-window-starts", _npz_case(load=np.ones((2, 2, 2), np.int64),
                                         window_starts=np.arange(3), top_k=np.array(1)), 1,
     "window_starts"),
    ("load-npz-coact-declared-huge", lambda d: stats(write(d / "l.npz", zip_of({
        "load.npy": npz_member_bytes(np.ones((1, 4), np.int64)),
        "coact.npy": npy_member("{'descr': '<i8', 'fortran_order': False, "
                                "'shape': (1, 32768, 32768), }")}))), 1, "truncated"),
])


def npz_member_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


@case("npy-declares-10^12", contains="", bomb=True)
def _npy_declares(d: Path) -> list[str]:
    return stats(write(d / "l.npy", npy_member(
        "{'descr': '<i8', 'fortran_order': False, 'shape': (1, 1000000, 1000000), }",
        b"\x00" * 64)))


@case("csv-windows-by-layers-budget", contains="more than placer's", bomb=True)
def _csv_budget(d: Path) -> list[str]:
    rows = "".join(f"{w},{layer},0,1\n" for w in range(33) for layer in range(33))
    return stats(write(d / "l.csv", "window,layer,expert,load\n" + rows + "0,0,32767,1\n"),
                 "--top-k", "1")


@case("json-65MiB", contains="larger than", bomb=True)
def _json_big(d: Path) -> list[str]:
    path = write(d / "l.json", '{"load": ')
    with open(path, "r+b") as f:
        f.truncate(65 << 20)  # sparse: no disk, but 65 MiB to read
    return stats(path)


@case("load-npz-zip-bomb", contains="inflates", bomb=True)
def _load_bomb(d: Path) -> list[str]:
    data = bomb_zip("load.npy", "{'descr': '<i8', 'fortran_order': False, "
                    "'shape': (10485760, 1), }", 80 << 20, {})
    return stats(write(d / "l.npz", data))


# -- SGLang recorder dumps (.pt) --------------------------------------------------------------
@case("pt-zero-stride-bomb", contains="more than their storages", bomb=True)
def _pt_stride(d: Path) -> list[str]:
    def build(storage: Callable[[np.ndarray], _PendingStorage]) -> Any:
        s = storage(np.array([7], np.int32))
        return {"rank": 0, "logical_count": _Tensor(s, (4096, 64, 1024), (0, 0, 0))}
    return stats(write(d / "d.pt", pt_bytes(build)))


@case("pt-views-repeat-storage", contains="more than their storages", bomb=True)
def _pt_views(d: Path) -> list[str]:
    def build(storage: Callable[[np.ndarray], _PendingStorage]) -> Any:
        s = storage(np.zeros(1 << 22, np.int32))  # 16 MiB, viewed 64 times
        return {"rank": 0, "logical_count": [_Tensor(s, (1 << 22,), (1,)) for _ in range(64)]}
    return stats(write(d / "d.pt", pt_bytes(build)))


@case("pt-beyond-storage", contains="reaches element")
def _pt_beyond(d: Path) -> list[str]:
    def build(storage: Callable[[np.ndarray], _PendingStorage]) -> Any:
        return {"logical_count": _Tensor(storage(np.ones(4, np.int32)), (2, 2, 2), (4, 2, 1))}
    return stats(write(d / "d.pt", pt_bytes(build)))


@case("pt-negative-stride", contains="negative")
def _pt_negative(d: Path) -> list[str]:
    def build(storage: Callable[[np.ndarray], _PendingStorage]) -> Any:
        return {"logical_count": _Tensor(storage(np.ones(4, np.int32)), (1, 2, 2), (4, -2, 1))}
    return stats(write(d / "d.pt", pt_bytes(build)))


@case("pt-bfloat16-odd-bytes", contains="")
def _pt_bf16(d: Path) -> list[str]:
    def build(storage: Callable[[np.ndarray], _PendingStorage]) -> Any:
        return {"logical_count": _Tensor(storage(np.ones(3, np.uint16)), (1, 1, 1), (1, 1, 1))}
    data = pt_bytes(build)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    members["archive/data/0"] = members["archive/data/0"][:-1]
    return stats(write(d / "d.pt", zip_of(members)))


@case("pt-os-system", contains="refusing to load global 'os.system'")
def _pt_evil(d: Path) -> list[str]:
    evil = b"\x80\x02cos\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03."
    return stats(write(d / "d.pt", pt_zip(evil, {})))


@case("pt-garbage-pickle", contains="cannot unpickle")
def _pt_garbage(d: Path) -> list[str]:
    return stats(write(d / "d.pt", pt_zip(b"\x80\x02\xff\xfe garbage", {})))


@case("pt-deep-pickle", contains="")
def _pt_deep(d: Path) -> list[str]:
    nested: Any = []
    for _ in range(200):
        nested = [nested]
    return stats(write(d / "d.pt", pt_zip(pickle.dumps({"logical_count": nested}, 2), {})))


@case("pt-storage-missing", contains="missing")
def _pt_missing(d: Path) -> list[str]:
    data = pt_bytes(lambda storage: {"logical_count": _Tensor(
        storage(np.ones(8, np.int32)), (2, 2, 2), (4, 2, 1))})
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        members = {n: zf.read(n) for n in zf.namelist() if not n.startswith("archive/data/")}
    return stats(write(d / "d.pt", zip_of(members)))


@case("pt-truncated", contains="")
def _pt_cut(d: Path) -> list[str]:
    path = pt(d / "d.pt", {"logical_count": np.ones((4, 2, 8), np.int32)})
    data = path.read_bytes()
    return stats(write(d / "c.pt", data[: len(data) // 2]), "--format", "sglang")


@case("pt-two-pickles", contains="one data.pkl")
def _pt_two(d: Path) -> list[str]:
    return stats(write(d / "d.pt", zip_of({"a/data.pkl": pickle.dumps({}), "b/data.pkl":
                                           pickle.dumps({}), "a/version": b"3"})),
                 "--format", "sglang")


@case("pt-data-pkl-bomb", contains="inflates", bomb=True)
def _pt_pkl_bomb(d: Path) -> list[str]:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("archive/version", "3\n")
        info = zipfile.ZipInfo("archive/data.pkl", date_time=(1980, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_DEFLATED
        with zf.open(info, "w", force_zip64=True) as f:
            f.write(b"\x80\x02")
            for _ in range(80):
                f.write(bytes(1 << 20))
    return stats(write(d / "d.pt", buf.getvalue()))


def _sglang(obj: Any, *extra: str) -> Builder:
    def build(d: Path) -> list[str]:
        return stats(pt(d / "d.pt", obj), *extra)
    return build


P2L = np.tile(np.arange(4), (2, 1)).astype(np.int64)
many([
    ("sglang-not-a-dict", _sglang([1, 2]), 1, "expected a dict"),
    ("sglang-no-keys", _sglang({"x": 1}), 1, "not an SGLang"),
    ("sglang-count-2d", _sglang({"logical_count": np.ones((2, 2), np.int32)}), 1,
     "logical_count"),
    ("sglang-count-negative", _sglang({"logical_count": -np.ones((2, 2, 2), np.int32)}), 1,
     ">= 0"),
    ("sglang-count-float", _sglang({"logical_count": np.ones((2, 2, 2), np.float32)}), 1,
     "integer"),
    ("sglang-count-zero", _sglang({"logical_count": np.zeros((2, 2, 2), np.int32)}), 1,
     "all zero"),
    ("sglang-count-40000-experts", _sglang({"logical_count": np.ones((1, 1, 40000), np.int32)},
                                           "--top-k", "1"), 1, "more than placer handles"),
    ("sglang-count-near-2^62", _sglang({"logical_count": np.full((1, 1, 4), 2**62, np.int64)},
                                       "--top-k", "1"), 1, "2^53"),
    ("sglang-per-token-out-of-range", _sglang({
        "records": [{"forward_pass_id": 0, "rank": 0,
                     "topk_ids_of_layer": np.full((2, 3, 2), 9, np.int32)}],
        "last_physical_to_logical_map": P2L}), 1, "outside"),
    ("sglang-per-token-ndim", _sglang({
        "records": [{"forward_pass_id": 0, "rank": 0,
                     "topk_ids_of_layer": np.zeros((2, 3), np.int32)}],
        "last_physical_to_logical_map": P2L}), 1, "shape"),
    ("sglang-per-token-pass-id-string", _sglang({
        "records": [{"forward_pass_id": "x", "rank": 0,
                     "topk_ids_of_layer": np.zeros((2, 3, 2), np.int32)}],
        "last_physical_to_logical_map": P2L}), 1, "forward_pass_id"),
    ("sglang-per-pass-negative", _sglang({
        "records": [{"forward_pass_id": 0, "rank": 0,
                     "global_physical_count": -np.ones((2, 4), np.int64)}],
        "last_physical_to_logical_map": P2L}, "--top-k", "1"), 1, ">= 0"),
    ("sglang-per-pass-shape", _sglang({
        "records": [{"forward_pass_id": 0, "rank": 0,
                     "global_physical_count": np.ones((3, 4), np.int64)}],
        "last_physical_to_logical_map": P2L}, "--top-k", "1"), 1, "shape"),
    ("sglang-map-40000", _sglang({
        "records": [{"forward_pass_id": 0, "rank": 0,
                     "global_physical_count": np.ones((1, 2), np.int64)}],
        "last_physical_to_logical_map": np.array([[0, 40000]])}, "--top-k", "1"), 1,
     "more than placer handles"),
    ("sglang-map-negative", _sglang({"records": [], "last_physical_to_logical_map":
                                     np.array([[0, -1]])}), 1, "logical expert ids"),
    ("sglang-records-not-list", _sglang({"records": {"a": 1}, "last_physical_to_logical_map":
                                         P2L}), 1, "records must be a list"),
])


# -- TensorRT-LLM statistics folders ---------------------------------------------------------
def _trt(tensors: dict[str, tuple[str, list[int], bytes]], **kw: Any) -> Builder:
    def build(d: Path) -> list[str]:
        return trtllm(d, tensors, **kw)
    return build


F32 = np.array([np.nan, 1, 2, 3], "<f4").tobytes()
many([
    ("trtllm-nan-float-counts", _trt({"0_3": ("F32", [4], F32)}), 1, "whole count"),
    ("trtllm-negative-counts", _trt({"0_3": ("I64", [4], np.array([5, -112, 2, 1],
                                                                  "<i8").tobytes())}), 1,
     ">= 0"),
    ("trtllm-u64-past-int64", _trt({"0_3": ("U64", [4], np.array([2**64 - 1, 1, 2, 3],
                                                                 "<u8").tobytes())}), 1, ""),
    ("trtllm-float-1e300", _trt({"0_3": ("F64", [4], np.array([1e300, 1, 2, 3],
                                                              "<f8").tobytes())}), 1, ""),
    ("trtllm-negative-shape", _trt({"0_3": ("I64", [-4], b"")}), 1, "shape"),
    ("trtllm-overflowing-shape", _trt({"0_3": ("I64", [2**62, 4], b"")}), 1, "data_offsets"),
    ("trtllm-header-past-end", lambda d: trtllm(d, {}, header={"x": 1}) and
     (write(d / "stat" / "rank0.safetensors", struct.pack("<Q", 10**6) + b"{}"),
      stats(d / "stat"))[1], 1, "header length"),
    ("trtllm-header-not-json", lambda d: (trtllm(d, {}), write(
        d / "stat" / "rank0.safetensors", struct.pack("<Q", 5) + b"{oops"), stats(d / "stat"))[2],
     1, "JSON"),
    ("trtllm-meta-not-utf8", _trt({"0_3": GOOD_COUNTS}, meta=b'{"num_experts": 4, "x": "\xff"}'),
     1, "UTF-8"),
    ("trtllm-meta-experts-string", _trt({"0_3": GOOD_COUNTS},
                                        meta='{"num_experts": "x", "num_experts_per_token": 2}'),
     1, "positive integer"),
    ("trtllm-meta-experts-10^9", _trt({"0_3": GOOD_COUNTS},
                                      meta='{"num_experts": 1000000000, "num_experts_per_token":'
                                           ' 2}'), 1, "more than placer handles"),
    ("trtllm-meta-nested", _trt({"0_3": GOOD_COUNTS}, meta='{"num_experts": ' + deep(5000) + "}"),
     1, "nests"),
    ("trtllm-meta-top-k-above-experts", _trt({"0_3": GOOD_COUNTS},
                                             meta='{"num_experts": 4, "num_experts_per_token":'
                                                  ' 9}'), 1, "num_experts"),
    ("trtllm-bad-key", _trt({"layer3": GOOD_COUNTS}), 1, "iter"),
    ("trtllm-wrong-length", _trt({"0_3": ("I64", [2], np.array([1, 2], "<i8").tobytes())}), 1,
     "shape"),
    ("trtllm-balancer-laughs", _trt({"0_3": GOOD_COUNTS}, extra={
        "lb.yaml": LAUGHS + "initial_global_assignments: {3: *i}\n"}), 1, "expands"),
    ("trtllm-balancer-recursive", _trt({"0_3": GOOD_COUNTS}, extra={
        "lb.yaml": "initial_global_assignments: &a {3: [*a]}\n"}), 1, ""),
    ("trtllm-balancer-strings", _trt({"0_3": GOOD_COUNTS}, extra={
        "lb.yaml": "initial_global_assignments: {3: [a, b, c, d]}\n"}), 1, "expert ids"),
    ("trtllm-balancer-empty-slots", _trt({"0_3": GOOD_COUNTS}, extra={
        "lb.yaml": "initial_global_assignments: {3: []}\n"}), 1, "expert ids"),
    ("trtllm-balancer-not-utf8", _trt({"0_3": GOOD_COUNTS}, extra={
        "lb.yaml": b"initial_global_assignments: {3: [0, 1, 2, 3]}\n# \xff\n"}), 1, "UTF-8"),
])


@case("trtllm-no-rank-files", contains="rank")
def _trt_none(d: Path) -> list[str]:
    (d / "stat").mkdir()
    write(d / "stat" / "meta_info.json", '{"num_experts": 4, "num_experts_per_token": 2}')
    return stats(d / "stat" / "meta_info.json")


# -- topology files ----------------------------------------------------------------------------
def _topology(text: str | bytes, command: str = "validate") -> Builder:
    def build(d: Path) -> list[str]:
        return ["topology", command, str(write(d / "t.yaml", text))]
    return build


many([
    ("topology-count-10^8", _topology(TOPOLOGY.replace("name: node0", "name: node\n    count:"
                                                        " 100000000")), 1,
     "more than placer handles"),
    ("topology-count-times-gpus", _topology(TOPOLOGY.replace("name: node0", "name: node\n    "
                                                              "count: 16384")), 1,
     "more than 16,384 GPUs"),
    ("topology-gpus-10^8", _topology(TOPOLOGY.replace("gpus: 8", "gpus: 100000000")), 1,
     "more than placer handles"),
    ("topology-gpus-per-switch-10^9", _topology(TOPOLOGY.replace(
        "{kind: nvswitch, gbps: 450}", "{kind: pcie, gbps: 32, gpus_per_switch: 1000000000}")),
     1, "more than placer handles"),
    ("topology-laughs", _topology(LAUGHS + TOPOLOGY), 1, "expands"),
    ("topology-recursive-alias", _topology("a: &a [*a]\n" + TOPOLOGY), 1, "nests"),
    ("topology-nested-5000", _topology("x: " + deep(5000) + "\n" + TOPOLOGY), 1, "nest"),
    ("topology-not-utf8", _topology(TOPOLOGY.encode() + b"# \xff\xfe\n"), 1, "UTF-8"),
    ("topology-int-past-int64", _topology(TOPOLOGY.replace("gpus: 8", f"gpus: {10**30}")), 1,
     "64-bit"),
    ("topology-gpus-float-inf", _topology(TOPOLOGY.replace("gpus: 8", "gpus: .inf")), 1,
     "integer"),
    ("topology-memory-nan", _topology(TOPOLOGY.replace("memory_gb: 80", "memory_gb: .nan")), 1,
     "finite"),
    ("topology-list-key", _topology("? [a, b]\n: 1\n" + TOPOLOGY), 1, "key"),
    ("topology-empty", _topology(""), 1, "mapping"),
    ("topology-show-laughs", _topology(LAUGHS + TOPOLOGY, "show"), 1, "expands"),
    ("topology-nodes-not-list", _topology(TOPOLOGY.split("nodes:")[0] + "nodes: 3\n"), 1,
     "list"),
])
many([
    ("topology-tabs", _topology(TOPOLOGY.replace("    gpus: 8", "\tgpus: 8")), 1, "YAML"),
    ("topology-merge-scalar", _topology("x: {<<: 1}\n" + TOPOLOGY), 1, "YAML"),
])


@case("topology-dev-zero", contains="")
def _topo_zero(d: Path) -> list[str]:
    return ["topology", "validate", "/dev/zero"]


@case("topology-65MiB", contains="larger than", bomb=True)
def _topo_big(d: Path) -> list[str]:
    path = write(d / "t.yaml", TOPOLOGY)
    with open(path, "r+b") as f:
        f.truncate(65 << 20)
    return ["topology", "validate", str(path)]


@case("topology-folder", contains="folder")
def _topo_dir(d: Path) -> list[str]:
    (d / "t.yaml").mkdir()
    return ["topology", "validate", str(d / "t.yaml")]


@case("topology-symlink-loop", contains="link")
def _topo_loop(d: Path) -> list[str]:
    os.symlink(d / "b.yaml", d / "a.yaml")
    os.symlink(d / "a.yaml", d / "b.yaml")
    return ["topology", "validate", str(d / "a.yaml")]


# -- model files -------------------------------------------------------------------------------
def _model(text: str | bytes, name: str = "m.yaml") -> Builder:
    def build(d: Path) -> list[str]:
        return ["model", "show", str(write(d / name, text))]
    return build


def _hf(**change: Any) -> Builder:
    return _model(json.dumps({**HF, **change}), "config.json")


many([
    ("model-layers-10^8", _model(MODEL.replace("num_hidden_layers: 4",
                                               "num_hidden_layers: 100000000")), 1,
     "more than placer handles"),
    ("model-layer-range-10^8", _model(MODEL + "moe_layer_ids: {first: 0, last: 100000000}\n"), 1,
     "more than placer handles"),
    ("model-layer-id-10^8", _model(MODEL + "moe_layer_ids: [1, 100000000]\n"), 1,
     "more than placer handles"),
    ("model-experts-40000", _model(MODEL.replace("num_experts: 8", "num_experts: 40000")), 1,
     "more than placer handles"),
    ("model-top-k-above-experts", _model(MODEL.replace("top_k: 2", "top_k: 9")), 1, "exceeds"),
    ("model-top-k-300", _model(MODEL.replace("top_k: 2", "top_k: 300").replace(
        "num_experts: 8", "num_experts: 512")), 1, "more than placer handles"),
    ("model-hidden-10^12", _model(MODEL.replace("hidden_size: 1024", "hidden_size: 10000000000"
                                                "00")), 1, "more than placer handles"),
    ("model-params-10^20", _model(MODEL.replace("non_expert_params: 1000000",
                                                "non_expert_params: 100000000000000000000")), 1,
     "64-bit"),
    ("model-laughs", _model(LAUGHS + MODEL), 1, "expands"),
    ("model-recursive-alias", _model("a: &a {b: *a}\n" + MODEL), 1, "nests"),
    ("model-not-utf8", _model(MODEL.encode() + b"# \xff\n"), 1, "UTF-8"),
    ("hf-layers-10^8", _hf(num_hidden_layers=100_000_000), 1, "more than placer handles"),
    ("hf-experts-10^6", _hf(num_experts=1_000_000), 1, "more than placer handles"),
    ("hf-vocab-10^12", _hf(vocab_size=10**12), 1, "more than placer handles"),
    ("hf-top-k-above-experts", _hf(num_experts_per_tok=9), 1, "exceeds"),
    ("hf-nested", _model('{"model_type": "qwen3_moe", "x": ' + deep(5000) + "}", "config.json"),
     1, "nests"),
    ("hf-nan", _model(json.dumps(HF)[:-1] + ', "rope_theta": NaN}', "config.json"), 1, "JSON"),
    ("hf-int-past-int64", _model(json.dumps(HF)[:-1] + f', "x": {10**30}}}', "config.json"), 1,
     "64-bit"),
    ("hf-not-utf8", _model(json.dumps(HF).encode()[:-1] + b', "x": "\xff"}', "config.json"), 1,
     "UTF-8"),
])


@case("capacity-model-laughs", contains="expands")
def _capacity_laughs(d: Path) -> list[str]:
    return ["capacity", "--model", str(write(d / "m.yaml", LAUGHS + MODEL)),
            "--topology", "dgx-h100"]


@case("capacity-topology-count", contains="more than placer handles")
def _capacity_topology(d: Path) -> list[str]:
    text = TOPOLOGY.replace("name: node0", "name: node\n    count: 100000000")
    return ["capacity", "--model", "mixtral-8x7b", "--topology", str(write(d / "t.yaml", text))]


# -- timings CSV (placer calibrate) ---------------------------------------------------------
A2A = ("benchmark,phase,mode,num_gpus,gpus_per_node,tokens_per_gpu,hidden,top_k,num_experts,"
       "top_groups,dtype,measured_us\n")
ROW = "all_to_all,dispatch,normal,8,8,4096,7168,8,256,0,fp8,{us}\n"


def _timings(text: str | bytes) -> Builder:
    def build(d: Path) -> list[str]:
        return ["calibrate", str(write(d / "t.csv", text)), "--topology", "dgx-h800"]
    return build


many([
    ("timings-gpus-10^9", _timings(A2A + ROW.format(us=100).replace(",8,8,", ",1000000000,8,")),
     1, "more than placer handles"),
    ("timings-tokens-10^9", _timings(A2A + ROW.format(us=100).replace("4096", "1000000000")), 1,
     "more than placer handles"),
    ("timings-tokens-product", _timings(A2A + ROW.format(us=100).replace(
        ",8,8,4096,", ",4096,8,65536,").replace(",256,", ",4096,")), 1, "tokens"),
    ("timings-hidden-10^12", _timings(A2A + ROW.format(us=100).replace("7168", "1000000000000")),
     1, "more than placer handles"),
    ("timings-nan", _timings(A2A + ROW.format(us="nan")), 1, "measured_us"),
    ("timings-not-utf8", _timings(A2A.encode() + b"\xff\xfe\n"), 1, "UTF-8"),
    ("timings-huge-field", _timings(A2A + "all_to_all,\"" + "x" * 200_000 + "\"\n"), 1, "CSV"),
    ("timings-5000-digits", _timings(A2A + ROW.format(us=100).replace("4096", "9" * 5000)), 1,
     "integer"),
])


# -- the same bad inputs through the other commands that read a trace ---------------------------
@case("plan-trace-expert-32768", contains="expert id 32768 is out of range [0, 8)")
def _plan(d: Path) -> list[str]:
    trace = write(d / "t.jsonl", jsonl([{"layer": 0, "experts": [32768, 1]}]))
    return ["plan", str(trace), "--model", "mixtral-8x7b", "--num-gpus", "8",
            "-o", str(d / "p.json")]


@case("plan-topology-laughs", contains="expands")
def _plan_topology(d: Path) -> list[str]:
    trace = write(d / "t.jsonl", jsonl([GOOD_ROW] * 4))
    return ["plan", str(trace), "--topology", str(write(d / "t.yaml", LAUGHS + TOPOLOGY)),
            "-o", str(d / "p.json")]


@case("plan-model-layers-10^8", contains="more than placer handles")
def _plan_model(d: Path) -> list[str]:
    trace = write(d / "t.jsonl", jsonl([GOOD_ROW] * 4))
    model = write(d / "m.yaml", MODEL.replace("num_hidden_layers: 4",
                                              "num_hidden_layers: 100000000"))
    return ["plan", str(trace), "--model", str(model), "--num-gpus", "8", "-o", str(d / "p.json")]


@case("plan-gzip-80MiB-blank-only", contains="the file is empty", bomb=True)
def _plan_bomb(d: Path) -> list[str]:
    data = gzip.compress(b"\n" * (80 << 20), 9, mtime=0)
    return ["plan", str(write(d / "t.jsonl.gz", data)), "--format", "jsonl", "--num-gpus", "8",
            "-o", str(d / "p.json")]


@case("plan-trtllm-nan", contains="whole count")
def _plan_trt(d: Path) -> list[str]:
    argv = trtllm(d, {"0_3": ("F32", [4], F32)})
    return ["plan", argv[1], "--num-gpus", "4", "-o", str(d / "p.json")]


@case("compare-csv-expert-99999999", contains="expert")
def _compare(d: Path) -> list[str]:
    trace = write(d / "l.csv", "layer,expert,load\n0,99999999,5\n")
    return ["compare", str(trace), "--topology", "dgx-h100", "--model", "mixtral-8x7b"]


def placement(path: Path) -> Path:
    """A valid placement of 8 experts on 8 GPUs, layer 0."""
    from placer.placement import Placement
    from placer.placement.document import write_placement

    write_placement(path, Placement(physical_to_logical=np.arange(8)[None], layer_ids=np.array([0]),
                                    num_experts=8, num_gpus=8))
    return path


@case("evaluate-npz-k-zero", contains="k = 0")
def _evaluate(d: Path) -> list[str]:
    trace = write(d / "t.npz", npz_bytes({"topk_ids": np.zeros((5, 2, 0), np.int16)}))
    return ["evaluate", str(trace), "-p", str(placement(d / "p.json")), "--model", "mixtral-8x7b",
            "--topology", "dgx-h100"]


@case("evaluate-csv-nan", contains="whole number")
def _evaluate_csv(d: Path) -> list[str]:
    trace = write(d / "l.csv", "layer,expert,load\n0,1,nan\n")
    return ["evaluate", str(trace), "-p", str(placement(d / "p.json")), "--model", "mixtral-8x7b",
            "--topology", "dgx-h100"]


@case("report-pt-zero-stride", contains="more than their storages")
def _report(d: Path) -> list[str]:
    def build(storage: Callable[[np.ndarray], _PendingStorage]) -> Any:
        s = storage(np.array([7], np.int32))
        return {"rank": 0, "logical_count": _Tensor(s, (4096, 64, 1024), (0, 0, 0))}
    trace = write(d / "d.pt", pt_bytes(build))
    return ["report", str(trace), "-p", str(placement(d / "p.json")), "--topology", "dgx-h100",
            "--model", "mixtral-8x7b", "-o", str(d / "r.html")]


@case("evaluate-sparse-tokens", contains="few of its", bomb=True)
def _evaluate_sparse(d: Path) -> list[str]:
    # 20,000 tokens, each in one of 4,096 layers: a dense [tokens, layers, k] trace of
    # 655 MB for 20,000 rows
    trace = write(d / "t.jsonl", jsonl(
        {"token": i, "layer": i % 4096, "experts": [i % 2, 7]} for i in range(20_000)))
    return ["evaluate", str(trace), "-p", str(placement(d / "p.json")), "--model", "mixtral-8x7b",
            "--topology", "dgx-h100"]


# -- placement JSON (evaluate -p, export, plan --current) -----------------------------------------
def placement_doc(layers: int = 1) -> dict[str, Any]:
    """A valid placement document: 8 experts on 8 GPUs, layers 0 .. layers - 1."""
    return {
        "format": "placer-placement", "version": 1,
        "model": {"name": None, "num_experts": 8, "top_k": None},
        "topology": {"name": None, "num_gpus": 8, "num_nodes": None},
        "num_physical_experts": 8, "slots_per_gpu": 1,
        "layers": [{"layer": i, "physical_to_logical": list(range(8))} for i in range(layers)],
    }


def changed(path: str, value: Any, layers: int = 1) -> str:
    """``placement_doc`` as JSON with the field at dotted ``path`` set to ``value``
    (``layers.0.physical_to_logical.3``); ``None`` as ``value`` of a missing key removes it."""
    doc: Any = placement_doc(layers)
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return json.dumps(doc)


#: A per-token trace of 8 experts for layer 0 (the placements above cover it).
TRACE8 = jsonl({"layer": 0, "experts": [i % 8, (i + 3) % 8]} for i in range(16))


def _evaluate_p(make: Callable[[Path], Path]) -> Builder:
    def build(d: Path) -> list[str]:
        return ["evaluate", str(write(d / "t.jsonl", TRACE8)), "-p", str(make(d)),
                "--model", "mixtral-8x7b", "--topology", "dgx-h100"]
    return build


def _export_p(make: Callable[[Path], Path]) -> Builder:
    def build(d: Path) -> list[str]:
        return ["export", str(make(d)), "--format", "sglang", "-o", str(d / "out.json"),
                "--model", "mixtral-8x7b"]
    return build


def _current_p(make: Callable[[Path], Path]) -> Builder:
    def build(d: Path) -> list[str]:
        return ["plan", str(write(d / "t.jsonl", TRACE8)), "--current", str(make(d)),
                "--model", "mixtral-8x7b", "--topology", "dgx-h100", "-s", "eplb",
                "-o", str(d / "out.json")]
    return build


def text_file(data: str | bytes, name: str = "p.json") -> Callable[[Path], Path]:
    return lambda d: write(d / name, data)


def folder(d: Path) -> Path:
    (d / "p.json").mkdir()
    return d / "p.json"


def fifo(d: Path) -> Path:
    """A named pipe nobody writes to: opening it for reading would wait forever."""
    os.mkfifo(d / "p.json")
    return d / "p.json"


def link_loop(d: Path) -> Path:
    os.symlink(d / "b.json", d / "p.json")
    os.symlink(d / "p.json", d / "b.json")
    return d / "p.json"


_GOOD_PLACEMENT = json.dumps(placement_doc())
_DUPLICATE_LAYERS = _GOOD_PLACEMENT[:-1] + ', "layers": []}'
_P2L = "layers.0.physical_to_logical"
many([
    ("evaluate-placement-truncated", _evaluate_p(text_file(_GOOD_PLACEMENT[:90])), 1,
     "invalid JSON"),
    ("export-placement-empty", _export_p(text_file("")), 1, "invalid JSON"),
    ("plan-current-top-level-array", _current_p(text_file("[1, 2, 3]")), 1, "expected object"),
    ("evaluate-placement-layers-object", _evaluate_p(text_file(changed("layers", {"0": 1}))), 1,
     "layers"),
    ("export-placement-string-expert", _export_p(text_file(changed(f"{_P2L}.3", "3"))), 1,
     "expected integer"),
    ("plan-current-nan-expert", _current_p(text_file(
        changed(f"{_P2L}.3", 3).replace(", 3,", ", NaN,"))), 1,
     "p.json:1: layers[0].physical_to_logical[3]: invalid JSON: NaN is not a JSON number"),
    ("evaluate-placement-infinity", _evaluate_p(text_file(
        changed("slots_per_gpu", 1).replace('"slots_per_gpu": 1', '"slots_per_gpu": Infinity'))),
     1, "p.json:1: slots_per_gpu: invalid JSON: Infinity is not a JSON number"),
    ("export-placement-int-10^30", _export_p(text_file(changed(f"{_P2L}.3", 10**30))), 1,
     "64-bit"),
    ("plan-current-gpus-2^70", _current_p(text_file(changed("topology.num_gpus", 2**70))), 1,
     "64-bit"),
    ("evaluate-placement-experts-10^15", _evaluate_p(text_file(
        changed("model.num_experts", 10**15))), 1, "more than placer handles"),
    ("export-placement-gpus-10^12", _export_p(text_file(
        changed("topology.num_gpus", 10**12).replace('"num_physical_experts": 8',
                                                     '"num_physical_experts": 1000000000000'))),
     1, "more than placer handles"),
    ("plan-current-expert-out-of-range", _current_p(text_file(changed(f"{_P2L}.7", 8))), 1,
     "8"),
    ("evaluate-placement-negative-expert", _evaluate_p(text_file(changed(f"{_P2L}.0", -1))), 1,
     "-1"),
    ("export-placement-bool-expert", _export_p(text_file(changed(f"{_P2L}.1", True))), 1,
     "boolean"),
    ("plan-current-float-expert", _current_p(text_file(changed(f"{_P2L}.1", 1.0))), 1,
     "expected integer"),
    ("evaluate-placement-short-row", _evaluate_p(text_file(changed(_P2L, list(range(7))))), 1,
     "7 slots"),
    ("export-placement-ragged-rows", _export_p(text_file(
        changed("layers.1.physical_to_logical", [0, 1, 2, 3, 4, 5, 6, 7, 0], layers=2))), 1,
     "9 slots"),
    ("plan-current-duplicate-layer", _current_p(text_file(changed("layers.1.layer", 0, 2))), 1,
     "repeats"),
    ("evaluate-placement-duplicate-key", _evaluate_p(text_file(_DUPLICATE_LAYERS)), 1,
     "duplicate key"),
    ("export-placement-nested-100000", _export_p(text_file(
        changed("metrics", 1).replace('"metrics": 1', '"metrics": ' + deep(100_000)))), 1,
     "nests deeper"),
    ("plan-current-not-utf8", _current_p(text_file(
        _GOOD_PLACEMENT.encode().replace(b"null", b"\"\xff\xfe\"", 1))), 1, "UTF-8"),
    ("evaluate-placement-folder", _evaluate_p(folder), 1, "folder"),
    ("export-placement-fifo", _export_p(fifo), 1, "pipe"),
    ("plan-current-symlink-loop", _current_p(link_loop), 1, "link"),
    ("evaluate-placement-missing", _evaluate_p(lambda d: d / "absent.json"), 1, "not found"),
    ("export-placement-no-layers", _export_p(text_file(changed("layers", []))), 1,
     "at least 1"),
    ("plan-current-layers-missing", _current_p(text_file(
        json.dumps({k: v for k, v in placement_doc().items() if k != "layers"}))), 1,
     "required field is missing"),
    ("evaluate-placement-negative-layer", _evaluate_p(text_file(changed("layers.0.layer", -3))),
     1, "-3"),
    ("export-placement-layer-10^12", _export_p(text_file(
        changed("layers.0.layer", 10**12))), 1, "more than placer handles"),
    ("plan-current-slots-mismatch", _current_p(text_file(changed("slots_per_gpu", 2))), 1,
     "num_physical_experts"),
    ("evaluate-placement-engine-format", _evaluate_p(text_file(changed("format", "sglang"))), 1,
     "unknown format"),
    ("export-placement-version-2", _export_p(text_file(changed("version", 2))), 1,
     "unsupported version"),
    ("plan-current-slots-zero", _current_p(text_file(changed("slots_per_gpu", 0))), 1, ">= 1"),
    ("evaluate-placement-expert-missing", _evaluate_p(text_file(
        changed(_P2L, [0, 1, 2, 3, 4, 5, 6, 6]))), 1, "no replica"),
    ("export-placement-layer-not-in-model", _export_p(text_file(changed("layers.0.layer", 77))),
     1, "p.json: layers[0]: layer 77 of the placement is not a MoE layer of mixtral-8x7b"),
    ("export-placement-layers-missing", _export_p(text_file(json.dumps(placement_doc(2)))), 1,
     "p.json: SGLang needs a placement for every MoE layer of mixtral-8x7b; 30 missing"),
    ("export-placement-5000-layers", _export_p(text_file(json.dumps(placement_doc(5000)))), 1,
     "more than placer handles"),
    ("plan-current-row-of-10^6", _current_p(text_file(
        changed(_P2L, [0] * 1_000_000).replace('"slots_per_gpu": 1', '"slots_per_gpu": 125000')
        .replace('"num_physical_experts": 8', '"num_physical_experts": 1000000'))), 1,
     "no replica"),
])


# -- engine placement files read back (placer import) -------------------------------------------
def _import(fmt: str, make: Callable[[Path], Path], *extra: str) -> Builder:
    def build(d: Path) -> list[str]:
        return ["import", str(make(d)), "--format", fmt, "--model", "mixtral-8x7b",
                "--ep-size", "8", "-o", str(d / "out.json"), *extra]
    return build


#: SGLang's map: one row of 8 slots per hidden layer of Mixtral (32).
SGLANG_ROWS = [list(range(8)) for _ in range(32)]


def sglang_doc(rows: Any = None) -> str:
    return json.dumps({"physical_to_logical_map": SGLANG_ROWS if rows is None else rows})


def rows_with(layer: int, row: Any) -> list[Any]:
    rows: list[Any] = [list(r) for r in SGLANG_ROWS]
    rows[layer] = row
    return rows


def _sg(data: str | bytes) -> Builder:
    return _import("sglang", text_file(data, "m.json"))


def _vl(data: str | bytes) -> Builder:
    return _import("vllm", text_file(data, "m.json"))


TRT_HEAD = "num_slots: 8\nlayer_updates_per_iter: 0\ninitial_global_assignments:\n"
TRT_ROWS = "".join(f"  {i}: [0, 1, 2, 3, 4, 5, 6, 7]\n" for i in range(32))


def _trt(data: str | bytes) -> Builder:
    return _import("trtllm", text_file(data, "m.yaml"))


def eplb_file(arrays: dict[str, np.ndarray] | bytes) -> Callable[[Path], Path]:
    data = arrays if isinstance(arrays, bytes) else npz_bytes(arrays)
    return text_file(data, "m.npz")


_PHY2LOG = np.tile(np.arange(8), (32, 1))
#: DeepSeek EPLB's arrays for Mixtral on 8 GPUs: one replica of every expert.
EPLB_ARRAYS = {"phy2log": _PHY2LOG, "log2phy": _PHY2LOG[:, :, None],
               "logcnt": np.ones((32, 8), int)}
many([
    ("import-sglang-truncated", _sg(sglang_doc()[:50]), 1, "invalid JSON"),
    ("import-sglang-nan", _sg(sglang_doc(rows_with(3, [0, 1, 2, 3, 4, 5, 6, 7]))
                              .replace("7]]", "NaN]]")), 1, "NaN"),
    ("import-sglang-nested-100000", _sg(deep(100_000)), 1, "nests deeper"),
    ("import-sglang-not-utf8", _sg(b'{"physical_to_logical_map": "\xff"}'), 1, "UTF-8"),
    ("import-sglang-duplicate-key", _sg(sglang_doc()[:-1] + ', "physical_to_logical_map": []}'),
     1, "duplicate key"),
    ("import-sglang-not-rectangle", _sg(sglang_doc(rows_with(5, [*range(8), 0]))), 1,
     "9 slots"),
    ("import-sglang-bool-ids", _sg(sglang_doc(rows_with(1, [True, *range(1, 8)]))), 1,
     "integers"),
    ("import-sglang-negative-id", _sg(sglang_doc(rows_with(2, [-1, *range(1, 8)]))), 1,
     "-1"),
    ("import-sglang-int-10^30", _sg(sglang_doc(rows_with(2, [10**30, *range(1, 8)]))), 1,
     "64-bit"),
    ("import-sglang-missing-layers", _sg(sglang_doc(SGLANG_ROWS[:20])), 1, "20 rows"),
    ("import-sglang-float-ids", _sg(sglang_doc(rows_with(0, [0.0, *range(1, 8)]))), 1,
     "integers"),
    ("import-sglang-folder", _import("sglang", lambda d: (d / "m.json").mkdir() or d / "m.json"),
     1, "folder"),
    ("import-sglang-fifo", _import("sglang", lambda d: os.mkfifo(d / "m.json") or d / "m.json"),
     1, "pipe"),
    ("import-sglang-symlink-loop", _import("sglang", link_loop), 1, "link"),
    ("import-sglang-65MiB", _sg(sglang_doc()[:-2] + " " * (65 << 20) + "]}"), 1, "larger than"),
    ("import-vllm-string", _vl('"0,1,2,3,4,5,6,7"'), 1, "expected a list"),
    ("import-vllm-ragged", _vl(json.dumps([list(range(8))] * 31 + [list(range(9))])), 1,
     "9 slots"),
    ("import-vllm-out-of-range", _vl(json.dumps([list(range(1, 9))] * 32)), 1, "outside"),
    ("import-vllm-infinity", _vl("[0, 1, 2, 3, 4, 5, 6, Infinity]"), 1, "Infinity"),
    ("import-vllm-wrong-layers", _vl(json.dumps([list(range(8))] * 5)), 1, "5 layer maps"),
    ("import-vllm-nested-rows", _vl(json.dumps([[list(range(8))]] * 32)), 1, "integers"),
    ("import-trtllm-laughs", _trt(LAUGHS + TRT_HEAD + TRT_ROWS), 1, "expands"),
    ("import-trtllm-recursive-alias", _trt("a: &a [*a]\n" + TRT_HEAD + TRT_ROWS), 1, ""),
    ("import-trtllm-not-utf8", _trt(TRT_HEAD.encode() + b"  0: [\xff]\n"), 1, "UTF-8"),
    ("import-trtllm-string-keys", _trt(TRT_HEAD + TRT_ROWS.replace("  0:", "  zero:")), 1,
     "not an integer layer id"),
    ("import-trtllm-slots-bool", _trt(TRT_HEAD.replace("8", "true") + TRT_ROWS), 1,
     "num_slots"),
    ("import-trtllm-duplicate-layer", _trt(TRT_HEAD + TRT_ROWS + "  3: [0, 1, 2, 3, 4, 5, 6, 7]\n"),
     1, "duplicate key"),
    ("import-trtllm-int-beyond-int64", _trt(TRT_HEAD + TRT_ROWS.replace("[0,", f"[{10**20},", 1)),
     1, "64-bit"),
    ("import-trtllm-missing-layers", _trt(TRT_HEAD + TRT_ROWS[: TRT_ROWS.index("  9:")]), 1,
     "no assignment"),
    ("import-trtllm-python-tag", _trt(TRT_HEAD.replace(
        "num_slots: 8", "num_slots: !!python/object/apply:os.system [echo]") + TRT_ROWS), 1,
     "num_slots"),
    ("import-trtllm-nested-100000", _trt(deep(100_000)), 1, "nests deeper"),
    ("import-eplb-not-a-zip", _import("eplb", eplb_file(b"PK\x03\x04 not a zip")), 1, ".npz"),
    ("import-eplb-zip-bomb", _import("eplb", eplb_file(bomb_zip(
        "phy2log.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (4096, 2560), }",
        80 << 20, {}))), 1, "inflates"),
    ("import-eplb-object-array", _import("eplb", eplb_file(zip_of({"phy2log.npy": npy_member(
        "{'descr': '|O', 'fortran_order': False, 'shape': (32, 8), }")}))), 1, "objects"),
    ("import-eplb-float", _import("eplb", eplb_file(
        {**EPLB_ARRAYS, "phy2log": _PHY2LOG.astype(np.float64)})), 1, "integers"),
    ("import-eplb-1d", _import("eplb", eplb_file({**EPLB_ARRAYS, "phy2log": np.arange(8)})), 1,
     "phy2log has shape"),
    ("import-eplb-logcnt-disagrees", _import("eplb", eplb_file(
        {**EPLB_ARRAYS, "logcnt": np.full((32, 8), 2)})), 1, "logcnt says"),
    ("import-eplb-pickle-member", _import("eplb", eplb_file(
        zip_of({"phy2log.npy": pickle.dumps(_PHY2LOG)}))), 1, ""),
])


def ascend_doc(change: Callable[[dict[str, Any]], None] | None = None) -> str:
    """vLLM-Ascend's expert map for Mixtral on 8 devices (one expert each), changed."""
    doc: dict[str, Any] = {"moe_layer_count": 32, "layer_list": [
        {"layer_id": i, "device_count": 8, "device_list": [
            {"device_id": g, "device_expert": [g]} for g in range(8)]} for i in range(32)]}
    if change is not None:
        change(doc)
    return json.dumps(doc)


def _asc(change: Callable[[dict[str, Any]], None]) -> Builder:
    return _import("vllm-ascend", text_file(ascend_doc(change), "m.json"))


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set the field at dotted ``path`` (list positions as numbers) to ``value``."""
    def change(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(last) if isinstance(node, list) else last] = value
    return change


many([
    ("import-vllm-ascend-layer-count", _asc(_set("moe_layer_count", 5)), 1,
     "moe_layer_count is 5"),
    ("import-vllm-ascend-device-order", _asc(_set("layer_list.3.device_list.2.device_id", 5)), 1,
     "device_id is 5"),
    ("import-vllm-ascend-uneven-devices", _asc(_set("layer_list.1.device_list.4.device_expert",
                                                    [4, 0])), 1, "2 experts where device 0"),
    ("import-vllm-ascend-device-count-string", _asc(_set("layer_list.0.device_count", "8")), 1,
     "device_count is '8'"),
    ("import-vllm-ascend-layer-id-10^30", _asc(_set("layer_list.0.layer_id", 10**30)), 1,
     "64-bit"),
])


# -- numbers of options out of range: the hint gives the valid range and the nearest value ------
def _with_trace(*argv: str, placement: bool = False) -> Builder:
    """``placer ARGV`` with ``{trace}`` (and ``{p}``, a one-layer placement for 8 experts on 8
    GPUs; ``{d}`` the case's folder) filled in."""
    def build(d: Path) -> list[str]:
        trace = write(d / "t.jsonl", TRACE8)
        plan = write(d / "p.json", _GOOD_PLACEMENT) if placement else d / "p.json"
        return [a.format(trace=trace, p=plan, d=d) for a in argv]
    return build


_MIXTRAL = ("-m", "mixtral-8x7b", "-t", "dgx-h100")
_PLAN = ("plan", "{trace}", *_MIXTRAL, "-o", "{d}/out.json")
_COMPARE = ("compare", "{trace}", *_MIXTRAL)
_REPORT = ("report", "{trace}", "-p", "{p}", *_MIXTRAL, "-o", "{d}/r.html")
_NEAREST = "the nearest valid one is"
many([
    ("option-plan-redundant-negative", _with_trace(*_PLAN, "--redundant", "-8"), 2,
     f"{_NEAREST} 0), or auto"),
    ("option-plan-kv-reserve-negative", _with_trace(*_PLAN, "--kv-reserve-gb", "-5"), 2,
     f"{_NEAREST} 0"),
    ("option-plan-seed-negative", _with_trace(*_PLAN, "--seed", "-1"), 2, f"{_NEAREST} 0"),
    ("option-plan-seed-past-int32", _with_trace(*_PLAN, "--seed", str(2**32)), 2,
     f"{_NEAREST} 2147483647"),
    ("option-plan-jobs-zero", _with_trace(*_PLAN, "--jobs", "0"), 2, f"{_NEAREST} 1"),
    ("option-plan-time-limit-zero", _with_trace(*_PLAN, "--time-limit", "0"), 2,
     f"{_NEAREST} 0.001"),
    ("option-plan-batch-tokens-zero", _with_trace(*_PLAN, "--batch-tokens", "0"), 2,
     f"{_NEAREST} 1"),
    ("option-compare-redundant-negative", _with_trace(*_COMPARE, "-r", "0,-8"), 2,
     f"{_NEAREST} 0"),
    ("option-compare-time-limit-zero", _with_trace(*_COMPARE, "-r", "0", "--time-limit", "0"),
     2, f"{_NEAREST} 0.001"),
    ("option-compare-dpi-zero", _with_trace(*_COMPARE, "-r", "0", "--report", "{d}/r.html",
                                            "--dpi", "0"), 2, f"{_NEAREST} 20"),
    ("option-report-dpi-zero", _with_trace(*_REPORT, "--dpi", "0", placement=True), 2,
     f"{_NEAREST} 20"),
    ("option-report-dpi-100000", _with_trace(*_REPORT, "--dpi", "100000", placement=True), 2,
     f"{_NEAREST} 400"),
    ("option-report-five-placements", _with_trace(*_REPORT, *["-p", "{p}"] * 4, placement=True),
     2, "report 1 to 4 placements at a time"),
    ("option-report-layer-absent", _with_trace(*_REPORT, "--layer", "9", "-q", placement=True), 1,
     "the placement's layers are 0"),
    ("option-evaluate-tokens-per-gpu-zero", _with_trace(
        "evaluate", "{trace}", "-p", "{p}", *_MIXTRAL, "--tokens-per-gpu", "0", placement=True),
     2, f"{_NEAREST} 1"),
    ("option-stats-top-zero", _with_trace("stats", "{trace}", "--top", "0"), 2, f"{_NEAREST} 1"),
    ("option-stats-window-tokens-zero", _with_trace("stats", "{trace}", "--window-tokens", "0"),
     2, f"{_NEAREST} 1"),
    ("option-capacity-kv-fraction-one", _with_trace(
        "capacity", *_MIXTRAL, "--kv-reserve-fraction", "1"), 2, "up to, not including, 1"),
    ("option-capacity-tp-zero", _with_trace("capacity", *_MIXTRAL, "--tp", "0"), 2,
     f"{_NEAREST} 1"),
    ("option-capacity-overhead-negative", _with_trace(
        "capacity", *_MIXTRAL, "--overhead-gb", "-1"), 2, f"{_NEAREST} 0"),
    ("option-replay-dpi-zero", _with_trace("replay", "{trace}", *_MIXTRAL, "--report",
                                           "{d}/r.html", "--dpi", "0"), 2, f"{_NEAREST} 20"),
])


# -- work and memory sized by the user's numbers: refused before the work, with the figures --------
#: A topology of ``count`` nodes of 8 GPUs (16,384 GPUs: 5 GiB of GPU-pair matrices).
def _nodes(count: int) -> str:
    return TOPOLOGY.replace("name: node0", f"name: node\n    count: {count}").replace(
        "fabric: {kind: nvswitch, gbps: 450}",
        "fabric: {kind: nvswitch, gbps: 450}\n    nic_gbps: 50") + "network: {kind: infiniband}\n"


def _synth(*argv: str) -> Builder:
    return lambda d: ["synth", str(d / "s.npz"), *argv]


_MEMORY = "of memory for"
many([
    ("limits-synth-weight-tables", _synth("--experts", "4096", "--clusters", "4096", "--layers",
                                          "1", "--tokens", "100"), 2, "weight tables"),
    ("limits-synth-topic-profiles", _synth("--experts", "256", "--layers", "4096", "--topics",
                                           "100", "--tokens", "100"), 2, "topic profiles"),
    ("limits-synth-chunk", _synth("--experts", "4096", "--layers", "4096", "--top-k", "64"), 2,
     f"{_MEMORY} a synthetic trace (a chunk of 32,768 tokens x 4,096 layers x top-64)"),
    ("limits-synth-step-slots", _synth("--topics", "2", "--tokens-per-step", str(10**11)), 2,
     "the requests of 100,000,000,000 slots"),
    ("limits-synth-disk", _synth("--tokens", str(10**16)), 2, "of disk for"),
    ("limits-synth-layers-10^8", _synth("--layers", "100000000"), 2, "more than placer handles"),
    ("limits-synth-layer-range-10^8", _synth("--layers", "0-100000000"), 2,
     "more than placer handles"),
    ("limits-topology-16384-gpus", lambda d: ["topology", "validate", str(write(
        d / "t.yaml", _nodes(2048)))], 1, "GPU-pair matrices"),
    ("limits-evaluate-sampled-batches", lambda d: [
        "evaluate", str(write(d / "l.csv", "layer,expert,load\n" + "".join(
            f"0,{e},{10**12}\n" for e in range(8)))), "-p", str(placement(d / "p.json")),
        "-m", "mixtral-8x7b", "-t", "dgx-h100", "--tokens-per-gpu", str(10**8), "-q"], 2,
     "sampled batches of 800,000,000 tokens"),
    ("limits-plan-slots", lambda d: [
        "plan", str(write(d / "t.jsonl", jsonl({"layer": i, "experts": [i % 8, (i + 1) % 8]}
                                               for i in range(128)))),
        "-g", "16384", "-S", "8", "-s", "eplb", "-o", str(d / "p.json")], 2,
     "128 layers of 131,072 slots"),
    ("limits-synth-from-affinity", lambda d: ["synth", str(d / "s.npz"), "--from", str(write(
        d / "t.jsonl", jsonl({"layer": layer, "experts": [e, (e + 1) % 4096]}
                             for layer in range(16) for e in range(4096)))), "-q"], 1,
     "a [layers, experts, experts] affinity"),
    ("limits-replay-slots-past-experts", _with_trace("replay", "{trace}", *_MIXTRAL, "-r", "64",
                                                     "-q"), 2, "two replicas of one expert"),
], bomb=True)


# -- what an outside tester tries first: empty and wrong files, names, edges -----------------------
def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


_ONE = jsonl([GOOD_ROW])
many([
    ("edge-npz-empty-file", _file_case("t.npz", b""), 1, "the file is empty"),
    ("edge-csv-empty-file", _file_case("l.csv", b""), 1, "the file is empty"),
    ("edge-npz-zero-tokens", _npz_case(topk_ids=np.zeros((0, 1, 2), np.int16)), 1,
     "no routing rows"),
    ("edge-npz-complex-ids", _npz_case(topk_ids=np.zeros((4, 1, 2), np.complex64)), 1,
     "complex64"),
    ("edge-npz-bool-ids", _npz_case(topk_ids=np.zeros((4, 1, 2), bool)), 1, "dtype bool"),
    ("edge-npz-string-ids", _npz_case(topk_ids=np.array([[["a", "b"]]])), 1, "expected integers"),
    ("edge-csv-all-zero-loads", _file_case("l.csv", "layer,expert,load\n0,0,0\n0,1,0\n"), 1,
     "top_k is unknown"),
    ("edge-npy-inf-load", _file_case("l.npy", _npy(np.array([[np.inf, 1.0]])), "--top-k", "1"),
     1, "is inf"),
    ("edge-npy-negative-load", _file_case("l.npy", _npy(np.array([[-1, 1]])), "--top-k", "1"),
     1, "counts are >= 0"),
    ("edge-npy-no-experts", _file_case("l.npy", _npy(np.zeros((0, 4))), "--top-k", "1"), 1,
     "expected [layers, experts]"),
    ("edge-topology-zero-gpus", _topology(TOPOLOGY.replace("gpus: 8", "gpus: 0")), 1,
     "gpus must be at least 1"),
    ("edge-topology-no-nodes", _topology(TOPOLOGY.split("nodes:")[0] + "nodes: []\n"), 1,
     "nodes is empty"),
    ("edge-topology-missing-gpu-types", _topology("name: t\nnodes:\n  - name: n\n    gpus: 8\n"),
     1, "missing key 'gpu_types'"),
    ("edge-topology-unknown-gpu-type", _topology(TOPOLOGY.replace("gpu_type: h100",
                                                                  "gpu_type: a100")), 1,
     "unknown GPU type 'a100'"),
    ("edge-topology-zero-bandwidth", _topology(TOPOLOGY.replace("gbps: 450", "gbps: 0")), 1,
     "gbps must be positive"),
    ("edge-topology-negative-memory", _topology(TOPOLOGY.replace("memory_gb: 80",
                                                                 "memory_gb: -80")), 1,
     "memory_gb must be positive"),
    ("edge-model-zero-layers", _model(MODEL.replace("num_hidden_layers: 4",
                                                    "num_hidden_layers: 0")), 1,
     "num_hidden_layers must be at least 1"),
    ("edge-model-top-k-zero", _model(MODEL.replace("top_k: 2", "top_k: 0")), 1,
     "top_k must be at least 1"),
    ("edge-model-empty", _model(""), 1, "expected a mapping"),
    ("edge-plan-unknown-solver", _with_trace(*_PLAN, "-s", "nope"), 2, "unknown solver 'nope'"),
    ("edge-plan-unknown-engine", _with_trace(*_PLAN, "--engine", "nope"), 2,
     "unknown engine 'nope'"),
    ("edge-plan-unknown-dispatch", _with_trace(*_PLAN, "--dispatch", "nope"), 2,
     "unknown dispatch policy 'nope'"),
    ("edge-plan-unknown-export-engine", _with_trace(*_PLAN, "-x", "nope:x.json"), 2,
     "unknown engine format 'nope'"),
    ("edge-plan-unknown-topology", _with_trace("plan", "{trace}", "-t", "nope", "-o",
                                               "{d}/p.json"), 1, "unknown topology 'nope'"),
    ("edge-import-unknown-engine", _import("nope", text_file(sglang_doc(), "m.json")), 2,
     "unknown engine format 'nope'"),
    ("edge-import-ep-size-zero", lambda d: ["import", str(write(d / "m.json", sglang_doc())),
                                            "--format", "sglang", "--model", "mixtral-8x7b",
                                            "--ep-size", "0", "-o", str(d / "o.json")], 2,
     "expected a value >= 1, got 0"),
    ("edge-import-ep-size-uneven", lambda d: ["import", str(write(d / "m.json", sglang_doc())),
                                              "--format", "sglang", "--model", "mixtral-8x7b",
                                              "--ep-size", "3", "-o", str(d / "o.json")], 1,
     "do not split over 3 GPUs"),
    ("edge-synth-top-k-past-experts", _synth("--experts", "8", "--top-k", "9"), 2,
     "expected top-k in [1, 7] for 8 experts, got 9"),
    ("edge-synth-top-k-all-experts", _synth("--experts", "2", "--top-k", "2"), 2,
     "expected top-k in [1, 1] for 2 experts"),
    ("edge-synth-tokens-zero", _synth("--tokens", "0"), 2, "expected a value >= 1, got 0"),
    ("edge-synth-unknown-output-format", lambda d: ["synth", str(d / "s.txt")], 2,
     "cannot tell the trace format"),
    ("edge-synth-layers-repeat", _synth("--layers", "0,0"), 2, "distinct"),
    ("edge-stats-top-k-past-experts", _jsonl_case(_ONE, "--top-k", "9", "--num-experts", "8"),
     2, "top_k 9 is more than num_experts 8"),
    ("edge-stats-absent-layer", _jsonl_case(_ONE, "--layer", "5"), 2,
     "layer 5 is not in the trace"),
    ("edge-replay-unknown-policy", _with_trace("replay", "{trace}", *_MIXTRAL, "-P", "nope"), 2,
     "unknown policy 'nope'"),
    ("edge-compare-unknown-scenarios", lambda d: ["compare", "--scenarios",
                                                  str(d / "nope.yaml")], 2,
     "scenario file not found"),
    ("edge-evaluate-placement-zero-gpus", _evaluate_p(text_file(changed("topology.num_gpus", 0))),
     1, "expected a value >= 1, got 0"),
])
