"""Shared pytest configuration.

Fixtures live in the test module that uses them, each with a docstring saying
what it is; only what several modules need belongs here.

The suite has two tiers: ``make test`` runs every test not marked ``slow`` over every
core (``-n auto``), ``make test-slow`` the rest, and CI (``.ci/run``) both.  A test is
slow when it takes more than about a second on a quiet core: a whole-model plan or
evaluation, a real subprocess or a Ray instance, a thousand-example property.  Such a
test is marked where it is written (``@pytest.mark.slow``) or listed in :data:`SLOW`,
which keeps the tier of tests that other modules own in one place, with the reason.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

# Tests must read the same output a user sees without colour codes.
os.environ.setdefault("NO_COLOR", "1")
os.environ.setdefault("COLUMNS", "160")

#: Tests left to the slow tier: a node id, or the start of one (every parameter of a
#: test, every test of a module), and why.
SLOW = {
    "tests/test_ray.py": "starts a Ray instance",
    "tests/cli/test_interrupt.py": "signals a real `placer plan` process mid-solve",
    "tests/cli/test_one_set_of_figures.py": "plans, evaluates, compares and reports the same"
    " placement four times per case",
    "tests/evaluate/test_bounds_invariant.py::test_plan_summary_brackets_are_possible[qwen3":
    "Qwen3 plans with the round_robin summary's brackets",
    "tests/evaluate/test_bounds_invariant.py::test_bounds_bracket_the_exact_figure":
    "a property over many routings",
    "tests/evaluate/test_bounds_invariant.py::test_bounds_are_ordered_for_any_counts":
    "a property over many counts",
    "tests/report/test_report_settings.py::test_placer_report_states_settings_command_and":
    "plans and reports Qwen3",
    "tests/report/test_report_settings.py::test_compare_report_opens_with_verdicts":
    "a compare report with pictures",
    "tests/traces/test_traces_real_logs.py::test_warm_up_exclusion_equals_brute_force":
    "a brute-force oracle over every chunking",
    "tests/calibrate/test_calibrate.py::test_shipped_deepep_csv": "a fit of DeepEP's tables",
    "tests/calibrate/test_calibrate.py::test_noisy_rows_report_standard_errors": "a fit",
    "tests/calibrate/test_calibrate.py::test_round_trip_finds_known_efficiencies": "fits",
    "tests/cli/test_cli_compare.py::test_qwen3_on_mi300x_vs_nvl72": "a redundancy search"
    " on two clusters",
    "tests/cli/test_cli_compare.py::test_scenario_file_runs_and_report_is_self_contained":
    "a study and its report",
    "tests/cli/test_cli_compare.py::test_installed_command": "a real subprocess",
    "tests/report/test_report.py::test_placer_report_writes_every_section": "a full report",
    "tests/report/test_report.py::test_gpu_load_bars_different_gpu_counts": "pictures",
    "tests/test_user_stories.py::test_qwen3_on_mi300x_vs_gb200_nvl72": "a redundancy search",
    "tests/test_user_stories.py::test_deepseek_v3_on_four_dgx_h100": "DeepSeek-V3 plans",
    "tests/test_user_stories.py::test_replan_from_an_imported_sglang_file": "re-plans",
    "tests/report/test_plots_readable.py": "renders and measures every picture's text",
    "tests/cli/test_cli_comforts.py::test_report_json_and_quiet": "a report",
    "tests/cli/test_cli_comforts.py::test_completion_completes": "real subprocesses",
    "tests/cli/test_cli_plan.py::test_plan_is_deterministic": "plans twice",
    "tests/cli/test_cli_plan.py::test_installed_placer_plans": "a real subprocess",
    "tests/cli/test_cpsat_cli.py::test_installed_placer_plans_with_cpsat": "a real subprocess",
    "tests/cli/test_cpsat_cli.py::test_replan_budget_frontier_and_progress": "re-plans",
    "tests/cli/test_cli_stats.py::test_installed_command": "a real subprocess",
    "tests/cli/test_cli_evaluate.py::test_installed_command": "a real subprocess",
    "tests/cli/test_engines_cli.py::test_installed_command": "a real subprocess",
    "tests/engines/test_trtllm_mtp.py::test_evaluate_times_the_mtp_layer": "DeepSeek-V3 plans",
    "tests/engines/test_trtllm_mtp.py::test_slot_statistics_map_back": "DeepSeek-V3 reads",
    "tests/engines/test_trtllm_mtp.py::test_round_trip_keeps_the_mtp_row": "DeepSeek-V3 files",
    "tests/engines/test_trtllm_mtp.py::test_key_61_for_a_model_without_mtp": "DeepSeek-V3",
    "tests/engines/test_trtllm_mtp.py::test_import_reads_the_mtp_key": "DeepSeek-V3 files",
    "tests/engines/test_trtllm_mtp.py::test_plan_export_writes": "DeepSeek-V3 plans",
    "tests/planning/test_eplb.py::test_equals_the_loop_on_random_inputs": "a property",
    "tests/planning/test_cpsat.py::test_traffic_first_buys_co_location": "two CP-SAT passes",
    "tests/planning/test_cpsat.py::test_invariants_under_every_robust_setting": "a property",
    "tests/planning/test_cpsat_latency.py": "plans judged by the evaluator",
    "tests/evaluate/test_evaluate_bound.py::test_no_placement_beats_the_floor": "a search",
    "tests/placement/test_migration.py::test_frontier_is_the_exact_knapsack": "a property",
    "tests/placement/test_migration.py::test_replan_respects_the_move_budget_exactly":
    "four re-plans",
    "tests/planning/test_cpsat.py::test_invariants_on_random_problems": "a property",
    "tests/planning/test_plan_phases.py::test_placer_plan_prints_the_steps_after_the_last":
    "a judged plan",
    "tests/io/test_faults_io.py::test_a_report_on_a_disk_that_fills": "a report",
    "tests/test_parallel_faults.py::test_a_plan_on_local_workers_ends_with_its_workers":
    "signals real worker processes",
    "tests/traces/test_traces_real_logs.py::test_occurrences_equal_a_plain_model": "an oracle",
    "tests/test_bench_latency.py": "the benchmark's own runs",
    "tests/traces/test_reader_fuzz.py": "fuzzing",
}

#: Modules whose tests share one costly module-scoped fixture: they run on one xdist
#: worker, so it is built once, not once per worker.
ONE_WORKER = ("tests/test_hostile_inputs.py",)
#: Tests whose parameters are console examples (ids ``PAGE:...``, ``readme_fixtures.
#: example_params``) that run in order in one working directory per page or command.
EXAMPLE_TESTS = ("tests/test_readme_commands.py::test_readme_command_runs_as_written",
                 "tests/test_docs_commands.py::test_docs_command_runs_as_written",
                 "tests/cli/test_help_examples.py::test_help_example_runs_as_written")


def xdist_group(nodeid: str) -> str | None:
    """The tests that must share an xdist worker with this one: its module's
    (:data:`ONE_WORKER`), or its page's (:data:`EXAMPLE_TESTS`); None for any worker."""
    module, _, rest = nodeid.partition("::")
    if module in ONE_WORKER:
        return module
    function, bracket, param = rest.partition("[")
    if bracket and f"{module}::{function}" in EXAMPLE_TESTS:
        return f"{module}::{function}[{param.split(':', 1)[0]}"
    return None


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` (the default: ``addopts``) with the groups of :func:`xdist_group`.

    xdist's own loadgroup reads ``xdist_group`` marks by renaming node ids, which pytest 9
    no longer allows (every test is then sent anywhere); this reads the groups off the
    node ids instead.  Largest groups first, then single tests as workers free up."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class Grouped(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid) or super()._split_scope(nodeid)

    return Grouped(config, log)


#: The keys of :data:`SLOW` that named a collected test (``tests/test_tiers.py`` checks
#: that every key still does).
SLOW_USED = pytest.StashKey[set[str]]()


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    used: set[str] = set()
    for item in items:
        keys = [key for key in SLOW if item.nodeid.startswith(key)]
        if keys:
            item.add_marker(pytest.mark.slow)
            used.update(keys)
    config.stash[SLOW_USED] = used
