"""Culprit replay on one background thread, so the controller keeps collecting other
workers' reports while a fresh process replays a dead worker's case (child.classify_replay)."""
from __future__ import annotations

import queue
import threading

from harness.engine import child
from harness.engine.plugins.rows_out import finish_row
from harness.engine.session import Run


NOT_AGAIN = "completed in a fresh process"


def confirm_outside(case, recent, target: str, timeout: float) -> tuple[str, str]:
    """(isolation, note) for a worker killed by a signal from outside: the case alone in a
    fresh process, then after its predecessors; NOT_AGAIN when neither dies."""
    alone = child.replay([case], target, timeout)
    if alone:
        return ("culprit" if recent else "alone"), f"dies alone in a fresh process ({alone[1]})"
    if recent:
        after = child.replay(list(recent) + [case], target, timeout)
        if after:
            return "victim", (f"fails only after {len(recent)} earlier case(s), first "
                              f"{recent[0].id} ({after[1]})")
    return "", NOT_AGAIN


def killed_from_outside(row: dict, signal_name: str, recent: int) -> dict:
    """The row of a worker killed from outside whose case then completed in a fresh process:
    not the library's crash but a run that was interrupted (ours to run again), failing."""
    where = f" during {row['stage']}" if row.get("stage") else ""
    after = f" and after its {recent} predecessor(s)" if recent else ""
    return dict(row, outcome="harness_error", severity="harness", isolation="",
                message=(f"the worker was killed by {signal_name} from outside the process"
                         f"{where} (the kernel's OOM killer, an operator or the CI runner): "
                         f"the case completed alone{after} in a fresh process, so the death "
                         f"is not booked as the library's; run it again to judge it"))


class ReplayQueue:
    def __init__(self, run: Run):
        self.run = run
        self.jobs: queue.Queue = queue.Queue()
        self.pending: dict[str, tuple] = {}
        self.thread: threading.Thread | None = None

    def submit(self, report, row, case, recent, timeout, outside: str = "") -> None:
        """outside: the signal that killed the worker when it is one a library does not
        send itself (signals.FROM_OUTSIDE); such a death is replayed even alone."""
        self.pending[report.nodeid] = (report, row)
        self.jobs.put((report, row, case, recent, timeout, outside))
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, name="harness-replay", daemon=True)
            self.thread.start()

    def _loop(self) -> None:
        while True:
            report, row, case, recent, timeout, outside = self.jobs.get()
            try:
                if outside:
                    iso, note = confirm_outside(case, recent, self.run.opt("target"), timeout)
                else:
                    iso, note = child.classify_replay(case, recent, self.run.opt("target"),
                                                      timeout)
            except Exception as e:  # the row matters more than the replay
                iso, note = "", f"replay failed: {type(e).__name__}: {e}"
            if outside and note == NOT_AGAIN:
                row = killed_from_outside(row, outside, len(recent))
            else:
                row = dict(row, isolation=iso)
                if note:
                    row["message"] = f"{row['message']} [replay: {note}]"
            if self.pending.pop(report.nodeid, None) is not None:
                finish_row(self.run, report, row)
            self.jobs.task_done()

    def finish(self, interrupted: bool) -> None:
        if self.thread is not None and not interrupted:
            self.jobs.join()
        for nodeid, (report, row) in list(self.pending.items()):
            if self.pending.pop(nodeid, None) is not None:
                row = dict(row, isolation="")
                row["message"] = f"{row['message']} [replay: interrupted]"
                finish_row(self.run, report, row)
