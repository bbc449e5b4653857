"""Leaving a process without the interpreter's teardown, once everything it writes is written.

With torch loaded, Python's own exit (module cleanup, a device context) takes 0.35-0.55 s on
the host, and a `harness check` paid it in series at its end: its xdist workers (which the
controller waits for), then the controller, then the parent. Each of them calls exit_now at
the point where its output is complete: every file it wrote is closed (rows are single
O_APPEND writes, synced by the controller at sessionfinish) and only the standard streams
can still hold bytes, which are flushed here.

A coverage run (harness/tools/coverage.py) has more to write that the teardown would have:
libgcov's counters and the Python tracer's data. flush_coverage writes them; exit_now and
every other os._exit of the harness (forked children, a retiring worker) call it first. It
imports nothing: a process that never loaded the library has no counters to write.
"""
from __future__ import annotations

import os
import sys

# Set by `harness check` for its child pytest; its xdist workers inherit it. A pytest run
# without it (the project's own tests, a user's own pytest over pytest_root/) exits the
# ordinary way.
ENV = "HARNESS_FAST_EXIT"


# Writers a coverage run registers (the Python tracer's); none in any other run.
_WRITERS: list = []


def on_flush(writer) -> None:
    """Have flush_coverage call writer() (no arguments) too."""
    _WRITERS.append(writer)


def flush_coverage() -> None:
    """Write what coverage counters this process holds; a no-op outside a coverage run."""
    lib = sys.modules.get("kernels._lib")
    for write in [getattr(lib, "flush_coverage", None), *_WRITERS]:
        if write is not None:
            try:
                write()
            except Exception as e:  # a lost count must not turn into a lost row
                print(f"coverage: could not write counters: {e}", file=sys.stderr)


def wanted() -> bool:
    return os.environ.get(ENV) == "1"


def exit_now(code: int) -> None:
    flush_coverage()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # a reader that went away: nothing more to say
            pass
    os._exit(code)
