"""The one child runner's children forked from a warm fork server, for tests whose subject is
what a child reports (its row, its death, its exit status), not the interpreter it starts in.

`repro`, `shrink` and `check-target` run each case through child.run in a fresh interpreter:
`import torch` and the target, 2-3 CPU-seconds, for a case that runs in milliseconds. The
`forked_children` fixture (conftest.py) routes those runs through a fork server
(harness/engine/forkserver.py, the one the xdist workers use for Target.fork_each): one
interpreter per target and environment in this test process, then a fork per run. The child
is still a process of its own that runs child.serve with the same breadcrumbs, and a death
still becomes its row through child._outcome, as a spawned child's does.

What a fork server cannot give is left to the spawned child: a run with its own environment,
stderr or fork source, and a target the server cannot load (the spawned child's own
harness_error row or one line). A server is keyed by the target spec and the environment a
spawned child would get, so a test that sets a variable gets a server that has it. The
spawned path itself stays tested by the tests that do not ask for the fixture.

Imported by module name (pytest puts this folder on sys.path), like shared_run.
"""
from __future__ import annotations

import atexit
import json
import tempfile
from collections import OrderedDict
from pathlib import Path

from harness.engine import child
from harness.engine.forkserver import ForkServer

# Servers kept per test process; the least recently used is closed past this many (each
# holds an interpreter with torch and a target).
MAX_SERVERS = 3
# Set by pytest for each test: never a difference a child could see.
_UNSEEN = ("PYTEST_CURRENT_TEST",)

_servers: "OrderedDict[tuple, ForkServer]" = OrderedDict()


def _server(spec: str, env: dict) -> ForkServer | None:
    key = (spec, json.dumps({k: v for k, v in env.items() if k not in _UNSEEN}, sort_keys=True))
    server = _servers.pop(key, None)
    if server is None or not server.alive():
        try:
            server = ForkServer(spec, env)
        except RuntimeError:   # the target cannot load there: the spawned child says how
            return None
    _servers[key] = server
    while len(_servers) > MAX_SERVERS:
        _servers.popitem(last=False)[1].close(kill_children=True)
    return server


def close_all() -> None:
    while _servers:
        _servers.popitem()[1].close(kill_children=True)


atexit.register(close_all)


def forking(spawn):
    """A child.run that forks from a warm server where it can and spawns (`spawn`) where
    it cannot."""
    def run(spec: child.Spec, *, budget_s=None, fork_from=None, env=None, stderr=None):
        server = None
        if fork_from is None and env is None and stderr is None:
            server = _server(spec.target, child.child_env())
        if server is None:
            return spawn(spec, budget_s=budget_s, fork_from=fork_from, env=env, stderr=stderr)
        with tempfile.TemporaryDirectory(prefix="harness-fork-") as state_dir:
            spec_path = Path(state_dir) / "spec.json"
            spec_path.write_text(json.dumps(spec.to_json()))
            rc, killed = server.run(str(spec_path), state_dir, budget_s)
            rows = Path(state_dir) / "rows"
            lines = rows.read_text().splitlines() if rows.exists() else []
            return child._outcome(spec, state_dir, lines, rc, killed, "")
    return run
