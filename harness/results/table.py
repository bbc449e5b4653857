"""The results table: one JSON line per case, appended as each case finishes.

Appending one line per row with one O_APPEND write means a run killed at any
moment keeps every row it finished (the kernel holds the line once write()
returns, whatever happens to the process), and two writers never interleave
a line. The file is synced to disk at the end of a run (sync()), not per row:
a per-row fsync cost 0.5-3 ms on the process that writes every row, and
guards only against the whole machine going down mid-run. NaN and inf are kept (a max |diff| can be either), so lines are JSON
with Python's NaN/Infinity extension; pandas and json.loads both read them.

One writer per table: a run holds TableLock (an flock on `<table>.lock`, which names
the pid) for its whole life, and a table is replaced only by renaming a new file over
it, so a reader never sees it half-gone. Every reader goes through read_rows, which
treats the file as hostile input: each column has a type, outcomes come from the known
list, names that end up in paths or markup match SAFE_NAME, one run never has two rows
for a case, and a torn last line (its writer was stopped mid-write) counts as unwritten.
"""
from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

from harness.results.columns import (COLUMNS, EXTRA_COLUMNS, ISOLATION,  # noqa: F401
                                     OPTION_COLUMNS, PER_OUTPUT_COLUMNS, ROW, SAFE_NAME)
from harness.results.columns import checks, of_kind

# The columns, their order and their types are harness/results/columns.py's ROW: a table
# holds COLUMNS (what every run writes) and may hold EXTRA_COLUMNS (read, never written).

RESULTS_DIR = Path("results")


class TableError(ValueError):
    """A table that cannot be read as rows, as one line naming the file, line and field."""


class TableBusy(RuntimeError):
    """Another run holds the table: one line naming the table and the pid holding it."""


def _digest_of(path) -> str:
    try:
        data = Path(path).read_bytes()
    except OSError:
        data = os.fsencode(str(path))   # the run says why the file cannot be read
    return hashlib.sha256(data).hexdigest()[:12]


def selection_slug(family=None, route=None, case_id=None, cases_file=None,
                   profile=None, shard=None) -> str:
    """'' for a full run; else a short, file-name-safe name of what the run selected.

    A partial run writes its own table, so it never replaces the full table
    that reports and the ledger read. A cases file is named by its content's digest:
    two files of one name (cases.json in two folders) are two selections, and
    one file edited between runs is a new one.
    """
    parts = [f"{k}={v}" for k, v in (("family", family), ("route", route), ("case", case_id),
                                     ("cases", _digest_of(cases_file) if cases_file else None),
                                     ("profile", profile),
                                     ("shard", str(shard).replace("/", "of") if shard else None))
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
                         arch: str | None = None, commit: str | None = None) -> Path:
    """Where a run's table goes: under ./results (or root), keyed by target, arch (this
    machine's unless given: `harness check`'s parent takes its child's, to load no torch),
    the library's commit (`harness check` passes it from its child's report; without it, a
    plain pytest run, this checkout's) and, for a partial run, what it selected."""
    from harness.model import platform_info
    if commit is None:
        commit = platform_info.repo_commit()
    return results_path(target, arch or platform_info.arch(), commit,
                        Path(root) if root is not None else Path.cwd() / RESULTS_DIR, selection)


def latest_path(target: str, arch: str, root: str | os.PathLike = RESULTS_DIR) -> Path:
    """<root>/<target>-<arch>.jsonl: a copy of the latest full run, for reports and CI."""
    return Path(root) / f"{target}-{arch}.jsonl"


