"""Failure classes as the report shows them: grouped by severity, worst first."""
from __future__ import annotations

from harness.results.failure_classes import GROUPS, FailureClass

from . import error_ratio, fmt_diff, repro_command
from .rows import crash_signal, fmt_ratio, row_view

GROUP_TITLES = {
    "correctness": "Correctness: wrong, silent, corrupt, crashing, hanging or unstable answers",
    "capability": "Capability: valid inputs refused",
    "clarity": "Clarity: refusals that do not name the field",
    "unrated": "Unrated: rows from a table without a severity column",
    "harness": "Harness errors: bugs in the harness or an adapter, not the library",
}


def _worst_diff(cls: FailureClass) -> str:
    diffs = cls.rows["max_abs_diff"].dropna()
    return fmt_diff(diffs.max()) if len(diffs) else ""


def _worst_ratio(cls: FailureClass) -> str:
    ratios = [r for r in map(error_ratio, cls.rows.to_dict("records")) if r is not None]
    return fmt_ratio(max(ratios)) if ratios else ""


def class_view(index: int, cls: FailureClass) -> dict:
    first = cls.rows.iloc[0]
    return {
        "id": f"class-{index}", "label": cls.label, "family": cls.family,
        "outcome": cls.outcome, "severity": cls.severity, "group": cls.group,
        "message": cls.message, "example_message": cls.example_message,
        "routes": cls.routes, "targets": cls.targets, "n_rows": cls.n_rows,
        "example": cls.example, "repro": repro_command(first), "signal": crash_signal(first),
        "max_abs_diff": _worst_diff(cls), "ratio": _worst_ratio(cls),
        "rows": [row_view(r) for r in cls.rows.to_dict("records")],
    }


def class_groups(classes: list[FailureClass]) -> list[dict]:
    """[{group, title, n_rows, classes: [class_view]}] for each group that has a class."""
    views = [class_view(i, c) for i, c in enumerate(classes)]
    groups = []
    for group in GROUPS:
        members = [v for v in views if v["group"] == group]
        if members:
            groups.append({"group": group, "title": GROUP_TITLES[group], "classes": members,
                           "n_rows": sum(v["n_rows"] for v in members)})
    return groups
