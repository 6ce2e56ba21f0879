"""The torch-free ``.pt`` reader: exact arrays, every dtype, and refusal of any other global."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

from placer.errors import DataError
from placer.io.ptfile import load_pt

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
STAT = FIXTURES / "sglang_stat" / "expert_distribution_recorder_1700000000.5.pt"
PER_TOKEN = sorted((FIXTURES / "sglang_per_token").glob("*.pt"))


def test_dtypes_match_the_saved_arrays() -> None:
    """Every storage dtype, a transposed tensor and a strided view at an offset."""
    loaded = load_pt(FIXTURES / "dtypes.pt")
    with np.load(FIXTURES / "dtypes.expected.npz") as expected:
        assert sorted(loaded["tensors"]) == sorted(expected.files)
        for name in expected.files:
            got, want = loaded["tensors"][name], expected[name]
            assert got.dtype == want.dtype, name
            assert got.shape == want.shape, name
            np.testing.assert_array_equal(got, want, err_msg=name)
    assert loaded["tensors"]["i64_view"].tolist() == [[5, 7], [9, 11], [13, 15]]
    assert loaded["nested"][0][0] == "a" and loaded["nested"][1] == {"k": None, "x": 1.5}
    assert dict(loaded["ordered"]) == {"one": 1}


def test_views_of_one_storage_do_not_alias() -> None:
    loaded = load_pt(FIXTURES / "dtypes.pt")["tensors"]
    loaded["i64_base"][5] = -1
    assert loaded["i64_view"][0, 0] == 5


def test_sglang_stat_dump() -> None:
    """SGLang ``stat`` mode: rank, logical_count int32 [steps, layers, experts], rate."""
    dump = load_pt(STAT)
    assert sorted(dump) == ["average_utilization_rate_over_window", "logical_count", "rank"]
    assert dump["rank"] == 0 and dump["average_utilization_rate_over_window"] is None
    with np.load(FIXTURES / "sglang_stat.expected.npz") as expected:
        np.testing.assert_array_equal(dump["logical_count"], expected["logical_count"])
    assert dump["logical_count"].dtype == np.int32


def test_sglang_per_token_dump() -> None:
    """SGLang ``per_token`` mode: records of physical top-k ids and the final map."""
    dump = load_pt(PER_TOKEN[0])
    assert sorted(dump) == ["last_physical_to_logical_map", "records"]
    record = dump["records"][0]
    assert record["topk_ids_of_layer"].shape == (4, 3, 8)
    assert record["topk_ids_of_layer"].dtype == np.int32
    assert (record["topk_ids_of_layer"][0] == -1).all()  # the dense layer selects nothing
    assert dump["last_physical_to_logical_map"].dtype == np.int64


@pytest.mark.parametrize(
    ("name", "global_name"),
    [("evil_os_system.pt", "posix.system"), ("evil_custom_class.pt", "__main__.Recorder")],
)
def test_other_globals_are_refused(name: str, global_name: str) -> None:
    with pytest.raises(DataError) as info:
        load_pt(FIXTURES / name)
    assert str(info.value) == f"{FIXTURES / name}: refusing to load global '{global_name}'"
    assert info.value.hint == (
        "placer reads tensors and plain containers only; load the file with torch if you trust it"
    )


def _archive(tmp_path: Path, payload: bytes, extra: dict[str, bytes] | None = None) -> Path:
    """A torch-style zip holding ``payload`` as data.pkl."""
    path = tmp_path / "made.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", payload)
        for name, data in (extra or {}).items():
            z.writestr(f"archive/{name}", data)
    return path


def test_builtins_eval_is_refused_before_lookup(tmp_path: Path) -> None:
    payload = b"\x80\x02cbuiltins\neval\nX\x04\x00\x00\x001+1\x85R."
    with pytest.raises(DataError, match=r"refusing to load global 'builtins\.eval'"):
        load_pt(_archive(tmp_path, payload))


def test_plain_containers_need_no_global(tmp_path: Path) -> None:
    payload = pickle.dumps({"a": [1, 2.5, None, True], "b": ("x", -3)}, protocol=2)
    assert load_pt(_archive(tmp_path, payload)) == {"a": [1, 2.5, None, True], "b": ("x", -3)}


def test_storage_too_small_for_the_tensor(tmp_path: Path) -> None:
    """A size/stride that reads past the storage is an error, not a memory read."""
    with zipfile.ZipFile(FIXTURES / "dtypes.pt") as z:
        payload = z.read("dtypes/data.pkl")
        storages = {n.split("/", 1)[1]: z.read(n) for n in z.namelist() if "/data/" in n}
    storages = {name: data[:8] for name, data in storages.items()}
    with pytest.raises(DataError, match=r"reaches element \d+ of storage data/"):
        load_pt(_archive(tmp_path, payload, storages))


def test_missing_storage(tmp_path: Path) -> None:
    with zipfile.ZipFile(STAT) as z:
        payload = next(z.read(n) for n in z.namelist() if n.endswith("data.pkl"))
    with pytest.raises(DataError, match=r"storage data/0 is missing"):
        load_pt(_archive(tmp_path, payload))


def test_not_a_zip(tmp_path: Path) -> None:
    path = tmp_path / "legacy.pt"
    path.write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(DataError, match=r"not a torch zip archive") as info:
        load_pt(path)
    assert info.value.where == str(path)


def test_truncated_pickle(tmp_path: Path) -> None:
    payload = pickle.dumps({"a": list(range(10))}, protocol=2)[:-5]
    with pytest.raises(DataError, match=r"cannot unpickle data.pkl \(EOFError: Ran out of input\)"):
        load_pt(_archive(tmp_path, payload))


def test_storage_type_is_not_callable(tmp_path: Path) -> None:
    """``torch.IntStorage(...)`` via REDUCE must not construct anything."""
    payload = b"\x80\x02ctorch\nIntStorage\nK\x05\x85R."
    with pytest.raises(DataError, match=r"cannot unpickle data\.pkl"):
        load_pt(_archive(tmp_path, payload))


def test_matches_torch_load() -> None:
    """Where torch is installed, the reader agrees with ``torch.load`` on every fixture."""
    torch = pytest.importorskip("torch", reason="torch is not installed (optional extra)")

    def to_numpy(obj: object) -> object:
        if isinstance(obj, torch.Tensor):
            t = obj.float() if obj.dtype == torch.bfloat16 else obj
            return t.numpy()
        if isinstance(obj, dict):
            return {k: to_numpy(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return type(obj)(to_numpy(v) for v in obj)
        return obj

    def same(a: object, b: object) -> None:
        if isinstance(a, np.ndarray):
            assert isinstance(b, np.ndarray) and a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
        elif isinstance(a, dict):
            assert isinstance(b, dict) and list(a) == list(b)
            for k in a:
                same(a[k], b[k])
        elif isinstance(a, list | tuple):
            assert type(a) is type(b) and len(a) == len(b)
            for x, y in zip(a, b, strict=True):
                same(x, y)
        else:
            assert a == b

    for path in [FIXTURES / "dtypes.pt", STAT, *PER_TOKEN]:
        theirs = torch.load(path, map_location="cpu", weights_only=True)
        same(load_pt(path), to_numpy(theirs))


def test_sglang_fixtures_carry_a_cuda_location() -> None:
    """Like a GPU dump, the storages say ``cuda:0``; the reader ignores the location."""
    with zipfile.ZipFile(STAT) as z:
        payload = next(z.read(n) for n in z.namelist() if n.endswith("data.pkl"))
    assert b"cuda:0" in payload
    assert load_pt(STAT)["logical_count"].shape == (6, 4, 4)
