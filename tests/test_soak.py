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


def test_a_table_is_judged_by_what_it_lost_duplicated_and_passed_falsely():
    rows = [_row("a", "match", True), _row("b", "wrong", False), _row("c", "match", True)]
    assert soak.judge(rows, CLEAN, False) == {"dupes": 0, "missing": 0, "changed": [],
                                               "false_passes": 0, "stopped_hang": 0}
    got = soak.judge([_row("a", "match", True), _row("a", "match", True),
                      _row("b", "match", True)], CLEAN, False)
    assert got["dupes"] == 1 and got["missing"] == 1 and got["false_passes"] == 1
    assert got["changed"] == ["b"]


def test_only_a_stopped_workers_one_case_may_be_a_hang():
    one = [_row("a", "hang", False), _row("b", "wrong", False), _row("c", "match", True)]
    assert soak.judge(one, CLEAN, True)["changed"] == []
    assert soak.judge(one, CLEAN, True)["stopped_hang"] == 1
    assert soak.judge(one, CLEAN, False)["changed"] == ["a"]       # no worker was stopped
    two = [_row("a", "hang", False), _row("b", "wrong", False), _row("c", "hang", False)]
    assert len(soak.judge(two, CLEAN, True)["changed"]) == 1