def replace_with(path: str | os.PathLike, data: bytes = b"") -> None:
    """Give `path` new contents by renaming a new file over it: a reader holding the
    old file keeps reading it whole, and no moment exists where the table is missing."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def copy_latest(path: str | os.PathLike, target: str, arch: str) -> Path:
    if not SAFE_NAME.match(str(arch)) or not SAFE_NAME.match(str(target)):
        raise TableError(f"{path}: arch {arch!r} or target {target!r} is not a safe name "
                         f"({SAFE_NAME.pattern}); the latest-table copy is not written")
    dest = latest_path(target, arch, Path(path).parent)
    if Path(path).resolve() != dest.resolve():
        replace_with(dest, Path(path).read_bytes())
    return dest


# ------------------------------------------------------------------ one writer

def lock_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".lock")


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return text if text.isdigit() else ""


class TableLock:
    """An exclusive flock on `<table>.lock` for a run's whole life; the file holds the pid.

    The lock goes with the process (the kernel drops an flock when its last descriptor
    closes), so a run killed with -9 leaves nothing locked. The holder removes the file when
    it is done; a lock is only held once the file it locked is still the one at the path
    (else another run removed it meanwhile, and it locks the new one).
    """

    def __init__(self, path: str | os.PathLike, fd: int, owner: bool):
        self.path, self.fd, self.owner = Path(path), fd, owner

    @classmethod
    def acquire(cls, path: str | os.PathLike, adopt_parent: bool = False) -> "TableLock":
        """The lock, or TableBusy. With adopt_parent, a lock held by this process's parent
        (`harness check`, which locks before it releases its pytest child) counts as held
        for this process too; a thread takes it over should the parent die first."""
        import fcntl
        lock = lock_path(path)
        lock.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(20):
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
                pid = _holder(fd)
                if adopt_parent and pid and int(pid) == os.getppid():
                    held = cls(path, fd, owner=False)
                    import threading
                    threading.Thread(target=held._take_over, name="harness-table-lock",
                                     daemon=True).start()
                    return held
                os.close(fd)
                raise TableBusy(f"{path} is being written by another run (pid "
                                f"{pid or 'unknown'}); wait for it to end, or choose another "
                                f"--results or --results-dir") from None
            if _same_file(fd, lock):
                held = cls(path, fd, owner=True)
                held._stamp()
                return held
            os.close(fd)   # removed by its last holder after we opened it: lock the new one
        raise TableBusy(f"{path}: its lock file {lock} keeps changing; another run is starting "
                        f"and ending on it")

    def _stamp(self) -> None:
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)

    def _take_over(self) -> None:
        import fcntl
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)   # returns when the parent's lock is gone
            if _same_file(self.fd, lock_path(self.path)):
                self.owner = True
                self._stamp()
        except OSError:
            pass

    def release(self) -> None:
        """Remove the lock file (when this process holds it) and let go."""
        if self.fd < 0:
            return
        if self.owner and _same_file(self.fd, lock_path(self.path)):
            try:
                os.unlink(lock_path(self.path))
            except OSError:
                pass
        os.close(self.fd)
        self.fd = -1


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def holder_of(path: str | os.PathLike) -> str | None:
    """The pid (as text, '' when unknown) of the run holding the table's lock; None when free."""
    import fcntl
    lock = lock_path(path)
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _holder(fd)
    finally:
        os.close(fd)
    return None


# ------------------------------------------------------------------ rows

# What a null is written as, where a column says (reruns 0, a message "", ...).
_EMPTY = {c.name: c.empty for c in ROW if c.written and c.empty is not None}


def normalize_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """Every column present, in schema order; params stored as a JSON string."""
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise ValueError(f"row has columns outside the schema: {sorted(unknown)}")
    out = {col: row.get(col) for col in COLUMNS}
    if not isinstance(out["params"], str):
        out["params"] = json.dumps(out["params"] if out["params"] is not None else {},
                                   sort_keys=True)
    for col, empty in _EMPTY.items():
        if out[col] is None:
            out[col] = empty
    if out["isolation"] not in ISOLATION:
        raise ValueError(f"row isolation must be one of {ISOLATION}, got {out['isolation']!r}")
    return out


class TableWriteError(OSError):
    """The table cannot take another row (a full disk, a file-size limit): one line."""


def append_row(path: str | os.PathLike, row: Mapping[str, Any]) -> None:
    """Append one row as one line; it survives the process once this returns.

    A write that fails part-way (ENOSPC, EFBIG) is cut back to the line before it, so
    the table ends on a whole row and the run's one error says what happened.
    """
    line = json.dumps(normalize_row(row), allow_nan=True, default=str) + "\n"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    start = None
    try:
        data = line.encode()
        start = os.fstat(fd).st_size
        # One write() of the whole line: O_APPEND makes it land after every
        # other writer's line, never inside one.
        written = os.write(fd, data)
        while written < len(data):
            written += os.write(fd, data[written:])
    except OSError as e:
        if start is not None:
            try:
                os.ftruncate(fd, start)   # one writer per table (TableLock): only ours to cut
            except OSError:
                pass
        why = {errno.ENOSPC: "the disk is full", errno.EFBIG: "the file-size limit is reached",
               errno.EDQUOT: "the disk quota is exceeded"}.get(e.errno, e.strerror or str(e))
        raise TableWriteError(e.errno, f"cannot append a row to {path}: {why}") from None
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
    except OSError:
        pass
    finally:
        os.close(fd)


# ------------------------------------------------------------------ the typed loader

# Numbers keep NaN (a max |diff| may be NaN); in any other column NaN is a missing cell.
_FLOATS = of_kind("num")
# column -> (check, what it must be), for every column a table may hold
SCHEMA: dict[str, tuple] = checks(ROW)


