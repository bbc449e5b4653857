"""One case performed in this process, start to row: what a worker, the one child runner
(child.py) and `repro --in-process` all do, so each judges a case the same way."""
from __future__ import annotations

import os

from harness.engine import identity, isolation
from harness.engine.row import case_row


def row_context(target) -> dict:
    """The columns every row of this process shares: where it ran and what it tested."""
    try:
        from harness.model import platform_info
        arch = platform_info.arch()
    except Exception as e:  # a row without arch is still a row
        arch = f"unknown ({type(e).__name__})"
    return {
        "arch": arch, "platform": _safe(target.platform), "target": target.name,
        "target_version": _safe(target.version),
        "library_commit": _safe(lambda: identity.library_commit(target)[0]),
        "harness_commit": _safe(identity.harness_commit),
        "shard": os.environ.get("HARNESS_SHARD", ""),   # harness/model/shard.py SHARD_ENV
        "build_hash": _safe(target.build_id),
        # The target's options as this process runs with them, each in its own column.
        **target.options_in_effect(),
    }


def _safe(fn) -> str:
    try:
        return str(fn())
    except Exception as e:
        return f"unknown ({type(e).__name__}: {e})"


def execute_repeated(case, target, repeat: int, on_stage=None):
    """(CaseResult, attempt records): the case `repeat` times, judged over all of them."""
    from harness.engine.attempts import combine_results
    from harness.engine.execute import execute_case

    results = []
    for attempt in range(1, repeat + 1):
        results.append(execute_case(case, target, on_stage=on_stage))
        # No attempt after a crash or on a poisoned device: it would only report the fault
        # again as its own (the row's health probe then retires the worker). After the last
        # attempt there is nothing to decide: the row's own probe follows at once.
        if results[-1].outcome in ("crash", "hang") or (
                attempt < repeat and isolation.health_probe() is not None):
            break
    return combine_results(results)


def perform(case, target, repeat: int, context: dict, on_stage=None, **extra) -> dict:
    """The case's row, every attempt judged."""
    result, attempts = execute_repeated(case, target, repeat, on_stage=on_stage)
    return case_row(case, result, attempts=attempts, repeat=repeat, **context, **extra)


def failure_text(row: dict) -> str:
    parts = [f"{row['outcome']} (expect {row['expect']})"]
    if row.get("max_abs_diff") is not None and row["outcome"] == "wrong":
        parts.append(f"max |diff| {row['max_abs_diff']:.3g}, "
                     f"{row.get('n_wrong')}/{row.get('n_total')} wrong")
    if row.get("stage"):
        parts.append(f"stage {row['stage']}")
    msg = "; ".join(parts)
    return f"{msg}: {row['message']}" if row.get("message") else msg
