"""The watchdog: a thread in the controller, outside every worker, that ends a worker whose
case is past its timeout even when the worker cannot act (stopped with SIGSTOP, or its own
timer's thread never scheduled). It records its verdict in the state folder, then SIGKILLs
the worker, and that case's row is `hang` with the stage it reached (diagnose)."""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from harness.engine import isolation
# No case may take longer than this, whatever --case-timeout and its per-element allowance
# say: past it the watchdog ends the worker (a 128k-context case takes minutes, not hours).
from harness.engine.isolation import CASE_TIMEOUT_CEILING_S
from harness.engine.session import Run

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
