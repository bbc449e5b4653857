"""The controller's rows: each case's final report becomes one row in the table, a dead
worker's case a `crash` or `hang` row from its breadcrumbs, a case that raised in the harness
a `harness_error` row; a full disk stops the run with every finished row kept."""
from __future__ import annotations

import json
from pathlib import Path

from harness.engine import isolation, row as rows
from harness.engine.plugins.watchdog import diagnose
from harness.engine.session import ROW_KEY, Run, case_id_of
from harness.model.classify import Verdict, harness_error_verdict
from harness.model.signals import FROM_OUTSIDE

# The stage in which the harness and the adapter build a case's inputs (engine/execute.py,
# plan_run/call.py): no library code has run in it.
BUILDING = "build inputs"
from harness.results import table


def keep_attempt(run: Run, report) -> None:
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


def harness_error_row(run: Run, report, phase: str, what: str) -> None:
    """The row of a case that never produced one: skipped, or a harness error."""
    case = run.cases_by_id().get(case_id_of(report.nodeid))
    if case is None:
        return
    if report.outcome == "skipped":
        row = rows.from_verdict(case, Verdict("skipped", True, _longrepr(report)[:500]),
                                **any_context(run))
    else:
        # A bug in the harness or an adapter: never counted as the library's crash.
        verdict = harness_error_verdict(f"{what}: " + _error_text(report))
        row = rows.from_verdict(case, verdict, error_type=phase, **any_context(run))
    finish_row(run, report, row)


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


def finish_row(run: Run, report, row: dict) -> None:
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


def crash_row(run: Run, report) -> None:
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
    if stage == BUILDING:
        # Before the library was called (an exception there is ours too: execute.py).
        what = (f"no result after {round(death.timeout_s or run.timeout_for(case), 1)} s"
                if death.kind == "hang" else f"the worker died ({death.cause})")
        row = rows.from_verdict(case, harness_error_verdict(
            f"{what} while the harness and the adapter built the inputs, before the library "
            f"was called: not the library's"), stage=stage, error_type=death.kind,
            **(death.context or any_context(run)))
        row["worker"] = worker
        finish_row(run, report, row)
        return
    if death.kind == "hang":
        timeout = death.timeout_s or run.timeout_for(case)
        verdict = classify.hang_verdict(case, round(timeout, 1), stage)
    else:
        verdict = classify.crash_verdict(case, death.cause, stage)
    context = death.context or any_context(run)
    row = rows.from_death(case, verdict, death, stage, context)
    row["worker"] = worker
    recent_ids = death.recent if death.case_id == case.id else []
    by_id = run.cases_by_id()
    recent = [by_id[i] for i in recent_ids if i in by_id]
    outside = death.cause if death.kind == "crash" and death.cause in FROM_OUTSIDE else ""
    if outside and not run.opt("no_replay"):
        # Killed from outside: the library's crash only if the case dies so again.
        timeout = death.timeout_s or run.timeout_for(case)
        run.replays.submit(report, row, case, recent, min(timeout, 600.0), outside)
        return
    if not recent:
        row["isolation"] = "alone"
        finish_row(run, report, row)
        return
    if run.opt("no_replay"):
        finish_row(run, report, row)
        return
    timeout = death.timeout_s or run.timeout_for(case)
    run.replays.submit(report, row, case, recent, min(timeout, 600.0))


def any_context(run: Run) -> dict:
    keys = ("arch", "platform", "target", "target_version", "library_commit", "build_hash",
            "harness_commit", "shard")
    for worker_file in Path(run.state_dir).glob("*.json"):
        try:
            ctx = json.loads(worker_file.read_text()).get("context")
        except (OSError, ValueError):
            continue
        if ctx:   # the target's option columns included, whatever they are
            return {**dict.fromkeys(keys, ""), **ctx}
    return {"target": run.opt("target")}
