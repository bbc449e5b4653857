"""The one way a case runs in a fresh process outside the xdist workers: culprit replay,
`repro`, `shrink` trials, `explore` draws (forked) and bisect's steps (`repro` a commit).
The parent hands the child a spec (cases or one case id, target, options, repeat,
timeouts); the child leaves a worker's breadcrumbs (isolation.WorkerState) and prints one
`ROW <json>` line per case; a death becomes a row as in the xdist controller
(isolation.diagnose, row.from_death). The user's PYTHONPATH is prepended to, never replaced.
A target that cannot load, or a case that raises in the harness, is a harness_error row:
our set-up failing is never the library crashing.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.engine import fast_exit, isolation

WORKER = "child"
ROOT = Path(__file__).resolve().parents[2]
EXIT_UNKNOWN_CASE = 4
ROW_PREFIX = "ROW "
UNKNOWN_PREFIX = "UNKNOWN "


def child_env(extra: dict | None = None) -> dict:
    """This process's environment for a child: this checkout first on PYTHONPATH, the
    user's own entries kept after it (an out-of-tree target must still import)."""
    env = dict(os.environ)
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + kept)
    env.update(extra or {})
    return env


@dataclass
class Spec:
    target: str
    cases: list = field(default_factory=list)      # Case objects (or case_id to look up)
    case_id: str | None = None
    options: dict | None = None    # {name: value}; None: the environment's (target_options)
    repeat: int = 1
    case_timeout: float | None = None              # None: isolation.case_timeout's own
    # Each case's whole timeout as its parent computed it (the per-element allowance and the
    # repeats included): a forked case's child times out first, at its parent's own timeout.
    timeout_s: float | None = None

    def to_json(self) -> dict:
        return {**vars(self), "cases": [c.to_json() for c in self.cases]}

    @classmethod
    def from_json(cls, data: dict) -> "Spec":
        from harness.model.case import Case
        return cls(**{**data, "cases": [Case.from_json(c) for c in data["cases"]]})

    def timeout_for(self, case) -> float:
        if self.timeout_s:
            return float(self.timeout_s)
        return isolation.case_timeout(dict(case.params), self.case_timeout)


def _init(self, target, *args, options=None, **kw):   # Spec(..., <option name>=value)
    named = {k: kw.pop(k) for k in list(kw) if k not in Spec.__dataclass_fields__}
    _fields_init(self, target, *args, **kw, options={**(options or {}), **named} or options)


_fields_init, Spec.__init__ = Spec.__init__, _init


@dataclass
class Outcome:
    rows: list[dict]                 # every row, finished or made from a death, in order
    returncode: int
    died: bool = False               # the child died inside a case (its row is the last)
    unknown: list[str] | None = None  # the case id was not found: the closest ids
    fault_text: str = ""
    stderr: str = ""
    killed: bool = False             # the caller's budget ran out and the child was killed


# ------------------------------------------------------------------ parent side

def run(spec: Spec, *, budget_s: float | None = None, fork_from=None, env: dict | None = None,
        stderr=None) -> Outcome:
    """Run the spec in a fresh child and wait for it. `fork_from` (a loaded target) forks
    this process instead of starting an interpreter, for the explorer's many small draws;
    everything else, the breadcrumbs and the rows included, is the same."""
    with tempfile.TemporaryDirectory(prefix="harness-child-") as state_dir:
        spec_path = Path(state_dir) / "spec.json"
        spec_path.write_text(json.dumps(spec.to_json()))
        if fork_from is not None:
            lines, rc, killed = _forked(spec, fork_from, state_dir, budget_s)
            err = ""
        else:
            lines, rc, killed, err = _spawned(spec_path, state_dir, budget_s, env, stderr)
        return _outcome(spec, state_dir, lines, rc, killed, err)


def _spawned(spec_path, state_dir, budget_s, env, stderr):
    cmd = [sys.executable, "-m", "harness.engine.child", str(spec_path), state_dir]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr or subprocess.PIPE,
                            env=env or child_env(), cwd=str(ROOT), text=True, errors="replace",
                            start_new_session=False)
    try:
        out, err = proc.communicate(timeout=budget_s)
        killed = False
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        killed = True
    except BaseException:   # Ctrl-C: the child goes too
        proc.kill()
        proc.wait()
        raise
    return out.splitlines(), proc.returncode, killed, err or ""


def _forked(spec: Spec, target, state_dir: str, budget_s: float | None):
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns
        os.close(r)
        code = 1
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(w, 1)
            os.dup2(null, 2)
            sys.stdout = os.fdopen(1, "w", buffering=1)
            import torch
            torch.set_num_threads(1)   # a forked child has no OpenMP pool threads
            code = serve(spec, state_dir, target=target)
        finally:
            fast_exit.flush_coverage()   # os._exit skips a coverage run's writers
            os._exit(code)
    os.close(w)
    data, killed = b"", False
    end = None if budget_s is None else time.monotonic() + budget_s
    with os.fdopen(r, "rb", buffering=0) as pipe:
        while True:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                os.kill(pid, signal.SIGKILL)
                killed = True
                break
            ready, _, _ = select.select([pipe], [], [], left)
            if ready:
                chunk = pipe.read(1 << 16)
                if not chunk:
                    break
                data += chunk
    _, status = os.waitpid(pid, 0)
    rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return data.decode(errors="replace").splitlines(), rc, killed


