"""The pytest controller watched from outside, by `harness check`'s parent process.

The controller watches its workers (a stopped or hung worker becomes a `hang` row), but
nothing inside the run can watch the controller itself: a controller that is stopped
(SIGSTOP, a job-control stop of that process alone) writes no row and ends no worker,
and the run would wait forever. The parent reads the controller's state from
/proc/<pid>/stat each time it polls the table; one stopped for longer than a case may
take (the run's case timeout) is ended: continued with SIGTERM pending (the plugin's
handler writes what it has and ends the workers), then killed if it lingers. The parent
then says what stopped the run, the rows kept and the resume command, as for Ctrl-C.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

GRACE_S = 10.0   # a continued controller's time to write what it has before SIGKILL


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of `pid` (R, S, D, T, t, Z...); None where it cannot
    be read (gone, or no /proc)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # pid (comm) state ...: comm may hold spaces and parentheses, so read after the last ')'.
    rest = text[text.rfind(")") + 1:].split()
    return rest[0] if rest else None


class ControllerWatch:
    """Call tick() at each poll; it ends a controller stopped longer than `limit_s` and
    returns the reason (one phrase), else None."""

    def __init__(self, proc: subprocess.Popen, limit_s: float, clock=time.monotonic):
        self.proc, self.limit_s, self.clock = proc, float(limit_s), clock
        self.stopped_since: float | None = None
        self.reason: str | None = None

    def tick(self) -> str | None:
        if self.reason is not None or self.proc.poll() is not None:
            return self.reason
        if process_state(self.proc.pid) != "T":
            self.stopped_since = None
            return None
        now = self.clock()
        if self.stopped_since is None:
            self.stopped_since = now
            return None
        if now - self.stopped_since < self.limit_s:
            return None
        self.reason = (f"the pytest controller (pid {self.proc.pid}) was stopped for "
                       f"{now - self.stopped_since:.0f} s, past the case timeout of "
                       f"{self.limit_s:g} s; it was ended")
        self.end()
        return self.reason

    def end(self) -> None:
        """SIGTERM, then SIGCONT so it is handled; SIGKILL after GRACE_S."""
        for sig in (signal.SIGTERM, signal.SIGCONT):
            try:
                os.kill(self.proc.pid, sig)
            except ProcessLookupError:
                return
        try:
            self.proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
