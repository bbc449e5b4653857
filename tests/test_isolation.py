"""Crash isolation: every injected failure kind becomes exactly one row."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.engine import isolation, pytest_root
from harness.results import table
from fault_target import fault_case

ROOT = Path(__file__).resolve().parent.parent


def write_cases(tmp_path, *faults, name="cases.json"):
    cases = [fault_case(f, i) for i, f in enumerate(faults)]
    path = tmp_path / name
    path.write_text(json.dumps([c.to_json() for c in cases]))
    return path, cases


def matrix_cmd(cases_file, results, *args):
    return [sys.executable, "-m", "pytest", str(pytest_root.PATH), "-p", "no:cacheprovider", "-q",
            "--target", "faults", "--cases-file", str(cases_file), "--results", str(results), *args]


def run_matrix(tmp_path, cases_file, *args, timeout=300, env=None):
    results = tmp_path / "results.jsonl"
    proc = subprocess.run(matrix_cmd(cases_file, results, *args), cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env)
    rows = table.read_rows(results) if results.exists() else []
    return proc, {r["case_id"]: r for r in rows}, rows


# ---------------------------------------------------------------- units

@pytest.mark.parametrize("header,name", [
    ("Floating point exception", "SIGFPE"), ("Segmentation fault", "SIGSEGV"),
    ("Bus error", "SIGBUS"), ("Aborted", "SIGABRT")])
def test_fault_text_names_the_signal(header, name):
    text = f"Fatal Python error: {header}\n\nCurrent thread 0x1 (most recent call first):\n"
    assert isolation.parse_fault_text(text) == ("crash", name)


def test_fault_text_timeout_and_nothing():
    assert isolation.parse_fault_text("Timeout (0:01:05)!\nThread 0x1") == ("hang", "timeout after 65 s")
    assert isolation.parse_fault_text("") is None


def test_diagnose_prefers_fault_file_then_exit_status(tmp_path):
    state = isolation.WorkerState(tmp_path, "gw9")
    state.begin("a/b", None)
    state.stage("plan")
    death = isolation.diagnose(tmp_path, "gw9", -11)
    assert (death.kind, death.cause, death.stage, death.case_id) == ("crash", "SIGSEGV", "plan", "a/b")
    assert isolation.diagnose(tmp_path, "gw9", 3).cause == "exit code 3"
    Path(state.fault_path).write_text("Fatal Python error: Aborted\n")
    assert isolation.diagnose(tmp_path, "gw9", -6).cause == "SIGABRT"
    state.end("a/b")
    assert isolation.read_state(tmp_path, "gw9")["recent"] == ["a/b"]
    assert isolation.diagnose(tmp_path, "nobody", None).cause.startswith("worker died")
    import faulthandler
    try:
        faulthandler.enable()  # back to stderr, where pytest had it
    except (OSError, ValueError):
        faulthandler.disable()


def test_timeout_scales_with_case_size():
    small = {"qo_lens": [1], "kv_lens": [1], "num_qo_heads": 1, "head_dim": 32}
    big = {"qo_lens": [4096] * 8, "kv_lens": [4096] * 8, "num_qo_heads": 32, "head_dim": 128}
    assert isolation.case_timeout(small) == pytest.approx(isolation.TIMEOUT_BASE_S, abs=0.01)
    assert isolation.case_timeout(big) > isolation.case_timeout(small) + 60
    assert isolation.case_timeout(small, base=2) == pytest.approx(2, abs=0.01)


# ---------------------------------------------------------------- end to end

@pytest.mark.system
def test_every_failure_kind_is_exactly_one_row(tmp_path):
    # KERNELS_TESTONLY=1: the failures happen inside the bundled library's host
    # kernels (integer division by zero, null write, abort(), a spinning kernel).
    # One rerun: each failing kind still dies twice (its worker, then that worker's
    # replacement), and both attempts must land on its one row with reruns counted; a
    # second rerun would only repeat that death again (three more workers and a 3 s hang
    # per run). Counting past one rerun is test_plugin.py's xdist rerun test's (reruns 2).
    path, cases = write_cases(tmp_path, "none", "sigfpe", "segv", "abort", "exit3", "hang", "none")
    proc, by_id, rows = run_matrix(tmp_path, path, "-n", "2", "--reruns", "1",
                                   "--case-timeout", "3",
                                   env=dict(os.environ, KERNELS_TESTONLY="1"))
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert len(rows) == len(cases) and set(by_id) == {c.id for c in cases}
    expected = {"sigfpe": ("crash", "SIGFPE"), "segv": ("crash", "SIGSEGV"),
                "abort": ("crash", "SIGABRT"), "exit3": ("crash", "exit code 3"),
                "hang": ("hang", "timeout after 3 s")}
    for case in cases:
        row = by_id[case.id]
        fault = case.params["fault"]
        if fault == "none":
            assert row["pass"] and row["outcome"] == "match", row
            continue
        outcome, cause = expected[fault]
        assert (row["outcome"], row["error_type"], row["stage"]) == (outcome, cause, "run"), row
        assert not row["pass"] and row["reruns"] == 1
        assert [a["outcome"] for a in row["attempts"]] == [outcome] * 2, row
        assert (cause if fault != "hang" else "no result after") in row["message"]
        assert row["isolation"] in ("alone", "culprit"), row
        assert row["arch"] and row["target"] == "faults"


@pytest.mark.system
def test_culprit_fails_alone(tmp_path):
    path, cases = write_cases(tmp_path, "none", "none", "segv")
    proc, by_id, rows = run_matrix(tmp_path, path, "-n", "1")
    assert proc.returncode == 1 and len(rows) == 3, proc.stdout[-3000:]
    row = by_id[cases[2].id]
    assert (row["outcome"], row["error_type"], row["isolation"]) == ("crash", "SIGSEGV", "culprit")
    assert "fails alone" in row["message"]


@pytest.mark.system
def test_victim_fails_only_after_earlier_cases(tmp_path):
    path, cases = write_cases(tmp_path, "none", "poison", "victim")
    proc, by_id, rows = run_matrix(tmp_path, path, "-n", "1")
    assert proc.returncode == 1 and len(rows) == 3, proc.stdout[-3000:]
    row = by_id[cases[2].id]
    assert (row["outcome"], row["isolation"]) == ("crash", "victim"), row
    assert "fails only after 2 earlier case(s)" in row["message"]
    assert by_id[cases[1].id]["pass"]


@pytest.mark.system
def test_sticky_device_error_retires_the_worker(tmp_path):
    path, cases = write_cases(tmp_path, "sticky", "none", "none")
    proc, by_id, rows = run_matrix(tmp_path, path, "-n", "1")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert len(rows) == 3 and set(by_id) == {c.id for c in cases}
    sticky = by_id[cases[0].id]
    assert sticky["outcome"] == "crash" and "sticky device error" in sticky["message"]
    later = [by_id[c.id] for c in cases[1:]]
    assert all(r["pass"] and r["reruns"] == 0 for r in later), later
    # the next case ran on a fresh worker, not on the one that saw the error
    assert all(r["worker"] != sticky["worker"] for r in later)


def _wait_rows(path, n, proc, limit=120):
    deadline = time.time() + limit
    while time.time() < deadline and proc.poll() is None:
        if path.exists() and len(table.read_rows(path)) >= n:
            return
        time.sleep(0.2)
    raise AssertionError(f"never saw {n} rows (exit {proc.poll()})")


@pytest.mark.system
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_interrupted_run_keeps_rows_and_resumes(tmp_path, sig):
    path, cases = write_cases(tmp_path, "none", "none", "slow", "none")
    results = tmp_path / "results.jsonl"
    # The slow case runs while the signal arrives (0.5-0.7 s after it started). It lasts
    # 4 s, not longer: after SIGTERM, xdist's shutdown waits for the worker's case to end
    # (execnet gives it 5 s before interrupting it), so a longer case only idles the test.
    from process_watch import new_mark, poll, worker_in_a_case
    mark = new_mark()
    env = dict(os.environ, FAULTS_SLOW_S="4", **dict([mark]))
    proc = subprocess.Popen(matrix_cmd(path, results, "-n", "1"), cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        # Two rows kept and the slow case inside its call: polled, not guessed.
        def two_rows_kept_and_slow_case_running():
            _wait_rows(results, 2, proc)
            return worker_in_a_case("=".join(mark), stage="run", case_id=cases[2].id)
        poll(two_rows_kept_and_slow_case_running)
        proc.send_signal(sig)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        # the SIGKILLed controller's worker notices its closed channel and exits;
        # make sure, without touching anything but this run's process group
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert rc != 0
    first = table.read_rows(results)
    assert [r["case_id"] for r in first] == [cases[0].id, cases[1].id]
    proc2, by_id, rows = run_matrix(tmp_path, path, "-n", "1", "--resume")
    assert proc2.returncode == 0, proc2.stdout[-3000:]
    assert [r["case_id"] for r in rows[:2]] == [c.id for c in cases[:2]]
    assert rows[:2] == first
    assert len(rows) == 4 and set(by_id) == {c.id for c in cases}
    assert {r["run_id"] for r in rows} == {first[0]["run_id"]}
