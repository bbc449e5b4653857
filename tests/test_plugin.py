"""The plugin end to end: pytest over cases/ in a child process, rows read back."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.engine import pytest_root
from harness.results import table
from fault_target import fault_case

pytestmark = pytest.mark.system   # real processes: the subject of every test here

ROOT = Path(__file__).resolve().parent.parent


def write_cases(tmp_path, *specs):
    """specs: fault names or (fault, extra params); case i gets tag n<i>."""
    cases = []
    for i, spec in enumerate(specs):
        fault, extra = (spec, {}) if isinstance(spec, str) else spec
        cases.append(fault_case(fault, i, **extra))
    path = tmp_path / "cases.json"
    path.write_text(json.dumps([c.to_json() for c in cases]))
    return path, cases


def run_matrix(tmp_path, cases_file, *args, timeout=300):
    results = tmp_path / "results.jsonl"
    cmd = [sys.executable, "-m", "pytest", str(pytest_root.PATH), "-p", "no:cacheprovider", "-q",
           "--target", "faults", "--cases-file", str(cases_file), "--results", str(results), *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    rows = table.read_rows(results) if results.exists() else []
    return proc, {r["case_id"]: r for r in rows}, rows


@pytest.fixture
def without_xdist(tmp_path_factory):
    """One run without xdist over a passing case, a wrong one and one whose bad params raise
    in the harness: what test_rows_without_xdist and
    test_a_case_that_raises_in_the_harness_still_gets_a_failing_row each assert on, made
    once per session (shared_run.once). Each case's row is its own, whatever else the run
    holds, and both tests expect the run's exit 1."""
    from shared_run import once

    def make(folder):
        path, cases = write_cases(folder, "none", "wrong", ("none", {"dtype": "fp8"}))
        proc, by_id, rows = run_matrix(folder, path)
        return {"rc": proc.returncode, "out": proc.stdout[-4000:], "rows": rows,
                "ids": [c.id for c in cases]}
    run = once(tmp_path_factory, "plugin-without-xdist", make)
    by_id = {r["case_id"]: r for r in run["rows"]}
    assert run["rc"] == 1, run["out"][-2000:]
    assert len(run["rows"]) == 3 and set(by_id) == set(run["ids"]), run["out"][-2000:]
    return run["out"], by_id, run["ids"]


def test_rows_without_xdist(without_xdist):
    out, by_id, ids = without_xdist
    ok, bad = by_id[ids[0]], by_id[ids[1]]
    assert ok["pass"] and ok["outcome"] == "match" and ok["worker"] == "main"
    assert not bad["pass"] and bad["outcome"] == "wrong" and bad["n_wrong"] == bad["n_total"] == 16
    assert bad["max_abs_diff"] > 0.9 and bad["first_bad_index"] == ["o", 0, 0, 0]
    assert ok["target"] == "faults" and ok["arch"] and ok["run_id"] == bad["run_id"]
    assert "wrong (expect match)" in out


def test_xdist_reruns_never_launder_a_wrong_attempt(tmp_path):
    path, cases = write_cases(tmp_path, "none", "wrong", ("flaky", {"marker_dir": str(tmp_path)}),
                              "none")
    proc, by_id, rows = run_matrix(tmp_path, path, "-n", "2", "--reruns", "2",
                                   "--run-id", "run-x", "--disable-guards", "g1,g2")
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert len(rows) == 4 and set(by_id) == {c.id for c in cases}
    wrong, flaky = by_id[cases[1].id], by_id[cases[2].id]
    assert wrong["outcome"] == "wrong" and not wrong["pass"] and wrong["reruns"] == 2
    assert [a["outcome"] for a in wrong["attempts"]] == ["wrong"] * 3
    # Wrong once, right on the rerun: every attempt is on the row, and the row fails.
    assert flaky["outcome"] == "nondeterministic" and not flaky["pass"], flaky
    assert flaky["severity"] == "correctness" and flaky["reruns"] == 1
    assert [a["outcome"] for a in flaky["attempts"]] == ["wrong", "match"]
    assert "attempt 1 wrong" in flaky["message"] and "attempt 2 match" in flaky["message"]
    assert by_id[cases[0].id]["reruns"] == 0 and by_id[cases[0].id]["pass"]
    assert {r["run_id"] for r in rows} == {"run-x"}
    assert all(r["worker"].startswith("gw") for r in rows)
    # --disable-guards reached the workers' environment before they started
    assert {r["disable_guards"] for r in rows} == {"g1,g2"}


def test_case_id_filter_and_exit_zero(tmp_path):
    path, cases = write_cases(tmp_path, "none", "wrong", "none")
    proc, by_id, rows = run_matrix(tmp_path, path, "-n", "1", "--case-id", "none")
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert set(by_id) == {cases[0].id, cases[2].id}


def test_a_case_that_raises_in_the_harness_still_gets_a_failing_row(without_xdist):
    # Bad params raise in build_problem before the case has a row; without a row
    # of its own the table (and every report made from it) would omit the case.
    out, by_id, ids = without_xdist     # the fixture asserts every case has its row
    bad = by_id[ids[2]]
    assert bad["outcome"] == "harness_error" and not bad["pass"] and bad["error_type"] == "call"
    assert bad["severity"] == "harness"
    assert bad["message"].startswith("harness error in the case: ValueError: ") and "dtype" in bad["message"]
    assert "(at problem.py:" in bad["message"]   # the error and where, not traceback source
    assert bad["target"] == "faults" and bad["arch"] and bad["run_id"] == by_id[ids[0]]["run_id"]


def test_repeat_compares_answers_in_one_worker(tmp_path):
    # --repeat runs the case again on fresh buffers in the same worker: the flaky
    # fault's second answer differs from its first, so the row is nondeterministic.
    path, cases = write_cases(tmp_path, "none", ("flaky", {"marker_dir": str(tmp_path)}))
    proc, by_id, rows = run_matrix(tmp_path, path, "--repeat", "2")
    assert proc.returncode == 1, proc.stdout[-2000:]
    ok, flaky = by_id[cases[0].id], by_id[cases[1].id]
    assert ok["pass"] and ok["repeat"] == 2 and [a["outcome"] for a in ok["attempts"]] == ["match"] * 2
    assert flaky["outcome"] == "nondeterministic" and not flaky["pass"], flaky
    assert flaky["reruns"] == 0 and [a["outcome"] for a in flaky["attempts"]] == ["wrong", "match"]
