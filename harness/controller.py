"""The controller's side of the plugin: reports in, rows out.

Runs in the process that writes the table (the xdist controller, or the lone
pytest process). A worker's row arrives on its call report; a dead worker's
case gets its row from the report xdist makes up for it, with the cause read
from the worker's breadcrumbs (isolation.py) and, when the worker had run
earlier cases, a culprit replay on a background thread.
"""
from __future__ import annotations

import json
import os
import queue
import threading
from pathlib import Path

import pytest

from harness import isolation, row as rows, table
from harness.classify import Verdict, harness_error_verdict
from harness.session import ROW_KEY, Run, case_id_of


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
    """Controller-side hooks that exist only when xdist is installed."""

    def __init__(self, run: Run):
        self.run = run

    def pytest_xdist_setupnodes(self, config, specs):
        dsession = config.pluginmanager.getplugin("dsession")
        if dsession is not None:
            no_replacement_after_the_end(dsession)

    def pytest_configure_node(self, node):
        node.workerinput["harness"] = {
            "run_id": self.run.run_id, "state_dir": self.run.state_dir,
            "done_ids": sorted(self.run.done_ids),
        }

    @pytest.hookimpl(trylast=True)
    def pytest_handlecrashitem(self, crashitem, report, sched):
        run = self.run
        worker = report.node.gateway.id
        death = isolation.diagnose(run.state_dir, worker, isolation.worker_exitcode(report.node))
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


class Controller:
    """Hooks of the process that writes rows: the xdist controller, or the
    lone pytest process without xdist."""

    def __init__(self, run: Run):
        self.run = run

    def pytest_runtest_logreport(self, report):
        run = self.run
        if getattr(report, "harness_retired", False):
            return
        if report.outcome == "rerun":
            # An earlier attempt of a case that will run again: it is kept, and
            # the final row is judged over every attempt (harness/attempts.py).
            _keep_attempt(run, report)
            return
        if report.when == "call":
            row = next((v for k, v in report.user_properties if k == ROW_KEY), None)
            if row is not None:
                _finish_row(run, report, dict(row))
            elif report.outcome != "passed":
                # The case raised before its row existed (bad params, an adapter
                # bug): without this row the table and its reports would omit a
                # failing case.
                _harness_error_row(run, report, "call", "harness error in the case")
        elif report.when == "???" or getattr(report, "harness_death", None) is not None:
            _crash_row(run, report)
        elif report.when == "setup" and report.outcome != "passed":
            _harness_error_row(run, report, "setup", "harness error before the case ran")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        run = self.run
        run.replays.finish(interrupted=exitstatus == pytest.ExitCode.INTERRUPTED)
        table.sync(run.results)
        if run.results.exists() and run.default_results:
            ctx = _any_context(run)
            if ctx.get("arch"):
                table.copy_latest(run.results, run.opt("target"), ctx["arch"])
        if run.failed_rows and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_report_header(self, config):
        run = self.run
        resumed = f", resuming ({len(run.done_ids)} cases done)" if run.done_ids else ""
        return (f"harness: target {config.getoption('target')}, run {run.run_id}, "
                f"results {run.results}{resumed}")

    def pytest_unconfigure(self, config):
        import shutil
        shutil.rmtree(self.run.state_dir, ignore_errors=True)


def _keep_attempt(run: Run, report) -> None:
    row = next((v for k, v in report.user_properties if k == ROW_KEY), None)
    if row is None:
        # The attempt left no row: its worker died or hung in it (xdist's made-up
        # report), or the case raised in the harness.
        death = getattr(report, "harness_death", None)
        if death is not None:
            outcome = "hang" if death.kind == "hang" else "crash"
        else:
            outcome = "crash" if report.when == "???" else "harness_error"
        row = {"outcome": outcome, "pass": False, "max_abs_diff": None}
    run.prior_attempts.setdefault(report.nodeid, []).append(dict(row))


def _harness_error_row(run: Run, report, phase: str, what: str) -> None:
    """The row of a case that never produced one: skipped, or a harness error."""
    case = run.cases_by_id().get(case_id_of(report.nodeid))
    if case is None:
        return
    if report.outcome == "skipped":
        row = rows.from_verdict(case, Verdict("skipped", True, _longrepr(report)[:500]),
                                **_any_context(run))
    else:
        # A bug in the harness or an adapter: never counted as the library's crash.
        verdict = harness_error_verdict(f"{what}: " + _error_text(report))
        row = rows.from_verdict(case, verdict, error_type=phase, **_any_context(run))
    _finish_row(run, report, row)


