"""The one child runner's children forked from a warm interpreter, for tests whose subject is
what a child reports (its row, its death, its exit status), not the interpreter it starts in.

`repro`, `shrink` and `check-target` run each case through child.run in a fresh interpreter:
`import torch`, 2-3 CPU-seconds, for a case that runs in milliseconds. The `forked_children`
fixture (conftest.py) routes those runs here: one interpreter per test process that has
imported torch and the child runner and nothing of any target, then a fork per run. The
forked child takes on what a spawned one would start with (the run's environment, exactly;
sys.path from its PYTHONPATH; stdout, stderr and the working folder), then runs child.serve
as `python -m harness.engine.child` does: it loads the target itself (a target that cannot
load is its own harness_error row or stderr line), leaves the same breadcrumbs, and its
death becomes its row through child._outcome. The caller's budget is kept by the server,
which kills that child alone (a pidfd: never a pid reused meanwhile) and says so.

What the server imported before the fork (torch, harness.engine.child and what it imports)
read their environment then: a server is kept per environment, less the variables only
what runs after the fork reads (PYTHONPATH, the harness's, kernels' and the test targets'),
and per resource limits and umask. A run with its own stderr or fork source is left to the
spawned child, as is every run where no server can start. The spawned path itself stays
tested by the tests that do not ask for the fixture.

Imported by module name (pytest puts this folder on sys.path), like shared_run; run by
the server as its own code (serve_forever).
"""
from __future__ import annotations

import atexit
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

from harness.engine import child

TESTS = str(Path(__file__).resolve().parent)
ROOT = str(child.ROOT)
# Servers kept per test process; the least recently used is closed past this many (each
# holds an interpreter with torch).
MAX_SERVERS = 3
# Read only by what a forked child imports or runs after the fork (or never by a child).
_AFTER_FORK = ("PYTHONPATH", "PYTEST_CURRENT_TEST", "IGNORED_PARAMS")
_AFTER_FORK_PREFIXES = ("HARNESS_", "KERNELS_")
_BOOT = (f"import sys; sys.path.insert(0, {TESTS!r}); import warm_children; "
         f"sys.path.remove({TESTS!r}); sys.exit(warm_children.serve_forever())")


def _before_fork(env: dict) -> dict:
    return {k: v for k, v in env.items()
            if k not in _AFTER_FORK and not k.startswith(_AFTER_FORK_PREFIXES)}


def _limits() -> tuple:
    """This process's resource limits and umask, which a server keeps from its start."""
    limits = []
    for name in sorted(n for n in dir(resource) if n.startswith("RLIMIT_")):
        try:
            limits.append((name, resource.getrlimit(getattr(resource, name))))
        except (OSError, ValueError):
            pass
    try:        # read, not set and put back: another thread may be creating a file
        mask = next(line for line in Path("/proc/self/status").read_text().splitlines()
                    if line.startswith("Umask:"))
    except (OSError, StopIteration):
        mask = None
    return mask, tuple(limits)


class Server:
    """The test process's handle on one warm interpreter (serve_forever)."""

    def __init__(self, env: dict):
        self.proc = subprocess.Popen([sys.executable, "-c", _BOOT], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=dict(env, PYTHONPATH=ROOT), cwd=ROOT, text=True)
        self.lock = threading.Lock()
        if self.proc.stdout.readline().strip() != "READY":
            self.close()
            raise RuntimeError("the warm interpreter did not start")

    def run(self, request: Path) -> tuple[int, bool] | None:
        """(exit status, killed by the budget) of the child that ran the request; None when
        the server itself is gone."""
        with self.lock:
            try:
                self.proc.stdin.write(f"RUN {request}\n")
                self.proc.stdin.flush()
                answer = self.proc.stdout.readline().split()
            except OSError:
                answer = []
        if len(answer) != 3 or answer[0] != "DONE":
            self.close()
            return None
        return int(answer[1]), answer[2] == "1"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, 9)     # its children too (serve_forever's own group)
        except OSError:
            self.proc.kill()
        self.proc.wait()


_servers: "OrderedDict[tuple, Server]" = OrderedDict()
_cannot_start: list = []      # a server failed to start here once: every run spawns


