"""Waiting on a real run's state instead of on the clock: the tests that signal a running
`harness check` (or pytest over the cases) poll for the state they assert, never sleep a guess.

A run's processes are found by a mark in their environment; a worker's case and stage by
its breadcrumbs (harness/engine/isolation.py: the JSON state file and the stage record, read
the way the controller reads them).

Imported by module name (pytest puts this folder on sys.path), like detection_helpers.
"""
from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path

import pytest

from harness.engine import isolation


def poll(condition, timeout: float = 120.0, every: float = 0.1):
    """condition()'s first truthy value, or the test fails after `timeout` seconds."""
    end = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout} s waiting for {condition.__name__}")
        time.sleep(every)


def new_mark() -> tuple[str, str]:
    """(variable, value): set in a run's environment, every process of it carries it."""
    return "FAULTS_RUN_MARK", uuid.uuid4().hex


def marked(mark: str) -> list[int]:
    """Pids of live processes whose environment holds `mark` ("NAME=value"; zombies are
    not processes)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if mark.encode() not in (proc / "environ").read_bytes():
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(proc.name))
    return found


def worker_in_a_case(mark: str, stage: str | None = None,
                     case_id: str | None = None) -> tuple[int, str] | None:
    """(pid, case id) of a worker of the marked run that is inside a case (that case, at
    that stage, when given), or None."""
    # Where isolation.state_tempdir() puts them: /dev/shm, else the temp folder.
    roots = [p for p in (Path("/dev/shm"), Path(tempfile.gettempdir())) if p.is_dir()]
    for state_dir in (d for root in roots for d in root.glob("harness-state-*")):
        for path in state_dir.glob("gw*.json"):
            state = isolation.read_state(state_dir, path.stem)
            pid, now = state.get("pid"), state.get("case_id")
            if not now or not isinstance(pid, int):
                continue
            if (case_id is not None and now != case_id) or \
                    (stage is not None and state.get("stage") != stage):
                continue
            if pid in marked(mark):
                return pid, now
    return None
