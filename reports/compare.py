"""Merge results tables by case id: base vs head, and arch vs arch."""
from __future__ import annotations

import pandas as pd

from harness.results.summary import diffs_text
from harness.results.table import OPTION_COLUMNS, PER_OUTPUT_COLUMNS

from . import prepare

CHANGES = ("regression", "fix", "new", "removed", "changed", "unchanged")
# The per-output columns (o's and lse's own max |diff|, tolerance, ratio) go along, so a
# change shows each output against its own tolerance.
_CARRIED = ("route", "family", "outcome", "pass", "max_abs_diff", "n_wrong", "n_total",
            "message", "target", *OPTION_COLUMNS, "case_json", "ledger", *PER_OUTPUT_COLUMNS)


def side(change, which: str) -> dict:
    """One side (`base` or `head`) of a compare() row as a row: its `<which>_*` columns."""
    prefix = f"{which}_"
    return {k[len(prefix):]: v for k, v in dict(change).items() if str(k).startswith(prefix)}


def head_side(change) -> dict:
    return side(change, "head")


def side_diffs(change, which: str) -> str:
    """That side's max |diff|, o's and lse's each against its own tolerance."""
    return diffs_text(side(change, which))


def _key(base: pd.DataFrame, head: pd.DataFrame) -> list[str]:
    """Cases match by id, and also by arch and target when both tables span the same ones."""
    key = ["case_id"]
    for col in ("arch", "target"):
        shared = set(base[col]) & set(head[col])
        if shared and (len(set(base[col])) > 1 or len(set(head[col])) > 1):
            key.insert(0, col)
    return key


def classify(base_pass, head_pass, base_outcome, head_outcome) -> str:
    if pd.isna(base_outcome) or base_outcome is None:
        return "new"
    if pd.isna(head_outcome) or head_outcome is None:
        return "removed"
    if bool(base_pass) and not bool(head_pass):
        return "regression"
    if not bool(base_pass) and bool(head_pass):
        return "fix"
    if base_outcome != head_outcome:
        return "changed"
    return "unchanged"


def compare(base: pd.DataFrame, head: pd.DataFrame) -> pd.DataFrame:
    """One row per case in either table: base_*/head_* columns and `change`.

    `change` is regression (pass -> fail), fix (fail -> pass), new, removed,
    changed (outcome differs, pass/fail the same) or unchanged.
    """
    base, head = prepare(base), prepare(head)
    key = _key(base, head)
    cols = [c for c in _CARRIED if c not in key]
    merged = pd.merge(base[key + cols], head[key + cols], on=key, how="outer",
                      suffixes=("_base", "_head"), indicator=True)
    out = pd.DataFrame({k: merged[k] for k in key})
    for col in cols:
        out[f"base_{col}"] = merged[f"{col}_base"]
        out[f"head_{col}"] = merged[f"{col}_head"]
    # Route and family come from whichever side has the case.
    for col in ("route", "family", "target"):
        if col in cols:
            out[col] = out[f"head_{col}"].where(merged["_merge"] != "left_only", out[f"base_{col}"])
    out["base_outcome"] = out["base_outcome"].where(merged["_merge"] != "right_only", None)
    out["head_outcome"] = out["head_outcome"].where(merged["_merge"] != "left_only", None)
    out["change"] = [classify(bp, hp, bo, ho) for bp, hp, bo, ho in zip(
        out["base_pass"], out["head_pass"], out["base_outcome"], out["head_outcome"])]
    order = {c: i for i, c in enumerate(CHANGES)}
    out = out.assign(_o=out["change"].map(order)).sort_values(
        ["_o", "route", "case_id"], kind="stable").drop(columns="_o")
    return out.reset_index(drop=True)


def summary(changes: pd.DataFrame) -> dict[str, int]:
    counts = changes["change"].value_counts()
    return {c: int(counts.get(c, 0)) for c in CHANGES}


def arches(df: pd.DataFrame) -> list[str]:
    return sorted(a for a in df["arch"].unique() if a)


def by_arch(df: pd.DataFrame) -> pd.DataFrame:
    """Arch vs arch: one row per (target, case), with outcome/pass/max |diff| per arch.

    Columns: target, route, family, case_id, then `outcome:<arch>`,
    `pass:<arch>`, `max_abs_diff:<arch>`, `diffs:<arch>` (o's and lse's own, diffs_text),
    `wrong:<arch>` for each arch, and
    `differs` (outcomes are not all the same) and `any_fail`.
    """
    df = prepare(df)
    names = arches(df)
    out = df.drop_duplicates(["target", "case_id"])[["target", "route", "family", "case_id"]]
    out = out.set_index(["target", "case_id"])
    for arch in names:
        part = df[df["arch"] == arch].set_index(["target", "case_id"])
        out[f"outcome:{arch}"] = part["outcome"]
        out[f"pass:{arch}"] = part["pass"]
        out[f"max_abs_diff:{arch}"] = part["max_abs_diff"]
        out[f"diffs:{arch}"] = [diffs_text(r) for r in
                                part.reindex(out.index).to_dict("records")]
        out[f"wrong:{arch}"] = [
            f"{int(w)}/{int(t)}" if pd.notna(w) and pd.notna(t) else ""
            for w, t in zip(part["n_wrong"].reindex(out.index), part["n_total"].reindex(out.index))]
    outcome_cols = [f"outcome:{a}" for a in names]
    pass_cols = [f"pass:{a}" for a in names]
    out["differs"] = out[outcome_cols].nunique(axis=1, dropna=False) > 1
    out["any_fail"] = ~out[pass_cols].fillna(True).astype(bool).all(axis=1)
    out = out.reset_index()
    out = out.sort_values(["any_fail", "differs", "route", "case_id"],
                          ascending=[False, False, True, True], kind="stable")
    return out.reset_index(drop=True)
