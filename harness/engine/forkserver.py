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


class ForkServer:
    """The worker's handle on its server (started on first use, one per worker)."""

    def __init__(self, target_spec: str, env: dict):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harness.engine.forkserver", target_spec],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=env, text=True)
        self.lock = threading.Lock()
        ready = self.proc.stdout.readline().strip()
        if ready != "READY":
            self.proc.kill()
            raise RuntimeError(f"the fork server for {target_spec} did not start: {ready!r}")

    def run(self, spec_path: str, state_dir: str, budget_s: float | None) -> tuple[int, bool]:
        """(exit status, killed): the status of the child that ran the spec; killed when
        the budget ran out first (the server, and with it the child, is then ended)."""
        with self.lock:
            self.proc.stdin.write(f"RUN {spec_path} {state_dir}\n")
            self.proc.stdin.flush()
            answer: list[str] = []
            reader = threading.Thread(target=lambda: answer.append(self.proc.stdout.readline()),
                                      daemon=True)
            reader.start()
            reader.join(budget_s)
            if reader.is_alive() or not answer or not answer[0].startswith("DONE "):
                self.close(kill_children=True)
                return -9, True
            return int(answer[0].split()[1]), False

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


def forks_each(target, case) -> bool:
    """Whether the case runs in a child forked from its worker: a target that declares
    that a contract's cases may write past their buffers (Target.fork_each) keeps those
    cases from poisoning the rows of whatever its worker runs next. Only on the CPU: a
    forked child cannot use a parent's GPU context."""
    wanted = getattr(target, "fork_each", frozenset())
    if case.expect not in wanted:
        return False
    import torch
    return not (torch.cuda.is_available() and torch.cuda.is_initialized())


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
    its finished row, or the row of its death."""
    case_spec = child.Spec(target=spec, cases=[case], repeat=repeat, case_timeout=timeout_s)
    out = run_spec(case_spec, timeout_s + 30)
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
    from harness.model.case import Case
    from harness.targets import load_target
    target = load_target(target_spec)
    print("READY", flush=True)
    for line in sys.stdin:
        parts = line.split()
        if len(parts) != 3 or parts[0] != "RUN":
            continue
        spec_path, state_dir = parts[1], parts[2]
        data = json.loads(Path(spec_path).read_text())
        spec = child.Spec(target=data["target"], cases=[Case.from_json(c) for c in data["cases"]],
                          disable_guards=data.get("disable_guards"),
                          repeat=int(data.get("repeat") or 1),
                          case_timeout=data.get("case_timeout"))
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
