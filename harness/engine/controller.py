"""The controller's side of the plugin: reports in, rows out.

Runs in the process that writes the table (the xdist controller, or the lone
pytest process). A worker's row arrives on its call report; a dead worker's
case gets its row from the report xdist makes up for it, with the cause read
from the worker's breadcrumbs (isolation.py) and, when the worker had run
earlier cases, a culprit replay on a background thread.

A watchdog thread here, outside every worker, ends a worker whose case is past its
timeout even when the worker cannot act (stopped with SIGSTOP, or its own timer's thread
never scheduled): it records its verdict in the state folder, then SIGKILLs the worker,
and that case's row is `hang` with the stage it reached.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.engine import child, isolation, row as rows
from harness.results import table
from harness.model.classify import Verdict, harness_error_verdict
from harness.engine.session import ROW_KEY, Run, case_id_of


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


class Controller:
    """Hooks of the process that writes rows: the xdist controller, or the
    lone pytest process without xdist."""

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
        # Without xdist, a full disk stops the run through session.shouldstop (_stop_session).
        self.session = session

    def pytest_runtest_logreport(self, report):
        run = self.run
        if getattr(report, "harness_retired", False):
            return
        if report.outcome == "rerun":
            # An earlier attempt of a case that will run again: it is kept, and
            # the final row is judged over every attempt (harness/engine/attempts.py).
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
            ctx = _any_context(run)
            if ctx.get("arch"):
                try:
                    table.copy_latest(run.results, run.opt("target"), ctx["arch"])
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
        import shutil
        shutil.rmtree(self.run.state_dir, ignore_errors=True)
        lock = getattr(self.run, "table_lock", None)
        if lock is not None:
            lock.release()   # under `harness check` its parent holds it, and removes it


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
        if nodeid in run.written or getattr(run, "stop_reason", None):
            return
        try:
            table.append_row(run.results, row)
        except OSError as e:
            # A full disk: every finished row stays, and the run stops with one line
            # instead of an INTERNALERROR for each report still to come.
            n = len(run.written)
            run.stop_reason = (f"{e.strerror or e}; the run stopped with {n} finished row(s) "
                               f"kept; free space, then continue with --resume")
            _stop_session(run)
            return
        run.written.add(nodeid)
        if not row.get("pass"):
            run.failed_rows += 1


def _stop_session(run: Run) -> None:
    """Ask pytest (and xdist's loop, which reads its own flag) to stop after this report."""
    config = run.config
    dsession = config.pluginmanager.getplugin("dsession")
    if dsession is not None:
        dsession.shouldstop = run.stop_reason
    controller = config.pluginmanager.getplugin("harness-controller")
    session = getattr(controller, "session", None)
    if session is not None:
        session.shouldstop = run.stop_reason


def _crash_row(run: Run, report) -> None:
    from harness.model import classify

    case = run.cases_by_id().get(case_id_of(report.nodeid))
    if case is None:
        return
    death = getattr(report, "harness_death", None)
    worker = getattr(report, "harness_worker", "")
    if death is None:
        node = getattr(report, "node", None)
        worker = node.gateway.id if node is not None else ""
        death = diagnose(run, worker, isolation.worker_exitcode(node))
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


STOP_PREFIX = "harness: error: "   # plugin.STOP_PREFIX: `harness check` shows these lines

# ------------------------------------------------------------------ the watchdog

# No case may take longer than this, whatever --case-timeout and its per-element allowance
# say: past it the watchdog ends the worker (a 128k-context case takes minutes, not hours).
from harness.engine.isolation import CASE_TIMEOUT_CEILING_S  # noqa: E402
WATCHDOG_POLL_S = 0.5
# How long past its timeout a case's worker has to end itself (its faulthandler timer
# dumps every thread's traceback first) before the watchdog ends it.
WATCHDOG_GRACE_S = (3.0, 0.25, 60.0)   # at least, share of the timeout, at most
VERDICT_SUFFIX = ".watchdog"


def watchdog_grace(timeout_s: float) -> float:
    low, share, high = WATCHDOG_GRACE_S
    return max(low, min(high, share * timeout_s))


def _is_child(pid: int) -> bool:
    """Whether pid is this process's child (never a pid reused by another process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return sys.platform != "linux" and pid > 0
    try:
        return int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid()
    except (IndexError, ValueError):
        return False


class Watchdog:
    """Reads each worker's state file and ends a worker whose case is past
    min(its timeout, CASE_TIMEOUT_CEILING_S) plus a grace."""

    def __init__(self, run: Run, poll_s: float = WATCHDOG_POLL_S):
        self.run, self.poll_s = run, poll_s
        self.started: dict[tuple, float] = {}
        self.killed: set[tuple] = set()
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="harness-watchdog", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - a watchdog that dies stops guarding; retry
                pass

    def check(self, now: float | None = None) -> list[str]:
        """One look at every worker; the workers it ended."""
        state_dir = Path(self.run.state_dir or "")
        if not self.run.state_dir or not state_dir.is_dir():
            return []
        now = time.time() if now is None else now
        ended = []
        for path in state_dir.glob("*.json"):
            worker = path.stem
            try:
                inode = path.stat()
            except OSError:
                continue
            state = isolation.read_state(state_dir, worker)
            case_id, pid, timeout = state.get("case_id"), state.get("pid"), state.get("timeout_s")
            if not case_id or not isinstance(pid, int) or not timeout or pid == os.getpid():
                continue
            # The state file is replaced at each case's start: its inode and mtime are that
            # start, seen from outside the worker.
            key = (pid, case_id, inode.st_ino)
            began = self.started.setdefault(key, float(state.get("started") or inode.st_mtime))
            limit = min(float(timeout), CASE_TIMEOUT_CEILING_S)
            if key in self.killed or now - began <= limit + watchdog_grace(limit):
                continue
            if not _is_child(pid):
                continue
            verdict = {"case_id": case_id, "pid": pid, "timeout_s": round(limit, 1),
                       "stage": state.get("stage") or "", "waited_s": round(now - began, 1)}
            tmp = state_dir / f"{worker}{VERDICT_SUFFIX}.tmp"
            tmp.write_text(json.dumps(verdict))
            os.replace(tmp, state_dir / f"{worker}{VERDICT_SUFFIX}")
            self.killed.add(key)
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
            ended.append(worker)
        return ended


def diagnose(run: Run, worker: str, exitcode: int | None) -> isolation.Death:
    """isolation.diagnose, with the watchdog's verdict when it ended the worker: a hang,
    not the SIGKILL that carried it out."""
    death = isolation.diagnose(run.state_dir, worker, exitcode)
    path = Path(run.state_dir) / f"{worker}{VERDICT_SUFFIX}"
    try:
        verdict = json.loads(path.read_text())
    except (OSError, ValueError):
        return death
    if not isinstance(verdict, dict) or verdict.get("case_id") != death.case_id:
        return death
    death.kind = "hang"
    death.timeout_s = verdict.get("timeout_s") or death.timeout_s
    death.cause = (f"timeout after {death.timeout_s:g} s (the worker stopped answering; "
                   f"the controller's watchdog ended it)")
    death.stage = death.stage or verdict.get("stage") or ""
    return death


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
                iso, note = child.classify_replay(case, recent, self.run.opt("target"),
                                                      timeout)
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
