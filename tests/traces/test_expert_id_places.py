"""An expert id the model does not have is an error naming the file and the line (or the
array index, or the layer and window of an aggregated load), whatever the reader.

``placer plan trace -m MODEL`` used to read the trace without the model's expert count and
then say only ``the trace has 41 experts per layer but tiny has 8``: which of millions of
rows held expert 40 was lost.  The command line now reads with the model's ``num_experts``
(:func:`placer.cli.common.read_trace`), so every reader's check names the place.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from placer.cli.main import app
from placer.traces import write_npz_trace

runner = CliRunner()

#: A model of 8 experts, top-2, two MoE layers (0 and 1).
TINY = """name: tiny
num_hidden_layers: 2
moe_layer_ids: [0, 1]
num_experts: 8
top_k: 2
hidden_size: 1024
moe_intermediate_size: 512
non_expert_params: 1000000
"""


def _rows(bad_row: int | None) -> list[dict]:
    """4 tokens x 2 layers of top-2 rows; row ``bad_row`` (0-based) selects expert 40."""
    rows = [{"token": t, "layer": layer, "experts": [1, 2]} for t in range(4) for layer in (0, 1)]
    if bad_row is not None:
        rows[bad_row]["experts"] = [3, 40]
    return rows


def _jsonl(folder: Path) -> Path:
    path = folder / "trace.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _rows(5)) + "\n")  # line 6
    return path


def _npz(folder: Path) -> Path:
    ids = np.tile(np.array([1, 2], dtype=np.int16), (4, 2, 1))
    ids[2, 1, 1] = 40
    path = folder / "trace.npz"
    write_npz_trace(path, ids, layer_ids=[0, 1])
    return path


def _load_npz(folder: Path) -> Path:
    load = np.zeros((2, 41), dtype=np.int64)
    load[:, :3] = 5
    load[1, 40] = 2
    path = folder / "load.npz"
    np.savez(path, load=load, top_k=2)
    return path


def _load_json(folder: Path) -> Path:
    load = np.zeros((2, 41), dtype=np.int64)
    load[:, 1:3] = 4
    load[0, 40] = 3
    path = folder / "load.json"
    path.write_text(json.dumps({"load": load.tolist(), "top_k": 2}))
    return path


def _load_csv(folder: Path) -> Path:
    path = folder / "load.csv"
    path.write_text("layer,expert,load\n0,1,5\n0,2,5\n1,40,3\n1,2,4\n")  # line 4
    return path


#: Each reader, the file it reads, and where its error must point.
CASES = {
    "jsonl": (_jsonl, "trace.jsonl:6: expert id 40 is out of range [0, 8)"),
    "npz": (_npz, "trace.npz: topk_ids[2, 1, 1]: expert id 40 is out of range [0, 8)"),
    "aggregated npz": (_load_npz, "load.npz: load: expert id 40 is out of range [0, 8): load"
                       " has 2 selections of it in layer 1, window 0"),
    "aggregated json": (_load_json, "load.json: load: expert id 40 is out of range [0, 8):"
                        " load has 3 selections of it in layer 0, window 0"),
    "aggregated csv": (_load_csv, "load.csv:4: expert id 40 is out of range [0, 8)"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_expert_beyond_the_model_is_named_where_it_is(case: str, tmp_path: Path) -> None:
    write, place = CASES[case]
    (tmp_path / "tiny.yaml").write_text(TINY)
    trace = write(tmp_path)
    result = runner.invoke(app, ["plan", str(trace), "-m", str(tmp_path / "tiny.yaml"),
                                 "--num-gpus", "2", "-o", str(tmp_path / "plan.json")])
    assert result.exit_code == 1, result.stdout
    assert f"error: {tmp_path}/{place}" in result.stderr
    assert "hint: num_experts is 8" in result.stderr


def test_a_trace_whose_ids_stop_short_of_the_model_has_the_model_s_experts(
    tmp_path: Path,
) -> None:
    """Experts 1-2 only, of a model of 8: the statistics have 8 experts, not 3."""
    (tmp_path / "tiny.yaml").write_text(TINY)
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in _rows(None)) + "\n")
    result = runner.invoke(app, ["plan", str(trace), "-m", str(tmp_path / "tiny.yaml"),
                                 "--num-gpus", "2", "-s", "eplb", "-o",
                                 str(tmp_path / "plan.json")])
    assert result.exit_code == 0, result.stderr
    assert "tiny: 8 experts, layers 0-1" in result.stdout
