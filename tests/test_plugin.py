"""The plugin end to end: pytest over cases/ in a child process, rows read back."""
import json
import subprocess
import sys
from pathlib import Path

from harness import table
from harness.targets.faults import fault_case

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
    cmd = [sys.executable, "-m", "pytest", str(ROOT / "cases"), "-p", "no:cacheprovider", "-q",
           "--target", "faults", "--cases-file", str(cases_file), "--results", str(results), *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    rows = table.read_rows(results) if results.exists() else []
    return proc, {r["case_id"]: r for r in rows}, rows


def test_rows_without_xdist(tmp_path):
    path, cases = write_cases(tmp_path, "none", "wrong")
    proc, by_id, rows = run_matrix(tmp_path, path)
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert len(rows) == 2
    ok, bad = by_id[cases[0].id], by_id[cases[1].id]
    assert ok["pass"] and ok["outcome"] == "match" and ok["worker"] == "main"
    assert not bad["pass"] and bad["outcome"] == "wrong" and bad["n_wrong"] == bad["n_total"] == 16
    assert bad["max_abs_diff"] > 0.9 and bad["first_bad_index"] == ["o", 0, 0, 0]
    assert ok["target"] == "faults" and ok["arch"] and ok["run_id"] == bad["run_id"]
    assert "wrong (expect match)" in proc.stdout


def test_xdist_reruns_flaky_and_deterministic_wrong(tmp_path):
    path, cases = write_cases(tmp_path, "none", "wrong", ("flaky", {"marker_dir": str(tmp_path)}),
                              "none")
    proc, by_id, rows = run_matrix(tmp_path, path, "-n", "2", "--reruns", "2",
                                   "--run-id", "run-x", "--disable-guards", "g1,g2")
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert len(rows) == 4 and set(by_id) == {c.id for c in cases}
    wrong, flaky = by_id[cases[1].id], by_id[cases[2].id]
    assert wrong["outcome"] == "wrong" and not wrong["pass"]
    assert wrong["reruns"] == 2 and not wrong["flaky"]
    assert flaky["pass"] and flaky["flaky"] and flaky["reruns"] == 1
    assert by_id[cases[0].id]["reruns"] == 0 and not by_id[cases[0].id]["flaky"]
    assert {r["run_id"] for r in rows} == {"run-x"}
    assert all(r["worker"].startswith("gw") for r in rows)
    # --disable-guards reached the workers' environment before they started
    assert {r["disable_guards"] for r in rows} == {"g1,g2"}


def test_case_id_filter_and_exit_zero(tmp_path):
    path, cases = write_cases(tmp_path, "none", "wrong", "none")
    proc, by_id, rows = run_matrix(tmp_path, path, "-n", "1", "--case-id", "none")
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert set(by_id) == {cases[0].id, cases[2].id}


def test_a_case_that_raises_in_the_harness_still_gets_a_failing_row(tmp_path):
    # Bad params raise in build_problem before the case has a row; without a row
    # of its own the table (and every report made from it) would omit the case.
    path, cases = write_cases(tmp_path, "none", ("none", {"dtype": "fp8"}))
    proc, by_id, rows = run_matrix(tmp_path, path)
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert set(by_id) == {c.id for c in cases}
    bad = by_id[cases[1].id]
    assert bad["outcome"] == "crash" and not bad["pass"] and bad["error_type"] == "call"
    assert "harness error in the case" in bad["message"] and "dtype" in bad["message"]
    assert bad["target"] == "faults" and bad["arch"] and bad["run_id"] == by_id[cases[0].id]["run_id"]
