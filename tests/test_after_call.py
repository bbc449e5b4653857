"""A device fault is the library's wherever it surfaces after the library's call: in the
worker's cache release of a case that held memory shares, or in the health probe. The case's
row is its `crash` at the step where the fault surfaced, the worker retires before its next
case, and none of the worker's own steps raises past the row."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from fault_target import fault_case
from harness.engine import after_call, device_memory, isolation
from harness.engine.plugins import worker
from harness.engine import pytest_root
from harness.engine.session import ROW_KEY, RUN, Run
from harness.results import table

ROOT = Path(__file__).resolve().parent.parent
ILLEGAL = "CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be..."


class Config:
    """What run_case reads of pytest's config: options and the stash."""

    def __init__(self, **options):
        self.options = {"target": "faults", "repeat": 1, "profile": "ci", **options}
        self.stash = {}

    def getoption(self, name, default=None):
        return self.options.get(name, default)


class State:
    """A worker's breadcrumbs, in memory (the real ones arm faulthandler in this process)."""

    def __init__(self):
        self.data, self.stages = {"context": None}, []

    def set_context(self, context):
        self.data["context"] = context

    def begin(self, case_id, timeout_s):
        self.stages.append(("begin", case_id))

    def stage(self, name):
        self.stages.append(name)

    def end(self, case_id):
        self.stages.append(("end", case_id))


def worker_run(tmp_path) -> Run:
    config = Config()
    run = Run(config, True, worker="gw0", run_id="r", state_dir=str(tmp_path))
    run.state = State()
    config.stash[RUN] = run
    return run


def run_one(run: Run, case) -> dict:
    node = SimpleNamespace(user_properties=[])
    try:
        worker.run_case(SimpleNamespace(config=run.config, node=node), case)
    except pytest.fail.Exception:
        pass
    return next(v for k, v in node.user_properties if k == ROW_KEY)


@pytest.fixture
def poisoned_release(monkeypatch):
    """A case that holds shares, whose cache release meets a poisoned context."""
    released = []

    def release_cached():
        released.append(True)
        raise RuntimeError(ILLEGAL)
    monkeypatch.setattr(device_memory, "shares_for", lambda params, total, extra=0: 2)
    monkeypatch.setattr(device_memory, "release_cached", release_cached)
    return released


def test_a_fault_in_the_cache_release_is_the_cases_crash_at_that_step(tmp_path, poisoned_release):
    run = worker_run(tmp_path)
    row = run_one(run, fault_case("none"))
    assert poisoned_release, "the case held shares but its cached blocks were never released"
    assert (row["outcome"], row["pass"], row["stage"], row["error_type"]) == \
        ("crash", False, after_call.RELEASE_STAGE, "device error"), row
    assert "illegal memory access" in row["message"] and "kernel errors" not in row["message"]
    assert "case outcome was match" in row["message"], row["message"]
    # The worker leaves before its next case (pytest_runtest_protocol retires it).
    assert run.retire_reason and "illegal memory access" in run.retire_reason


