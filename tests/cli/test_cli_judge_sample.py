"""``placer evaluate``, ``report`` and ``compare`` keep per-token routing as ``placer plan``
does: the whole trace while it is small (their figures are those of the library on every
token), else a sample of whole batches per window, drawn with the seed, in the batch size
they judge with; they say so in their text and JSON, and are deterministic for the seed.

The size kept whole is lowered in-process (``placer.summary.JUDGE_WHOLE_SELECTIONS``)
rather than writing a trace over it.
"""

from __future__ import annotations

import html
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import placer.evaluate.many
import placer.summary
from placer.cli.common import read_trace
from placer.cli.main import app
from placer.compare import CompareSettings, Scenario
from placer.compare.run import run_scenario, split_routing
from placer.evaluate import evaluate_many
from placer.model import load_model
from placer.placement.document import read_placement
from placer.regime import Regime
from placer.stats.windows import parse_window_range
from placer.topology import load_topology

runner = CliRunner()
SYNTH = Path(__file__).resolve().parents[2] / "traces" / "synthetic-small.jsonl.gz"
MODEL, TOPOLOGY = "gpt-oss-20b", "dgx-h100"
#: 8 tokens per GPU on a DGX H100: batches of 64 tokens, 4 starting in each 256-token window
#: of the 8,192-token trace; read as a sample, one batch per window is kept.
FLAGS = ["--tokens-per-gpu", "8"]
REGIME = Regime("vllm", "decode", 8)
SAMPLED = "read as a sample of whole batches, 1 per window (seed 0)"


