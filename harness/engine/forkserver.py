"""A clean process that forks one child per case, for a worker whose target runs some cases
each in a process of their own (Target.fork_each).

An xdist worker cannot fork safely: its execnet and device threads may hold locks a forked
child inherits and waits on forever, and the child would hold the worker's pipes open so
the controller never sees the worker die. This server is started by the worker as a fresh
interpreter with no other threads; it loads the target once and forks from that clean
state, so a case costs a fork, not an interpreter. Each child runs the one child runner's
`serve` (child.py): the same breadcrumbs, the same rows, the same way a death becomes a row.

Protocol (lines on stdin / stdout): the worker writes `RUN <spec.json> <state dir>`; the
server forks, waits for the child and answers `DONE <exit status>` (negative: the signal);
the child's rows are in `<state dir>/rows`.

Timing: the server starts before the case's timer (server_for, called by the worker ahead of
the case), so its start-up (an interpreter, torch, the target: 10-21 s on a loaded host) is no
part of any case. Then the forked child's own timer fires first, at the case's timeout, and
its breadcrumbs say the stage it hung in; the worker's budget for the child (slack_s later)
and the worker's own timer (slack_s after that) only act when the child cannot.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from harness.engine import child, fast_exit

# How long a server may take to start (an interpreter, torch, the target) before the case
# that wanted it is a harness_error: its start is ours, never the library's hang.
START_BUDGET_S = 300.0


def slack_s(timeout_s: float) -> float:
    """How long after a forked child's own timer its parent's budget, and then the worker's
    own timer, each wait: a fork, the child's traceback dump and its breadcrumbs fit."""
    return max(10.0, 0.1 * timeout_s)


def worker_timeout(timeout_s: float) -> float:
    """The worker's own timer for a case forked with `timeout_s`: past the child's and past
    the budget the worker gives the child, so the child's stage is what the row says."""
    return timeout_s + 2 * slack_s(timeout_s)


class ForkServer:
    """The worker's handle on its server (started on first use, one per worker)."""

    def __init__(self, target_spec: str, env: dict, start_budget_s: float = START_BUDGET_S):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harness.engine.forkserver", target_spec],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=env, text=True)
        self.lock = threading.Lock()
        ready = _read_line(self.proc, start_budget_s)
        if ready is None or ready.strip() != "READY":
            self.close(kill_children=True)
            said = "no answer" if ready is None else repr(ready.strip())
            raise RuntimeError(f"the fork server for {target_spec} did not start within "
                               f"{start_budget_s:g} s ({said})")

    def run(self, spec_path: str, state_dir: str, budget_s: float | None) -> tuple[int, bool]:
        """(exit status, killed): the status of the child that ran the spec; killed when
        the budget ran out first (the server, and with it the child, is then ended)."""
        with self.lock:
            self.proc.stdin.write(f"RUN {spec_path} {state_dir}\n")
            self.proc.stdin.flush()
            answer = _read_line(self.proc, budget_s)
            if answer is None or not answer.startswith("DONE "):
                self.close(kill_children=True)
                return -9, True
            return int(answer.split()[1]), False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, kill_children: bool = False) -> None:
        if kill_children:
            try:
                os.killpg(self.proc.pid, 9)
            except OSError:
                self.proc.kill()
        else:
            self.proc.kill()
        self.proc.wait()


def _read_line(proc, budget_s: float | None) -> str | None:
    """proc's next stdout line, or None when none came within budget_s."""
    answer: list[str] = []
    reader = threading.Thread(target=lambda: answer.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(budget_s)
    return None if reader.is_alive() or not answer else answer[0]


def forks_each(target, case) -> bool:
    """Whether the case runs in a child forked from its worker: a target that declares
    that a contract's cases may write past their buffers (Target.fork_each) keeps those
    cases from poisoning the rows of whatever its worker runs next. Only on the CPU: a
    forked child cannot use a parent's GPU context. A case skipped before the library is
    called (a capability the target lacks, the size ceiling, the adapter's own skip) is
    never forked: it runs no library code, and its skip costs no child."""
    wanted = getattr(target, "fork_each", frozenset())
    if case.expect not in wanted:
        return False
    import torch
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return False
    from harness.engine.precheck import skip_reason
    return skip_reason(case, target) is None


_SERVERS: dict = {}


def server_for(spec: str) -> "ForkServer":
    """This process's fork server for the target spec (started on first use)."""
    server = _SERVERS.get(spec)
    if server is None or not server.alive():
        server = _SERVERS[spec] = ForkServer(spec, child.child_env())
    return server


def run_spec(case_spec: "child.Spec", budget_s: float | None) -> "child.Outcome":
    """The one child runner's outcome for a spec, its child forked by the fork server: for a
    process that has threads of its own, which cannot fork safely itself."""
    with tempfile.TemporaryDirectory(prefix="harness-fork-") as state_dir:
        spec_path = Path(state_dir) / "spec.json"
        spec_path.write_text(json.dumps(case_spec.to_json()))
        rc, killed = server_for(case_spec.target).run(str(spec_path), state_dir, budget_s)
        rows_path = Path(state_dir) / "rows"
        lines = rows_path.read_text().splitlines() if rows_path.exists() else []
        return child._outcome(case_spec, state_dir, lines, rc, killed, "")


def forked_row(case, spec: str, target, repeat: int, timeout_s: float, context: dict) -> dict:
    """The case's row from a child forked by this worker's fork server (forkserver.py):
    its finished row, or the row of its death. The child's own timer is `timeout_s`."""
    case_spec = child.Spec(target=spec, cases=[case], repeat=repeat, timeout_s=timeout_s)
    out = run_spec(case_spec, timeout_s + slack_s(timeout_s))
    if out.rows:
        return dict(out.rows[-1], isolation=out.rows[-1].get("isolation") or "alone")
    from harness.engine import row as rows
    from harness.model.classify import harness_error_verdict
    return rows.from_verdict(case, harness_error_verdict(
        f"the forked child reported no row (exit status {out.returncode})"), **context)


def _serve_forever(target_spec: str) -> int:
    os.setpgid(0, 0)          # its children are ended with it (ForkServer.close)
    import torch
    torch.set_num_threads(1)  # no OpenMP pool in this process: a fork inherits no threads
    from harness.targets import load_target
    target = load_target(target_spec)
    print("READY", flush=True)
    for line in sys.stdin:
        parts = line.split()
        if len(parts) != 3 or parts[0] != "RUN":
            continue
        spec_path, state_dir = parts[1], parts[2]
        spec = child.Spec.from_json(json.loads(Path(spec_path).read_text()))
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns
            code = 1
            try:
                fd = os.open(os.path.join(state_dir, "rows"), os.O_WRONLY | os.O_CREAT, 0o644)
                os.dup2(fd, 1)
                sys.stdout = os.fdopen(1, "w", buffering=1)
                code = child.serve(spec, state_dir, target=target)
            finally:
                fast_exit.flush_coverage()   # os._exit skips a coverage run's writers
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        print(f"DONE {rc}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_serve_forever(sys.argv[1]))
