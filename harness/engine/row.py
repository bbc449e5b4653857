"""One results row per case, built here and nowhere else.

A row comes from one of three things: a CaseResult (the case ran in a worker,
harness/engine/execute.py), a death (the worker died or hung in the case:
harness/engine/isolation.py's diagnosis), or a harness error (the case raised in the
harness or an adapter before it had a result). Whatever the source, `finish`
stamps the run, judges every attempt (harness/engine/attempts.py) and sets the
severity, so a row's verdict is decided in one place. The columns are
harness/results/table.py's COLUMNS; the outcomes harness/model/classify.py's OUTCOMES.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone

from harness.engine.attempts import combine_rows
from harness.model.classify import Verdict, severity

# o's and lse's own max |diff|, tolerance and ratio (harness/results/table.py COLUMNS).
PER_OUTPUT_COLUMNS = tuple(f"{name}_{what}" for name in ("o", "lse")
                           for what in ("max_abs_diff", "tolerance", "error_ratio"))

def _now() -> str:
    # Milliseconds: a run's timeline (benchmarks/timeline.py) tells start-up from throughput.
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _jsonable(v):
    if v is None or isinstance(v, (int, float, str, bool)):
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return str(v)


def case_row(case, result=None, **extra) -> dict:
    """A row's case-derived fields, plus a CaseResult's fields when given."""
    row = {
        "route": case.route, "family": case.family, "case_id": case.id,
        "params": json.dumps(dict(case.params), sort_keys=True), "expect": case.expect,
        "timestamp": _now(),
    }
    if result is not None:
        row.update(outcome=result.outcome, **{"pass": bool(result.passed)},
                   max_abs_diff=result.max_abs_diff, n_wrong=result.n_wrong,
                   n_total=result.n_total, first_bad_index=_jsonable(result.first_bad_index),
                   message=result.message or "", error_type=result.error_type or "",
                   stage=result.stage or "", duration_s=result.duration_s,
                   tolerance=result.tolerance, baseline_error=result.baseline_error,
                   rel_error=result.rel_error, error_ratio=result.error_ratio,
                   **{col: getattr(result, col, None) for col in PER_OUTPUT_COLUMNS})
    row.update(extra)
    if "outcome" in row:
        row["severity"] = severity(row["outcome"], bool(row.get("pass")))
    return row


def from_verdict(case, verdict: Verdict, **extra) -> dict:
    """A row decided without a CaseResult: a death, a hang, a skip, a harness error."""
    return case_row(case, outcome=verdict.outcome, **{"pass": bool(verdict.passed)},
                    message=verdict.message, **extra)


def from_death(case, verdict: Verdict, death, stage: str, context: dict) -> dict:
    """The row of a case whose worker died or hung in it."""
    return from_verdict(case, verdict, error_type=death.cause, stage=stage, duration_s=None,
                        **context)


def finish(row: dict, *, run_id: str, reruns: int, prior: list, worker: str) -> dict:
    """The row as written: stamped, judged over every attempt, its severity set."""
    row = dict(row, run_id=run_id, reruns=reruns)
    if prior:
        row = combine_rows(prior, row)
    row["severity"] = severity(row.get("outcome", ""), bool(row.get("pass")))
    row.setdefault("isolation", "")
    row["worker"] = worker
    return row
