"""`harness check` exits as docs/ci.md's table says, and every bad input is one line
before the first case.

Each code of the table is made to happen here. The runs go through cli.main in this process
(the check's pytest child is still a real process); a process of the test's own is paid for
only where a process is the subject (a killed pytest child).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import cli
from harness.results import table
from fault_target import fault_case

ROOT = Path(__file__).resolve().parents[1]


def doc_codes() -> dict[int, str]:
    text = (ROOT / "docs" / "ci.md").read_text()
    section = text[text.index("## Exit codes"):text.index("Which rows gate:")]
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^\| (\d+) \| (.+) \|$", section,
                                                            re.M)}


def check(capfd, *argv):
    capfd.readouterr()
    rc = cli.main(["check", "--target", "faults", "-n", "0", *argv])
    out, err = capfd.readouterr()
    return rc, out, err


def one_line(err: str) -> str:
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "INTERNALERROR" not in err, err
    return lines[0]


def test_the_table_has_the_codes_check_returns():
    assert sorted(doc_codes()) == [0, 1, 2, 3, 4]
    assert "NOT TESTED" in doc_codes()[3] and "empty" in doc_codes()[4]


def test_pass_fail_not_tested_and_empty_are_their_codes(tmp_path, capfd, monkeypatch):
    rc, out, _ = check(capfd, "--case-id", "none", "--results", str(tmp_path / "a.jsonl"))
    assert rc == 0 and "PASS" in out
    rc, out, _ = check(capfd, "--case-id", "wrong", "--results", str(tmp_path / "b.jsonl"))
    assert rc == 1 and "FAIL" in out
    # A selection that fails, with a ceiling every case is over: every case skipped, so
    # nothing was tested; never PASS, never 0. The ceiling is in the header and the JSON.
    monkeypatch.setenv("HARNESS_MAX_CASE_BYTES", "1")
    summary_json = tmp_path / "s.json"
    rc, out, err = check(capfd, "--case-id", "wrong", "--results", str(tmp_path / "c.jsonl"),
                         "--summary-json", str(summary_json))
    assert rc == 3, out + err
    assert "PASS" not in out and out.strip().startswith("NOT TESTED: all 1 cases were skipped")
    assert "limits: max case bytes 1 (HARNESS_MAX_CASE_BYTES)" in err
    doc = json.loads(summary_json.read_text())
    assert doc["verdict"] == "fail" and doc["exit_code"] == 3
    assert doc["verdict_line"].startswith("NOT TESTED")
    assert doc["limits"] == {"max_case_bytes": {"value": 1, "from": "HARNESS_MAX_CASE_BYTES"}}
    monkeypatch.delenv("HARNESS_MAX_CASE_BYTES")
    rc, _, err = check(capfd, "--case-id", "zzz")
    assert rc == 4 and one_line(err).startswith("check: no cases selected")


@pytest.mark.parametrize("argv,env,words", [
    (["-n", "two"], {}, ["-n", "'two'", "auto"]),
    (["--case-id", "none"], {"HARNESS_MAX_CASE_BYTES": "abc"},
     ["HARNESS_MAX_CASE_BYTES='abc'", "whole number"]),
    (["--case-id", "none"], {"HARNESS_MAX_CASE_BYTES": "0"}, ["HARNESS_MAX_CASE_BYTES=0"]),
    (["--case-id", "none"], {"KERNELS_TESTONLY_FAULT": "bogus"},
     ["KERNELS_TESTONLY_FAULT='bogus'", "KERNELS_TESTONLY=1"]),
    (["--case-id", "none", "--html", "/proc/no/r.html"], {}, ["--html", "/proc/no/r.html"]),
    (["--case-id", "none", "--junitxml", "/proc/no/j.xml"], {}, ["--junitxml"]),
], ids=["workers", "ceiling-abc", "ceiling-0", "testonly-fault", "html", "junitxml"])
def test_bad_options_and_environment_are_one_line_before_any_case(argv, env, words, capfd,
                                                                  monkeypatch, tmp_path):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("KERNELS_TESTONLY", raising=False)
    results = tmp_path / "r.jsonl"
    try:
        rc, out, err = check(capfd, "--results", str(results), *argv)
    except SystemExit as stop:   # argparse's own one line
        rc, (out, err) = stop.code, capfd.readouterr()
    assert rc == 2, out + err
    line = one_line(err)
    for word in words:
        assert word in line, line
    assert not results.exists()


GOOD = fault_case("none").to_json()


@pytest.mark.parametrize("change,words", [
    ({"route": "faults.single_prefil"}, ["case 0", "'faults.single_prefil'",
                                          "did you mean 'faults.single_prefill'"]),
    ({"requires": ["plan_runn"]}, ["case 0", "'plan_runn'", "did you mean 'plan_run'"]),
    ({"requires": "plan_run"}, ["case 0", "'requires' must be a list of strings", "'plan_run'"]),
    ({"refuse_words": 5}, ["case 0", "'refuse_words' must be a list of strings", "5"]),
    ({"expect": "pass"}, ["case 0", "'expect'", "'pass'"]),
    (None, ["case 1", "also case 0's"]),
], ids=["misspelt-route", "unknown-feature", "requires-string", "refuse-words-int", "expect",
        "duplicate-id"])
def test_a_cases_file_is_checked_before_its_first_case(change, words, capfd, tmp_path):
    cases = [GOOD, GOOD] if change is None else [{**GOOD, **change}]
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    results = tmp_path / "r.jsonl"
    rc, out, err = check(capfd, "--cases-file", str(path), "--results", str(results))
    assert rc == 2, out + err
    line = one_line(err)
    assert line.startswith(f"check: --cases-file {path}: "), line
    for word in words:
        assert word in line, line
    assert not results.exists()


def test_an_output_that_cannot_be_written_is_one_line_with_the_rows_kept(tmp_path, capfd):
    folder = tmp_path / "out"
    folder.mkdir()
    junit = folder / "j.xml"
    results = tmp_path / "r.jsonl"
    # Writable when the run starts (so the pre-check lets it go), a folder when it ends.
    from harness.tools import check as check_tool
    real = check_tool.ci_outputs

    def then_blocked(*args, **kwargs):
        junit.mkdir()
        return real(*args, **kwargs)
    import unittest.mock
    with unittest.mock.patch.object(check_tool, "ci_outputs", then_blocked):
        rc, out, err = check(capfd, "--case-id", "none", "--results", str(results),
                             "--junitxml", str(junit))
    assert rc == 2, out + err
    lines = [l for l in err.splitlines() if l.startswith("check: cannot write")]
    assert len(lines) == 1 and str(junit) in lines[0] and f"kept in {results}" in lines[0], err
    assert "Traceback" not in err
    assert len(table.read_rows(results)) == 1


def _children(pid: int) -> list[int]:
    try:
        found = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
        return found
    except OSError:
        return []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def pytest_child(check_pid: int, deadline: float) -> int:
    while time.monotonic() < deadline:
        for pid in _children(check_pid):
            if " pytest " in _cmdline(pid):
                return pid
        time.sleep(0.1)
    raise AssertionError("no pytest child started")


def start_slow_check(tmp_path, *extra):
    """`harness check` of two cases, the second sleeping 120 s, as a process of its own."""
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([fault_case("none").to_json(), fault_case("slow").to_json()]))
    results = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "harness", "check", "--target", "faults", "-n", "0",
           "--cases-file", str(cases), "--results", str(results), *extra]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), FAULTS_SLOW_S="120"))
    return proc, cases, results


def wait_for_rows(results: Path, n: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            if len(table.read_rows(results, torn_note=lambda _: None)) >= n:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"{results}: fewer than {n} rows")


@pytest.mark.system
def test_a_killed_pytest_child_is_one_line_with_the_rows_kept_and_the_resume_command(tmp_path):
    proc, cases, results = start_slow_check(tmp_path)
    try:
        deadline = time.monotonic() + 240
        child = pytest_child(proc.pid, deadline)
        wait_for_rows(results, 1, deadline)
        os.kill(child, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 2, out + err
    lines = [l for l in err.splitlines() if l.startswith("check: ") and "rows go to" not in l]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"check: the pytest run (pid {child}) was killed by SIGKILL; "
                               f"1 of 2 rows kept in {results}; continue with: harness check "), lines[0]
    assert lines[0].endswith(f"--cases-file {cases} --results {results} --resume"), lines[0]
    assert "PASS" not in out and "Traceback" not in err


@pytest.mark.system
def test_a_stopped_controller_is_ended_by_the_parent_with_the_rows_kept(tmp_path):
    """SIGSTOP of the pytest controller alone: the parent `harness check` sees it stopped
    (its state in /proc), ends it once it has been stopped past the case timeout, and says
    what is kept and how to go on."""
    from harness.tools.controller_watch import process_state
    proc, cases, results = start_slow_check(tmp_path, "--case-timeout", "3")
    try:
        deadline = time.monotonic() + 240
        child = pytest_child(proc.pid, deadline)
        wait_for_rows(results, 1, deadline)
        os.kill(child, signal.SIGSTOP)
        while process_state(child) != "T" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process_state(child) == "T"
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 2, out + err
    assert process_state(child) in (None, "Z"), "the stopped controller was left behind"
    lines = [l for l in err.splitlines() if l.startswith("check: ") and "rows go to" not in l]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"check: the pytest controller (pid {child}) was stopped for "), lines[0]
    assert "past the case timeout of 3 s; it was ended; 1 of 2 rows kept in " in lines[0], lines[0]
    assert lines[0].endswith(f"--cases-file {cases} --results {results} --case-timeout 3 "
                             f"--resume"), lines[0]
    assert "PASS" not in out and "Traceback" not in err
    assert [r["case_id"] for r in table.read_rows(results)][0].endswith("faults.none/n0")


@pytest.mark.system   # a real process under a file-size limit, with xdist workers, is the subject
def test_a_full_disk_under_xdist_stops_with_no_pass(tmp_path):
    """The table cannot take a fourth row (a file-size limit stands in for a full disk): the
    run stops on a whole row and says so once; no PASS, never 0."""
    import resource

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a full disk's ENOSPC, as EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([fault_case("none", i).to_json() for i in range(10)]))
    probe = tmp_path / "probe.jsonl"
    cmd = [sys.executable, "-m", "harness", "check", "--target", "faults", "--cases-file",
           str(cases)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    assert subprocess.run([*cmd, "-n", "0", "--case-id", "n0", "--results", str(probe)],
                          cwd=tmp_path, env=env, capture_output=True).returncode == 0
    limit = int(probe.stat().st_size * 3.5)
    results = tmp_path / "r.jsonl"
    done = subprocess.run([*cmd, "-n", "2", "--results", str(results)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, preexec_fn=small_files, timeout=600)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "PASS" not in done.stdout and "Traceback" not in done.stderr, done.stdout
    said = [l for l in done.stderr.splitlines() if "--resume" in l]
    assert len(said) == 1, done.stderr
    assert results.read_bytes().endswith(b"\n") and len(table.read_rows(results)) == 3
