"""What the guard-detection tests share: cases by (route, family, variant), run with
guards turned off in this process or in a fresh one.

Imported by module name (pytest puts this folder on sys.path), as the kernel tests
import test_kernels_routes.
"""
from __future__ import annotations

import json

from cases import generate
from harness.engine.execute import execute_case
from harness.engine import forkserver
from harness.engine.child import Spec
from harness.model.routes import BUNDLED_ROUTES

GUARDS_ENV = "KERNELS_DISABLE_GUARDS"


def cases_by_key(families, routes=BUNDLED_ROUTES) -> dict:
    """The families' cases on `routes`, keyed by (route, family, variant)."""
    return {(c.route, c.family, c.variant): c for c in generate(families, routes)}


def run_guard_off(case, target, guard: str, monkeypatch):
    """The case's result with `guard` (comma-separated guard names) turned off."""
    monkeypatch.setenv(GUARDS_ENV, guard)
    return execute_case(case, target, "cpu")


def replay_guard_off(case, guard: str, monkeypatch):
    """The case run with `guard` off in a process of its own: (kind, cause) if it died
    ("crash" and the signal, or "hang"), else None, as child.replay says it.

    The process is a child forked from a warm fork server (harness/engine/forkserver.py,
    one per test process, started once with the guards on): a fork, not an interpreter
    and torch, per case; the spec carries the guard to the child, as a worker's does."""
    monkeypatch.delenv(GUARDS_ENV, raising=False)   # the server itself starts guarded
    out = forkserver.run_spec(Spec(target="bundled", cases=[case], disable_guards=guard,
                                   case_timeout=60), budget_s=120)
    if not out.died or len(out.rows) != 1:
        return None
    row = out.rows[-1]
    return ("hang" if row["outcome"] == "hang" else "crash"), row.get("error_type") or ""


def failures_with_guards_on(cases, target, monkeypatch) -> list[str]:
    """'id: outcome message' for each case that does not pass with every guard on."""
    monkeypatch.delenv(GUARDS_ENV, raising=False)
    failures = []
    for case in cases:
        r = execute_case(case, target, "cpu")
        if not r.passed:
            failures.append(f"{case.id}: {r.outcome} {r.message}")
    return failures


def keep_references(kept: dict, monkeypatch) -> None:
    """execute_case's reference and baseline of a problem computed the first time a case
    of it is judged, and read back from `kept` after: a module that judges the same cases
    on the faultless library and under several faults pays for each reference once (it
    was 30-40% of judging a case). The key is what build_problem makes the problem from,
    its params and seed, and where it lives: the reference is a function of those alone,
    whatever library ran the case. `kept` lives as long as its owner (a module fixture)."""
    from harness.engine import execute
    from harness.model import reference

    def kept_one(name: str):
        compute = getattr(reference, name)

        def read_or_compute(problem):
            key = (name, problem.seed, str(problem.device),
                   json.dumps(problem.params, sort_keys=True, default=repr))
            if key not in kept:
                kept[key] = compute(problem)
            return kept[key]
        return read_or_compute
    for name in ("attention_reference", "attention_baseline"):
        monkeypatch.setattr(execute, name, kept_one(name))