def _run(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def placement(tmp_path_factory) -> Path:
    """EPLB fitted on the default split's windows 0:24, planned under the regime."""
    path = tmp_path_factory.mktemp("judge-sample") / "eplb.json"
    _run("plan", str(SYNTH), "-m", MODEL, "-t", TOPOLOGY, "-r", "8", "-s", "eplb", *FLAGS,
         "--fit", "0:24", "-o", str(path), "--json", "-q")
    return path


@pytest.fixture(scope="module")
def every_token():
    """The library's reading before: every token kept."""
    model = load_model(MODEL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model, read_trace([SYNTH], model=model, keep_tokens=True)


def _library_parts(placement: Path, every_token, **parts):
    model, routing = every_token
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return evaluate_many([("eplb", read_placement(placement))], routing,
                             load_topology(TOPOLOGY), model, REGIME, **parts)


def test_a_small_trace_is_judged_whole_with_the_figures_of_every_token(placement, every_token):
    """evaluate, report and compare on the bundled trace: figures identical to the library
    on every token, no sample said."""
    doc = json.loads(_run("evaluate", str(SYNTH), "-p", str(placement), *FLAGS,
                          "--fit", "0:24", "--json", "-q"))
    library = _library_parts(placement, every_token, fit=parse_window_range("0:24"))
    assert [p["windows"] for p in doc["parts"]] == [list(p.windows) for p in library]
    for part, done in zip(doc["parts"], library, strict=True):
        assert part["placements"][0]["metrics"] == done.evaluations[0][1].metrics
        assert part["judged"]["sample"] is None and part["judged"]["why"] == ""
        assert part["judged"]["num_tokens"] == part["judged"]["of_tokens"]
    text = _run("evaluate", str(SYNTH), "-p", str(placement), *FLAGS, "--fit", "0:24", "-q")
    assert SAMPLED not in text and "judged on windows" not in text

    reported = json.loads(_run("report", str(SYNTH), "-p", str(placement), *FLAGS, "-o",
                               str(placement.parent / "r.html"), "--dpi", "30", "--json",
                               "-q")) if _has_matplotlib() else None
    if reported is not None:
        (held,) = _library_parts(placement, every_token, held_out=(24, 32))
        assert reported["placements"][0]["metrics"] == held.evaluations[0][1].metrics
        assert reported["judged"]["sample"] is None

    compared = json.loads(_run("compare", str(SYNTH), "-m", MODEL, "-t", TOPOLOGY, "-r", "8",
                               "-s", "eplb", *FLAGS, "--json", "-q"))
    model, routing = every_token
    settings = CompareSettings(model=MODEL, tokens_per_gpu=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outcome = run_scenario(Scenario(TOPOLOGY, 8, "eplb"), split_routing(routing), model,
                               load_topology(TOPOLOGY), settings)
    (row,) = compared["rows"]
    for key, value in outcome.row.as_dict().items():
        if key not in ("solve_seconds", "verdict", "outcome"):
            assert row[key] == value, key
    assert compared["judged"] == [] and outcome.judged is None


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture
def sampled(monkeypatch):
    """Every trace read as a sample; the routing each evaluation replays, recorded."""
    monkeypatch.setattr(placer.summary, "JUDGE_WHOLE_SELECTIONS", 0)
    replayed: list = []
    real = placer.evaluate.many.evaluate

    def spy(placement, routing, *args, **kwargs):
        replayed.append(routing)
        return real(placement, routing, *args, **kwargs)

    monkeypatch.setattr(placer.evaluate.many, "evaluate", spy)
    return replayed


def _whole_batches(routing, batch_tokens: int) -> np.ndarray:
    """The batches a replayed routing holds, each checked whole (``batch_tokens`` long)."""
    sample = routing.trace.sample
    assert sample is not None and sample.batch_tokens == batch_tokens
    held = np.unique(sample.batch)
    assert (np.bincount(sample.batch)[held] == batch_tokens).all()
    assert routing.trace.topk_ids.shape[0] == held.size * batch_tokens < sample.num_tokens
    return held


def test_evaluate_judges_a_large_trace_on_a_stated_sample(placement, sampled):
    args = ["evaluate", str(SYNTH), "-p", str(placement), *FLAGS, "--fit", "0:24"]
    doc = json.loads(_run(*args, "--json", "-q"))
    # fit: 24 batches held (one per window), 16 judged; held-out: the 8 held
    assert [len(_whole_batches(r, 64)) for r in sampled] == [16, 8]
    fit, held = doc["parts"]
    assert fit["judged"]["sample"] == {"trace_tokens": 8192, "batches_held": 24,
                                       "per_window": 1, "seed": 0, "batches_judged": 16}
    assert (held["judged"]["num_tokens"], held["judged"]["of_tokens"]) == (512, 2048)
    assert held["source"] == "trace" and held["params"]["sample"] is False
    assert SAMPLED in held["judged"]["why"]
    assert held["placements"][0]["metrics"]["num_tokens"] == 512
    text = _run(*args, "-q")
    assert (f"judged on windows 24:32: 512 of 2048 tokens ({held['judged']['why']})"
            in text.splitlines())
    again = json.loads(_run(*args, "--json", "-q"))  # the same seed, the same batches
    assert again["parts"] == doc["parts"]
    other = json.loads(_run(*args, "--seed", "1", "--json", "-q"))
    assert other["parts"][1]["judged"]["sample"]["seed"] == 1


def test_the_sampled_figures_are_plans(placement, sampled):
    """plan, evaluate, report and compare judge the same sampled batches of the held-out
    windows: one set of figures, as on a trace kept whole."""
    planned = json.loads(_run("plan", str(SYNTH), "-m", MODEL, "-t", TOPOLOGY, "-r", "8",
                              "-s", "eplb", *FLAGS, "--fit", "0:24", "-o",
                              str(placement.parent / "again.json"), "--json", "-q"))
    evaluated = json.loads(_run("evaluate", str(SYNTH), "-p", str(placement), *FLAGS,
                                "--fit", "0:24", "--json", "-q"))
    compared = json.loads(_run("compare", str(SYNTH), "-m", MODEL, "-t", TOPOLOGY, "-r", "8",
                               "-s", "eplb", *FLAGS, "--json", "-q"))
    held = evaluated["parts"][1]
    assert planned["judged"]["sample"] == held["judged"]["sample"]
    (row,) = compared["rows"]
    for key in ("step_p99_us", "step_p50_us", "moe_layer_p99_us", "all_to_all_us"):
        value = planned["times"]["eplb"][key]
        assert held["placements"][0]["metrics"][key] == value
        assert row[key] == value
    (judged,) = compared["judged"]
    assert judged["scenario"] == row["scenario"] and judged["sample"] == planned["judged"]["sample"]
    assert (judged["num_tokens"], judged["of_tokens"]) == (512, 2048)


@pytest.mark.skipif(not _has_matplotlib(), reason="placer report draws pictures")
def test_report_says_it_judged_on_a_sample(placement, sampled, tmp_path):
    args = ["report", str(SYNTH), "-p", str(placement), *FLAGS, "-o", str(tmp_path / "r.html"),
            "--dpi", "30"]
    doc = json.loads(_run(*args, "--json", "-q"))
    (replayed,) = sampled
    assert len(_whole_batches(replayed, 64)) == 8
    assert doc["windows"] == [24, 32] and doc["judged"]["num_tokens"] == 512
    assert doc["judged"]["of_tokens"] == 2048 and SAMPLED in doc["judged"]["why"]
    assert doc["params"]["sample"] is False
    assert f"judged on windows 24:32: 512 of 2048 tokens ({doc['judged']['why']})" in (
        _run(*args, "-q").splitlines())
    page = (tmp_path / "r.html").read_text()
    assert "512 of 2048 tokens" in page and SAMPLED in page
    assert json.loads(_run(*args, "--json", "-q"))["placements"] == doc["placements"]


@pytest.mark.skipif(not _has_matplotlib(), reason="placer compare --report draws pictures")
def test_compares_page_says_it_judged_on_a_sample(monkeypatch, tmp_path):
    monkeypatch.setattr(placer.summary, "JUDGE_WHOLE_SELECTIONS", 0)
    page = tmp_path / "c.html"
    said = _run("compare", str(SYNTH), "-m", MODEL, "-t", TOPOLOGY, "-r", "8", "-s", "eplb",
                *FLAGS, "--report", str(page), "--dpi", "30", "-q")
    line = next(x for x in said.splitlines() if x.startswith("judged on "))
    assert "512 of 2048 tokens" in line and SAMPLED in line
    assert html.escape(line) in page.read_text()


def test_compare_samples_in_the_batches_most_scenarios_judge_with(monkeypatch):
    """Two 8-GPU scenarios and one of 16: the sample holds 64-token batches; the 16-GPU
    scenario (128-token batches) samples batches from the statistics, and says why."""
    monkeypatch.setattr(placer.summary, "JUDGE_WHOLE_SELECTIONS", 0)
    args = ["compare", str(SYNTH), "-m", MODEL, "-t", TOPOLOGY, "-t", "2x-dgx-h100", "-r",
            "0,16", *FLAGS, "-q"]
    doc = json.loads(_run(*args, "--json"))
    judged = {j["scenario"]: j for j in doc["judged"]}
    assert set(judged) == {r["scenario"] for r in doc["rows"] if r["status"] == "ok"}
    small = [j for name, j in judged.items() if name.startswith(f"{TOPOLOGY} ")]
    large = [j for name, j in judged.items() if name.startswith("2x-")]
    assert len(small) == 2 and large
    assert all(j["num_tokens"] == 512 < j["of_tokens"] and SAMPLED in j["why"] for j in small)
    assert all(j["why"].startswith("the per-token sample holds batches of 64 tokens, the"
                                   " judge's are 128") for j in large)
    text = _run(*args).splitlines()
    assert all(any(line.startswith(f"{name}: judged on ") for line in text) for name in judged)
    again = json.loads(_run(*args, "--json"))  # the same seed, the same figures
    assert again["judged"] == doc["judged"]
    assert [_figures(r) for r in again["rows"]] == [_figures(r) for r in doc["rows"]]


def _figures(row: dict) -> dict:
    """A compare row without its solve time (wall clock)."""
    return {key: value for key, value in row.items() if key != "solve_seconds"}
