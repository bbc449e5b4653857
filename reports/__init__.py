"""Reports over results tables: HTML, Markdown, and base-vs-head / arch-vs-arch compares.

Everything here reads the results table's columns (harness/results/columns.py) and
nothing else: a report can be rebuilt from the JSON lines alone.
"""
from __future__ import annotations


import json
import math
from typing import Any, Iterable

import pandas as pd

from harness.model.classify import OUTCOMES  # noqa: F401  (one outcome list, re-exported)
from harness.results.failure_classes import OUTCOME_ORDER
from harness.results.repro_command import guard_names, options_of, repro_args, typed
from harness.results.summary import diffs_text, output_numbers  # noqa: F401  (re-exported)
from harness.results.table import COLUMNS, EXTRA_COLUMNS, load_table

# Worst first: the order a failing cell or table sorts by.
SEVERITY = {name: rank for rank, name in enumerate(OUTCOME_ORDER)}

# Columns a report reads that a run does not write (the ledger's reason, a shrunk case's
# file, a rerun's flakiness: harness/results/columns.py); prepare() adds them, and the
# columns older tables lack, as empty.
OPTIONAL = EXTRA_COLUMNS


def load_results(paths: Iterable[str]) -> pd.DataFrame:
    """Tables from JSON lines files (harness/results/table.py reads and checks them)."""
    return prepare(load_table([str(p) for p in paths]))


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    return bool(value)


def prepare(df: pd.DataFrame) -> pd.DataFrame:
    """A copy with every column present, `pass` boolean, and one row per (arch, target, case).

    A case run twice in one table (a rerun appended later) keeps its last row.
    """
    df = df.copy()
    for col in COLUMNS + OPTIONAL:
        if col not in df.columns:
            df[col] = None
    df["pass"] = df["pass"].map(_as_bool).astype(bool)   # bool even with no rows
    for col in ("arch", "target", "route", "family", "case_id", "outcome", "severity"):
        df[col] = df[col].fillna("").astype(str)
    if len(df) and df["timestamp"].notna().any():
        df = df.sort_values("timestamp", kind="stable")
    df = df.drop_duplicates(subset=["arch", "target", "case_id"], keep="last")
    return df.reset_index(drop=True)


def is_missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def fmt_diff(value: Any) -> str:
    if is_missing(value):
        return ""
    value = float(value)
    if math.isinf(value) or math.isnan(value):
        return str(value)
    return f"{value:.3g}"


def error_ratio(row: Any) -> float | None:
    """The worst output's max |diff| / its own tolerance (above 1 is wrong); None when the
    row lacks the numbers.

    The recorded error_ratio, else the per-output columns' worst. Only a row from before
    both falls back to max |diff| / tolerance: a row with per-output columns never divides
    one output's diff by the other's tolerance."""
    recorded = row.get("error_ratio")
    if _number(recorded) is not None:
        return _number(recorded)
    per = output_numbers(row)
    if per:
        ratios = [n["ratio"] for n in per if n["ratio"] is not None]
        return max(ratios) if ratios else None
    diff, tol = _number(row.get("max_abs_diff")), _number(row.get("tolerance"))
    if diff is None or tol is None or tol <= 0:
        return None
    return diff / tol


def _number(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def fmt_wrong(row: Any) -> str:
    n_wrong, n_total = row.get("n_wrong"), row.get("n_total")
    if is_missing(n_wrong) or is_missing(n_total):
        return ""
    return f"{int(n_wrong)}/{int(n_total)}"


def params_text(value: Any) -> str:
    """Params as indented JSON, whether the row holds a dict or its JSON string."""
    if is_missing(value):
        return ""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, indent=2, sort_keys=True)


def guards_of(row: Any) -> list[str]:
    return guard_names(row.get("disable_guards"))


def repro_command(row: Any) -> str:
    """The command that re-runs exactly this row's case as its run did."""
    case_json, target = row.get("case_json"), row.get("target")
    return typed(repro_args(str(row.get("case_id")),
                            None if is_missing(target) else str(target),
                            options_of(row),
                            None if is_missing(case_json) or not case_json else str(case_json)))


def sort_failures_first(df: pd.DataFrame) -> pd.DataFrame:
    """Failing rows first, worst outcome first, then route and case id."""
    key = df.assign(_pass=df["pass"].astype(int),
                    _sev=df["outcome"].map(lambda o: SEVERITY.get(o, -1)))
    key = key.sort_values(["_pass", "_sev", "route", "case_id"], kind="stable")
    return key.drop(columns=["_pass", "_sev"])
