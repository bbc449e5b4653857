"""Failure classes as the report shows them: grouped by severity, worst first."""
from __future__ import annotations

import os
from pathlib import Path

from harness.results.failure_classes import GROUPS, FailureClass

from . import error_ratio, fmt_diff, output_numbers, repro_command
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


def worst_outputs(cls: FailureClass) -> list[dict]:
    """[{name, diff, ratio}] per output over the class's rows: o's worst max |diff| and its
    worst ratio to o's own tolerance, then lse's the same; [] when no row records them."""
    worst: dict[str, dict] = {}
    for row in cls.rows.to_dict("records"):
        for n in output_numbers(row):
            w = worst.setdefault(n["name"], {"diff": None, "ratio": None})
            w["diff"] = n["diff"] if w["diff"] is None else max(w["diff"], n["diff"])
            if n["ratio"] is not None:
                w["ratio"] = n["ratio"] if w["ratio"] is None else max(w["ratio"], n["ratio"])
    return [{"name": name, "diff": fmt_diff(w["diff"]), "ratio": fmt_ratio(w["ratio"])}
            for name, w in worst.items()]


def repro_link(cls: FailureClass, repros, html_path) -> str:
    """`<repros relative to the HTML file>/<slug>.py` when `report --repros` wrote that
    script, else ''."""
    if not repros:
        return ""
    script = Path(repros) / f"{cls.slug}.py"
    if not script.is_file():
        return ""
    base = Path(html_path).parent if html_path is not None else Path.cwd()
    return Path(os.path.relpath(script.resolve(), base.resolve())).as_posix()


def class_view(index: int, cls: FailureClass, repros=None, html_path=None) -> dict:
    first = cls.rows.iloc[0]
    return {
        "id": f"class-{index}", "label": cls.label, "family": cls.family,
        "outcome": cls.outcome, "severity": cls.severity, "group": cls.group,
        "message": cls.message, "example_message": cls.example_message,
        "routes": cls.routes, "targets": cls.targets, "n_rows": cls.n_rows,
        "stage": cls.stage, "differs": cls.differs, "variants": cls.variants,
        "tensors": cls.tensors, "call_forms": cls.call_forms, "slug": cls.slug,
        "script": repro_link(cls, repros, html_path),
        "example": cls.example, "repro": repro_command(first), "signal": crash_signal(first),
        "max_abs_diff": _worst_diff(cls), "ratio": _worst_ratio(cls),
        "outputs": worst_outputs(cls),
        "rows": [row_view(r) for r in cls.rows.to_dict("records")],
    }


def class_groups(classes: list[FailureClass], repros=None, html_path=None) -> list[dict]:
    """[{group, title, n_rows, classes: [class_view]}] for each group that has a class."""
    views = [class_view(i, c, repros, html_path) for i, c in enumerate(classes)]
    groups = []
    for group in GROUPS:
        members = [v for v in views if v["group"] == group]
        if members:
            groups.append({"group": group, "title": GROUP_TITLES[group], "classes": members,
                           "n_rows": sum(v["n_rows"] for v in members)})
    return groups
