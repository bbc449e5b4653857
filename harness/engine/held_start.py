"""A child process started before its parent has decided to run it, and held until then.

`harness check` starts its pytest child at once and lets the child, which imports torch and
the targets anyway, work out what the run is: the selected case ids, the machine's arch
(for the table's default name) and whether the target owns its contract. The child sends
that report (or the one line that says why the run cannot start) to its parent on one pipe,
then waits at its first hook, before it writes anything, for one message on another: "go"
and the results table's path, or the pipe closed without it (the run is called off, and
the child exits having written nothing). The parent so never imports torch or a target,
and the run starts as soon as the child is ready: on an H200 box `import torch` alone is
3.9 s, which the parent used to pay before the child could go.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

GO_FD_ENV = "HARNESS_GO_FD"
REPORT_FD_ENV = "HARNESS_REPORT_FD"
# The exit status of a child whose run was called off (its parent has said why).
EXIT_CALLED_OFF = 2
# How long a called-off child that has reported gets to end its workers before it is killed.
CALL_OFF_WAIT_S = 5.0


class HeldChild:
    """A held child: report() is what it says of the run, go(results) releases it,
    call_off() ends it."""

    def __init__(self, cmd: list[str], cwd, env: dict, quiet: bool):
        # quiet: pytest's console goes to a log file (shown only when pytest itself fails).
        self.log = tempfile.NamedTemporaryFile(prefix="harness-check-", suffix=".log",
                                               delete=False) if quiet else None
        self._reported = False
        go_read, self._go = os.pipe()
        self._report, report_write = os.pipe()
        env = dict(env, **{GO_FD_ENV: str(go_read), REPORT_FD_ENV: str(report_write)})
        try:
            self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=self.log,
                                         stderr=None if self.log is None else subprocess.STDOUT,
                                         pass_fds=(go_read, report_write))
        finally:
            os.close(go_read)
            os.close(report_write)

    def report(self) -> dict | None:
        """The child's report; None when it ended (or closed the pipe) without one."""
        with os.fdopen(self._report, "rb") as pipe:
            raw = pipe.read()
        self._reported = bool(raw)
        try:
            report = json.loads(raw) if raw else None
        except ValueError:
            return None
        return report if isinstance(report, dict) else None

    def go(self, results: Path) -> None:
        os.write(self._go, b"go\t" + os.fsencode(results))
        os.close(self._go)

    def call_off(self) -> None:
        os.close(self._go)
        # It has written nothing (it writes only once released). Once it has reported it
        # reads the closed pipe at once, ends the xdist workers it may have started and
        # exits; one that has not reported yet is still starting up, and is killed.
        try:
            self.proc.wait(timeout=CALL_OFF_WAIT_S if self._reported else 0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.log is not None:
            self.log.close()
            os.unlink(self.log.name)


def is_held() -> bool:
    """In the child: whether a parent holds it (never in xdist workers: see wait_for_go)."""
    return GO_FD_ENV in os.environ


def send_report(report: dict) -> None:
    """In the child: the report of the run, once, before wait_for_go."""
    fd = os.environ.pop(REPORT_FD_ENV, None)
    if fd is None:
        return
    with os.fdopen(int(fd), "wb") as pipe:
        pipe.write(json.dumps(report).encode())


def wait_for_go() -> str | None:
    """In the child: the results table's path once released; None when not held; exits
    (EXIT_CALLED_OFF) when called off. The variables are popped so xdist workers never wait."""
    report_fd = os.environ.pop(REPORT_FD_ENV, None)
    if report_fd is not None:   # a child that had nothing to report: its parent reads EOF
        os.close(int(report_fd))
    fd = os.environ.pop(GO_FD_ENV, None)
    if fd is None:
        return None
    with os.fdopen(int(fd), "rb") as pipe:
        word = pipe.read()
    if not word.startswith(b"go\t"):
        raise SystemExit(EXIT_CALLED_OFF)
    return os.fsdecode(word[3:])