def _longrepr(report) -> str:
    return str(report.longrepr) if report.longrepr is not None else ""


def _error_text(report) -> str:
    """The exception and where it was raised, first: a traceback's tail can be all source
    lines, which a report's one-line message would show instead of the error."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is None:
        return _longrepr(report)[-500:]
    return f"{crash.message[:400]} (at {Path(crash.path).name}:{crash.lineno})"


def _reruns(run: Run, report) -> int:
    return max(0, int(getattr(report, "rerun", 0) or 0) - run.retire_bumps.get(report.nodeid, 0))


def _finish_row(run: Run, report, row: dict) -> None:
    worker = getattr(report, "worker_id", None) or row.get("worker") or run.worker
    row = rows.finish(row, run_id=run.run_id, reruns=_reruns(run, report),
                      prior=run.prior_attempts.pop(report.nodeid, []), worker=worker)
    write_row(run, report.nodeid, row)


def write_row(run: Run, nodeid: str, row: dict) -> None:
    with run.lock:
        if nodeid in run.written:
            return
        run.written.add(nodeid)
        table.append_row(run.results, row)
        if not row.get("pass"):
            run.failed_rows += 1


def _crash_row(run: Run, report) -> None:
    from harness import classify

    case = run.cases_by_id().get(case_id_of(report.nodeid))
    if case is None:
        return
    death = getattr(report, "harness_death", None)
    worker = getattr(report, "harness_worker", "")
    if death is None:
        node = getattr(report, "node", None)
        worker = node.gateway.id if node is not None else ""
        death = isolation.diagnose(run.state_dir, worker, isolation.worker_exitcode(node))
    stage = death.stage if death.case_id == case.id else ""
    if death.kind == "hang":
        timeout = death.timeout_s or run.timeout_for(case)
        verdict = classify.hang_verdict(case, round(timeout, 1), stage)
    else:
        verdict = classify.crash_verdict(case, death.cause, stage)
    context = death.context or _any_context(run)
    row = rows.from_death(case, verdict, death, stage, context)
    row["worker"] = worker
    recent_ids = death.recent if death.case_id == case.id else []
    by_id = run.cases_by_id()
    recent = [by_id[i] for i in recent_ids if i in by_id]
    if not recent:
        row["isolation"] = "alone"
        _finish_row(run, report, row)
        return
    if run.opt("no_replay"):
        _finish_row(run, report, row)
        return
    timeout = death.timeout_s or run.timeout_for(case)
    run.replays.submit(report, row, case, recent, min(timeout, 600.0))


def _any_context(run: Run) -> dict:
    keys = ("arch", "platform", "target", "target_version", "library_commit", "build_hash",
            "disable_guards")
    for worker_file in Path(run.state_dir).glob("*.json"):
        try:
            ctx = json.loads(worker_file.read_text()).get("context")
        except (OSError, ValueError):
            continue
        if ctx:
            return {k: ctx.get(k, "") for k in keys}
    return {"target": run.opt("target")}


class ReplayQueue:
    """Culprit replay on one background thread, so the controller keeps
    collecting other workers' reports while a fresh process replays."""

    def __init__(self, run: Run):
        self.run = run
        self.jobs: queue.Queue = queue.Queue()
        self.pending: dict[str, tuple] = {}
        self.thread: threading.Thread | None = None

    def submit(self, report, row, case, recent, timeout) -> None:
        self.pending[report.nodeid] = (report, row)
        self.jobs.put((report, row, case, recent, timeout))
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, name="harness-replay", daemon=True)
            self.thread.start()

    def _loop(self) -> None:
        while True:
            report, row, case, recent, timeout = self.jobs.get()
            try:
                iso, note = isolation.classify_replay(case, recent, self.run.opt("target"),
                                                      timeout, env=dict(os.environ))
            except Exception as e:  # the row matters more than the replay
                iso, note = "", f"replay failed: {type(e).__name__}: {e}"
            row = dict(row, isolation=iso)
            if note:
                row["message"] = f"{row['message']} [replay: {note}]"
            if self.pending.pop(report.nodeid, None) is not None:
                _finish_row(self.run, report, row)
            self.jobs.task_done()

    def finish(self, interrupted: bool) -> None:
        if self.thread is not None and not interrupted:
            self.jobs.join()
        for nodeid, (report, row) in list(self.pending.items()):
            if self.pending.pop(nodeid, None) is not None:
                row = dict(row, isolation="")
                row["message"] = f"{row['message']} [replay: interrupted]"
                _finish_row(self.run, report, row)
