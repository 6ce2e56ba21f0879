"""Read PyTorch ``.pt`` files without torch, and without running their code.

``torch.save`` writes a zip archive::

    <root>/data.pkl        a pickle of the saved object
    <root>/data/<key>      the raw bytes of each tensor storage
    <root>/byteorder       "little" or "big" (absent in old files: little)
    <root>/version, ...    bookkeeping

The pickle names a few globals to rebuild tensors: ``torch._utils._rebuild_tensor_v2``
(called with a storage, offset, size, stride, ...), a storage type such as
``torch.IntStorage``, and ``collections.OrderedDict`` (the empty backward hooks).
Storages are not in the pickle: they are "persistent ids"
``("storage", storage_type, key, location, numel)`` that point at ``data/<key>``.

:func:`load_pt` unpickles with an allow-list of exactly those globals and
rebuilds every tensor as a numpy array (copied, so views of one storage do not
alias).  Any other global -- ``builtins.eval``, ``os.system``, a model class --
is refused with a :class:`~placer.errors.DataError` that names it, before it is
looked up.  Plain containers (dict, list, tuple, str, int, float, bool, None)
need no global and load as they are.  This is what lets users without torch
read SGLang's expert-distribution dumps, and makes reading a file from
elsewhere safe (``torch.load`` without ``weights_only`` executes pickled code).

:func:`is_torch_archive` tells a torch zip by its members (wherever the pickle's keys
sit in it), and :func:`save_pt` writes the same layout from numpy arrays, so tests and
tools make SGLang-shaped dumps without torch.
"""

from __future__ import annotations

import collections
import io
import math
import pickle
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from placer import constants
from placer.errors import DataError, PlacerError

__all__ = ["check_zip", "is_torch_archive", "load_pt", "save_pt"]

#: numpy dtype of each storage type torch writes; bfloat16 is widened to float32.
_STORAGE_DTYPES: dict[str, str] = {
    "DoubleStorage": "float64",
    "FloatStorage": "float32",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
}

_DAMAGED_HINT = "the file may be damaged or incomplete; save it again"

_ALLOWED_HINT = (
    "placer reads tensors and plain containers only; load the file with torch if you trust it"
)


@dataclass(frozen=True)
class _StorageType:
    """Stand-in for ``torch.<X>Storage``: only carries the dtype.  Not callable."""

    name: str

    @property
    def dtype(self) -> str:
        return _STORAGE_DTYPES[self.name]


@dataclass(frozen=True)
class _Storage:
    """One storage: its flat elements as a read-only numpy array."""

    key: str
    elements: np.ndarray


def check_zip(archive: zipfile.ZipFile, where: str, error: type[PlacerError] = DataError) -> None:
    """Refuse a zip archive (.pt, .npz) that would inflate like a compression bomb.

    Members may together decompress to ``constants.DECOMPRESSION_FREE_BYTES``; past
    that, to at most ``constants.MAX_DECOMPRESSION_RATIO`` times their compressed size.
    The sizes are the archive's own (zipfile never reads past a member's declared size,
    and a member whose data does not match fails its CRC).
    """
    infos = archive.infolist()
    inflated = sum(i.file_size for i in infos)
    packed = sum(i.compress_size for i in infos)
    if (
        inflated > constants.DECOMPRESSION_FREE_BYTES
        and inflated > constants.MAX_DECOMPRESSION_RATIO * max(packed, 1)
    ):
        raise error(
            f"the archive inflates {inflated / max(packed, 1):,.0f} times (to"
            f" {inflated >> 20:,} MiB from {packed >> 10:,} KiB), more than"
            f" {constants.MAX_DECOMPRESSION_RATIO} times: no real data compresses this well",
            where=where, hint="is this a compression bomb? (limits: docs/limits.md)",
        )


#: What reading a damaged zip member raises (CRC mismatch, bad deflate data,
#: truncation, encryption, an unknown compression method).
ZIP_READ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, RuntimeError,
                   NotImplementedError, ValueError)


