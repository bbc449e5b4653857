"""The pytest process's life: tied to its parent, stopped with one line, left fast.

A worker dies with its controller, the run's process with `harness check`; a run that cannot go on
leaves one line (STOP_PREFIX) and exit status 2; under `harness check` the process leaves at
pytest_unconfigure instead of paying the interpreter's teardown (harness/engine/fast_exit.py).
"""
from __future__ import annotations

import os
import sys

import pytest

from harness.engine import fast_exit

# The start of the one line a run that cannot go on leaves on stderr; `harness check`
# shows these lines alone instead of the end of pytest's log.
STOP_PREFIX = "harness: error: "

_EXIT_STATUS = pytest.StashKey[int]()

# Set by `harness check` for its pytest child: the pid whose death ends the run.
PARENT_PID_ENV = "HARNESS_PARENT_PID"


def int_or_none(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def die_with_parent(sig: int, parent: int | None = None) -> None:
    """Have the kernel send `sig` to this process when its parent exits (Linux's
    PR_SET_PDEATHSIG); elsewhere a thread that watches the parent pid. `parent` is the pid
    the parent had: a parent that died before this call is caught too."""
    parent = parent or os.getppid()
    armed = False
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(1, int(sig), 0, 0, 0) == 0   # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            armed = False
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)
        return
    if armed:
        return
    import threading

    def watch():
        import time
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), sig)
    threading.Thread(target=watch, name="harness-parent-watch", daemon=True).start()


def terminate_workers(config) -> None:
    """End xdist's workers (when it started them already), at once."""
    dsession = config.pluginmanager.getplugin("dsession")
    manager = getattr(dsession, "nodemanager", None)
    if manager is not None:
        manager.group.terminate(0.5)


def stop_now(config, run, line: str) -> None:
    """End the run before it writes a row: the one line on stderr, the workers and the
    breadcrumbs gone, exit status 2."""
    print(STOP_PREFIX + line, file=sys.stderr, flush=True)
    terminate_workers(config)
    if run is not None and run.state_dir:
        import shutil
        shutil.rmtree(run.state_dir, ignore_errors=True)
    fast_exit.exit_now(2)


def sigterm(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


@pytest.hookimpl(hookwrapper=True)
def pytest_sessionfinish(session, exitstatus):
    yield
    # After every other sessionfinish: the rows are synced and xdist's workerfinished is sent.
    session.config.stash[_EXIT_STATUS] = int(session.exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    # The last thing pytest does before it returns its exit status.
    if fast_exit.wanted() and _EXIT_STATUS in config.stash:
        fast_exit.exit_now(config.stash[_EXIT_STATUS])


def parent_pid() -> int | None:
    return int_or_none(os.environ.get(PARENT_PID_ENV))


def started_by_check() -> bool:
    """Whether `harness check` started this process (and so locked the table first)."""
    return os.environ.get(PARENT_PID_ENV) is not None and parent_pid() == os.getppid()


def stray_parent_line() -> str:
    value = os.environ.get(PARENT_PID_ENV)
    return (f"{PARENT_PID_ENV}={value!r}: not the pid of this process's parent; it is set by "
            f"`harness check` for its own pytest child (unset it to run pytest directly)")
