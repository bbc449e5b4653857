"""The plugin's side of the held start (harness/engine/held_start.py): what a held child
reports of its run before it may go, and the wait for the go."""
from __future__ import annotations

import os

import pytest

from harness.engine import held_start
from harness.engine.plugins.lifecycle import int_or_none
from harness.engine.plugins.options import check_options, one_line, run_options, setup_errors
from harness.engine.session import RUN, Run

# Set by `harness check` for its pytest child: the pid whose death ends the run.
PARENT_PID_ENV = "HARNESS_PARENT_PID"


def run_report(config, run: Run) -> dict:
    """The selected case ids, the arch that names a default table and whether the target owns
    its contract; or, when the options cannot make a run, {"error": one line}."""
    from harness.model import platform_info
    try:
        check_options(config)
        setup_error = setup_errors(config)
        if setup_error:
            return {"error": setup_error}
        ids = [c.id for c in run.cases()]
        owns = bool(getattr(run.target(), "owns_contract", False))
        # An option's variable set by hand, not by the option: one line now instead of
        # every case's harness_error row.
        env_error = run.target().environment_error(run_options(config))
        if env_error:
            return {"error": env_error}
    # An unknown name or file, or a target whose library is missing or cannot run here
    # (its message says what to install): one line, and nothing runs.
    except (pytest.UsageError, ValueError, OSError, RuntimeError, ImportError) as why:
        return {"error": one_line(why)}
    return {"ids": ids, "arch": platform_info.arch(), "owns_contract": owns,
            **run.identity(),   # the library's name and commit, which name the table
            "costs": run.costs()}   # each case's estimated cost, for the parent's ETA


def held_env_error() -> str | None:
    """One line when the held-start variables name no pipe (set by hand, or left over in
    an environment): else the wait for the go dies in a traceback."""
    for name in (held_start.GO_FD_ENV, held_start.REPORT_FD_ENV):
        value = os.environ.get(name)
        if value is None:
            continue
        fd = int_or_none(value)
        if fd is None or fd < 0:
            return (f"{name}={value!r}: not a file descriptor; it is set by `harness check` "
                    f"for its own pytest child (unset it to run pytest directly)")
        try:
            os.fstat(fd)
        except OSError:
            return (f"{name}={value}: no such open file descriptor; it is set by `harness check` "
                    f"for its own pytest child (unset it to run pytest directly)")
    return None


def workers_start_first(config) -> bool:
    return (held_start.is_held() and not config.getoption("resume")
            and not config.getoption("collectonly")
            and config.pluginmanager.hasplugin("xdist")
            and config.getoption("dist", "no") != "no")


def hold(config) -> None:
    """A held child reports the run and waits for the go."""
    run = config.stash[RUN]
    if held_start.is_held():
        held_start.send_report(run_report(config, run))
    results = held_start.wait_for_go()   # before anything is written
    if results is not None:
        config.option.results = results


def parent_pid() -> int | None:
    return int_or_none(os.environ.get(PARENT_PID_ENV))


def held_start_parent() -> bool:
    """Whether `harness check` started this process (and so locked the table first)."""
    return os.environ.get(PARENT_PID_ENV) is not None and parent_pid() == os.getppid()
