"""Every bad input of ``tests/hostile_corpus.py`` through the real command line, in a process
limited to 1 GiB of address space.

Each case must end with its exit code (1 bad data, 2 bad usage), an ``error:`` line first on
stderr that holds the case's text, a ``hint:`` line (every one: there is no exception), and
no traceback; a case marked
``accepted`` is read (exit 0) with the warning it names.  The cases run in two worker
processes (one per core) that build each case's files and call the CLI in-process with
typer's CliRunner, so a case that allocated gigabytes or ran on would fail (``MemoryError``
becomes ``internal error``, exit 3; a case has ``CASE_SECONDS``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hostile_corpus import CASES, Case

#: Address space of a worker: what every case, with placer and numpy loaded, must fit in.
MEMORY_LIMIT = 1 << 30
#: Seconds one case may take before it counts as a hang.
CASE_SECONDS = 30
WORKERS = 2


def run_cases(names: list[str], root: Path, out: Path) -> None:
    """Worker body: build and run the named cases, one JSON result a line in ``out``."""
    import resource
    import signal

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    from typer.testing import CliRunner

    from placer.cli.main import app

    runner = CliRunner()
    by_name = {c.name: c for c in CASES}
    timed_out = False

    def alarm(signum: int, frame: Any) -> None:
        nonlocal timed_out
        timed_out = True
        raise TimeoutError(f"the case ran past {CASE_SECONDS} s")

    signal.signal(signal.SIGALRM, alarm)
    with open(out, "w") as f:
        for name in names:
            folder = root / name
            folder.mkdir(parents=True)
            timed_out = False
            start = time.perf_counter()
            try:
                argv = by_name[name].build(folder)
                signal.alarm(CASE_SECONDS)
                try:
                    result = runner.invoke(app, argv)
                finally:
                    signal.alarm(0)
                exc = result.exception
                record = {
                    "name": name, "argv": argv, "code": result.exit_code,
                    "stderr": result.stderr, "timed_out": timed_out,
                    "exception": None if exc is None or isinstance(exc, SystemExit)
                    else f"{type(exc).__name__}: {exc}",
                }
            except BaseException as e:  # building the case failed: report, go on
                record = {"name": name, "argv": [], "code": None, "stderr": "",
                          "timed_out": timed_out, "exception": f"{type(e).__name__}: {e}"}
            record["seconds"] = round(time.perf_counter() - start, 2)
            f.write(json.dumps(record) + "\n")
            f.flush()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every case's outcome, from ``WORKERS`` worker processes run side by side."""
    root = tmp_path_factory.mktemp("hostile")
    names = [c.name for c in CASES]
    shares = [names[i::WORKERS] for i in range(WORKERS)]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "NO_COLOR": "1", "COLUMNS": "160"}
    procs = []
    for i, share in enumerate(shares):
        out = root / f"results{i}.jsonl"
        code = ("import sys; sys.path.insert(0, sys.argv[1]); import test_hostile_inputs as t;"
                " import json, pathlib;"
                " t.run_cases(json.loads(sys.argv[2]), pathlib.Path(sys.argv[3]),"
                " pathlib.Path(sys.argv[4]))")
        procs.append((out, subprocess.Popen(
            [sys.executable, "-c", code, str(Path(__file__).parent), json.dumps(share),
             str(root / f"w{i}"), str(out)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    found: dict[str, dict[str, Any]] = {}
    for out, proc in procs:
        log, _ = proc.communicate(timeout=CASE_SECONDS * len(names))
        if out.exists():
            for line in out.read_text().splitlines():
                record = json.loads(line)
                found[record["name"]] = record
        for name in names:
            found.setdefault(name, {"worker": f"exit {proc.returncode}: {log[-2000:]}"})
    return found


def test_the_corpus_is_broad():
    """At least 150 bad inputs, every reader and command among them, and the memory bombs
    the corpus was started for."""
    assert len(CASES) >= 150
    assert len({c.name for c in CASES}) == len(CASES)
    prefixes = {c.name.split("-")[0] for c in CASES}
    assert {"jsonl", "npz", "csv", "json", "npy", "pt", "sglang", "trtllm", "topology",
            "model", "hf", "timings", "plan", "compare", "evaluate", "report", "export",
            "import", "option"} <= prefixes
    assert sum(c.bomb for c in CASES) >= 15
    from placer.engines import engine_names

    for reader in ("evaluate-placement-", "export-placement-", "plan-current-",
                   *(f"import-{name}-" for name in engine_names())):
        assert any(c.name.startswith(reader) for c in CASES), f"no case reads {reader}*"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input(case: Case, results: dict[str, dict[str, Any]]):
    got = results[case.name]
    assert "worker" not in got, f"the worker died before the case: {got.get('worker')}"
    stderr = got["stderr"]
    where = f"{' '.join(got['argv'])!r} -> exit {got['code']}\n{stderr}"
    assert got["exception"] is None, f"{got['exception']}: {where}"
    assert not got["timed_out"], where
    assert "Traceback" not in stderr and "internal error" not in stderr, where
    assert got["code"] == case.code, where
    assert case.contains in stderr, f"expected {case.contains!r}: {where}"
    if case.code:
        assert stderr.startswith("error: "), where
        assert "\nhint: " in stderr, f"every refusal carries a hint: {where}"
    else:
        assert "warning: " in stderr, where
