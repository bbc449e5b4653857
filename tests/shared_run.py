"""One expensive run, shared by the tests that assert on it, once per test session.

Several tests may each assert one thing about the same `harness check` (or pytest over
harness/engine/pytest_root) child run. A module-scoped fixture alone would not share it under xdist: each
worker that picks up one of those tests would start the run again. `once` keeps the run's
JSON-able result in the session's base temp folder, which every xdist worker of the
session shares (pytest-xdist's documented pattern), behind a file lock: the first test to
get there runs it, a test arriving while it runs waits for it, and every later one reads
it back. In conftest.py's SLOW table only the first of those tests carries the run's
seconds, so the others start later, when the result is already there.

Imported by module name (pytest puts this folder on sys.path), like detection_helpers.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import Callable


def session_dir(tmp_path_factory) -> Path:
    """The folder this session's xdist workers share (this process's base temp without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once(tmp_path_factory, name: str, make: Callable[[Path], object]):
    """make(folder)'s result, computed once per session: the first caller runs make in a
    folder of its own and saves the result; every other caller, in any worker, reads it.
    A make that raises saves nothing, so the next caller runs it again (and fails alike)."""
    root = session_dir(tmp_path_factory) / "shared-runs"
    root.mkdir(parents=True, exist_ok=True)
    folder, saved = root / name, root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if saved.exists():
            return json.loads(saved.read_text())
        shutil.rmtree(folder, ignore_errors=True)   # what a make that raised left
        folder.mkdir()
        result = make(folder)
        saved.write_text(json.dumps(result))
        return json.loads(saved.read_text())