def is_torch_archive(path: str | Path) -> bool:
    """Whether ``path`` is a ``torch.save`` zip: one ``<root>/data.pkl`` beside
    ``<root>/version`` or a storage ``<root>/data/<key>`` (no unpickling)."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except ZIP_READ_ERRORS:
        return False
    roots = [n[: -len("data.pkl")] for n in names if n == "data.pkl" or n.endswith("/data.pkl")]
    if len(roots) != 1:
        return False
    root = roots[0]
    return f"{root}version" in names or f"{root}.format_version" in names or any(
        n.startswith(f"{root}data/") for n in names
    )


def load_pt(path: str | Path) -> Any:
    """Load a ``torch.save`` file; tensors come back as numpy arrays.

    Parameters
    ----------
    path: a ``.pt`` file written by ``torch.save`` (zip format, torch >= 1.6).

    Returns
    -------
    The saved object, with every tensor replaced by a numpy array of the same
    shape and dtype (bfloat16 tensors become float32).

    Raises
    ------
    DataError: the file is not a torch zip archive, is damaged, or names a
        global other than tensors and ``collections.OrderedDict``.
    """
    path = Path(path)
    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise DataError("file not found", where=str(path), hint="check the path") from None
    except ZIP_READ_ERRORS:
        raise DataError(
            "not a torch zip archive (torch.save from torch >= 1.6)",
            where=str(path),
            hint="re-save it with a recent torch, or check that it is a .pt file",
        ) from None
    with archive:
        check_zip(archive, str(path))
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
        if len(pickles) != 1:
            raise DataError(
                f"expected one data.pkl in the archive, found {len(pickles)}", where=str(path),
                hint="a torch.save file holds one data.pkl; is this a .pt file?",
            )
        root = pickles[0][: -len("data.pkl")]
        byteorder = "little"
        if f"{root}byteorder" in archive.namelist():
            try:
                raw = archive.open(f"{root}byteorder").read(16)
            except ZIP_READ_ERRORS as e:
                raise DataError(
                    f"cannot read byteorder ({e})", where=str(path), hint=_DAMAGED_HINT
                ) from None
            byteorder = raw.decode("ascii", "replace").strip()
            if byteorder not in ("little", "big"):
                raise DataError(
                    f"unknown byteorder {byteorder!r:.20}", where=str(path),
                    hint="torch writes little or big",
                )
        unpickler = _RestrictedUnpickler(archive, root, byteorder, path)
        try:
            return unpickler.load()
        except DataError:
            raise
        except Exception as e:  # malformed pickles raise anything; none is the user's bug
            raise DataError(
                f"cannot unpickle data.pkl ({type(e).__name__}: {e!s:.120})",
                where=str(path), hint=_DAMAGED_HINT,
            ) from None


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler whose globals are an allow-list and whose storages come from the zip."""

    def __init__(self, archive: zipfile.ZipFile, root: str, byteorder: str, path: Path):
        info = archive.getinfo(f"{root}data.pkl")
        if info.file_size > constants.MAX_DOCUMENT_BYTES:
            raise DataError(
                f"data.pkl is {info.file_size >> 20:,} MiB, more than the"
                f" {constants.MAX_DOCUMENT_BYTES >> 20} MiB placer unpickles",
                where=str(path), hint="is this the right file? (limits: docs/limits.md)",
            )
        try:
            data = archive.read(info)
        except ZIP_READ_ERRORS as e:
            raise DataError(
                f"cannot read data.pkl ({e})", where=str(path), hint=_DAMAGED_HINT
            ) from None
        super().__init__(io.BytesIO(data))
        self._archive = archive
        self._root = root
        self._byteorder = byteorder
        self._path = path
        self._storages: dict[str, _Storage] = {}
        # bytes tensors may take: their storages, plus what stride-0 views repeat
        self._budget = constants.MAX_PT_EXPANDED_BYTES + sum(
            i.file_size for i in archive.infolist() if i.filename.startswith(f"{root}data/")
        )

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return self._rebuild_tensor
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        raise DataError(
            f"refusing to load global '{module}.{name}'",
            where=str(self._path),
            hint=_ALLOWED_HINT,
        )

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise DataError(
                f"unknown persistent id {pid!r:.80}", where=str(self._path), hint=_ALLOWED_HINT
            )
        _, storage_type, key, _location, _numel = pid
        if not isinstance(storage_type, _StorageType) or not isinstance(key, str):
            raise DataError(
                f"malformed storage reference {pid!r:.80}", where=str(self._path),
                hint=_DAMAGED_HINT,
            )
        if key not in self._storages:
            self._storages[key] = self._read_storage(key, storage_type)
        return self._storages[key]

    def _read_storage(self, key: str, storage_type: _StorageType) -> _Storage:
        member = f"{self._root}data/{key}"
        try:
            raw = self._archive.read(member)
        except KeyError:
            raise DataError(
                f"storage data/{key:.40} is missing", where=str(self._path), hint=_DAMAGED_HINT
            ) from None
        except ZIP_READ_ERRORS as e:
            raise DataError(
                f"cannot read storage data/{key} ({e})", where=str(self._path),
                hint=_DAMAGED_HINT,
            ) from None
        dtype = storage_type.dtype
        if dtype == "bfloat16":
            if len(raw) % 2:
                raise DataError(
                    f"storage data/{key} has {len(raw)} bytes, not a multiple of bfloat16",
                    where=str(self._path), hint=_DAMAGED_HINT,
                )
            halves = np.frombuffer(raw, dtype=np.dtype("uint16").newbyteorder(self._order))
            elements = (halves.astype(np.uint32) << 16).view(np.float32)
        else:
            np_dtype = np.dtype(dtype)
            if len(raw) % np_dtype.itemsize:
                raise DataError(
                    f"storage data/{key} has {len(raw)} bytes, not a multiple of {dtype}",
                    where=str(self._path), hint=_DAMAGED_HINT,
                )
            elements = np.frombuffer(raw, dtype=np_dtype.newbyteorder(self._order))
        return _Storage(key, elements)

    @property
    def _order(self) -> Literal["<", ">"]:
        return "<" if self._byteorder == "little" else ">"

    def _rebuild_tensor(
        self,
        storage: Any,
        storage_offset: Any,
        size: Any,
        stride: Any,
        requires_grad: Any = False,
        backward_hooks: Any = None,
        metadata: Any = None,
    ) -> np.ndarray:
        """Rebuild one tensor as a numpy array (a copy, in native byte order)."""
        where = str(self._path)
        if not isinstance(storage, _Storage):
            raise DataError("tensor without a storage", where=where, hint=_DAMAGED_HINT)
        if not (
            _is_int_tuple(size) and _is_int_tuple(stride) and len(size) == len(stride)
            and isinstance(storage_offset, int) and storage_offset >= 0
        ):
            raise DataError(
                f"malformed tensor in storage data/{storage.key}: size {size!r:.60},"
                f" stride {stride!r:.60}, offset {storage_offset!r:.20}",
                where=where, hint=_DAMAGED_HINT,
            )
        flat = storage.elements
        if any(s < 0 for s in size) or any(s < 0 for s in stride):
            raise DataError(
                f"negative size or stride in data/{storage.key}", where=where,
                hint=_DAMAGED_HINT,
            )
        nbytes = math.prod(size) * flat.itemsize
        self._budget -= nbytes
        if self._budget < 0:
            # stride-0 (expanded) tensors and views repeat their storages' elements
            raise DataError(
                f"the tensors take more than their storages and"
                f" {constants.MAX_PT_EXPANDED_BYTES >> 20} MiB besides (a tensor of size"
                f" {tuple(size)!s:.60} over storage data/{storage.key} of {flat.size} elements)",
                where=where, hint="save contiguous tensors (.contiguous()); limits:"
                " docs/limits.md",
            )
        if 0 in size:
            return np.zeros(size, dtype=flat.dtype.newbyteorder("="))
        last = storage_offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
        if last >= flat.size:
            raise DataError(
                f"tensor of size {tuple(size)!s:.60} reaches element {last} of storage"
                f" data/{storage.key}, which has {flat.size}",
                where=where, hint=_DAMAGED_HINT,
            )
        view = np.lib.stride_tricks.as_strided(
            flat[storage_offset:],
            shape=tuple(size),
            strides=tuple(s * flat.itemsize for s in stride),
            writeable=False,
        )
        return np.array(view, dtype=flat.dtype.newbyteorder("="), copy=True)