def test_a_fault_seen_only_by_the_health_probe_is_the_cases_crash_at_the_probe(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setattr(isolation, "_FORCED_UNHEALTHY", [f"AcceleratorError: {ILLEGAL}"])
    run = worker_run(tmp_path)
    row = run_one(run, fault_case("none"))
    assert (row["outcome"], row["stage"]) == ("crash", after_call.PROBE_STAGE), row
    assert run.retire_reason


def test_the_cases_own_failure_stays_on_the_row_beside_the_late_fault(tmp_path, poisoned_release):
    row = run_one(worker_run(tmp_path), fault_case("wrong"))
    assert row["outcome"] == "crash" and "case outcome was wrong" in row["message"], row


def test_a_healthy_case_holding_shares_is_its_own_verdict_and_keeps_its_worker(tmp_path,
                                                                               monkeypatch):
    released = []
    monkeypatch.setattr(device_memory, "shares_for", lambda params, total, extra=0: 2)
    monkeypatch.setattr(device_memory, "release_cached", lambda: released.append(True))
    run = worker_run(tmp_path)
    row = run_one(run, fault_case("none"))
    assert (row["outcome"], row["pass"]) == ("match", True) and released
    assert run.retire_reason is None


def test_an_error_of_ours_after_the_call_is_never_the_librarys(tmp_path, monkeypatch):
    def release_cached():
        raise OSError("no such file: shares.pick")
    monkeypatch.setattr(device_memory, "shares_for", lambda params, total, extra=0: 2)
    monkeypatch.setattr(device_memory, "release_cached", release_cached)
    run = worker_run(tmp_path)
    row = run_one(run, fault_case("none"))
    assert (row["outcome"], row["pass"]) == ("harness_error", False), row
    assert "not a device error" in row["message"] and "shares.pick" in row["message"]
    assert run.retire_reason is None
    failed = run_one(worker_run(tmp_path), fault_case("wrong"))
    assert failed["outcome"] == "wrong" and "shares.pick" in failed["message"], failed


def test_a_harness_bug_raises_and_a_sick_device_still_retires_the_worker(tmp_path, monkeypatch):
    def bug(*args, **kwargs):
        raise KeyError("num_pages")
    monkeypatch.setattr(worker, "execute_repeated", bug)
    monkeypatch.setattr(isolation, "_FORCED_UNHEALTHY", [f"AcceleratorError: {ILLEGAL}"])
    run = worker_run(tmp_path)
    node = SimpleNamespace(user_properties=[])
    with pytest.raises(KeyError):
        worker.run_case(SimpleNamespace(config=run.config, node=node), fault_case("none"))
    assert node.user_properties == [] and run.retire_reason


@pytest.mark.system
def test_a_poisoned_context_is_that_cases_crash_and_the_next_case_its_own_verdict(tmp_path):
    # One worker: the `late` case holds shares and leaves the context poisoned; the worker's
    # cache release meets it. The next case, in that worker's slot, runs on a fresh context.
    cases = [fault_case("late", 0), fault_case("none", 1), fault_case("wrong", 2)]
    cases_file = tmp_path / "cases.json"
    cases_file.write_text(json.dumps([c.to_json() for c in cases]))
    results = tmp_path / "results.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(pytest_root.PATH), "-p", "no:cacheprovider", "-q",
         "--target", "faults", "--cases-file", str(cases_file), "--results", str(results),
         "-n", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    rows = {r["case_id"]: r for r in table.read_rows(results)}
    assert proc.returncode == 1 and len(rows) == 3, proc.stdout[-3000:]
    late, plain, wrong = (rows[c.id] for c in cases)
    assert (late["outcome"], late["stage"], late["error_type"]) == \
        ("crash", after_call.RELEASE_STAGE, "device error"), late
    assert "illegal memory access" in late["message"], late["message"]
    assert (plain["outcome"], plain["pass"], plain["reruns"]) == ("match", True, 0), plain
    assert wrong["outcome"] == "wrong", wrong
    assert plain["worker"] != late["worker"], "the next case ran on the poisoned worker"


@pytest.mark.system
def test_without_xdist_a_poisoned_context_stops_the_run_and_resume_goes_on(tmp_path):
    # No worker to retire: the next case would run on the dead context and take its crash.
    cases = [fault_case("late", 0), fault_case("none", 1)]
    cases_file = tmp_path / "cases.json"
    cases_file.write_text(json.dumps([c.to_json() for c in cases]))
    results = tmp_path / "results.jsonl"
    cmd = [sys.executable, "-m", "pytest", str(pytest_root.PATH), "-p", "no:cacheprovider", "-q",
           "--target", "faults", "--cases-file", str(cases_file), "--results", str(results)]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    rows = table.read_rows(results)
    assert first.returncode == 2, first.stdout[-3000:]
    assert [(r["case_id"], r["outcome"]) for r in rows] == [(cases[0].id, "crash")], rows
    assert f"the device is unusable after {cases[0].id}" in first.stdout, first.stdout[-3000:]
    resumed = subprocess.run(cmd + ["--resume"], cwd=ROOT, capture_output=True, text=True,
                             timeout=300)
    rows = {r["case_id"]: r for r in table.read_rows(results)}
    assert resumed.returncode == 0 and rows[cases[1].id]["outcome"] == "match", \
        resumed.stdout[-3000:]
