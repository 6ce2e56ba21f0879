"""placer.compare: per-topology redundancy sweeps, baselines, throughput and the recommendation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placer.compare import (
    CompareRow,
    CompareSettings,
    Grid,
    Scenario,
    Study,
    Sweep,
    baselines,
    parse_counts,
    parse_sweep,
    recommend,
    resolve_study,
    study_from_yaml,
    sweep_scenarios,
    topology_sweep,
    with_verdicts,
)
from placer.compare import throughput as row_throughput
from placer.errors import UsageError
from placer.model import load_model

# -- parsing ------------------------------------------------------------------------------------


def test_counts_are_lists_and_inclusive_ranges_in_order():
    assert parse_counts("0,16,32", "--redundant", "0,16") == (0, 16, 32)
    assert parse_counts("8..12", "--slots-per-gpu", "8..12") == (8, 9, 10, 11, 12)
    assert parse_counts(" 8..9, 12 ,4", "--slots-per-gpu", "8..12") == (8, 9, 12, 4)
    assert parse_counts("7..7", "--slots-per-gpu", "8..12") == (7,)


@pytest.mark.parametrize(
    ("text", "message", "hint"),
    [
        ("0,x", "expected integers or ranges A..B separated by commas, got '0,x'",
         "for example --slots-per-gpu 8..12"),
        ("8..", "expected integers or ranges A..B separated by commas, got '8..'",
         "for example --slots-per-gpu 8..12"),
        ("12..8", "range 12..8 is reversed", "write it 8..12"),
        ("-1..4", "expected numbers >= 0, got -1",
         "give counts >= 0 (the nearest valid one is 0), for example --slots-per-gpu 8..12"),
        ("0..5000", "range 0..5000 stands for 5001 values",
         "at most 1024; list a few values instead"),
    ],
)
def test_bad_counts_name_the_option_and_say_how_to_fix(text, message, hint):
    with pytest.raises(UsageError) as info:
        parse_counts(text, "--slots-per-gpu", "8..12")
    assert (info.value.where, info.value.message, info.value.hint) == (
        "--slots-per-gpu", message, hint)


def test_sweep_from_the_two_options():
    assert parse_sweep(None, None) == Sweep()
    assert parse_sweep("auto", None) == Sweep("auto")
    assert parse_sweep(" AUTO ", None) == Sweep("auto")
    assert parse_sweep("0,16..17", None) == Sweep("redundant", (0, 16, 17))
    assert parse_sweep(None, "9,10") == Sweep("slots", (9, 10))
    with pytest.raises(UsageError) as info:
        parse_sweep("0", "8")
    assert info.value.message == "--redundant and --slots-per-gpu exclude each other"
    with pytest.raises(UsageError, match="takes no values"):
        Sweep("auto", (1,))
    with pytest.raises(UsageError, match="no value to compare"):
        Sweep("slots")
    with pytest.raises(UsageError, match="unknown kind of sweep 'all'"):
        Sweep("all")


# -- one topology ---------------------------------------------------------------------------


def test_redundant_values_that_do_not_split_evenly_are_skipped_with_one_note():
    """128 experts over 72 GPUs: only R = 16 (2 slots) of 0, 16, 32, 64 splits evenly."""
    got = topology_sweep(Sweep("redundant", (0, 16, 32, 64, 16)), "gb200-nvl72", 128, 72)
    assert got.redundant == (16,)
    assert got.note == (
        "gb200-nvl72: skipped --redundant 0, 32, 64 (128 experts + R do not split evenly over"
        " 72 GPUs: engines need equal slots per GPU; valid near them: 16, 88)")
    assert topology_sweep(Sweep("redundant", (0, 16, 32, 64)), "x", 128, 16).redundant == (
        0, 16, 32, 64)
    assert topology_sweep(Sweep("redundant", (0, 16, 32, 64)), "x", 128, 16).note is None
    none_left = topology_sweep(Sweep("redundant", (0,)), "gb200-nvl72", 128, 72)
    assert none_left.redundant == ()
    assert none_left.note.startswith("gb200-nvl72: skipped --redundant 0 (")
    assert none_left.note.endswith(" (every value)")
    too_many = topology_sweep(Sweep("redundant", (0, 8, 16)), "one", 4, 2)
    assert too_many.redundant == (0,)
    assert too_many.note == ("one: skipped --redundant 8, 16 (above 4: a GPU would hold two"
                             " replicas of one expert)")


def test_slots_per_gpu_give_r_per_topology_and_skip_impossible_counts():
    """R = S x G - E; S below ceil(E / G) would make R negative, S above E two replicas."""
    got = topology_sweep(Sweep("slots", (1, 2, 8, 9, 200)), "2x8", 128, 16)
    assert got.redundant == (0, 16)
    assert got.note == (
        "2x8: skipped --slots-per-gpu 1, 2 (below 8: 16 GPUs x 7 slots cannot hold the 128"
        " experts, R would be negative); 200 (more slots than the 128 experts: a GPU would hold"
        " two replicas of one expert)")
    wide = topology_sweep(Sweep("slots", (8, 9, 10)), "nvl72", 128, 72)
    assert wide.redundant == (8 * 72 - 128, 9 * 72 - 128, 10 * 72 - 128)
    assert wide.note is None


def test_fewest_is_zero_when_the_gpus_divide_the_experts_else_the_least_that_splits():
    assert topology_sweep(Sweep(), "x", 128, 16) == topology_sweep(Sweep(), "x", 128, 8)
    assert topology_sweep(Sweep(), "x", 128, 16).redundant == (0,)
    assert topology_sweep(Sweep(), "x", 128, 72).redundant == (16,)
    assert topology_sweep(Sweep(), "x", 256, 72).redundant == (32,)


def test_auto_tries_plans_slot_counts_up_to_the_memory_bound():
    from placer.planning.redundancy import slot_candidates

    got = topology_sweep(Sweep("auto"), "2x8", 128, 16, max_slots=12)
    assert got.redundant == tuple(s * 16 - 128 for s in slot_candidates(128, 16, 12))
    assert got.redundant == (0, 16, 32, 64)
    assert got.note == ("2x8: --redundant auto tries R = 0, 16, 32, 64 (8, 9, 10, 12 slots per"
                        " GPU; memory holds 12)")
    roomy = topology_sweep(Sweep("auto"), "b200", 32, 8, max_slots=100)
    assert roomy.note == ("b200: --redundant auto tries R = 0, 8, 16, 32, 64, 128 (4, 5, 6, 8, 12,"
                          " 20 slots per GPU; memory holds 100, a GPU at most the 32 experts)")
    tight = topology_sweep(Sweep("auto"), "h100", 256, 8, max_slots=None)
    assert tight.redundant == (0,)
    assert tight.note == ("h100: --redundant auto: even 32 slots per GPU (R = 0) do not fit in"
                          " memory; its row says why")


# -- the whole grid ---------------------------------------------------------------------------


def test_sweep_scenarios_are_topology_major_with_notes_for_skips():
    model = load_model("gpt-oss-20b")  # 32 experts
    scenarios, notes = sweep_scenarios(["dgx-h100", "gb200-nvl72"],
                                       Sweep("redundant", (0, 8, 40)), ["eplb", "linear"], model)
    assert [(s.topology, s.redundant, s.solver) for s in scenarios] == [
        ("dgx-h100", 0, "eplb"), ("dgx-h100", 0, "linear"), ("dgx-h100", 8, "eplb"),
        ("dgx-h100", 8, "linear"), ("dgx-h100", 40, "eplb"), ("dgx-h100", 40, "linear"),
        ("gb200-nvl72", 40, "eplb"), ("gb200-nvl72", 40, "linear")]
    assert notes == ("gb200-nvl72: skipped --redundant 0, 8 (32 experts + R do not split evenly"
                     " over 72 GPUs: engines need equal slots per GPU; valid near them: 40)",)


def test_auto_sweep_reads_the_memory_of_each_topology():
    from placer.model.capacity import plan_capacity
    from placer.planning.redundancy import slot_candidates
    from placer.topology import load_topology

    model = load_model("gpt-oss-20b")
    scenarios, notes = sweep_scenarios(["dgx-h100"], Sweep("auto"), ["eplb"], model,
                                       kv_reserve_gb=70.0)
    bound = plan_capacity(model, load_topology("dgx-h100"), kv_reserve_gb=70.0).slots_per_gpu
    assert 4 < bound < 32  # the reserve leaves room for a few replicas, not every expert
    assert [s.redundant for s in scenarios] == [
        s * 8 - 32 for s in slot_candidates(32, 8, bound)]
    assert notes[0].endswith(f"memory holds {bound})")


def test_resolve_study_puts_the_grid_first_and_stops_when_nothing_is_left():
    listed = (Scenario("dgx-h100", 8, "eplb", name="mine"),)
    study = Study(listed, CompareSettings(model="gpt-oss-20b"),
                  grid=Grid(("dgx-h100",), Sweep("slots", (4, 5)), ("eplb",)))
    resolved = resolve_study(study)
    assert [s.label for s in resolved.scenarios] == [
        "dgx-h100 R=0 eplb", "dgx-h100 R=8 eplb", "mine"]
    assert resolve_study(resolved) is resolved
    empty = Study((), CompareSettings(model="gpt-oss-20b"),
                  grid=Grid(("gb200-nvl72",), Sweep("redundant", (0,)), ("eplb",)))
    with pytest.raises(UsageError) as info:
        resolve_study(empty)
    assert info.value.where == "--redundant"
    assert info.value.message.startswith("no scenario left to compare")
    with pytest.raises(UsageError, match="no model to plan for"):
        resolve_study(Study((), CompareSettings(model=""), grid=empty.grid))


# -- scenario files -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "sweep"),
    [
        ("slots_per_gpu: [8, 9, 10]", Sweep("slots", (8, 9, 10))),
        ("slots_per_gpu: '8..10'", Sweep("slots", (8, 9, 10))),
        ("slots_per_gpu: 9", Sweep("slots", (9,))),
        ("redundant: auto", Sweep("auto")),
        ("redundant: 0..2", Sweep("redundant", (0, 1, 2))),
        ("redundant: [0, 16]", Sweep("redundant", (0, 16))),
        ("seed: 1", Sweep()),
    ],
)
def test_scenario_file_sweeps(text, sweep):
    study = study_from_yaml(f"model: m\ntopologies: [a, b]\n{text}\n", "study.yaml")
    assert study.grid == Grid(("a", "b"), sweep, ("eplb",))
    assert study.scenarios == ()


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        ("redundant: [0]\nslots_per_gpu: [8]", "study.yaml:4: slots_per_gpu",
         "'redundant' and 'slots_per_gpu' exclude each other"),
        ("slots_per_gpu: '9..8'", "study.yaml:3: slots_per_gpu", "range 9..8 is reversed"),
        ("slots_per_gpu: [8, x]", "study.yaml:3: slots_per_gpu[1]",
         "expected a number of slots per GPU >= 0, got 'x'"),
        ("redundant: every", "study.yaml:3: redundant",
         "expected integers or ranges A..B separated by commas, got 'every'"),
        ("slots_per_gpu: {a: 1}", "study.yaml:3: slots_per_gpu",
         "expected a list of slots per GPU, got {'a': 1}"),
    ],
)
def test_scenario_file_sweep_errors_name_line_and_key(text, where, message):
    with pytest.raises(UsageError) as info:
        study_from_yaml(f"model: m\ntopologies: [a]\n{text}\n", "study.yaml")
    assert (info.value.where, info.value.message) == (where, message)


def test_scenario_file_takes_the_recommendation_settings():
    study = study_from_yaml("model: m\ntopologies: [a]\np99_target_us: 5000\np99_slack_pct: 5\n",
                            "study.yaml")
    assert (study.settings.p99_target_us, study.settings.p99_slack_pct) == (5000.0, 5.0)
    with pytest.raises(UsageError) as info:
        CompareSettings(model="m", p99_target_us=0)
    assert info.value.where == "--p99-target-us"
    with pytest.raises(UsageError) as info:
        CompareSettings(model="m", p99_slack_pct=-1)
    assert info.value.where == "--p99-slack"


# -- rows: baselines and throughput ------------------------------------------------------------


def _row(scenario: str, solver: str = "eplb", redundant: int = 0, topology: str = "t",
         **kw) -> CompareRow:
    figures = {"status": "ok", "num_gpus": 8, "step_p99_us": 100.0, "step_mean_us": 90.0,
               "tokens_per_s_per_gpu": 1000.0}
    return CompareRow(scenario=scenario, topology=topology, redundant=redundant, solver=solver,
                      **{**figures, **kw})


def test_baseline_is_eplb_at_the_same_redundancy_else_the_topologys_first_eplb_row():
    rows = [_row("cpsat R0", "cpsat", 0), _row("eplb R0", "eplb", 0),
            _row("cpsat R32", "cpsat", 32), _row("eplb R32", "eplb", 32),
            _row("linear R64", "linear", 64), _row("broken", "eplb", 64, status="error: x"),
            _row("other", "cpsat", 0, topology="u"), _row("other 2", "linear", 0, topology="u")]
    assert baselines(rows) == [1, None, 3, 1, 1, None, None, 6]
    judged = with_verdicts(rows)
    assert [r.baseline for r in judged] == [
        "eplb R0", None, "eplb R32", "eplb R0", "eplb R0", None, None, "other"]
    assert [r.outcome for r in judged] == [
        "equal", "baseline", "equal", "equal", "equal", None, "baseline", "equal"]


def test_throughput_is_tokens_per_step_over_the_mean_step_and_the_gpus():
    metrics = {"num_tokens": 2048.0, "num_batches": 2.0, "step_mean_us": 500.0}
    assert row_throughput(metrics, 8) == {"tokens_per_step": 1024.0,
                                          "tokens_per_s_per_gpu": 1024 / 500e-6 / 8}
    assert row_throughput({**metrics, "step_mean_us": float("nan")}, 8) == {
        "tokens_per_step": 1024.0, "tokens_per_s_per_gpu": None}
    assert row_throughput({}, 8) == {"tokens_per_step": None, "tokens_per_s_per_gpu": None}


# -- the recommendation --------------------------------------------------------------------------

#: Three clusters: the smallest serves the most per GPU, the largest has the lowest p99.
CLUSTERS = [
    _row("A", num_gpus=8, step_p99_us=400.0, tokens_per_s_per_gpu=300_000.0),
    _row("B", num_gpus=16, step_p99_us=380.0, tokens_per_s_per_gpu=150_000.0),
    _row("C", num_gpus=72, step_p99_us=300.0, tokens_per_s_per_gpu=90_000.0),
    _row("D", num_gpus=4, status="does not fit: too big", step_p99_us=None,
         tokens_per_s_per_gpu=None),
]


def test_without_a_target_the_lowest_p99_wins_unless_others_are_within_the_slack():
    alone = recommend(CLUSTERS)
    assert (alone.scenario, alone.candidates) == ("C", ("C",))
    assert alone.line == ("recommended: C — the lowest step p99 (300.0 µs), 90,000 tokens/s per"
                          " GPU; no other scenario within 10% of it")
    wide = recommend(CLUSTERS, p99_slack_pct=40)
    assert (wide.scenario, wide.candidates) == ("A", ("A", "B", "C"))
    assert wide.reason == ("the most tokens/s per GPU (300,000) of the 3 scenarios with step p99"
                           " within 40% of the lowest; its step p99: 400.0 µs, +33.3% over the"
                           " lowest (300.0 µs, C)")
    assert wide.rule == ("highest throughput per GPU among the scenarios with step p99 within"
                         " 40% of the lowest")


def test_with_a_target_the_fewest_gpus_that_meet_it_win():
    met = recommend(CLUSTERS, p99_target_us=390)
    assert (met.scenario, met.candidates) == ("B", ("B", "C"))
    assert met.reason == ("the fewest GPUs (16) with step p99 <= 390.0 µs: 380.0 µs, 150,000"
                          " tokens/s per GPU")
    missed = recommend(CLUSTERS, p99_target_us=100)
    assert missed.scenario is None
    assert missed.line == ("recommended: none — no scenario meets step p99 <= 100.0 µs; the"
                           " lowest is 300.0 µs, C")
    assert missed.to_dict()["p99_target_us"] == 100


def test_equal_throughputs_prefer_fewer_gpus_then_fewer_redundant_experts():
    rows = [_row("R=64", redundant=64, tokens_per_s_per_gpu=100_050.0),
            _row("R=0", redundant=0, tokens_per_s_per_gpu=100_000.0),
            _row("slow", redundant=0, tokens_per_s_per_gpu=90_000.0)]
    got = recommend(rows)
    assert got.scenario == "R=0"
    assert got.reason.endswith("; 2 scenarios within 0.1% of that throughput: the fewest GPUs,"
                               " then the fewest redundant experts")


def test_no_recommendation_without_rows_that_ran():
    assert recommend(CLUSTERS[3:]).line == (
        "recommended: none — no scenario ran to a step time; see the status column")
    assert recommend([]).scenario is None


# -- invariants -------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(experts=st.integers(1, 512), gpus=st.integers(1, 96),
       kind=st.sampled_from(["redundant", "slots"]),
       values=st.lists(st.integers(0, 1200), min_size=1, max_size=8))
def test_every_kept_value_splits_evenly_and_every_skipped_one_is_named(experts, gpus, kind,
                                                                       values):
    got = topology_sweep(Sweep(kind, tuple(values)), "t", experts, gpus)
    for r in got.redundant:
        assert r >= 0 and (experts + r) % gpus == 0 and (experts + r) // gpus <= max(
            experts, -(-experts // gpus))
    as_r = values if kind == "redundant" else [s * gpus - experts for s in values]
    skipped = [v for v, r in zip(values, as_r, strict=True) if r not in got.redundant]
    assert (got.note is None) == (not skipped)
    for v in skipped:
        assert str(v) in got.note
    assert len(set(got.redundant)) == len(got.redundant)
