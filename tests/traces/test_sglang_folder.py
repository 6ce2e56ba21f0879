"""A folder SGLang's recorder wrote is a trace: its ``expert_distribution_recorder_*.pt``
files, in any mode, read as if each were named.

SGLang writes its dumps into one folder (``SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR``):
one ``expert_distribution_recorder_{time}.pt`` in ``stat`` mode, one
``expert_distribution_recorder_{time}_{rank}.pt`` per rank in ``per_token`` and
``per_pass`` modes.  Pointing ``placer`` at that folder used to fail with "a folder that no
trace format recognises".
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from placer.cli.main import app
from placer.errors import TraceError
from placer.io.ptfile import load_pt, save_pt
from placer.traces import detect_format, read_routing
from placer.traces.formats.sglang import dump_files

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
STAT = FIXTURES / "sglang_stat"
PER_TOKEN = FIXTURES / "sglang_per_token"


def _per_pass(folder: Path) -> Path:
    """The per_token fixtures as per_pass dumps (counts only), in a folder of their own,
    next to a file SGLang did not write."""
    folder.mkdir()
    for path in sorted(PER_TOKEN.glob("*.pt")):
        dump = load_pt(path)
        records = [{k: r[k] for k in ("forward_pass_id", "rank", "gatherer_key",
                                      "global_physical_count")} for r in dump["records"]]
        save_pt({"records": records,
                 "last_physical_to_logical_map": dump["last_physical_to_logical_map"]},
                folder / path.name)
    (folder / "server.log").write_text("not a dump\n")
    return folder


def test_each_mode_s_folder_is_detected_as_sglang(tmp_path: Path) -> None:
    for folder in (STAT, PER_TOKEN, _per_pass(tmp_path / "per_pass")):
        assert detect_format(folder).name == "sglang", folder


def test_a_per_token_folder_reads_as_its_rank_files() -> None:
    files = sorted(PER_TOKEN.glob("*.pt"))
    by_folder = read_routing(PER_TOKEN, keep_tokens=True)
    by_files = read_routing(files, keep_tokens=True)
    assert by_folder.stats.provenance.sources == tuple(str(f) for f in files)
    np.testing.assert_array_equal(by_folder.stats.load, by_files.stats.load)
    assert by_folder.trace is not None and by_files.trace is not None
    np.testing.assert_array_equal(by_folder.trace.topk_ids, by_files.trace.topk_ids)


def test_stat_and_per_pass_folders_read_as_their_files(tmp_path: Path) -> None:
    stat = read_routing(STAT, top_k=2).stats
    np.testing.assert_array_equal(stat.load, read_routing(
        STAT / "expert_distribution_recorder_1700000000.5.pt", top_k=2).stats.load)
    per_pass = read_routing(_per_pass(tmp_path / "pp"), top_k=2).stats  # server.log ignored
    np.testing.assert_array_equal(per_pass.load, read_routing(PER_TOKEN).stats.load)


def test_dumps_are_read_by_time_then_rank(tmp_path: Path) -> None:
    for name in ("expert_distribution_recorder_1700000001.25_10.pt",
                 "expert_distribution_recorder_1700000001.25_2.pt",
                 "expert_distribution_recorder_1700000000.5_3.pt", "notes.pt"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in dump_files(tmp_path)] == [
        "expert_distribution_recorder_1700000000.5_3.pt",
        "expert_distribution_recorder_1700000001.25_2.pt",
        "expert_distribution_recorder_1700000001.25_10.pt"]


def test_a_folder_of_something_else_says_what_it_holds(tmp_path: Path) -> None:
    (tmp_path / "server.log").write_text("x\n")
    with pytest.raises(TraceError, match=r"no trace format recognises \(it holds server\.log\)"):
        detect_format(tmp_path)
    with pytest.raises(TraceError, match="without sglang files"):
        read_routing(tmp_path, format="sglang")


def test_placer_reads_the_folder(tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    shutil.copytree(PER_TOKEN, dumps)
    result = CliRunner().invoke(app, ["stats", str(dumps)])
    assert result.exit_code == 0, result.stderr
    assert "expert_distribution_recorder_1700000000.5_0.pt" in result.stdout
    assert "(sglang)" in result.stdout
