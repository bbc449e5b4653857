"""A row's compute-sanitizer report, as the readers of a table show it (the replay that
makes one is harness/tools/sanitizer.py)."""
from __future__ import annotations

import json
from typing import Any, Mapping


def report_of(value: Any) -> dict | None:
    """A row's `sanitizer` value as a dict (it may come back as JSON text), else None."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return dict(value) if isinstance(value, Mapping) else None


def where_text(report: Mapping[str, Any]) -> str:
    """The report's `where`, with its address when it reads "is 4 bytes after ..."."""
    where = report.get("where") or ""
    if where.startswith("is ") and report.get("address"):
        where = f"address {report['address']} {where}"
    return where
