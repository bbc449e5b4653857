"""Cross-target view: the same cases side by side, one column per (target, arch).

Rows are keyed by case id. Targets name their routes differently
(`fa2.single_prefill`, `sdpa_math.single_prefill`, `fi_fa2.single_prefill`),
so when the tables hold more than one target a row is keyed by the case id
without the route's backend (`single_prefill/strided.q_stride2/bf16-d128-…`)
and a cell lists each of that target's routes that ran it. A row differs
when its cells' outcome sets are not all the same; a failing outcome counts
apart from the same passing one, and neither a cell with no row nor a skipped
route (the target cannot express the case there) is compared. When one set
is the most common, the cells outside it are marked odd.
"""
from __future__ import annotations

from collections import Counter

import pandas as pd

from harness.results.failure_classes import GROUPS, group_of

from . import SEVERITY, fmt_diff, is_missing


def pairs(df: pd.DataFrame) -> list[tuple[str, str]]:
    """The (target, arch) pairs in the table, sorted."""
    return sorted(set(zip(df["target"], df["arch"])))


def _op_key(route: str, case_id: str) -> str:
    op = route.split(".", 1)[1] if "." in route else route
    rest = case_id.split("/", 1)[1] if "/" in case_id else case_id
    return f"{op}/{rest}"


def row_keys(df: pd.DataFrame) -> pd.Series:
    if df["target"].nunique() <= 1:
        return df["case_id"]
    return pd.Series([_op_key(r, c) for r, c in zip(df["route"], df["case_id"])], index=df.index)


def _label(target: str, arch: str, version: str, same_target: bool, same_arch: bool) -> dict:
    if same_target:
        name = arch
    elif same_arch:
        name = target
    else:
        name = f"{target} · {arch}"
    return {"target": target, "arch": arch, "version": version, "name": name}


def _columns(df: pd.DataFrame, found: list[tuple[str, str]]) -> list[dict]:
    versions = {(t, a): "" if is_missing(v) else str(v)
                for t, a, v in zip(df["target"], df["arch"], df["target_version"])}
    same_target = len({t for t, _ in found}) == 1
    same_arch = len({a for _, a in found}) == 1
    return [_label(t, a, versions[(t, a)], same_target, same_arch) for t, a in found]


def _entry(row) -> dict:
    return {"route": row["route"], "backend": str(row["route"]).split(".", 1)[0],
            "outcome": row["outcome"], "pass": bool(row["pass"]),
            "diff": fmt_diff(row["max_abs_diff"]), "case_id": row["case_id"],
            "group": "" if row["pass"] else group_of(row["outcome"], str(row["severity"]))}


def _cell(rows: list[dict]) -> dict:
    if not rows:
        return {"entries": [], "outcome": "", "signature": "", "empty": True, "fail": False}
    entries = sorted((_entry(r) for r in rows), key=lambda e: e["route"])
    worst = min((e["outcome"] for e in entries), key=lambda o: SEVERITY.get(o, -1))
    # A failing refusal (one that does not name the field) differs from a passing one.
    ran = {e["outcome"] + ("" if e["pass"] else " (fail)") for e in entries} - {"skipped"}
    return {"entries": entries, "outcome": worst, "empty": False,
            "signature": "/".join(sorted(ran)), "fail": any(not e["pass"] for e in entries)}


def _mark_odd(cells: list[dict]) -> bool:
    """Mark cells outside the most common outcome set; True when the row differs."""
    counts = Counter(c["signature"] for c in cells if c["signature"])
    ranked = counts.most_common()
    differs = len(ranked) > 1
    common = ranked[0][0] if differs and ranked[0][1] > ranked[1][1] else None
    for c in cells:
        c["odd"] = bool(common and c["signature"] and c["signature"] != common)
    return differs


def cross_target(df: pd.DataFrame) -> dict | None:
    """The view's columns and rows; None when the table holds one (target, arch) pair."""
    found = pairs(df)
    if len(found) < 2:
        return None
    cols = ["target", "arch", "route", "family", "case_id", "outcome", "pass", "max_abs_diff",
            "severity"]
    by_key: dict[str, dict[tuple[str, str], list[dict]]] = {}
    for key, record in zip(row_keys(df), df[cols].to_dict("records")):
        by_key.setdefault(key, {}).setdefault((record["target"], record["arch"]), []).append(record)
    rows = []
    for key in sorted(by_key):
        cells = [_cell(by_key[key].get(pair, [])) for pair in found]
        differs = _mark_odd(cells)
        failing = [g for g in GROUPS if any(e["group"] == g for c in cells for e in c["entries"])]
        family = next(iter(by_key[key].values()))[0]["family"]
        rows.append({"key": key, "family": str(family), "cells": cells,
                     "differs": differs, "fail": any(c["fail"] for c in cells),
                     "severities": " ".join(failing) or "passing"})
    rows.sort(key=lambda r: (not r["differs"], not r["fail"], r["key"]))
    return {
        "columns": _columns(df, found), "rows": rows,
        "keyed_by": "case id" if df["target"].nunique() <= 1 else "operation and case",
        "families": sorted({r["family"] for r in rows}),
        "severities": [g for g in GROUPS + ("passing",)
                       if any(g in r["severities"].split() for r in rows)],
        "n_differs": sum(r["differs"] for r in rows),
    }
