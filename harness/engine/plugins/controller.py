"""The controller's hooks: reports in, rows out.

Registered (configure.settle) in the process that writes the table: the xdist controller, or
the lone pytest process. A worker's row arrives on its call report; a dead worker's case gets
its row from the report xdist makes up for it, with the cause read from the worker's
breadcrumbs (isolation.py, xdist_nodes.py) and, when the worker had run earlier cases, a
culprit replay (replay.py). Hook order:

  pytest_handlecrashitem  -> read the dead worker's breadcrumbs (xdist_nodes.py)
  pytest_runtest_logreport -> the final attempt's report becomes one row;
                              "rerun" reports only count towards `reruns`.
"""
from __future__ import annotations

import shutil
import sys

import pytest

from harness.engine.plugins import rows_out
from harness.engine.plugins.lifecycle import STOP_PREFIX
from harness.engine.plugins.watchdog import Watchdog
from harness.engine.session import ROW_KEY, Run
from harness.results import table


class Controller:
    def __init__(self, run: Run):
        self.run = run
        self.watchdog: Watchdog | None = None
        self.session = None

    def start_watchdog(self, config) -> None:
        """Only over xdist workers: without them the cases run in this very process."""
        if getattr(config.option, "numprocesses", None) and \
                getattr(config.option, "dist", "no") != "no":
            self.watchdog = Watchdog(self.run)
            self.watchdog.start()

    def pytest_sessionstart(self, session):
        # Without xdist, a full disk stops the run through session.shouldstop (rows_out).
        self.session = session

    def pytest_runtest_logreport(self, report):
        run = self.run
        if getattr(report, "harness_retired", False):
            return
        if report.outcome == "rerun":
            # An earlier attempt of a case that will run again: it is kept, and
            # the final row is judged over every attempt (harness/engine/attempts.py).
            rows_out.keep_attempt(run, report)
            return
        if report.when == "call":
            row = next((v for k, v in report.user_properties if k == ROW_KEY), None)
            if row is not None:
                rows_out.finish_row(run, report, dict(row))
            elif report.outcome != "passed":
                # The case raised before its row existed (bad params, an adapter
                # bug): without this row the table and its reports would omit a
                # failing case.
                rows_out.harness_error_row(run, report, "call", "harness error in the case")
        elif report.when == "???" or getattr(report, "harness_death", None) is not None:
            rows_out.crash_row(run, report)
        elif report.when == "setup" and report.outcome != "passed":
            rows_out.harness_error_row(run, report, "setup", "harness error before the case ran")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        run = self.run
        if self.watchdog is not None:
            self.watchdog.stop()
        stopped = getattr(run, "stop_reason", None)
        run.replays.finish(interrupted=exitstatus == pytest.ExitCode.INTERRUPTED or
                           bool(stopped))
        table.sync(run.results)
        if stopped:
            # One line, the table's finished rows intact; pytest's INTERRUPTED (2) exit.
            print(f"{STOP_PREFIX}{stopped}", file=sys.stderr, flush=True)
            session.exitstatus = pytest.ExitCode.INTERRUPTED
            return
        if run.results.exists() and run.default_results:
            ctx = rows_out.any_context(run)
            if ctx.get("arch"):
                try:
                    table.copy_latest(run.results, ctx.get("target") or run.opt("target"),
                                      ctx["arch"])
                except (OSError, ValueError) as e:
                    print(f"{STOP_PREFIX}the latest-table copy of {run.results} was not "
                          f"written ({e})", file=sys.stderr, flush=True)
        if run.failed_rows and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_report_header(self, config):
        run = self.run
        resumed = f", resuming ({len(run.done_ids)} cases done)" if run.done_ids else ""
        return (f"harness: target {config.getoption('target')}, run {run.run_id}, "
                f"results {run.results}{resumed}")

    def pytest_unconfigure(self, config):
        shutil.rmtree(self.run.state_dir, ignore_errors=True)
        lock = getattr(self.run, "table_lock", None)
        if lock is not None:
            lock.release()   # under `harness check` its parent holds it, and removes it
