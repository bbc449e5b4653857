"""The results table: one JSON line per case, appended as each case finishes.

Appending one line per row with one O_APPEND write means a run killed at any
moment keeps every row it finished (the kernel holds the line once write()
returns, whatever happens to the process), and two writers never interleave
a line. The file is synced to disk at the end of a run (sync()), not per row:
a per-row fsync cost 0.5-3 ms on the process that writes every row, and
guards only against the whole machine going down mid-run. NaN and inf are kept (a max |diff| can be either), so lines are JSON
with Python's NaN/Infinity extension; pandas and json.loads both read them.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterable, Mapping

COLUMNS = (
    "run_id", "timestamp", "arch", "platform", "target", "target_version",
    "library_commit", "build_hash", "route", "family", "case_id", "params",
    "expect", "outcome", "pass", "max_abs_diff", "n_wrong", "n_total",
    "first_bad_index", "message", "error_type", "stage", "duration_s",
    "severity", "tolerance", "baseline_error", "rel_error", "error_ratio",
    "attempts", "repeat", "profile", "reruns", "isolation", "worker", "disable_guards",
    # compute-sanitizer's first report from `check --sanitizer` (harness/sanitizer.py), or null
    "sanitizer",
)
ISOLATION = ("", "culprit", "victim", "alone")

RESULTS_DIR = Path("results")


def selection_slug(family=None, route=None, case_id=None, cases_file=None,
                   profile=None) -> str:
    """'' for a full run; else a short, file-name-safe name of what the run selected.

    A partial run writes its own table, so it never replaces the full table
    that reports and the ledger read.
    """
    parts = [f"{k}={v}" for k, v in (("family", family), ("route", route), ("case", case_id),
                                     ("cases", Path(cases_file).stem if cases_file else None),
                                     ("profile", profile))
             if v]
    if not parts:
        return ""
    text = re.sub(r"[^A-Za-z0-9_.=,+-]+", "_", "_".join(parts))
    if len(text) > 60:
        text = text[:48] + "-" + hashlib.sha256(text.encode()).hexdigest()[:8]
    return text


def results_path(target: str, arch: str, commit: str, root: str | os.PathLike = RESULTS_DIR,
                 selection: str = "") -> Path:
    """<root>/<target>-<arch>-<commit>.jsonl, or ...-<commit>.partial-<selection>.jsonl."""
    tail = f".partial-{selection}" if selection else ""
    return Path(root) / f"{target}-{arch}-{commit or 'unknown'}{tail}.jsonl"


def default_results_path(target: str, selection: str = "", root: str | os.PathLike | None = None,
                         arch: str | None = None) -> Path:
    """Where a run's table goes: under ./results (or root), keyed by target, arch (this
    machine's unless given: `harness check`'s parent takes its child's, to load no torch),
    commit and, for a partial run, what it selected."""
    from harness import platform_info
    return results_path(target, arch or platform_info.arch(), platform_info.repo_commit(),
                        Path(root) if root is not None else Path.cwd() / RESULTS_DIR, selection)


def latest_path(target: str, arch: str, root: str | os.PathLike = RESULTS_DIR) -> Path:
    """<root>/<target>-<arch>.jsonl: a copy of the latest full run, for reports and CI."""
    return Path(root) / f"{target}-{arch}.jsonl"


def copy_latest(path: str | os.PathLike, target: str, arch: str) -> Path:
    dest = latest_path(target, arch, Path(path).parent)
    if Path(path).resolve() != dest.resolve():
        shutil.copyfile(path, dest)
    return dest


def normalize_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """Every column present, in schema order; params stored as a JSON string."""
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise ValueError(f"row has columns outside the schema: {sorted(unknown)}")
    out = {col: row.get(col) for col in COLUMNS}
    if not isinstance(out["params"], str):
        out["params"] = json.dumps(out["params"] if out["params"] is not None else {},
                                   sort_keys=True)
    if out["isolation"] is None:
        out["isolation"] = ""
    if out["isolation"] not in ISOLATION:
        raise ValueError(f"row isolation must be one of {ISOLATION}, got {out['isolation']!r}")
    for col, default in (("reruns", 0), ("message", ""), ("stage", ""), ("severity", ""),
                         ("error_type", ""), ("worker", ""), ("disable_guards", "")):
        if out[col] is None:
            out[col] = default
    return out


def append_row(path: str | os.PathLike, row: Mapping[str, Any]) -> None:
    """Append one row as one line; it survives the process once this returns."""
    line = json.dumps(normalize_row(row), allow_nan=True, default=str) + "\n"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        data = line.encode()
        # One write() of the whole line: O_APPEND makes it land after every
        # other writer's line, never inside one.
        written = os.write(fd, data)
        while written < len(data):
            written += os.write(fd, data[written:])
    finally:
        os.close(fd)


def sync(path: str | os.PathLike) -> None:
    """Flush a finished run's table to disk."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of one file; a corrupt line raises ValueError naming file and line.

    A torn last line (the writer was killed mid-write) is also corrupt: the
    caller decides whether to repair it, never this reader silently.
    """
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: corrupt results line ({e.msg}): "
                                 f"{line[:80]!r}") from None
            if not isinstance(row, dict) or "case_id" not in row:
                raise ValueError(f"{path}:{lineno}: corrupt results line "
                                 f"(not a row object with a case_id): {line[:80]!r}")
            rows.append(row)
    return rows


def load_table(paths: str | os.PathLike | Iterable[str | os.PathLike]):
    """A DataFrame of every row of every file, in schema column order."""
    import pandas as pd

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    rows: list[dict[str, Any]] = []
    for path in paths:
        rows.extend(read_rows(path))
    df = pd.DataFrame(rows)
    for col in COLUMNS:
        if col not in df.columns:
            df[col] = None
    extra = [c for c in df.columns if c not in COLUMNS]
    df = df[list(COLUMNS) + extra]
    if len(df):
        df["pass"] = df["pass"].astype(bool)
        df["reruns"] = df["reruns"].fillna(0).astype(int)
        df["severity"] = df["severity"].fillna("").astype(str)
        df["max_abs_diff"] = pd.to_numeric(df["max_abs_diff"], errors="coerce")
    return df


def done_case_ids(path: str | os.PathLike) -> set[str]:
    """Case ids that already have a row in `path` (for --resume)."""
    if not Path(path).exists():
        return set()
    return {row["case_id"] for row in read_rows(path)}


def last_run_id(path: str | os.PathLike) -> str | None:
    if not Path(path).exists():
        return None
    rows = read_rows(path)
    return rows[-1].get("run_id") if rows else None


def merge_by_case(tables: Mapping[str, Any], columns=("outcome", "pass", "max_abs_diff")):
    """One row per case id, one column group per table label (arch or commit).

    `tables` maps a label ("gfx942", "base", a commit) to a DataFrame; a
    case missing from a table has NaN in that table's columns.
    """
    import pandas as pd

    parts = []
    for label, df in tables.items():
        last = df.drop_duplicates("case_id", keep="last").set_index("case_id")
        keep = [c for c in columns if c in last.columns]
        sub = last[keep].copy()
        sub.columns = pd.MultiIndex.from_product([[label], keep])
        parts.append(sub)
    meta = pd.concat([df.drop_duplicates("case_id", keep="last")
                      .set_index("case_id")[["route", "family"]] for df in tables.values()])
    meta = meta[~meta.index.duplicated(keep="first")]
    meta.columns = pd.MultiIndex.from_product([["case"], list(meta.columns)])
    return pd.concat([meta] + parts, axis=1).sort_index()
