"""placer.compare: scenarios -> rows, on the bundled trace; the scenario file schema."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import placer.compare.run as compare_mod
from placer import constants
from placer.compare import (
    BASELINE_RULE,
    TABLE_COLUMNS,
    CompareRow,
    CompareSettings,
    Grid,
    Scenario,
    ScenarioOutcome,
    Sweep,
    compare,
    expand_scenarios,
    format_table,
    read_study,
    resolve_study,
    split_routing,
    study_from_yaml,
    table_cells,
)
from placer.errors import PlacerError, PlacerWarning, UsageError
from placer.evaluate import evaluate
from placer.evaluate.params import regime_params
from placer.model import load_model
from placer.planning.build import ProblemSpec, build_problem
from placer.planning.solvers import solve
from placer.problem import SolveParams
from placer.regime import Regime
from placer.topology import load_topology
from placer.traces import read_routing

BUNDLED = Path(__file__).resolve().parents[2] / "traces" / "synthetic-small.jsonl.gz"

#: gpt-oss-20b (32 experts, top-4) matches the bundled trace. With 71 GB of each
#: H100 kept for the KV cache, 1.4 GB is left for experts: 4 slots of 0.32 GB.
SETTINGS = CompareSettings(model="gpt-oss-20b", kv_reserve_gb=71.0, seed=0)


@pytest.fixture(scope="module")
def bundled():
    """The bundled synthetic trace: 4 layers x 32 experts, top-4, 8,192 tokens, 32 windows."""
    return read_routing(BUNDLED, keep_tokens=True)


@pytest.fixture(scope="module")
def four_rows(bundled):
    """dgx-h100 and 2x-dgx-h100 x R in {0, 16} x eplb, in process."""
    scenarios = expand_scenarios(["dgx-h100", "2x-dgx-h100"], [0, 16], ["eplb"])
    return compare(bundled, scenarios, SETTINGS)


def test_two_presets_two_redundancy_levels_give_the_expected_rows(four_rows):
    rows = [o.row for o in four_rows]
    assert [r.scenario for r in rows] == [
        "dgx-h100 R=0 eplb", "dgx-h100 R=16 eplb", "2x-dgx-h100 R=0 eplb",
        "2x-dgx-h100 R=16 eplb",
    ]
    assert [r.num_gpus for r in rows] == [8, 8, 16, 16]
    assert [r.num_nodes for r in rows] == [1, 1, 2, 2]
    assert [r.slots_per_gpu for r in rows] == [4, None, 2, 3]
    assert [r.ok for r in rows] == [True, False, True, True]
    assert rows[1].status.startswith("does not fit: 6 slots per GPU need 1.9 GB of expert weights")
    assert "holds 4" in rows[1].status
    for row in (rows[0], rows[2], rows[3]):
        assert row.solver_status == "HEURISTIC"
        assert all(getattr(row, f) is not None for f in compare_mod.METRIC_FIELDS)
    # one node: nothing crosses nodes; two nodes: something does
    assert rows[0].remote_copies_per_token_node == 0.0 and rows[0].bytes_per_token_inter == 0.0
    assert rows[2].remote_copies_per_token_node > 0 and rows[2].bytes_per_token_inter > 0
    # one more slot per GPU costs KV memory; replicas lower the hot shard
    assert rows[3].kv_left_gb < rows[2].kv_left_gb
    assert rows[3].hot_shard_ratio < rows[2].hot_shard_ratio
    # the row that did not fit carries no figures and no placement
    assert rows[1].kv_left_gb is None and four_rows[1].placement is None


def test_rows_equal_plan_then_evaluate_by_hand(bundled, four_rows):
    """The row of 2x-dgx-h100 R=16 is what build_problem -> solve -> evaluate gives."""
    model, topology = load_model("gpt-oss-20b"), load_topology("2x-dgx-h100")
    problem = build_problem(bundled, ProblemSpec(model=model, topology=topology, redundant=16,
                            kv_reserve_gb=71.0, fit=(0, 24)))
    result = solve(problem, "eplb")
    evaluation = evaluate(result.placement, bundled, topology, model,
                          regime_params(Regime(), topology.num_gpus, windows=(24, 32),
                                        num_layers=bundled.stats.num_layers))
    row = four_rows[3].row
    for field, key in compare_mod.METRIC_FIELDS.items():
        assert getattr(row, field) == pytest.approx(evaluation.metrics[key]), field
    assert four_rows[3].placement == result.placement


def test_parallel_jobs_give_the_same_rows_in_the_same_order(bundled, four_rows):
    scenarios = expand_scenarios(["dgx-h100", "2x-dgx-h100"], [0, 16], ["eplb"])
    seen = []
    parallel = compare(bundled, scenarios, SETTINGS, jobs=2, keep_details=False,
                       on_done=lambda i, o: seen.append(i))
    assert sorted(seen) == [0, 1, 2, 3]

    def figures(row: CompareRow) -> dict:
        return {k: v for k, v in row.as_dict().items() if k != "solve_seconds"}

    assert [figures(o.row) for o in parallel] == [figures(o.row) for o in four_rows]
    assert all(o.placement is None for o in parallel)


def test_uneven_slots_and_bugs_become_error_rows(bundled, monkeypatch):
    scenarios = (Scenario("dgx-h100", 12, "linear"), Scenario("dgx-h100", 0, "linear"))
    real = compare_mod.run_scenario

    def flaky(scenario, *args, **kwargs):
        if scenario.redundant == 0:
            raise RuntimeError("boom")
        return real(scenario, *args, **kwargs)

    monkeypatch.setattr(compare_mod, "run_scenario", flaky)
    rows = [o.row for o in compare(bundled, scenarios, SETTINGS)]
    assert rows[0].status.startswith(
        "error: 32 experts + 12 redundant = 44 slots do not split evenly over 8 GPUs")
    assert rows[1].status == "error: RuntimeError: boom"
    assert (rows[1].num_gpus, rows[1].num_nodes) == (8, 1)


def test_unknown_names_stop_the_study_before_it_runs(bundled):
    with pytest.raises(UsageError) as info:
        compare(bundled, (Scenario("dgx-h100", 0, "nope"),), SETTINGS)
    assert info.value.message == "unknown solver 'nope'" and info.value.where == "--solver"
    with pytest.raises(PlacerError):
        compare(bundled, (Scenario("no-such-box", 0, "eplb"),), SETTINGS)
    with pytest.raises(UsageError) as info:
        compare(bundled, (Scenario("dgx-h100", 0, "eplb"),), SETTINGS, jobs=0)
    assert str(info.value) == "jobs: jobs must be at least 1, got 0"
    with pytest.raises(UsageError) as info:
        compare(bundled, (Scenario("dgx-h100", 0, "eplb"),), CompareSettings(model=""))
    assert info.value.message == "no model to plan for"


def test_split_holds_out_the_last_quarter_of_windows(bundled):
    split = split_routing(bundled)
    assert (split.fit, split.judge) == ((0, 24), (24, 32))
    assert split.description == "fitted on windows 0:24, judged on held-out windows 24:32"
    assert split.judge_stats.num_windows == 8
    every = split_routing(bundled, holdout=False)
    assert every.fit == every.judge == (0, 32)
    assert every.description == "fitted and judged on all 32 window(s): no hold-out asked"


def test_expand_scenarios_is_topology_major_and_labels_files_by_stem():
    got = expand_scenarios(["a", "cfg/box.yaml"], [0, 8], ["eplb", "linear"])
    assert [s.label for s in got][:3] == ["a R=0 eplb", "a R=0 linear", "a R=8 eplb"]
    assert got[-1].label == "box R=8 linear"
    assert Scenario("a", 0, "eplb", name="mine").label == "mine"
    with pytest.raises(UsageError, match="redundant experts must be zero or more, got -1"):
        Scenario("a", -1, "eplb")
    with pytest.raises(UsageError, match="no topology to compare"):
        expand_scenarios([], [0], ["eplb"])


def test_settings_validate_themselves():
    with pytest.raises(UsageError) as info:
        CompareSettings(model="m", policy="fastest")
    assert str(info.value) == "dispatch_override: unknown dispatch policy 'fastest'"
    assert info.value.hint == ("choose one of: vllm_hash, trtllm_block, round_robin, sglang,"
                               " local_first, random")
    with pytest.raises(UsageError, match="unknown all-to-all mode 'slow'"):
        CompareSettings(model="m", mode="slow")
    with pytest.raises(UsageError, match="time limit must be positive, got 0"):
        CompareSettings(model="m", time_limit_s=0)
    with pytest.raises(UsageError) as info:
        CompareSettings(model="m", dtype="int3")
    assert str(info.value) == "dtype: unknown dtype 'int3'"


def _row(**kw) -> CompareRow:
    base = {"scenario": "s", "topology": "t", "redundant": 0, "solver": "eplb", "status": "ok"}
    return CompareRow(**{**base, **kw})


def test_format_table_numbers_notes_and_alignment():
    rows = [
        _row(scenario="ok one", num_gpus=8, num_nodes=1, slots_per_gpu=4, kv_left_gb=71.06,
             bytes_per_token_intra=35_400.0, moe_layer_p99_us=23.34, solver_status="OPTIMAL"),
        _row(scenario="big", status="does not fit: too big", num_gpus=8),
        _row(scenario="big too", status="does not fit: too big"),
        _row(scenario="odd", status="error: uneven"),
    ]
    lines = format_table(rows, wide=True).splitlines()
    assert lines[0].split()[:4] == ["scenario", "GPUs", "nodes", "slots/GPU"]
    assert lines[2].startswith("ok one ")
    cells = table_cells(rows[0])
    assert cells[4] == "71.06" and cells[9] == "35,400" and cells[13] == "23.3"
    # every figure's header and format are the metric table's (placer.metrics)
    for col, text in zip(TABLE_COLUMNS, cells, strict=True):
        if col.metric is not None:
            assert col.header == col.metric.header
            assert text == col.metric.cell(getattr(rows[0], col.field))
    assert lines[3].endswith("does not fit [1]") and lines[4].endswith("does not fit [1]")
    assert lines[5].endswith("error [2]")
    assert lines[-2:] == ["[1] too big", "[2] uneven"]
    gpus_end = lines[0].index("GPUs") + len("GPUs")  # numbers are right-aligned
    assert lines[2][gpus_end - 2:gpus_end] == " 8"


# -- the scenario file ------------------------------------------------------------------------
STUDY = """\
trace: trace.jsonl
model: gpt-oss-20b
topologies: [dgx-h100, 2x-dgx-h100]
redundant: [0, 16]
solvers: [eplb, linear]
scenarios:
  - {name: NVL72, topology: gb200-nvl72, redundant: 40, solver: eplb}
