"""No impossible numbers: every remote-copy bracket and estimate ``placer plan`` prints lies
in ``[0, G - 1]`` (GPUs) or ``[0, N - 1]`` (nodes), never above top_k, and every estimate
inside its bracket; ``remote_copy_bounds`` brackets the exact figure of random routings
(thresholded pairs, tokens with fewer picks, top-k up to 8)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from placer.cli.main import app
from placer.errors import DataError
from placer.evaluate.static import (
    expected_remote_copies,
    missing_pairs,
    pairwise_is_exact,
    remote_copy_bounds,
)
from placer.placement import Placement
from placer.stats import ExpertStats

runner = CliRunner()
TRACES = Path(__file__).resolve().parents[2] / "traces"
SYNTH = str(TRACES / "synthetic-small.jsonl.gz")  # gpt-oss-20b shape: 4 layers x 32, top-4
QWEN = str(TRACES / "qwen3-30b-a3b.npz")  # 48 layers x 128, top-8, thresholded pairs, 1 window
#: Short cpsat searches: the invariant, not the search, is under test.
CPSAT = ["--solver", "cpsat", "--time-limit", "1", "--option", "patience=2",
         "--option", "balance_iterations=4", "--option", "cost_iterations=4"]
TOL = 1e-9

# (trace, top_k, options); --fit ranges cut the trace while the pair counts cover all of it
CASES = [
    *[(SYNTH, 4, ["-m", "gpt-oss-20b", "-t", "dgx-h100", "--redundant", "8",
                  "--solver", "round_robin", *fit])
      for fit in ([], ["--fit", "0:6"], ["--fit", "6:8"], ["--fit", "16:32"], ["--fit", "31:32"])],
    (SYNTH, 4, ["-m", "gpt-oss-20b", "-t", "2x-dgx-h100", "--solver", "linear"]),
    (SYNTH, 4, ["-m", "gpt-oss-20b", "-t", "2x-dgx-h100", "--solver", "round_robin",
                "--fit", "0:6"]),
    (SYNTH, 4, ["-t", "2x-dgx-h100", "--solver", "round_robin", "--fit", "4:10"]),  # no model
    (SYNTH, 4, ["-g", "8", "--solver", "round_robin", "--fit", "0:6"]),  # no topology
    (QWEN, 8, ["-m", "qwen3-30b-a3b", "-t", "2x-dgx-h100", "-r", "16",
               "--solver", "round_robin"]),
    (QWEN, 8, ["-m", "qwen3-30b-a3b", "-t", "2x-dgx-h100", "-r", "16",
               "--solver", "round_robin", "--fit", "0:1"]),
    (QWEN, 8, ["-t", "4x-dgx-h100", "--solver", "round_robin"]),  # closed form was 3.53 nodes
    # the README tour's planner run, with a short search
    (SYNTH, 4, ["-m", "gpt-oss-20b", "-t", "dgx-h100", "--redundant", "8", "--fit", "0:6",
                *CPSAT]),
]


def _plan(tmp_path: Path, trace: str, options: list[str], *extra: str) -> Any:
    result = runner.invoke(app, ["plan", trace, *options, "-o", str(tmp_path / "p.json"),
                                 *extra])
    assert result.exit_code == 0, result.stderr
    return result


def check_side(side: dict[str, Any], gpus: int, nodes: int, top_k: int) -> int:
    """Assert the invariant on one column of the side-by-side; the brackets checked."""
    checked = 0
    for kind, others in (("gpus", gpus - 1), ("nodes", nodes - 1)):
        estimate = side[f"remote_{kind}_per_token"]
        bounds = side[f"remote_{kind}_per_token_bounds"]
        if kind == "nodes" and nodes == 1:
            assert estimate is None and bounds is None
            continue
        cap = min(others, top_k)
        if estimate is not None:
            assert -TOL <= estimate <= cap + TOL, (kind, estimate, cap)
        if bounds is not None:
            low, high = bounds
            assert 0 <= low <= high <= cap + TOL, (kind, bounds, cap)
            checked += 1
            if estimate is not None:
                assert low - TOL <= estimate <= high + TOL, (kind, low, estimate, high)
    if top_k > 2:
        # the pairwise closed form is no estimate beyond top-2
        assert not side["remote_copies_from"].startswith("evaluator, closed form")
    return checked


@pytest.mark.parametrize("trace,top_k,options", CASES,
                         ids=[" ".join(Path(c[0]).name.split(".")[:1] + c[2]) for c in CASES])
def test_plan_summary_brackets_are_possible(tmp_path, trace, top_k, options):
    summary = json.loads(_plan(tmp_path, trace, options, "--json").stdout)
    problem = summary["problem"]
    versus = summary["versus"]
    checked = sum(check_side(versus[name], problem["num_gpus"], problem["num_nodes"], top_k)
                  for name in versus["columns"])
    assert checked >= 2  # top-4 and top-8: a bracket in every column
    if "-m" not in options or "-t" not in options:  # no sampled estimate without both
        assert all(versus[name]["remote_gpus_per_token"] is None for name in versus["columns"])


def test_fit_figures_cover_the_whole_trace(tmp_path):
    """With --fit the figures use every window (where loads and pairs agree), and say so."""
    summary = json.loads(_plan(tmp_path, SYNTH, CASES[1][2], "--json").stdout)
    assert "all 32 windows" in summary["versus"]["eplb"]["remote_copies_from"]
    whole = json.loads(_plan(tmp_path, SYNTH, CASES[0][2], "--json").stdout)
    assert summary["versus"]["eplb"]["remote_gpus_per_token_bounds"] != (
        whole["versus"]["eplb"]["remote_gpus_per_token_bounds"])  # another placement
    assert summary["versus"]["round_robin"]["remote_gpus_per_token_bounds"] == (
        whole["versus"]["round_robin"]["remote_gpus_per_token_bounds"])  # same placement


def test_printed_brackets_hold_the_printed_estimates(tmp_path):
    """The text table: each ``low-high`` cell holds the estimate printed above it."""
    out = _plan(tmp_path, SYNTH, ["-m", "gpt-oss-20b", "-t", "2x-dgx-h100", "--solver",
                                  "round_robin", "--fit", "0:6"]).stdout
    rows = {line[:24].strip(): line[24:].split() for line in out.splitlines()}
    for kind, cap in (("GPUs", 15), ("nodes", 1)):
        estimates = [float(x) for x in rows[f"remote {kind} per token"]]
        spans = [[float(x) for x in cell.split("-")] for cell in rows[f"remote {kind}, bounds"]]
        for estimate, (low, high) in zip(estimates, spans, strict=True):
            assert 0 <= low <= estimate <= high <= cap
    assert re.search(r"^remote copies(, \w+)?: evaluator, sampled batches, all 32 windows",
                     out, re.M)


def test_top2_closed_form_is_shown_only_when_exact(tmp_path):
    """A top-2 trace with every pair counted: the closed form, no bracket; with light
    pairs dropped (thresholded), a bracket and no closed form."""
    from placer.traces import write_npz_trace

    rng = np.random.default_rng(3)
    topk = np.stack([rng.choice(8, 2, replace=False) for _ in range(400)])[:, None, :]
    trace = tmp_path / "top2.npz"
    write_npz_trace(trace, topk, layer_ids=[0], step=np.arange(400) // 50,
                    meta={"num_experts": 8, "top_k": 2})
    options = ["-g", "4", "-r", "4", "--solver", "round_robin", "--fit", "0:3"]
    versus = json.loads(_plan(tmp_path, str(trace), options, "--json").stdout)["versus"]
    for name in versus["columns"]:
        side = versus[name]
        assert side["remote_copies_from"].startswith("evaluator, closed form (exact: top-2")
        assert side["remote_gpus_per_token_bounds"] is None
        assert 0 < side["remote_gpus_per_token"] <= 2 * (1 - 1 / 4)


# -- remote_copy_bounds against the exact figure of random routings ------------------------


def _random_case(seed: int, top_k: int, gpus_per_node: list[int], threshold: int,
                 short: bool) -> tuple[Placement, ExpertStats, SimpleNamespace, np.ndarray]:
    """A random placement, routing, and the routing's exact ``[layers, 2]`` figure."""
    rng = np.random.default_rng(seed)
    num_gpus = sum(gpus_per_node)
    num_experts = int(rng.integers(top_k + 1, max(top_k + 2, 13)))
    slots = int(rng.integers(-(-num_experts // num_gpus), num_experts + 1))
    layers = 2
    rows = []
    for _ in range(layers):
        held: list[set[int]] = [set() for _ in range(num_gpus)]
        for i, e in enumerate(rng.permutation(num_experts)):
            held[i % num_gpus].add(int(e))
        for gpu in held:
            while len(gpu) < slots:
                gpu.add(int(rng.integers(num_experts)))
        rows.append([e for gpu in held for e in sorted(gpu)])
    placement = Placement(np.array(rows), np.arange(layers), num_experts, num_gpus)
    tokens = int(rng.integers(1, 40))
    popular = rng.dirichlet(np.full(num_experts, 0.5))  # skewed, some experts together
    load = np.zeros((1, layers, num_experts), dtype=np.int64)
    coact = np.zeros((layers, num_experts, num_experts), dtype=np.int64)
    exact = np.zeros((layers, 2))
    node_of_gpu = np.repeat(np.arange(len(gpus_per_node)), gpus_per_node)
    onehot = np.eye(len(gpus_per_node))[node_of_gpu]
    w = 1.0 - onehot.sum(axis=0) / num_gpus
    for layer in range(layers):
        f = placement.expert_gpu_mask[layer] / placement.replica_counts[layer][:, None]
        f_node = f @ onehot
        for _ in range(tokens):
            picks = int(rng.integers(1, top_k + 1)) if short and rng.random() < 0.3 else top_k
            ids = rng.choice(num_experts, size=picks, replace=False, p=popular)
            load[0, layer, ids] += 1
            for a in ids:
                for b in ids:
                    if a != b:
                        coact[layer, a, b] += 1
            exact[layer, 0] += (1 - 1 / num_gpus) * (1 - np.prod(1 - f[ids], axis=0)).sum()
            exact[layer, 1] += w @ (1 - np.prod(1 - f_node[ids], axis=0))
    coact[coact < threshold] = 0  # thresholded pair lists, as published statistics are
    stats = ExpertStats(load=load, tokens=np.array([tokens]), layer_ids=np.arange(layers),
                        top_k=top_k, coact=coact)
    return placement, stats, SimpleNamespace(node_of_gpu=node_of_gpu), exact / tokens


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), top_k=st.integers(1, 8),
       gpus_per_node=st.lists(st.integers(1, 4), min_size=1, max_size=3),
       threshold=st.sampled_from([0, 0, 2, 4]), short=st.booleans())
def test_bounds_bracket_the_exact_figure(seed, top_k, gpus_per_node, threshold, short):
    placement, stats, topology, exact = _random_case(seed, top_k, gpus_per_node, threshold,
                                                     short)
    bounds = remote_copy_bounds(placement, stats, topology)  # [layer, gpu|node, lo|hi]
    num_gpus, num_nodes = sum(gpus_per_node), len(gpus_per_node)
    low, high = bounds[..., 0], bounds[..., 1]
    assert (low >= 0).all() and (low <= exact + TOL).all() and (exact <= high + TOL).all()
    assert (high[:, 0] <= num_gpus - 1 + TOL).all() and (high[:, 1] <= num_nodes - 1 + TOL).all()
    assert (high <= top_k + TOL).all()
    closed = expected_remote_copies(placement, stats, topology)
    if pairwise_is_exact(stats):
        np.testing.assert_allclose(closed, exact, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(low, exact, rtol=1e-9, atol=1e-12)
    elif (missing_pairs(stats) == 0).all():  # every pair counted, top-k > 2: Bonferroni
        assert (closed <= exact + TOL).all() and (closed <= low + TOL).all()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), top_k=st.integers(1, 8),
       gpus_per_node=st.lists(st.integers(1, 4), min_size=1, max_size=3))
