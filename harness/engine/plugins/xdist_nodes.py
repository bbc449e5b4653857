"""Controller-side hooks that exist only when xdist is installed: what each worker is sent
at its spawn, a dead worker's cause, and no replacement worker once the run is done."""
from __future__ import annotations

import os

import pytest

from harness.engine import isolation
from harness.engine.plugins.watchdog import diagnose
from harness.engine.session import Run


def no_replacement_after_the_end(dsession) -> None:
    """xdist replaces every worker that dies, even when nothing is left to run: when two die
    near the end of a run, the replacement joins after the shutdown began and the run ends in
    an INTERNALERROR (`assert node in self.node2pending`), losing the summary. A dead worker is
    replaced only while the scheduler still has work; its own crashed case, and any case put
    back for a rerun, count as work (xdist hands them back before it replaces the worker)."""
    clone = dsession._clone_node

    def clone_while_work_is_left(node):
        sched = dsession.sched
        if sched is not None and sched.tests_finished:
            return None   # xdist's loop sees tests_finished next and shuts the rest down
        return clone(node)
    dsession._clone_node = clone_while_work_is_left


class XdistHooks:
    def __init__(self, run: Run):
        self.run = run

    def pytest_xdist_setupnodes(self, config, specs):
        dsession = config.pluginmanager.getplugin("dsession")
        if dsession is not None:
            no_replacement_after_the_end(dsession)

    def pytest_configure_node(self, node):
        node.workerinput["harness"] = {
            "run_id": self.run.run_id, "state_dir": self.run.state_dir,
            "done_ids": sorted(self.run.done_ids), "controller_pid": os.getpid(),
        }

    @pytest.hookimpl(trylast=True)
    def pytest_handlecrashitem(self, crashitem, report, sched):
        run = self.run
        worker = report.node.gateway.id
        death = diagnose(run, worker, isolation.worker_exitcode(report.node))
        report.harness_death = death
        report.harness_worker = worker
        if death.kind == "retired" and death.case_id is None:
            # The worker retired between cases: the item xdist blames never
            # started. Run it elsewhere, and do not count this as an attempt.
            if report.outcome != "rerun":
                sched.mark_test_pending(crashitem)
                report.outcome = "rerun"
            else:
                run.retire_bumps[crashitem] = run.retire_bumps.get(crashitem, 0) + 1
            report.harness_retired = True
