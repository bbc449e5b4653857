"""One self-contained HTML report: inline CSS and JS, no external URL, works offline."""
from __future__ import annotations

import datetime as _dt
import functools
import json
from pathlib import Path

import jinja2
import markupsafe
import pandas as pd

from harness.results.cause import shown
from harness.results.columns import ROW
from harness.results.failure_classes import failure_classes, label_of
from harness.results.ledger import known_mask

from . import OUTCOMES, SEVERITY, prepare
from .classes import class_groups
from .compare import CHANGES, compare, side_diffs, summary
from .cross import cross_target, pairs
from .errchart import family_charts
from .header import header
from .rows import attempts_of, row_view, set_anchors, text

_TEMPLATES = Path(__file__).parent / "templates"

COLORS = {
    "match": "#2e7d32", "refused": "#1565c0", "wrong": "#c62828", "silent": "#ef6c00",
    "corrupt": "#6a1b9a", "crash": "#4e0000", "hang": "#795548",
    "unexpected_refusal": "#f9a825", "skipped": "#9e9e9e", "nondeterministic": "#00838f",
    "harness_error": "#455a64",
}


def _visible(value):
    """Every text the template prints, its controls, bidi and zero-width marks written as
    escapes (a page never shows a case id in another order than it is); its own newlines
    and tabs kept. Markup (the template's own HTML) stays Markup."""
    if isinstance(value, markupsafe.Markup):
        return markupsafe.Markup(shown(str(value), "\n\t"))
    return shown(value, "\n\t") if isinstance(value, str) else value


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    # One environment a process: it compiles report.html.j2 once (0.26 s), not per report.
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(_TEMPLATES)),
                             autoescape=True, trim_blocks=True, lstrip_blocks=True,
                             finalize=_visible)
    env.filters["tojson_attr"] = lambda v: json.dumps(v, sort_keys=True)
    return env


def matrix(df: pd.DataFrame) -> dict:
    """Route x family outcome counts, each cell with its worst failing outcome."""
    routes = sorted(df["route"].unique())
    families = sorted(df["family"].unique())
    cells = {}
    for (route, family), part in df.groupby(["route", "family"]):
        counts = {o: int(n) for o, n in part["outcome"].value_counts().items()}
        failing = part[~part["pass"]]
        worst = min(failing["outcome"], key=lambda o: SEVERITY.get(o, -1)) if len(failing) else ""
        cells[(route, family)] = {
            "counts": dict(sorted(counts.items(), key=lambda kv: SEVERITY.get(kv[0], -1))),
            "total": len(part), "fail": len(failing), "worst": worst,
        }
    return {"routes": routes, "families": families, "cells": cells}


def run_headings(columns=ROW) -> list[dict]:
    """The runs table's columns: the row's run columns (harness/results/columns.py), in the
    table's order; ids, commits and hashes shown as code."""
    return [{"name": c.name, "label": c.label or c.name, "code": c.kind == "id"}
            for c in columns if c.run]


def _runs(df: pd.DataFrame) -> list[dict]:
    cols = [h["name"] for h in run_headings()]
    runs = df[cols].astype(str).replace({"None": "", "nan": ""}).drop_duplicates()
    return runs.to_dict("records")


def _unstable(df: pd.DataFrame) -> list[dict]:
    """Rows that are nondeterministic, flaky, or whose attempts disagree."""
    views = [row_view(r) for r in df.to_dict("records")
             if r["outcome"] == "nondeterministic" or text(r.get("flaky")) == "True"
             or len({a["outcome"] for a in attempts_of(r)}) > 1]
    return sorted(views, key=lambda v: (v["pass"], v["case_id"]))


def _changes(base_df: pd.DataFrame, df: pd.DataFrame) -> dict:
    changes = compare(base_df, df)
    groups = {}
    for kind in ("regression", "fix", "new", "removed", "changed"):
        part = changes[changes["change"] == kind]
        groups[kind] = [{
            "case_id": r["case_id"], "route": text(r["route"]),
            "arch": text(r.get("arch", "")),
            "base": text(r["base_outcome"]), "head": text(r["head_outcome"]),
            "base_diff": side_diffs(r, "base"),
            "head_diff": side_diffs(r, "head"),
            "head_pass": text(r["head_pass"]) == "True",
        } for _, r in part.iterrows()]
    return {"summary": summary(changes), "groups": groups}


def context(df: pd.DataFrame, base_df: pd.DataFrame | None = None, title: str = "",
            groups: dict | None = None, repros=None, html_path=None) -> dict:
    """`repros`: the folder `report --repros` wrote its `<slug>.py` scripts into; each class
    whose script is there links to it, relative to `html_path` (the report's file)."""
    df = prepare(df)
    counts = df["outcome"].value_counts()
    classes = failure_classes(df)
    known = df[known_mask(df)]
    by_severity, unstable = class_groups(classes, repros, html_path), _unstable(df)
    known_views = [dict(row_view(r), label=label_of(r)) for r in known.to_dict("records")]
    cross = cross_target(df)
    changes = _changes(base_df, df) if base_df is not None else None
    # Failing rows take the plain `case-…` anchors: the ones a link to a case most often wants.
    used: set[str] = set()
    set_anchors([r for g in by_severity for c in g["classes"] for r in c["rows"]], "", used)
    set_anchors(unstable, "unstable", used)
    set_anchors(known_views, "known", used)
    if changes is not None:
        set_anchors([r for kind in changes["groups"].values() for r in kind], "change", used,
                    where=("arch",))
    if cross:
        set_anchors(cross["rows"], "xt", used, key="key", where=())
    return {
        "title": title,
        "generated": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        # Attribute names are built from these fixed lists only, never from a table's values.
        "outcomes": OUTCOMES, "change_kinds": CHANGES, "colors": COLORS, "header": header(df, classes),
        # Known rows (the ledger's) count apart: neither passes nor new failures.
        "total": len(df), "n_pass": int(df["pass"].sum()) - len(known),
        "n_fail": int((~df["pass"]).sum()), "n_known": len(known),
        "counts": {o: int(counts.get(o, 0)) for o in OUTCOMES},
        "runs": _runs(df), "run_headings": run_headings(), "matrix": matrix(df),
        "class_groups": by_severity, "n_classes": len(classes),
        "multi_arch": len(pairs(df)) > 1, "unstable": unstable, "known": known_views,
        "cross": cross, "charts": family_charts(df, COLORS), "changes": changes,
        "groups": groups,
    }


def render_html(df: pd.DataFrame, path, base_df: pd.DataFrame | None = None,
                title: str = "Attention correctness report", groups: dict | None = None,
                repros=None) -> Path:
    """Write the report to `path` (parents created) and return the path.

    `groups` (reports.groups.side_by_side) adds the per-run counts of tables merged with
    --merge-different; `repros` (report --repros) links each class to its script there."""
    path = Path(path)
    html = _env().get_template("report.html.j2").render(
        **context(df, base_df, title, groups, repros=repros, html_path=path))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html, encoding="utf-8")
    return path
