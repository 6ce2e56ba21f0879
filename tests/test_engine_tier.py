"""The engine tier's runner (``tests/engine/run.sh``): where vllm cannot be installed it
says so and passes, unless ``PLACER_REQUIRE_VLLM=1`` (CI), where it fails."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parent / "engine" / "run.sh"


def _run(tmp_path: Path, require: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PLACER_REQUIRE_VLLM"}
    # an environment that does not exist, and an interpreter that cannot make one
    env.update(PLACER_ENGINE_VENV=str(tmp_path / "venv"), PY="false")
    if require is not None:
        env["PLACER_REQUIRE_VLLM"] = require
    return subprocess.run(["bash", str(RUN)], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.mark.parametrize(("require", "code"), [("1", 1), (None, 0), ("0", 0)])
def test_no_vllm_fails_only_where_it_is_required(tmp_path, require, code) -> None:
    done = _run(tmp_path, require)
    assert done.returncode == code
    assert "cannot create a virtual environment" in done.stderr
    assert ("error: PLACER_REQUIRE_VLLM=1" in done.stderr) == (code == 1)
