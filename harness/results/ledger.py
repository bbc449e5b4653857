"""The reviewed ledger of known per-arch failures (cases/known_failures.json).

A list of {"target", "arch", "case_id", "outcome", "reason"} ("target" may be
left out for the bundled library). A row that matches an entry (same target,
arch, case and outcome) counts as passing and carries the reason in a
`ledger` column: a reviewed finding, still shown in every report. An entry whose case now passes is an error: the ledger
must shrink as fixes land, so nothing stays excused that no longer fails.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd


DEFAULT_PATH = Path(__file__).resolve().parents[2] / "cases" / "known_failures.json"
FIELDS = ("arch", "case_id", "outcome", "reason")
OPTIONAL = ("target",)
from harness.model.routes import DEFAULT_TARGET  # noqa: E402
_OUTCOMES = ("wrong", "silent", "corrupt", "crash", "hang", "nondeterministic",
             "unexpected_refusal", "refused", "match")


def load_ledger(path=None) -> list[dict]:
    """Entries of the ledger file; ValueError naming the file, entry and field when malformed."""
    path = Path(path) if path is not None else DEFAULT_PATH
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text() or "[]")
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: the ledger must be a JSON list of entries, got {type(data).__name__}")
    seen = set()
    for i, entry in enumerate(data):
        where = f"{path}: entry {i}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: must be an object with fields {FIELDS}")
        if isinstance(entry.get("case_id"), str):
            where += f" ({entry['case_id']})"
        for field in FIELDS:
            value = entry.get(field)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{where}: field {field!r} is missing or empty"
                                 + ("; every entry needs a reason" if field == "reason" else ""))
        unknown = set(entry) - set(FIELDS) - set(OPTIONAL)
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}; fields are "
                             f"{FIELDS + OPTIONAL}")
        if not all(o in _OUTCOMES for o in outcomes_of(entry)):
            raise ValueError(f"{where}: field 'outcome' is {entry['outcome']!r}, "
                             f"not one of {_OUTCOMES} (or several joined by '|')")
        key = (entry.get("target", DEFAULT_TARGET), entry["arch"], entry["case_id"])
        if key in seen:
            raise ValueError(f"{where}: a second entry for target {key[0]!r}, arch {key[1]!r}, "
                             f"case {key[2]!r}")
        seen.add(key)
    return data


def outcomes_of(entry: dict) -> list[str]:
    """An entry's outcomes: one, or several joined by "|" for a case whose failure takes
    one of them from run to run (a read past a buffer: garbage, or a SIGSEGV), each one
    reviewed and each one a failure."""
    return [o.strip() for o in str(entry.get("outcome", "")).split("|")]


def _passes_on_its_own(row) -> bool:
    """Whether the row passes without the ledger (so applying a ledger twice changes nothing)."""
    ledgered = isinstance(row.get("ledger"), str) and row.get("ledger")
    return bool(row.get("pass")) and not ledgered


def apply_ledger(df: pd.DataFrame, arch: str, path=None,
                 target: str = DEFAULT_TARGET) -> tuple[pd.DataFrame, list[str]]:
    """Rows of (`target`, `arch`) matching an entry pass, with the reason in `ledger`;
    plus the errors.

    Errors: an entry whose case now passes ("remove the entry"), or whose case
    fails with a different outcome than the entry names. An entry whose case
    is not in the table is not an error: the run may cover a subset.
    """
    entries = [e for e in load_ledger(path)
               if e["arch"] == arch and e.get("target", DEFAULT_TARGET) == target]
    df = df.copy()
    if "ledger" not in df.columns:
        df["ledger"] = None
    errors: list[str] = []
    if not entries or not len(df):
        return df, errors
    on_arch = df["arch"].astype(str) == arch if "arch" in df.columns else pd.Series(True, df.index)
    where = path if path is not None else DEFAULT_PATH
    for entry in entries:
        rows = df.index[on_arch & (df["case_id"] == entry["case_id"])]
        for i in rows:
            outcome = df.at[i, "outcome"]
            label = f"{entry['case_id']} on {target}/{arch}"
            if _passes_on_its_own(df.loc[i]):
                errors.append(f"{where}: remove the entry for {label} (case now passes, "
                              f"outcome {outcome!r}; the entry expected {entry['outcome']!r})")
            elif outcome in outcomes_of(entry):
                df.at[i, "pass"] = True
                df.at[i, "ledger"] = entry["reason"]
            else:
                errors.append(f"{where}: the entry for {label} expects {entry['outcome']!r} "
                              f"but the case gave {outcome!r}; update or remove the entry")
    return df, errors


def apply_ledger_per_arch(df: pd.DataFrame, path=None) -> tuple[pd.DataFrame, list[str]]:
    """apply_ledger on each (target, arch)'s rows of a table that may merge several."""
    parts, errors = [], []
    arch = df["arch"].fillna("").astype(str)
    target = df["target"].fillna(DEFAULT_TARGET).replace("", DEFAULT_TARGET).astype(str) \
        if "target" in df.columns else pd.Series(DEFAULT_TARGET, df.index)
    for (tname, name), part in df.groupby([target, arch], sort=False):
        part, errs = apply_ledger(part, name, path, tname)
        parts.append(part)
        errors.extend(errs)
    return (pd.concat(parts).sort_index() if parts else df), errors