dispatch: local_first
mode: low_latency
kv_reserve_gb: 20
time_limit_s: 2
layer_time_limit_s: 0.5
seed: 3
tokens_per_gpu: 64
holdout: false
"""


def test_scenario_file_gives_product_then_listed_scenarios(tmp_path):
    (tmp_path / "trace.jsonl").write_text("")
    path = tmp_path / "study.yaml"
    path.write_text(STUDY)
    study = read_study(path)
    assert study.grid == Grid(("dgx-h100", "2x-dgx-h100"), Sweep("redundant", (0, 16)),
                              ("eplb", "linear"))
    assert study.scenarios == (Scenario("gb200-nvl72", 40, "eplb", name="NVL72"),)
    resolved = resolve_study(study)
    assert resolved.grid is None and resolved.notes == ()
    assert len(resolved.scenarios) == 2 * 2 * 2 + 1
    assert resolved.scenarios[:2] == (Scenario("dgx-h100", 0, "eplb"),
                                      Scenario("dgx-h100", 0, "linear"))
    assert resolved.scenarios[-1] == Scenario("gb200-nvl72", 40, "eplb", name="NVL72")
    assert study.trace == (str(tmp_path / "trace.jsonl"),)
    assert study.settings == CompareSettings(
        model="gpt-oss-20b", policy="local_first", mode="low_latency", kv_reserve_gb=20.0,
        time_limit_s=2.0, layer_time_limit_s=0.5, seed=3, tokens_per_gpu=64, holdout=False)


def test_the_old_key_policy_reads_as_dispatch_with_a_warning():
    """``policy`` was the flag ``--policy`` (now ``--dispatch``): a file that says it still
    reads, and is told the new name; both keys at once are one setting given twice."""
    old = "model: m\ntopologies: [a]\npolicy: sglang\n"
    with pytest.warns(PlacerWarning, match=r"^study.yaml:3: policy: the key 'policy' is now"
                      r" 'dispatch' \(as the flag --dispatch\); read as such$"):
        study = study_from_yaml(old, "study.yaml")
    assert study.settings.regime.dispatch == "sglang"
    with pytest.raises(UsageError, match="'policy' and 'dispatch' are one setting") as info:
        study_from_yaml(old + "dispatch: random\n", "study.yaml")
    assert info.value.where == "study.yaml:3: policy"


def test_time_limits_reach_the_solver_as_plan_does():
    """--time-limit is each scenario's whole plan (as placer plan), --layer-time-limit one
    layer's cap; unset, the solver's defaults apply."""
    params = CompareSettings(model="m", time_limit_s=7.0, layer_time_limit_s=0.25).solve_params()
    assert (params.total_time_limit_s, params.time_limit_s) == (7.0, 0.25)
    default = CompareSettings(model="m").solve_params()
    assert default.total_time_limit_s == constants.DEFAULT_PLAN_SECONDS
    assert default.time_limit_s == SolveParams().time_limit_s
    with pytest.raises(UsageError, match="time limit must be positive"):
        CompareSettings(model="m", layer_time_limit_s=-1)


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        ("model: m\ntopologies: [a]\nredundnat: [0]\n", "study.yaml:3: redundnat",
         "unknown key 'redundnat'"),
        ("model: m\ntopologies: [a]\nredundant: [0, -16]\n", "study.yaml:3: redundant[1]",
         "expected a number of redundant experts >= 0, got -16"),
        ("model: m\nscenarios:\n  - {topology: a, solvr: eplb}\n",
         "study.yaml:3: scenarios[0].solvr", "unknown key 'solvr'"),
        ("model: m\ntopologies: [a]\ndispatch: fastest\n", "study.yaml:3: dispatch",
         "unknown dispatch 'fastest'"),
        ("model: m\n", "study.yaml:1", "the scenario file names no scenario"),
        ("model: m\ntopologies: a\n", "study.yaml:2: topologies",
         "topologies must be a list, got a string"),
    ],
)
def test_scenario_file_errors_name_line_and_yaml_path(text, where, message):
    with pytest.raises(UsageError) as info:
        study_from_yaml(text, "study.yaml")
    assert (info.value.where, info.value.message) == (where, message)


def test_scenario_file_unknown_key_hint_suggests_the_right_one():
    with pytest.raises(UsageError) as info:
        study_from_yaml("model: m\ntopologies: [a]\nredundnat: [0]\n", "study.yaml")
    assert info.value.hint.startswith("did you mean 'redundant'?")


def test_missing_scenario_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError) as info:
        read_study(tmp_path / "none.yaml")
    assert info.value.message == "scenario file not found"


def test_outcome_row_as_dict_has_every_field():
    row = _row(kv_left_gb=1.5)
    assert list(row.as_dict()) == [f.name for f in dataclasses.fields(CompareRow)]
    assert ScenarioOutcome(row).evaluation is None
    assert np.isclose(row.as_dict()["kv_left_gb"], 1.5)


# -- verdicts against the baseline, and the workload ------------------------------------------


def _cell(row: CompareRow, header: str) -> str:
    return table_cells(row)[[c.header for c in TABLE_COLUMNS].index(header)]


def test_rows_carry_a_verdict_against_the_first_scenario_of_their_topology(four_rows):
    rows = [o.row for o in four_rows]
    assert [r.verdict for r in rows[:3]] == ["baseline", None, "baseline"]  # 1: did not fit
    assert [r.outcome for r in rows[:3]] == ["baseline", None, "baseline"]
    assert [r.versus_baseline for r in rows[:3]] == [None, None, None]
    base, row = rows[2], rows[3]
    change = row.step_p99_us / base.step_p99_us - 1
    assert row.versus_baseline == pytest.approx(change)
    assert row.versus_baseline_mean == pytest.approx(row.step_mean_us / base.step_mean_us - 1)
    assert row.baseline == "2x-dgx-h100 R=0 eplb"
    word = "faster" if change < 0 else "slower"
    assert row.outcome == word
    assert row.verdict == (f"verdict: 2x-dgx-h100 R=16 eplb is {abs(change):.1%} {word} than"
                           f" 2x-dgx-h100 R=0 eplb on held-out step p99")
    assert _cell(base, "step p99 µs") == format(base.step_p99_us, ".1f")
    assert [_cell(base, h) for h in ("Δ p99", "Δ mean", "verdict")] == ["base"] * 3
    assert _cell(row, "Δ p99") == format(change, "+.1%")
    assert _cell(row, "verdict") == word
    assert format_table(rows).splitlines()[7] == BASELINE_RULE


def test_verdicts_by_hand():
    rows = compare_mod.with_verdicts([
        _row(scenario="a", status="error: x"), _row(scenario="b", step_p99_us=200.0),
        _row(scenario="c", step_p99_us=190.0), _row(scenario="d", step_p99_us=200.1),
        _row(scenario="e"), _row(scenario="f", topology="u", step_p99_us=300.0),
        _row(scenario="g", topology="u", step_p99_us=330.0)], on="step p99")
    assert [r.verdict for r in rows] == [
        None, "baseline", "verdict: c is 5.0% faster than b on step p99",
        "verdict: d and b are equal (within 0.1%) on step p99", None, "baseline",
        "verdict: g is 10.0% slower than f on step p99"]
    assert [_cell(r, "Δ p99") for r in rows] == [
        "-", "base", "-5.0%", "=", "-", "base", "+10.0%"]
    assert [r.outcome for r in rows] == [
        None, "baseline", "faster", "equal", None, "baseline", "slower"]
    assert [r.baseline for r in rows] == [None, None, "b", "b", None, None, "f"]


def test_workload_sets_policy_mode_batch_and_the_solvers_workload(bundled, monkeypatch):
    settings = CompareSettings(model="gpt-oss-20b", kv_reserve_gb=71.0, engine="sglang",
                               tokens_per_gpu=32)
    assert settings.regime == Regime("sglang", "decode", 32)
    params = settings.eval_params(16, (24, 32))
    assert (params.policy, params.mode, params.batch_tokens, params.windows) == (
        "sglang", "low_latency", 512, (24, 32))
    assert CompareSettings(model="m").regime == Regime()  # as plan and evaluate default
    seen = []
    real = compare_mod.solve

    def spy(problem, solver, params):
        seen.append(params.regime)
        return real(problem, solver, params)

    monkeypatch.setattr(compare_mod, "solve", spy)
    (outcome,) = compare(bundled, (Scenario("dgx-h100", 0, "eplb"),), settings)
    assert seen == [Regime("sglang", "decode", 32)]
    assert outcome.evaluation.params.policy == "sglang"
    assert outcome.evaluation.params.batch_tokens == 32 * 8
    override = CompareSettings(model="m", workload="prefill", mode="low_latency").regime
    assert (override.dispatch, override.all_to_all, override.tokens) == (
        "vllm_hash", "low_latency", 4096)  # --mode overrides the workload's kernels
    with pytest.raises(UsageError, match="unknown engine 'deepspeed'"):
        CompareSettings(model="m", engine="deepspeed")


def test_scenario_file_takes_the_workload():
    study = study_from_yaml("model: m\ntopologies: [a]\nengine: sglang\nworkload: prefill\n"
                            "tokens_per_gpu: 1024\n", "study.yaml")
    assert (study.settings.engine, study.settings.workload, study.settings.tokens_per_gpu) == (
        "sglang", "prefill", 1024)
    with pytest.raises(UsageError) as info:
        study_from_yaml("model: m\ntopologies: [a]\nengine: deepspeed\n", "study.yaml")
    assert info.value.where == "study.yaml:3: engine"


def test_rows_carry_the_step_figures_and_the_throughput_per_gpu(four_rows):
    for outcome in four_rows:
        row = outcome.row
        if not row.ok:
            assert (row.step_mean_us, row.tokens_per_s_per_gpu) == (None, None)
            continue
        metrics = outcome.evaluation.metrics
        assert (row.step_p50_us, row.step_mean_us) == (
            pytest.approx(metrics["step_p50_us"]), pytest.approx(metrics["step_mean_us"]))
        assert row.step_p50_us <= row.step_p99_us
        assert row.tokens_per_step == metrics["num_tokens"] / metrics["num_batches"]
        assert row.tokens_per_s_per_gpu == pytest.approx(
            row.tokens_per_step * 1e6 / row.step_mean_us / row.num_gpus)
