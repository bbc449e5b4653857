"""Forked cases timed and judged right: the fork server starts before the case's timer, the
forked child's own timer fires first and names the child's stage, and a case skipped before
the library is called is never forked."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fault_target import ForkingFaultsTarget, fault_case
from harness.engine import forkserver
from harness.engine import pytest_root
from harness.model.capabilities import Capabilities
from harness.results import table

ROOT = Path(__file__).resolve().parent.parent
FORKING = f"{ROOT / 'tests' / 'fault_target.py'}:make_forking_target"


def test_a_forked_childs_timer_fires_before_its_parents_budget_and_the_workers_timer():
    for timeout in (0.5, 2.0, 60.0, 1800.0):
        budget = timeout + forkserver.slack_s(timeout)
        assert timeout < budget < forkserver.worker_timeout(timeout)


def test_a_case_skipped_before_the_library_is_called_is_never_forked(monkeypatch):
    target = ForkingFaultsTarget()
    assert forkserver.forks_each(target, fault_case("none"))
    lacking = ForkingFaultsTarget()
    lacking.capabilities = Capabilities(ops=frozenset())    # lacks the case's op
    assert not forkserver.forks_each(lacking, fault_case("none"))
    monkeypatch.setattr(ForkingFaultsTarget, "skip_reason",
                        lambda self, case: "this adapter cannot express it", raising=False)
    assert not forkserver.forks_each(ForkingFaultsTarget(), fault_case("none"))


@pytest.mark.system
def test_forked_cases_with_a_short_timeout_hang_only_when_their_child_hangs(tmp_path):
    # The library takes 6 s to load and each case may take 2: the fork server's start (a
    # load) is longer than a case's timeout, and must not count in the first case's.
    cases = [fault_case("none", 0), fault_case("hang", 1), fault_case("none", 2)]
    cases_file = tmp_path / "cases.json"
    cases_file.write_text(json.dumps([c.to_json() for c in cases]))
    results = tmp_path / "results.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(pytest_root.PATH), "-p", "no:cacheprovider", "-q",
         "--target", FORKING, "--cases-file", str(cases_file), "--results", str(results),
         "--case-timeout", "2", "-n", "1"], cwd=ROOT, capture_output=True, text=True,
        timeout=300, env=dict(os.environ, FAULTS_LOAD_S="6"))
    rows = {r["case_id"]: r for r in table.read_rows(results)}
    assert len(rows) == 3, proc.stdout[-3000:] + proc.stderr[-2000:]
    first, hung, last = (rows[c.id] for c in cases)
    assert (first["outcome"], first["pass"]) == ("match", True), first
    assert (last["outcome"], last["pass"]) == ("match", True), last
    # The child's own timer: its stage, and the child's row (alone), not the worker's death.
    assert (hung["outcome"], hung["stage"]) == ("hang", "run"), hung
    assert "no result after 2 s during run" in hung["message"], hung["message"]
    assert hung["isolation"] == "alone" and hung["worker"] == first["worker"], hung