def test_bounds_are_ordered_for_any_counts(seed, top_k, gpus_per_node):
    """Counts no routing has: a DataError, or a bracket that is still possible."""
    placement, stats, topology, _ = _random_case(seed, top_k, gpus_per_node, 0, True)
    rng = np.random.default_rng(seed + 1)
    noisy = np.triu(rng.integers(0, 6, size=stats.coact.shape), k=1)
    stats = ExpertStats(load=stats.load, tokens=stats.tokens, layer_ids=stats.layer_ids,
                        top_k=top_k, coact=noisy + noisy.transpose(0, 2, 1))
    try:
        bounds = remote_copy_bounds(placement, stats, topology)
    except DataError as exc:
        assert "co-activation counts do not fit the loads" in exc.message
        return
    num_gpus, num_nodes = sum(gpus_per_node), len(gpus_per_node)
    assert (bounds[..., 0] >= 0).all() and (bounds[..., 0] <= bounds[..., 1]).all()
    assert (bounds[:, 0, 1] <= num_gpus - 1 + TOL).all()
    assert (bounds[:, 1, 1] <= num_nodes - 1 + TOL).all()


def test_fitted_windows_with_all_window_pairs_are_refused():
    """The cause of "bounds 1.24-1.00": loads of some windows, pairs of all of them."""
    placement, stats, topology, _ = _random_case(5, 4, [2, 2], 0, False)
    windows = ExpertStats(load=np.concatenate([stats.load // 2, stats.load - stats.load // 2]),
                          tokens=np.array([stats.tokens[0] // 2, stats.tokens[0]
                                           - stats.tokens[0] // 2]),
                          layer_ids=stats.layer_ids, top_k=4, coact=stats.coact)
    remote_copy_bounds(placement, windows, topology)  # all windows: fine
    with pytest.raises(DataError, match="co-activation counts do not fit the loads"):
        remote_copy_bounds(placement, windows.select_windows(0, 1), topology)
