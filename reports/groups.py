"""Tables of different runs side by side: one column per (target, guards, library commit).

Tables that differ in any of those did not test the same thing, so `report` merges them
only on request (--merge-different), and then counts each group apart instead of mixing them.
"""
from __future__ import annotations

import pandas as pd

from . import OUTCOMES, is_missing, prepare
from .header import guards_text

KEY = ("target", "disable_guards", "library_commit")


def _text(value) -> str:
    return "" if is_missing(value) else str(value)


def signature(df: pd.DataFrame) -> dict[str, frozenset]:
    """The distinct targets, guard settings and library commits of one table's rows."""
    return {"target": frozenset(_text(v) for v in df["target"]),
            "disable_guards": frozenset(guards_text(v) for v in df["disable_guards"]),
            "library_commit": frozenset(_text(v) for v in df["library_commit"])}


def differing(tables: list[pd.DataFrame]) -> list[str]:
    """The KEY columns in which the tables' rows do not all agree."""
    sigs = [signature(t) for t in tables]
    return [col for col in KEY if len({s[col] for s in sigs}) > 1]


def side_by_side(tables: list[pd.DataFrame]) -> dict:
    """{columns: [{target, guards, commit}], rows: [{label, counts}]}, counts in column order.

    Each table is deduplicated on its own first, so the same case of two runs (two commits,
    say) counts once in each group rather than once in all.
    """
    frames = [prepare(t) for t in tables]
    df = pd.concat(frames, ignore_index=True) if frames else prepare(pd.DataFrame())
    df = df.assign(_guards=[guards_text(v) for v in df["disable_guards"]],
                   _target=[_text(v) for v in df["target"]],
                   _commit=[_text(v) for v in df["library_commit"]])
    keys = list(dict.fromkeys(zip(df["_target"], df["_guards"], df["_commit"])))
    parts = [df[(df["_target"] == t) & (df["_guards"] == g) & (df["_commit"] == c)]
             for t, g, c in keys]
    rows = [{"label": "cases", "counts": [len(p) for p in parts]},
            {"label": "pass", "counts": [int(p["pass"].sum()) for p in parts]},
            {"label": "fail", "counts": [int((~p["pass"]).sum()) for p in parts]}]
    for outcome in OUTCOMES:
        counts = [int((p["outcome"] == outcome).sum()) for p in parts]
        if any(counts):
            rows.append({"label": outcome, "counts": counts})
    return {"columns": [{"target": t, "guards": g, "commit": c} for t, g, c in keys],
            "rows": rows}
