"""The summary's judge on a trace read as a sample (``TokenSample``): a bounded part of
the held-out windows' batches, stated (how many tokens of how many, how many batches, the
seed) and deterministic; and its floor, computed in two processes, equal to one
process's."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from placer.cli.summary import judged_text
from placer.evaluate import evaluate, time_bound
from placer.model import load_model
from placer.planning.build import ProblemSpec, build_problem
from placer.planning.solvers import solve
from placer.regime import Regime
from placer.summary import TIME_FIGURES, judge_sample, summarize_plan
from placer.topology import load_topology
from placer.traces import TokenSample, read_routing

SYNTH = Path(__file__).resolve().parents[2] / "traces" / "synthetic-small.jsonl.gz"
#: 8 tokens per GPU on a DGX H100: batches of 64 tokens, 4 starting in each 256-token window.
WORKLOAD = Regime("vllm", "decode", 8)


def _read(**options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return read_routing(SYNTH, **options)


@pytest.fixture(scope="module")
def cluster():
    """gpt-oss-20b on one DGX H100, the plans of the bundled trace (32 windows of 256
    tokens) fitted on windows 0:6: round robin and EPLB."""
    model, topology = load_model("gpt-oss-20b"), load_topology("dgx-h100")
    problem = build_problem(_read(), ProblemSpec(model=model, topology=topology, redundant=8,
                                                 fit=(0, 6)))
    return model, topology, problem, solve(problem, "round_robin"), solve(problem, "eplb")


def _sampled(seed: int = 0):
    """The trace read as a sample: one batch of 64 tokens per window, drawn with ``seed``."""
    return _read(sample=TokenSample(64, 1, seed, whole_selections=0))


def _summary(cluster, routing):
    _, _, problem, plan, base = cluster
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return summarize_plan(problem, plan, base, routing, regime=WORKLOAD, fit=(0, 6))


def test_a_sampled_trace_is_judged_on_a_stated_bounded_part(cluster):
    """26 batches of the sample start in the held-out windows 6:32; the judge replays 16
    (as many as sampling would draw), spread evenly, and says so."""
    model, topology, _, plan, _ = cluster
    routing = _sampled()
    summary = _summary(cluster, routing)
    judged = summary.judged
    assert (judged.part, judged.windows, judged.source) == ("held-out", (6, 32), "trace")
    assert (judged.num_batches, judged.batch_tokens, judged.num_tokens) == (16, 64, 1024)
    assert judged.of_tokens == int(routing.stats.tokens[6:32].sum()) == 6656
    assert judged.sample == {"trace_tokens": 8192, "batches_held": 26, "per_window": 1,
                             "seed": 0, "batches_judged": 16}
    assert "judged on 16 of the 26 held in these windows, spread evenly" in judged.source_why
    assert judged.to_dict()["of_tokens"] == 6656 and judged.to_dict()["sample"] == judged.sample
    assert judged_text(judged).startswith(
        "held-out windows 6:32 (fitted 0:6), per-token replay: 16 batches of up to 64 tokens,"
        " 1024 of 6656 tokens (the trace's 8,192 tokens are too many to keep")
    # the figures are the evaluator's on exactly those whole batches
    cut, _, _ = judge_sample(routing, (6, 32), 16, 64)
    assert cut is not None and np.unique(cut.trace.sample.batch).size == 16
    assert all(np.bincount(cut.trace.sample.batch)[np.unique(cut.trace.sample.batch)] == 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        direct = evaluate(plan.placement, cut, topology, model, summary.eval_params)
    for figure in TIME_FIGURES:
        assert summary.times[plan.solver][figure.key] == direct.metrics[figure.key]


def test_the_judged_sample_is_deterministic(cluster):
    """Same trace and seed: the same batches and figures; another seed, other batches."""
    first, again = _summary(cluster, _sampled(0)), _summary(cluster, _sampled(0))
    assert first.times == again.times and first.judged == again.judged
    held = [judge_sample(_sampled(seed), (6, 32), 16, 64)[0] for seed in (0, 1)]
    batches = [np.unique(h.trace.sample.batch).tolist() for h in held]
    assert batches[0] != batches[1]


def test_judge_sample_spreads_its_batches_in_time():
    routing = _sampled()
    cut, _, doc = judge_sample(routing, (0, 32), 4, 64)
    held = np.unique(routing.trace.sample.batch)
    assert doc == {"trace_tokens": 8192, "batches_held": 32, "per_window": 1, "seed": 0,
                   "batches_judged": 4}
    # the middle batch of each quarter of the 32 held, one per window
    assert np.unique(cut.trace.sample.batch).tolist() == held[[4, 12, 20, 28]].tolist()


def test_judge_sample_refuses_batches_of_another_size():
    cut, why, _ = judge_sample(_sampled(), (6, 32), 16, 128)
    assert cut is None and why.startswith("the per-token sample holds batches of 64 tokens,"
                                          " the judge's are 128")


def test_the_floors_in_two_processes_are_one_process_floors(cluster):
    """Every other layer floored in a child, the halves put back in layer order: the same
    figures, to the last bit, as :func:`time_bound` and ``counts_floor`` in one call."""
    from placer.evaluate.hot_floor import counts_floor

    model, topology, problem, plan, base = cluster
    routing = _read(keep_tokens=True)
    summary = _summary(cluster, routing)
    params = summary.eval_params
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bound = time_bound(routing, topology, model, params, problem.slots_per_gpu)
        batch = {r.solver: counts_floor(r.placement, routing, topology, model, params,
                                        general=bound).metrics()["step_p99_us"]
                 for r in (plan, base)}
    assert summary.floor == bound.metrics()
    assert summary.batch_floor == batch
