"""Leaving a process without the interpreter's teardown, once everything it writes is written.

With torch loaded, Python's own exit (module cleanup, a device context) takes 0.35-0.55 s on
the host, and a `harness check` paid it in series at its end: its xdist workers (which the
controller waits for), then the controller, then the parent. Each of them calls exit_now at
the point where its output is complete: every file it wrote is closed (rows are single
O_APPEND writes, synced by the controller at sessionfinish) and only the standard streams
can still hold bytes, which are flushed here.
"""
from __future__ import annotations

import os
import sys

# Set by `harness check` for its child pytest; its xdist workers inherit it. A pytest run
# without it (the project's own tests, a user's `pytest cases`) exits the ordinary way.
ENV = "HARNESS_FAST_EXIT"


def wanted() -> bool:
    return os.environ.get(ENV) == "1"


def exit_now(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # a reader that went away: nothing more to say
            pass
    os._exit(code)
