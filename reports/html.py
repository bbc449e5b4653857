"""One self-contained HTML report: inline CSS and JS, no external URL, works offline."""
from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

import jinja2
import pandas as pd

from . import (OUTCOMES, SEVERITY, fmt_diff, fmt_wrong, guards_of, is_missing, params_text,
               prepare, repro_command, sort_failures_first)
from .compare import arches, by_arch, compare, summary

_TEMPLATES = Path(__file__).parent / "templates"

COLORS = {
    "match": "#2e7d32", "refused": "#1565c0", "wrong": "#c62828", "silent": "#ef6c00",
    "corrupt": "#6a1b9a", "crash": "#4e0000", "hang": "#795548",
    "unexpected_refusal": "#f9a825", "skipped": "#9e9e9e",
}


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(_TEMPLATES)),
                             autoescape=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson_attr"] = lambda v: json.dumps(v, sort_keys=True)
    return env


def _text(value) -> str:
    return "" if is_missing(value) else str(value)


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


def _row_view(row) -> dict:
    return {
        "case_id": row["case_id"], "route": row["route"], "family": row["family"],
        "arch": row["arch"], "target": row["target"], "outcome": row["outcome"],
        "expect": _text(row["expect"]), "pass": bool(row["pass"]),
        "max_abs_diff": fmt_diff(row["max_abs_diff"]), "wrong": fmt_wrong(row),
        "first_bad_index": _text(row["first_bad_index"]), "message": _text(row["message"]),
        "error_type": _text(row["error_type"]), "stage": _text(row["stage"]),
        "params": params_text(row["params"]), "reruns": _text(row["reruns"]),
        "flaky": _text(row["flaky"]), "worker": _text(row["worker"]),
        "guards": ",".join(guards_of(row)), "ledger": _text(row["ledger"]),
        "repro": repro_command(row),
    }


def _runs(df: pd.DataFrame) -> list[dict]:
    cols = ["run_id", "arch", "platform", "target", "target_version", "library_commit",
            "build_hash"]
    runs = df[cols].astype(str).replace({"None": "", "nan": ""}).drop_duplicates()
    return runs.to_dict("records")


def context(df: pd.DataFrame, base_df: pd.DataFrame | None = None, title: str = "") -> dict:
    df = prepare(df)
    counts = df["outcome"].value_counts()
    failing = sort_failures_first(df[~df["pass"]])
    known = df[df["pass"] & df["ledger"].notna() & (df["ledger"].astype(str) != "")]
    ctx = {
        "title": title,
        "generated": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "outcomes": OUTCOMES, "colors": COLORS,
        "total": len(df), "n_pass": int(df["pass"].sum()), "n_fail": int((~df["pass"]).sum()),
        "counts": {o: int(counts.get(o, 0)) for o in OUTCOMES},
        "runs": _runs(df), "matrix": matrix(df),
        "failures": [_row_view(r) for _, r in failing.iterrows()],
        "known": [_row_view(r) for _, r in known.iterrows()],
        "arches": arches(df), "arch_rows": [], "arch_same": 0,
        "changes": None,
    }
    if len(ctx["arches"]) > 1:
        table = by_arch(df)
        shown = table[table["differs"] | table["any_fail"]]
        ctx["arch_same"] = len(table) - len(shown)
        ctx["arch_rows"] = [{
            "case_id": r["case_id"], "route": r["route"], "target": r["target"],
            "cells": [{"arch": a, "outcome": _text(r[f"outcome:{a}"]),
                       "pass": _text(r[f"pass:{a}"]) == "True",
                       "diff": fmt_diff(r[f"max_abs_diff:{a}"]), "wrong": r[f"wrong:{a}"]}
                      for a in ctx["arches"]],
        } for _, r in shown.iterrows()]
    if base_df is not None:
        changes = compare(base_df, df)
        groups = {}
        for kind in ("regression", "fix", "new", "removed", "changed"):
            part = changes[changes["change"] == kind]
            groups[kind] = [{
                "case_id": r["case_id"], "route": _text(r["route"]),
                "arch": _text(r.get("arch", "")),
                "base": _text(r["base_outcome"]), "head": _text(r["head_outcome"]),
                "base_diff": fmt_diff(r["base_max_abs_diff"]),
                "head_diff": fmt_diff(r["head_max_abs_diff"]),
                "head_pass": _text(r["head_pass"]) == "True",
            } for _, r in part.iterrows()]
        ctx["changes"] = {"summary": summary(changes), "groups": groups}
    return ctx


def render_html(df: pd.DataFrame, path, base_df: pd.DataFrame | None = None,
                title: str = "Attention correctness report") -> Path:
    """Write the report to `path` (parents created) and return the path."""
    html = _env().get_template("report.html.j2").render(**context(df, base_df, title))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html, encoding="utf-8")
    return path
