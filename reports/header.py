"""The report's header: the verdict line and the conditions the rows were run under."""
from __future__ import annotations

import pandas as pd

from harness.results.failure_classes import FailureClass, verdict

from . import guards_of, is_missing


def _distinct(values) -> list[str]:
    seen: dict[str, None] = {}
    for value in values:
        if not is_missing(value) and str(value) != "":
            seen.setdefault(str(value), None)
    return list(seen)


def _guards(df: pd.DataFrame) -> list[str]:
    names: dict[str, None] = {}
    seen: set[str] = set()
    for value in df["disable_guards"]:
        key = value if isinstance(value, str) else repr(value)
        if key not in seen:
            seen.add(key)
            for name in guards_of({"disable_guards": value}):
                names.setdefault(name, None)
    return list(names)


def _repeats(df: pd.DataFrame) -> list[str]:
    values = pd.to_numeric(df["repeat"], errors="coerce").dropna()
    return [str(int(v)) for v in sorted(values.unique())]


def header(df: pd.DataFrame, classes: list[FailureClass]) -> dict:
    """Verdict, and the run's guards off, profile, repeat count, targets and arches.

    Each list holds the distinct values over all rows, so a merged table of
    two runs that differ shows both. An empty list means no row records it.
    """
    pairs = df[["target", "target_version"]].drop_duplicates()
    targets = sorted(_distinct(f"{t} {v}" if not is_missing(v) and str(v) else t
                               for t, v in zip(pairs["target"], pairs["target_version"])))
    return {
        "verdict": verdict(df, classes),
        "failing": bool(classes),
        "guards_off": _guards(df),
        "profiles": _distinct(df["profile"]),
        "repeats": _repeats(df),
        "targets": targets,
        "arches": _distinct(df["arch"]),
    }


def guards_text(value) -> str:
    """`guards on` for a row that turned none off, else `guards off: a, b`."""
    names = guards_of({"disable_guards": value})
    return "guards off: " + ", ".join(names) if names else "guards on"


def conditions(df: pd.DataFrame) -> list[tuple[str, list[str]]]:
    """(name, distinct values) for what a run was run against and under, in a fixed order.

    A merged table lists every value its rows hold; guards always says on or off, since a
    row that records none ran with every guard on.
    """
    return [
        ("target", _distinct(df["target"])),
        ("target version", _distinct(df["target_version"])),
        ("library commit", _distinct(df["library_commit"])),
        ("arch", _distinct(df["arch"])),
        ("guards", _distinct(guards_text(v) for v in df["disable_guards"]) if len(df) else []),
        ("profile", _distinct(df["profile"])),
        ("repeat", _repeats(df)),
    ]