def _server(env: dict) -> Server | None:
    if _cannot_start:
        return None
    key = (json.dumps(_before_fork(env), sort_keys=True), _limits())
    server = _servers.pop(key, None)
    if server is None or not server.alive():
        try:
            server = Server(_before_fork(env))
        except (OSError, RuntimeError):
            _cannot_start.append(True)
            return None
    _servers[key] = server
    while len(_servers) > MAX_SERVERS:
        _servers.popitem(last=False)[1].close()
    return server


def close_all() -> None:
    while _servers:
        _servers.popitem()[1].close()


atexit.register(close_all)


def forking(spawn):
    """A child.run that forks from a warm server where it can and spawns (`spawn`) where
    it cannot."""
    def run(spec: child.Spec, *, budget_s=None, fork_from=None, env=None, stderr=None):
        env = env or child.child_env()
        server = None if fork_from is not None or stderr is not None else _server(env)
        if server is not None:
            with tempfile.TemporaryDirectory(prefix="harness-fork-") as state_dir:
                request = Path(state_dir) / "request.json"
                request.write_text(json.dumps({"spec": spec.to_json(), "env": env,
                                               "state_dir": state_dir, "budget_s": budget_s}))
                done = server.run(request)
                if done is not None:
                    rows, err = (Path(state_dir) / "rows", Path(state_dir) / "stderr")
                    lines = rows.read_text().splitlines() if rows.exists() else []
                    said = err.read_text(errors="replace") if err.exists() else ""
                    return child._outcome(spec, state_dir, lines, done[0], done[1], said)
        return spawn(spec, budget_s=budget_s, fork_from=fork_from, env=env, stderr=stderr)
    return run


# ------------------------------------------------------------------ the server's side

def _become_the_child(request: dict, base_path: list) -> child.Spec:
    """This forked process as `python -m harness.engine.child` would start: its environment,
    sys.path, argv, standard streams; the spec it serves."""
    import importlib
    env, state_dir = request["env"], request["state_dir"]
    os.environ.clear()
    os.environ.update(env)
    user = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [ROOT] + user + [p for p in base_path if p not in user]
    importlib.invalidate_caches()
    spec_path = os.path.join(state_dir, "spec.json")
    Path(spec_path).write_text(json.dumps(request["spec"]))
    sys.argv = [child.__file__, spec_path, state_dir]
    for fd, name, flags in ((0, os.devnull, os.O_RDONLY),
                            (1, os.path.join(state_dir, "rows"), os.O_WRONLY | os.O_CREAT),
                            (2, os.path.join(state_dir, "stderr"), os.O_WRONLY | os.O_CREAT)):
        os.dup2(os.open(name, flags, 0o644), fd)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    return child.Spec.from_json(request["spec"])


def _child_main(request: dict, base_path: list) -> None:  # pragma: no cover - never returns
    import traceback
    from harness.engine import fast_exit
    code = 1
    try:
        code = child.serve(_become_the_child(request, base_path), request["state_dir"])
    except SystemExit as e:         # as the interpreter would exit
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:           # as an uncaught exception ends an interpreter
        traceback.print_exc()
    finally:
        fast_exit.flush_coverage()  # os._exit skips a coverage run's writers
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:       # noqa: BLE001 - the exit status is what is left
                pass
        os._exit(code)


def serve_forever() -> int:
    import select
    import signal
    os.setpgid(0, 0)          # its children are ended with it (Server.close)
    import torch
    torch.set_num_threads(1)  # no OpenMP pool in this process: a fork inherits no threads
    os.close(os.pidfd_open(os.getpid()))   # no pidfds (Linux < 5.3): no READY, runs spawn
    base_path = [p for p in sys.path if p not in ("", ROOT, TESTS)]
    print("READY", flush=True)
    for line in sys.stdin:
        parts = line.split()
        if len(parts) != 2 or parts[0] != "RUN":
            continue
        request = json.loads(Path(parts[1]).read_text())
        pid = os.fork()
        if pid == 0:
            _child_main(request, base_path)
        pidfd, killed = os.pidfd_open(pid), False
        if not select.select([pidfd], [], [], request["budget_s"])[0]:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            killed = True
        _, status = os.waitpid(pid, 0)
        os.close(pidfd)
        rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        print(f"DONE {rc} {int(killed)}", flush=True)
    return 0
