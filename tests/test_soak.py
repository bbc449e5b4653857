"""benchmarks/soak.py's own logic: a round waits past a stopped worker's timeout, grace and
replay; a second run is started only once the first holds the table; a table is judged by
what it lost, duplicated or passed falsely, a stopped worker's hang allowed once."""
from __future__ import annotations

from benchmarks import soak
from harness.engine.isolation import RECENT
from harness.engine.plugins.watchdog import watchdog_grace
from harness.results.table import TableLock


def test_a_round_waits_past_a_stopped_workers_timeout_grace_and_replay():
    for timeout in (5.0, 20.0, 60.0):
        need = timeout + watchdog_grace(timeout) + RECENT * timeout
        assert soak.round_limit(10.0, timeout) > need + 2 * 10.0
    # the old fixed 120 s was shorter than a default (60 s) case timeout's hang and replay
    assert soak.round_limit(10.0, 60.0) > 120


class _Proc:
    def __init__(self, code):
        self.code = code

    def poll(self):
        return self.code


def test_the_second_run_waits_for_the_lock_to_be_held(tmp_path):
    table = tmp_path / "t.jsonl"
    assert soak.wait_for_lock(table, _Proc(0), limit_s=5) is False     # ended, never held
    lock = TableLock.acquire(table)
    try:
        assert soak.holder_of(table) is not None
        assert soak.wait_for_lock(table, _Proc(None), limit_s=5) is True
    finally:
        lock.release()
    assert soak.holder_of(table) is None


CLEAN = {"a": {"outcome": "match", "pass": True}, "b": {"outcome": "wrong", "pass": False},
         "c": {"outcome": "match", "pass": True}}


def _row(case_id, outcome, passed):
    return {"case_id": case_id, "outcome": outcome, "pass": passed}


STOPPED = {"struck": True, "who": "worker", "sig": "SIGSTOP"}
KILLED = {"struck": True, "who": "worker", "sig": "SIGKILL"}
NONE = {"struck": False}


def test_a_table_is_judged_by_what_it_lost_duplicated_and_passed_falsely():
    rows = [_row("a", "match", True), _row("b", "wrong", False), _row("c", "match", True)]
    assert soak.judge(rows, CLEAN, NONE) == {"dupes": 0, "missing": 0, "changed": [],
                                              "false_passes": 0, "blow_row": ""}
    got = soak.judge([_row("a", "match", True), _row("a", "match", True),
                      _row("b", "match", True)], CLEAN, NONE)
    assert got["dupes"] == 1 and got["missing"] == 1 and got["false_passes"] == 1
    assert got["changed"] == ["b"]


def test_only_the_struck_workers_one_case_may_tell_the_blow():
    one = [_row("a", "hang", False), _row("b", "wrong", False), _row("c", "match", True)]
    assert soak.judge(one, CLEAN, STOPPED)["changed"] == []
    assert soak.judge(one, CLEAN, STOPPED)["blow_row"].startswith("hang")
    assert soak.judge(one, CLEAN, NONE)["changed"] == ["a"]       # no worker was stopped
    assert soak.judge(one, CLEAN, KILLED)["changed"] == ["a"]     # a killed one crashes
    assert soak.judge(one, CLEAN, dict(STOPPED, who="controller"))["changed"] == ["a"]
    two = [_row("a", "hang", False), _row("b", "wrong", False), _row("c", "hang", False)]
    assert len(soak.judge(two, CLEAN, STOPPED)["changed"]) == 1
    crash = [dict(_row("a", "crash", False), message="worker died: SIGKILL [replay: did not "
                  "reproduce alone or after 3 earlier case(s)]"), _row("b", "wrong", False),
             _row("c", "match", True)]
    got = soak.judge(crash, CLEAN, KILLED)
    assert got["changed"] == [] and "did not reproduce" in got["blow_row"]
    # a killed worker's case that completed alone afterwards: ours, naming the signal
    ours = [dict(_row("a", "harness_error", False), message="the worker was killed by "
                 "SIGKILL from outside the process"), _row("b", "wrong", False),
            _row("c", "match", True)]
    got = soak.judge(ours, CLEAN, KILLED)
    assert got["changed"] == [] and "from outside" in got["blow_row"]
    assert soak.judge(ours, CLEAN, STOPPED)["changed"] == ["a"]   # a stopped one hangs
    # a crash passing is still a false pass, whatever the blow
    assert soak.judge([_row("a", "match", True), _row("b", "crash", True),
                       _row("c", "match", True)], CLEAN, KILLED)["false_passes"] == 1


def test_a_second_run_counts_only_when_refused_naming_the_first_runs_pid():
    held = "x.jsonl is being written by another run (pid 41); wait for it to end"
    assert soak.refusal_verdict(2, held, {40, 41}, True) == (True, False)
    assert soak.refusal_verdict(2, held, {40, 41}, False) == (True, False)
    # refused, but naming a stranger, or not refused, while the first ran: broken
    assert soak.refusal_verdict(2, held, {40}, True) == (True, True)
    assert soak.refusal_verdict(0, "", {40}, True) == (True, True)
    # the first ended before the second was refused: not this strike, not broken
    assert soak.refusal_verdict(1, "", {40}, False) == (False, False)


def test_a_run_says_pass_by_exit_0_or_a_pass_line(tmp_path):
    log = tmp_path / "log"
    log.write_text("158 cases, 1 failing\nFAIL: 1 of 158 rows\n")
    assert not soak.said_pass(1, log)
    assert soak.said_pass(0, log)
    log.write_text("PASS: 158 rows, 0 failing\n")
    assert soak.said_pass(2, log)
    assert not soak.said_pass(None, tmp_path / "absent")


def test_the_cases_file_plants_one_failing_case_check_accepts(tmp_path):
    import json
    from harness.model.cases_file import load_file
    path = tmp_path / "cases.json"
    planted = soak.write_cases(path, "gqa", "fa2.single_prefill")
    cases = load_file(str(path), "soak", ("fa2.single_prefill",))
    ids = [c.id for c in cases]
    assert ids.count(planted) == 1 and planted.endswith(soak.PLANTED_TAG)
    case = cases[ids.index(planted)]
    assert case.expect == "refuse" and 0 < ids.index(planted) < len(ids) - 1
    assert len(json.loads(path.read_text())) == len(cases)