def _no_constant(name: str):
    return float(name)   # NaN, Infinity, -Infinity: numbers a max |diff| may be


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_row(row: Any, where: str) -> dict:
    """The row, or TableError naming `where` and the first field that breaks the schema."""
    if not isinstance(row, dict):
        raise TableError(f"{where}: corrupt results line (not a row object with a case_id)")
    if "case_id" not in row:
        raise TableError(f"{where}: corrupt results line (not a row object with a case_id)")
    for col, value in list(row.items()):
        if isinstance(value, float) and math.isnan(value) and col not in _FLOATS:
            # A table written through pandas has NaN for every missing cell.
            row[col] = value = None
        rule = SCHEMA.get(col)
        if rule is None:
            raise TableError(f"{where}: field {_show(col)} is not a results column")
        check, what = rule
        if not check(value):
            raise TableError(f"{where}: field {col!r} must be {what}, got {_show(value)}")
    for col in ("outcome", "pass"):
        if col not in row:
            raise TableError(f"{where}: field {col!r} is missing")
    return row


def read_rows(path: str | os.PathLike, torn_note=None) -> list[dict[str, Any]]:
    """Rows of one file, each checked against SCHEMA; TableError naming file, line and
    field for a line that is not a row, and for a second row of one case in one run.

    A torn last line (no newline at its end: the writer was stopped mid-write) is not a
    row: it is left out, and said so on stderr (or to `torn_note`), so a resume runs
    that case again. Anywhere else a bad line is an error, never skipped.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except IsADirectoryError:
        raise TableError(f"{path}: is a folder, not a results table") from None
    lines = data.split(b"\n")
    # data ends with "\n" for a whole table: the last piece is then empty.
    tail = lines.pop()
    rows: list[dict[str, Any]] = []
    seen: dict[tuple, int] = {}
    for lineno, raw in enumerate(lines, 1):
        rows_at = _parse_line(path, lineno, raw)
        if rows_at is None:
            continue
        key = (rows_at.get("run_id"), rows_at.get("arch"), rows_at.get("target"),
               rows_at["case_id"])
        if key in seen:
            raise TableError(f"{path}:{lineno}: case {_show(rows_at['case_id'])} has a second "
                             f"row in run {_show(rows_at.get('run_id'))} (first at line "
                             f"{seen[key]}); a run has one row per case")
        seen[key] = lineno
        rows.append(rows_at)
    if tail.strip():
        note = (f"{path}:{len(lines) + 1}: the last line is torn (its writer stopped "
                f"mid-write); it counts as not written")
        (torn_note or _stderr_note)(note)
    return rows


def _stderr_note(text: str) -> None:
    print(f"results: {text}", file=sys.stderr)


def _parse_line(path, lineno: int, raw: bytes) -> dict | None:
    where = f"{path}:{lineno}"
    if not raw.strip():
        return None
    try:
        text = raw.decode("utf-8")
        row = json.loads(text, parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise TableError(f"{where}: corrupt results line (not UTF-8)") from None
    except (json.JSONDecodeError, RecursionError) as e:
        msg = getattr(e, "msg", "nested too deep")
        raise TableError(f"{where}: corrupt results line ({msg}): {raw[:80]!r}") from None
    return check_row(row, where)


def torn_tail(path: str | os.PathLike) -> int | None:
    """The byte offset where a torn last line starts, or None when the table ends whole."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if not data or data.endswith(b"\n"):
        return None
    return data.rfind(b"\n") + 1


def drop_torn_tail(path: str | os.PathLike) -> bool:
    """Cut a torn last line off before a run appends (the writer holds TableLock): else the
    next row would land after it and make it a corrupt line in the middle."""
    cut = torn_tail(path)
    if cut is None:
        return False
    os.truncate(path, cut)
    return True


def load_table(paths: str | os.PathLike | Iterable[str | os.PathLike]):
    """A DataFrame of every row of every file, in schema column order."""
    import pandas as pd

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    rows: list[dict[str, Any]] = []
    seen: dict[tuple, str] = {}
    for path in paths:
        here = read_rows(path)   # one file's own second rows are refused there
        for row in here:
            key = (row.get("run_id"), row.get("arch"), row.get("target"), row["case_id"])
            if key in seen:
                raise TableError(f"{path}: case {_show(row['case_id'])} of run "
                                 f"{_show(row.get('run_id'))} is also in {seen[key]}; "
                                 f"a run has one row per case")
        for row in here:
            seen[(row.get("run_id"), row.get("arch"), row.get("target"), row["case_id"])] = \
                str(path)
        rows.extend(here)
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
        for col in ("max_abs_diff", *PER_OUTPUT_COLUMNS):
            df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


def done_case_ids(path: str | os.PathLike) -> set[str]:
    """Case ids that already have a row in `path` (for --resume)."""
    if not Path(path).exists():
        return set()
    return {row["case_id"] for row in read_rows(path)}


def last_run_id(path: str | os.PathLike) -> str | None:
    if not Path(path).exists():
        return None
    rows = read_rows(path, torn_note=lambda _: None)
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
