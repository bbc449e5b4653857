"""One results row per case, built here and nowhere else.

A row comes from one of three things: a CaseResult (the case ran in a worker,
harness/engine/execute.py), a death (the worker died or hung in the case:
harness/engine/isolation.py's diagnosis), or a harness error (the case raised in the
harness or an adapter before it had a result). Whatever the source, `finish`
stamps the run, judges every attempt (harness/engine/attempts.py) and sets the
severity, so a row's verdict is decided in one place. The columns are
harness/results/columns.py's ROW; the outcomes harness/model/classify.py's OUTCOMES.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone

from harness.engine.attempts import combine_rows
from harness.model.classify import Verdict, severity
from harness.results.columns import from_result

# The columns a CaseResult fills (harness/results/columns.py: each names its field).
FROM_RESULT = from_result()


def _now() -> str:
    # Milliseconds: a run's timeline (benchmarks/timeline.py) tells start-up from throughput.
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _jsonable(v):
    if v is None or isinstance(v, (int, float, str, bool)):
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return str(v)


def _cell(col, value):
    """A CaseResult field as its column holds it: a flag as a bool, an index as JSON, an
    unset text as its column's empty value."""
    if col.kind == "bool":
        return bool(value)
    if col.kind == "index":
        return _jsonable(value)
    return col.empty if value is None and col.empty is not None else value


def case_row(case, result=None, **extra) -> dict:
    """A row's case-derived fields, plus a CaseResult's fields when given."""
    row = {
        "route": case.route, "family": case.family, "case_id": case.id,
        "params": json.dumps(dict(case.params), sort_keys=True), "expect": case.expect,
        "timestamp": _now(),
    }
    if result is not None:
        row.update({col.name: _cell(col, getattr(result, col.result))
                    for col in FROM_RESULT})
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