def _is_int_tuple(value: Any) -> bool:
    return isinstance(value, tuple) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    )


# -- writing --------------------------------------------------------------------------------
#: Storage type torch writes for each numpy dtype (the inverse of ``_STORAGE_DTYPES``).
_DTYPE_STORAGES: dict[str, str] = {
    dtype: name for name, dtype in _STORAGE_DTYPES.items() if dtype != "bfloat16"
}


@dataclass(frozen=True)
class _Global:
    """A global the pickle names (``torch._utils._rebuild_tensor_v2``) without importing it."""

    module: str
    name: str

    def __call__(self, *args: Any) -> Any:  # pickle's REDUCE wants a callable
        raise TypeError(f"{self.module}.{self.name} is a stand-in for writing only")


@dataclass(frozen=True)
class _PendingStorage:
    """An array's elements, written as ``data/<key>`` and referred to by persistent id."""

    key: str
    storage_type: _Global
    numel: int


_REBUILD = _Global("torch._utils", "_rebuild_tensor_v2")


class _TorchPickler(pickle._Pickler):
    """Pickles numpy arrays as torch tensors and keeps their bytes for the zip."""

    dispatch = pickle._Pickler.dispatch.copy()  # type: ignore[attr-defined]

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=2)
        self.storages: list[tuple[str, bytes]] = []
        self._globals: dict[tuple[str, str], _Global] = {}

    def _global(self, module: str, name: str) -> _Global:
        # one object a global, so the memo writes it once
        return self._globals.setdefault((module, name), _Global(module, name))

    def save_torch_global(self, obj: _Global) -> None:
        # the pure-Python pickler's own helpers (typeshed leaves them out)
        self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode("ascii"))  # type: ignore[attr-defined]
        self.memoize(obj)  # type: ignore[attr-defined]

    dispatch[_Global] = save_torch_global  # type: ignore[assignment]

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, _PendingStorage):
            return ("storage", obj.storage_type, obj.key, "cpu", obj.numel)
        return None

    def reducer_override(self, obj: Any) -> Any:
        if not isinstance(obj, np.ndarray):
            return NotImplemented
        name = _DTYPE_STORAGES.get(obj.dtype.name)
        if name is None:
            raise ValueError(f"save_pt cannot write dtype {obj.dtype}")
        flat = np.ascontiguousarray(obj).astype(obj.dtype.newbyteorder("<"), copy=False)
        key = str(len(self.storages))
        self.storages.append((key, flat.tobytes()))
        storage = _PendingStorage(key, self._global("torch", name), int(obj.size))
        stride, step = [], 1
        for n in reversed(obj.shape):
            stride.append(step)
            step *= n
        size = tuple(int(n) for n in obj.shape)
        args: tuple[Any, ...] = (
            storage, 0, size, tuple(reversed(stride)), False, collections.OrderedDict()
        )
        return (self._global(_REBUILD.module, _REBUILD.name), args)


def _plain(obj: Any) -> Any:
    """``obj`` with numpy scalars as Python numbers (they would need numpy's globals)."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return type(obj)((k, _plain(v)) for k, v in obj.items())
    if isinstance(obj, list | tuple):
        return type(obj)(_plain(v) for v in obj)
    return obj


def save_pt(obj: Any, path: str | Path, *, root: str = "archive") -> None:
    """Write ``obj`` as ``torch.save`` would, with numpy arrays as tensors (no torch).

    Parameters
    ----------
    obj: plain containers (dict, list, tuple, str, int, float, bool, None) and numpy
        arrays of the dtypes in ``_STORAGE_DTYPES`` (not bfloat16); each array becomes a
        contiguous little-endian tensor with its own storage.
    path: the ``.pt`` file to write.
    root: folder name inside the zip (torch uses the file's stem; any name loads).
    """
    buffer = io.BytesIO()
    pickler = _TorchPickler(buffer)
    pickler.dump(_plain(obj))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(f"{root}/data.pkl", buffer.getvalue())
        archive.writestr(f"{root}/byteorder", "little")
        for key, data in pickler.storages:
            archive.writestr(f"{root}/data/{key}", data)
        archive.writestr(f"{root}/version", "3\n")