def _outcome(spec: Spec, state_dir: str, lines: list[str], rc: int, killed: bool,
             err: str) -> Outcome:
    rows = [json.loads(l[len(ROW_PREFIX):]) for l in lines if l.startswith(ROW_PREFIX)]
    unknown = next((json.loads(l[len(UNKNOWN_PREFIX):]) for l in lines
                    if l.startswith(UNKNOWN_PREFIX)), None)
    state = isolation.read_state(state_dir, WORKER)
    if unknown is not None or not state.get("case_id"):
        # The child finished every case it began (or never began one).
        return Outcome(rows, rc, unknown=unknown, stderr=err, killed=killed)
    death = isolation.diagnose(state_dir, WORKER, rc)
    if killed and death.kind == "crash":
        death.kind, death.cause = "hang", "the caller's time budget ran out"
    case = _case_from(state_dir, state["case_id"])
    rows.append(death_row(case, death, death.context or {}))
    return Outcome(rows, rc, died=True, fault_text=death.fault_text, stderr=err, killed=killed)


def _case_from(state_dir: str, case_id: str):
    from harness.model.case import Case
    case = Case.from_json(json.loads((Path(state_dir) / "case.json").read_text()))
    assert case.id == case_id, (case.id, case_id)
    return case


def death_row(case, death: isolation.Death, context: dict) -> dict:
    """The row of a case its process died or hung in: the same row the controller writes."""
    from harness.engine import row as rows
    from harness.model import classify
    verdict = (classify.hang_verdict(case, round(death.timeout_s or 0, 1), death.stage)
               if death.kind == "hang" else classify.crash_verdict(case, death.cause, death.stage))
    return rows.from_death(case, verdict, death, death.stage, dict(context, isolation="alone"))


# ------------------------------------------------------------------ culprit replay

def replay(cases: list, target: str, timeout_s: float, env: dict | None = None
           ) -> tuple[str, str] | None:
    """Run `cases` in order in a fresh child; (kind, cause) if the LAST one dies in it.

    None when the last case completes (whatever its outcome), or when an earlier case
    died first (the sequence did not reach it)."""
    out = run(Spec(target=target, cases=list(cases), case_timeout=timeout_s),
              budget_s=timeout_s * len(cases) + 60, env=env)
    if not out.died or len(out.rows) != len(cases):
        return None
    last = out.rows[-1]
    return ("hang" if last["outcome"] == "hang" else "crash"), last.get("error_type") or ""


def classify_replay(case, recent: list, target: str, timeout_s: float,
                    env: dict | None = None) -> tuple[str, str]:
    """(isolation, note): culprit if the case fails alone, victim if only after `recent`."""
    if not recent:
        return "alone", ""
    alone = replay([case], target, timeout_s, env=env)
    if alone:
        return "culprit", f"fails alone in a fresh process ({alone[1]})"
    after = replay(list(recent) + [case], target, timeout_s, env=env)
    if after:
        return "victim", (f"fails only after {len(recent)} earlier case(s), first "
                          f"{recent[0].id} ({after[1]})")
    return "", f"did not reproduce alone or after {len(recent)} earlier case(s)"


# ------------------------------------------------------------------ child side

def _target_error_row(case, message, context, stage="load target", error_type="TargetLoadError"):
    from harness.engine import row as rows
    from harness.model.classify import harness_error_verdict
    return rows.from_verdict(case, harness_error_verdict(message), stage=stage,
                             error_type=error_type, **context)


def _lookup(spec: Spec, target) -> list:
    """The spec's cases: given, or the one id found in every profile."""
    if spec.cases or not spec.case_id:
        return list(spec.cases)
    from harness.engine.session import all_cases
    by_id = {c.id: c for c in all_cases(target)}
    if spec.case_id in by_id:
        return [by_id[spec.case_id]]
    import difflib
    close = difflib.get_close_matches(spec.case_id, list(by_id), n=5, cutoff=0.4)
    print(UNKNOWN_PREFIX + json.dumps(close or [i for i in by_id if spec.case_id in i][:5]),
          flush=True)
    return []


def serve(spec: Spec, state_dir: str, target=None) -> int:
    """Run the spec's cases here, leaving breadcrumbs in state_dir; exit status 0 whatever
    the outcomes (a row says them), EXIT_UNKNOWN_CASE for an id that is nowhere."""
    from harness.engine.perform import perform, row_context
    from harness.model.target_options import from_env
    state = isolation.WorkerState(state_dir, WORKER)
    if target is None:
        from harness.targets import load_target
        try:
            target = load_target(spec.target)
        except Exception as e:
            context = {"target": spec.target}
            if any(t.__name__ == "BuildError" for x in (e, e.__cause__) if x is not None
                   for t in type(x).__mro__):
                print(f"BuildError: {e}", file=sys.stderr)
                return 5
            for case in spec.cases:
                print(ROW_PREFIX + json.dumps(_target_error_row(case, str(e), context),
                                              default=str), flush=True)
            if not spec.cases:
                print(f"{type(e).__name__}: {e}", file=sys.stderr)
                return 2
            return 0
    target.apply_options(from_env() if spec.options is None else spec.options)
    context = row_context(target)
    state.set_context(context)
    cases = _lookup(spec, target)
    if not cases:
        return EXIT_UNKNOWN_CASE if spec.case_id else 0
    for case in cases:
        (Path(state_dir) / "case.json").write_text(json.dumps(case.to_json()))
        state.begin(case.id, spec.timeout_for(case))
        try:
            row = perform(case, target, spec.repeat, context, on_stage=state.stage)
        except Exception as e:  # noqa: BLE001 - ours, as a check's controller books it
            row = _target_error_row(case, f"harness error in the case: {type(e).__name__}: "
                                    f"{e}", context, "", type(e).__name__)
        state.end(case.id)
        print(ROW_PREFIX + json.dumps(row, allow_nan=True, default=str), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    spec_path, state_dir = (argv or sys.argv[1:])[:2]
    return serve(Spec.from_json(json.loads(Path(spec_path).read_text())), state_dir)


if __name__ == "__main__":
    sys.exit(main())
