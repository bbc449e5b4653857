"""Suite-wide settings for `make test` (pytest tests -n auto): how the tests share the
machine, never what they check.

One OpenMP thread per xdist worker, as `harness check` gives its own workers
(harness/engine/plugin.py: cores // workers). The host kernels and torch's CPU ops each start
a pool as wide as the machine, so on 2 cores two workers, plus the `harness` children
some tests start, oversubscribe it and spin-wait for each other: the suite ran 1.3-1.7x
slower. Set in the controller before xdist starts the workers, so they and every child
they start inherit it; a value already in the environment is kept.

The slowest tests first, handed out one at a time. Most of the suite's time is a few
dozen tests that start `harness` processes, search for a fixed budget or wait out a
timeout; under xdist's default chunks one of them could start last and run alone while
the other worker idles. The longest first and one test at a time to whichever worker is
free keeps both busy to the end. SLOW is each test's seconds on a 2-core host (from
`--durations`; the order is all that matters, an unlisted test counts 0, a renamed one
only loses its place): refresh it when a new test takes more than a few seconds.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

SLOW = {
    # The fast tier's longest: `--durations=0` of `make test` on the quiet 2-core host
    # (2026-12-03, 112 s); a parametrized test counts its slowest item.
    "test_explore.py::test_found_failures_are_saved_and_replay_the_same": 14.6,
    "test_generator_reach.py::test_new_families_pass_with_guards_on": 10.8,
    # Makes the runs the module's other tests share (tests/shared_run.py).
    "test_declared_target.py::test_each_planted_bug_is_found": 8.8,
    "test_exit_codes.py::test_pass_fail_not_tested_and_empty_are_their_codes": 7.8,
    "test_generator_reach.py::test_fault_is_caught_by_its_family_and_missed_by_normal_values": 6.9,
    "test_target_dialects.py::test_an_installed_target_catches_its_planted_defect_everywhere": 5.9,
    "test_explore.py::test_with_guards_on_a_short_search_finds_nothing": 5.0,
    "test_table_names.py::test_a_table_is_named_for_the_library_and_its_commit": 4.5,
    "test_detection_part2.py::test_all_guards_on_every_case_passes": 3.6,
    "test_explore.py::test_search_shrinks_each_class_and_keeps_looking": 3.6,
    "test_detection_part1.py::test_guard_off_heap_write_is_caught_in_its_own_process": 3.1,
    "test_report_hostile.py::test_random_rows_load_or_fail_in_one_line_and_always_render": 2.9,
    "test_sanitizer.py::test_failing_rows_get_the_report_every_row_is_kept_and_reports_show_it": 2.9,
    "test_features_detection.py::test_a_check_child_with_the_fault_in_its_environment_fails_only_that_feature": 2.7,
    "test_standalone_hostile.py::test_hostile_fields_reach_a_script_only_as_data": 2.6,
    "test_exit_codes.py::test_an_output_that_cannot_be_written_is_one_line_with_the_rows_kept": 2.4,
    "test_features_detection.py::test_the_faultless_test_only_library_passes_every_case_the_faults_run": 2.3,
    "test_table_names.py::test_without_a_repository_the_commit_is_unknown_and_said_once": 2.3,
    "test_cli.py::test_repro_in_a_child_keeps_the_usage_exit_codes": 2.3,
    "test_sanitizer.py::test_sanitizer_all_replays_passing_rows_without_changing_the_exit_status": 2.2,
    "test_explore.py::test_fork_runner_hang_and_budget_cut": 2.1,
    "test_features_detection.py::test_fault_fails_its_feature_and_passes_every_case_without_it": 2.0,
    "test_detection_part1.py::test_guard_off_crash_is_isolated": 1.9,
    "test_target_sdpa.py::test_valid_family_passes_on_every_route": 1.8,
    "test_reach_faults.py::test_the_fault_fails_the_new_cases_and_passes_the_old_near_ones": 1.8,
    "test_standalone.py::test_every_bundled_case_gets_a_script": 1.6,
    "test_detection_part1.py::test_all_guards_on_every_case_passes": 1.6,
    "test_reach_faults.py::test_the_new_cases_pass_on_the_faultless_test_only_library": 1.5,
    "test_standalone.py::test_repro_standalone_writes_the_script_and_keeps_the_exit_code": 1.4,
    "test_cli.py::test_repro_prints_the_crash_row_of_a_case_that_kills_its_process": 1.3,
    "test_reports.py::test_markdown_stays_under_limit_with_20000_rows": 1.2,
    "test_target_dialects.py::test_check_target_names_what_the_adapter_does_wrong": 1.2,
    "test_budget.py::test_a_huge_page_is_estimated_above_its_real_need": 1.1,
    # The system tier's.
    "test_faults_runs.py::test_a_second_run_on_a_held_table_exits_2_naming_it_and_the_holder": 37,
    "test_exit_codes.py::test_a_full_disk_under_xdist_stops_with_no_pass": 26,
    "test_table_names.py::test_a_plain_pytest_run_names_its_table_for_the_library_too": 15,
    "test_faults_runs.py::test_a_stopped_worker_is_ended_by_the_watchdog_and_its_case_is_a_hang_row": 25,
    "test_faults_runs.py::test_kill_9_of_the_parent_leaves_no_process_and_resume_has_no_duplicates": 20,
    "test_faults_runs.py::test_a_torn_last_line_is_unwritten_and_the_resume_reruns_its_case": 15,
    "test_faults_runs.py::test_a_full_disk_stops_the_run_with_one_line_and_whole_rows": 10,
    "test_target_dialects.py::test_a_target_from_a_file_runs_under_check_and_explore": 30,
    "test_isolation.py::test_every_failure_kind_is_exactly_one_row": 18,
    "test_kernels_build.py::test_gpu_compile_only_amd": 12,
    "test_isolation.py::test_interrupted_run_keeps_rows_and_resumes": 10,
    "test_plugin.py::test_xdist_reruns_never_launder_a_wrong_attempt": 5.5,
    "test_cli.py::test_ctrl_c_during_check_is_one_line_with_the_resume_command": 5.5,
    "test_readme_commands.py::test_readme_command_runs_as_written": 5.5,
    "test_isolation.py::test_victim_fails_only_after_earlier_cases": 5,
    "test_isolation.py::test_sticky_device_error_retires_the_worker": 4.5,
    "test_detection_part1.py::test_guard_off_heap_write_is_caught_in_its_own_process": 4,
    "test_sanitizer.py::test_failing_rows_get_the_report_every_row_is_kept_and_reports_show_it": 4,
    # Makes the run test_check_prints_progress_and_no_pytest_failures_section shares (unlisted:
    # it runs later and reads the run back; tests/shared_run.py).
    "test_cli.py::test_check_summarizes_and_exits_by_rows": 4,
    "test_isolation.py::test_culprit_fails_alone": 3.5,
    "test_bisect.py::test_bisect_finds_commit_that_disables_a_guard": 3.5,
    "test_kernels_build.py::test_gpu_compile_only_nvidia": 3.5,
    "test_plugin.py::test_case_id_filter_and_exit_zero": 3.5,
    "test_cli.py::test_repro_in_a_child_keeps_the_usage_exit_codes": 3,
    "test_cli.py::test_repro_prints_the_crash_row_of_a_case_that_kills_its_process": 2.5,
    # Makes the run test_a_case_that_raises_in_the_harness_still_gets_a_failing_row shares.
    "test_plugin.py::test_rows_without_xdist": 2.5,
    "test_cli.py::test_check_with_the_flaky_fault_fails_as_nondeterministic": 2.5,
    "test_plugin.py::test_repeat_compares_answers_in_one_worker": 2.5,
}


# pytest keeps each test module's assertion-rewritten bytecode in tests/__pycache__ unless
# bytecode writing is off (PYTHONDONTWRITEBYTECODE): then every xdist worker rewrites and
# compiles all of them again at each collection, about 4.5 CPU-seconds a worker. Set before
# any test module is imported; the variable itself is left as it is for every child a test
# starts.
sys.dont_write_bytecode = False

# The test-only `faults` target (tests/fault_target.py) is registered here, not in the
# project's registry: every process a test starts inherits the name through the environment.
FAULT_TARGET = str(Path(__file__).resolve().parent / "fault_target.py")
os.environ["HARNESS_TARGETS"] = ",".join(
    filter(None, [os.environ.get("HARNESS_TARGETS", ""), f"faults={FAULT_TARGET}"]))


@pytest.fixture
def forked_children(monkeypatch):
    """child.run (repro, shrink, check-target's cases) forks from a warm fork server instead
    of starting an interpreter per run (tests/warm_children.py says where it still spawns)."""
    from harness.engine import child
    from warm_children import forking
    monkeypatch.setattr(child, "run", forking(child.run))


def pytest_configure(config):
    workers = getattr(config.option, "numprocesses", None)
    if not (isinstance(workers, int) and workers > 0):
        return
    if "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
    if getattr(config.option, "dist", None) == "load" and config.option.maxschedchunk is None:
        config.option.maxschedchunk = 1


def _seconds(item) -> float:
    name = item.nodeid.rsplit("/", 1)[-1].split("[", 1)[0]
    return SLOW.get(name, 0)


def pytest_collection_modifyitems(config, items):
    # Under xdist only (its workers collect; a run in one process keeps pytest's order).
    # Stable: the rest keep pytest's order, and every worker sorts the same collection
    # the same way, as xdist requires.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=_seconds, reverse=True)
