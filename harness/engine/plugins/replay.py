"""Culprit replay on one background thread, so the controller keeps collecting other
workers' reports while a fresh process replays a dead worker's case (child.classify_replay)."""
from __future__ import annotations

import queue
import threading

from harness.engine import child
from harness.engine.plugins.rows_out import finish_row
from harness.engine.session import Run


class ReplayQueue:
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
