"""The run's verdict in words: the console summary, the before/after table of a guards-off
run, which failing rows gate the exit status, and each output's own error as text."""
from __future__ import annotations

import math

from harness.results.numbers import finite_number

# The outputs a row records separately (harness/results/table.py PER_OUTPUT_COLUMNS).
OUTPUTS = ("o", "lse")


def _fmt_diff(v) -> str:
    try:
        v = float(v)
    except (TypeError, ValueError):
        return ""
    return "" if v != v else f"{v:.3g}"


_num = finite_number   # one reader of a hostile table's numbers


def output_numbers(row) -> list[dict]:
    """[{name, diff, tol, ratio}] for o and lse, each with its own max |diff|, its own
    tolerance and their ratio, for the outputs the row compared (none in a table from
    before the per-output columns). A ratio is never one output's diff over the other's
    tolerance."""
    out = []
    for name in OUTPUTS:
        diff = _num(row.get(f"{name}_max_abs_diff"))
        if diff is None:
            continue
        tol = _num(row.get(f"{name}_tolerance"))
        ratio = _num(row.get(f"{name}_error_ratio"))
        if ratio is None and tol is not None and tol > 0:
            ratio = diff / tol
        out.append({"name": name, "diff": diff, "tol": tol, "ratio": ratio})
    return out


def fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return ""
    return "∞×" if ratio == math.inf else f"{ratio:.3g}×"


def output_text(n: dict) -> str:
    """`o 1.5 (30× tol 0.05)`: one output's max |diff|, ratio and tolerance."""
    text = f"{n['name']} {_fmt_diff(n['diff'])}"
    if n["tol"] is not None:
        ratio = fmt_ratio(n["ratio"])
        text += f" ({ratio + ' ' if ratio else ''}tol {_fmt_diff(n['tol'])})"
    return text


def diffs_text(row) -> str:
    """Each compared output's max |diff| against its own tolerance: `o 1.5 (30× tol 0.05);
    lse 0.002 (0.2× tol 0.01)`. A row from before the per-output columns has only the max
    over its outputs, shown bare (its tolerance is o's, and the max may be lse's)."""
    per = output_numbers(row)
    if per:
        return "; ".join(output_text(n) for n in per)
    return _fmt_diff(row.get("max_abs_diff"))


def _fmt_wrong(row) -> str:
    n_wrong, n_total = row.get("n_wrong"), row.get("n_total")
    if n_total is None or n_total != n_total:
        return ""
    return f"{int(n_wrong or 0)}/{int(n_total)}"


def _md_cell(text) -> str:
    return str("" if text is None else text).replace("|", "\\|").replace("\n", " ")


def before_after_table(df, failing_only: bool = True, max_message: int = 120) -> str:
    """Markdown in the style of a PR's "Before this PR" table.

    One line per (route, case): outcome, max |diff| (each output's own against its own
    tolerance: diffs_text), wrong/total and the message, failing rows first (all of them
    when failing_only is False).
    """
    if failing_only:
        df = df[~df["pass"].astype(bool)]
    if not len(df):
        return "_No failing rows._\n"
    df = df.sort_values(["route", "case_id"])
    lines = ["| Route | Case | Result | max \\|diff\\| | wrong/total | Message |",
             "|---|---|---|---|---|---|"]
    for _, row in df.iterrows():
        case = str(row["case_id"]).split("/", 1)[-1]
        msg = str(row.get("message") or "")
        if len(msg) > max_message:
            msg = msg[:max_message - 1] + "…"
        lines.append(f"| {_md_cell(row['route'])} | {_md_cell(case)} | {_md_cell(row['outcome'])} "
                     f"| {_md_cell(diffs_text(row))} | {_fmt_wrong(row)} | {_md_cell(msg)} |")
    return "\n".join(lines) + "\n"


def summary_text(df, wall_s: float | None = None, max_classes: int = 60) -> str:
    """What `check` prints once, at the end: the verdict line (`FAIL: N distinct causes
    ...`), the failure classes (worst first, each once, a message printed once:
    harness/results/failure_classes.py), the route x outcome counts, then one line of
    totals. Never one line per row: that table is the Markdown report's (`--markdown`).
    Each row's own numbers are in its message already, so nothing here repeats them."""
    import pandas as pd

    from harness.results.failure_classes import (classes_text, failure_classes, known_count,
                                                 verdict)

    out = []
    failing = df[~df["pass"].astype(bool)] if len(df) else df
    classes = failure_classes(df) if len(failing) else []
    out.append(verdict(df, classes))
    if classes:
        out.append(classes_text(classes, max_classes=max_classes) + "\n")
    if len(df):
        counts = pd.crosstab(df["route"], df["outcome"], margins=True, margins_name="total")
        out.append(counts.to_string())
    tail = f"\n{len(df)} cases, {len(failing)} failing"
    if len(failing):
        by = failing["severity"].fillna("").replace("", "unrated").value_counts()
        tail += " (" + ", ".join(f"{n} {sev}" for sev, n in by.items()) + ")"
    known = known_count(df)
    if known:
        tail += f", {known} known (ledger: passing for the exit status, not passes)"
    if wall_s is not None:
        tail += f", wall time {wall_s:.1f} s"
    out.append(tail)
    return "\n".join(out)


def gating(df, target_owns_contract: bool, strict: bool):
    """The failing rows that decide the exit status (see the module docstring)."""
    failing = ~df["pass"].astype(bool)
    if strict or target_owns_contract:
        return df[failing]
    return df[failing & df["severity"].isin(["correctness", "harness", ""])]
