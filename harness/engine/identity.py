"""Which library a run tested, as tables, rows and reports name it.

A table is named for the library under test, never for the harness that ran it: the
target's declared name, the arch, and the library's commit. The commit comes from, in
order:

  1. the adapter's own `commit()`, when it says one;
  2. the git repository that holds the adapter's file (a library keeps its adapter in its
     own repository: the commit checked out there is the library's), unless that
     repository is the harness's own checkout (whose commit is the harness's, a column);
  3. the installed distribution that provides the adapter's package: the commit pip
     recorded for a VCS install (direct_url.json), else `v<version>`;
  4. "unknown", said once by the run.

The harness's own commit is its own column (`harness_commit`) on every row.
"""
from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
from pathlib import Path

from harness.model import platform_info

UNKNOWN = "unknown"
_SAFE = re.compile(r"[^A-Za-z0-9_.+-]+")


def safe_name(text: str, fallback: str = "target") -> str:
    """`text` with what cannot be in a file name replaced: tables and ids carry it."""
    return _SAFE.sub("_", str(text)).strip("._-")[:80] or fallback


def adapter_file(target, spec: str | None = None) -> Path | None:
    """The file the adapter came from: the spec's file or module, else the target's class's."""
    spec = spec or getattr(target, "harness_spec", None)
    if spec:
        where = spec.partition(":")[0]
        if where.endswith(".py") or os.sep in where:
            return Path(where).expanduser().resolve()
        if ":" in spec:
            try:
                found = importlib.util.find_spec(where)
            except (ImportError, ValueError):
                found = None
            if found is not None and found.origin and found.origin != "built-in":
                return Path(found.origin).resolve()
    try:
        return Path(inspect.getsourcefile(type(target)) or "").resolve() or None
    except (TypeError, OSError):
        return None


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.relative_to(folder)
        return True
    except ValueError:
        return False


def _own_commit(target) -> str:
    """The adapter's commit(), when its class says one ("" when it does not)."""
    from harness.targets.base import Target
    method = getattr(type(target), "commit", None)
    if method is None or method is Target.commit:
        return ""
    try:
        return str(target.commit() or "").strip()
    except Exception:  # noqa: BLE001 - an adapter's broken commit(): the next source says
        return ""


def _top_module(path: Path) -> str | None:
    """The top-level module name `path` is imported as, from the first sys.path folder
    that holds it."""
    import sys
    for entry in sys.path:
        try:
            rel = path.relative_to(Path(entry or ".").resolve())
        except (ValueError, OSError):
            continue
        return rel.parts[0].removesuffix(".py") if rel.parts else None
    return None


def _distribution_commit(path: Path) -> str:
    """The commit (or v<version>) of the installed distribution that provides `path`'s
    top-level package: pip's record of a VCS install, else its version."""
    from importlib import metadata
    top = _top_module(path)
    if not top:
        return ""
    try:
        names = metadata.packages_distributions().get(top) or []
        if not names:
            return ""
        dist = metadata.distribution(names[0])
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
        commit = str((direct.get("vcs_info") or {}).get("commit_id") or "")
        if commit:
            return commit[:12]
        version = str(dist.metadata.get("Version") or "")
    except Exception:  # noqa: BLE001 - broken metadata must not stop a run: unknown
        return ""
    return f"v{version}" if version else ""


def library_commit(target, spec: str | None = None) -> tuple[str, str]:
    """(the library's commit, where it came from), UNKNOWN when nothing says one."""
    own = _own_commit(target)
    if own:
        return own, "the adapter's commit()"
    path = adapter_file(target, spec)
    if path is not None and path.is_file() and not _inside(path, platform_info.REPO_ROOT):
        repo = platform_info.repo_commit(path.parent)
        if repo:
            return repo, f"the git repository holding {path}"
        dist = _distribution_commit(path)
        if dist:
            return dist, f"the installed distribution holding {path}"
    return UNKNOWN, ("the adapter has no commit(), its file is in no git repository of "
                     "its own and no installed distribution provides it")


def harness_commit() -> str:
    return platform_info.repo_commit() or UNKNOWN


def describe(target, spec: str | None = None) -> dict:
    """What a run reports about the library before it starts: the table's name parts."""
    commit, source = library_commit(target, spec)
    try:
        version = str(target.version())
    except Exception as e:  # noqa: BLE001 - a row without a version is still a row
        version = f"unknown ({type(e).__name__})"
    return {"target_name": safe_name(getattr(target, "name", "") or "target"),
            "library_commit": commit, "commit_source": source, "target_version": version,
            "harness_commit": harness_commit()}


def table_key(described: dict) -> str:
    """The part of a table's name after the arch: the library's commit, else its version
    (`v<version>`), else "unknown"."""
    commit = described.get("library_commit") or UNKNOWN
    if commit != UNKNOWN:
        return safe_name(commit, UNKNOWN)
    version = str(described.get("target_version") or "")
    if version and not version.startswith("unknown"):
        return safe_name("v" + version, UNKNOWN)
    return UNKNOWN
