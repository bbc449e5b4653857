"""One results row as the HTML template shows it: every field as display text."""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from harness.results.sanitizer_report import report_of, where_text

from . import (error_ratio, fmt_diff, fmt_wrong, guards_of, is_missing, output_numbers,
               params_text, repro_command)

_SIGNAL = re.compile(r"\bSIG[A-Z0-9]+\b|\bexit -?\d+\b|\bsignal \d+\b")


def anchor(case_id: Any, *where: Any) -> str:
    """`case-<slug>-<digest>`: an id and URL fragment for a row, safe whatever the case id holds.

    The slug only keeps the address readable (it folds many ids onto one); the digest of the
    whole id, and of whatever else tells two rows of one case apart (`where`), keeps them apart.
    """
    key = "\0".join(str(v) for v in (case_id, *where))
    digest = hashlib.sha1(key.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    slug = re.sub(r"[^A-Za-z0-9]+", "-", str(case_id)).strip("-")[:40].strip("-")
    return f"case-{slug}-{digest}" if slug else f"case-{digest}"


def set_anchors(views: list[dict], section: str, used: set[str],
                key: str = "case_id", where: tuple[str, ...] = ("target", "arch")) -> None:
    """Give each view an `anchor` unique in the document (`used` holds those taken).

    A case shown once in a section is found by its id alone; one shown per target or arch
    adds those to the digest. `section` tells apart the same case's rows in two sections.
    """
    counts: dict[str, int] = {}
    for v in views:
        counts[str(v[key])] = counts.get(str(v[key]), 0) + 1
    for v in views:
        extra = [v.get(w, "") for w in where] if counts[str(v[key])] > 1 else []
        name = anchor(v[key], *extra)
        name = name if not section else f"{section}-{name}"
        taken, n = name, 1
        while taken in used:
            n += 1
            taken = f"{name}-{n}"
        used.add(taken)
        v["anchor"] = taken


def text(value: Any) -> str:
    return "" if is_missing(value) else str(value)


def whole(value: Any) -> str:
    """A count as `2`, even from a float column (`2.0`); '' when missing."""
    try:
        return str(int(float(value)))
    except (TypeError, ValueError, OverflowError):
        return text(value)


def crash_signal(row: Any) -> str:
    """`SIGSEGV` (or `exit 3`) for a crash row, from its error type or message; else ''."""
    if row.get("outcome") != "crash":
        return ""
    for field in ("error_type", "message"):
        found = _SIGNAL.search(text(row.get(field)))
        if found:
            return found.group(0)
    return ""


def attempts_of(row: Any) -> list[dict]:
    """The row's attempts as [{outcome, diff}], from a list or its JSON text."""
    value = row.get("attempts")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return []
    if not isinstance(value, (list, tuple)):
        return []
    return [{"outcome": text(a.get("outcome")), "diff": fmt_diff(a.get("max_abs_diff"))}
            for a in value if isinstance(a, dict)]


def fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return ""
    return "∞×" if ratio == float("inf") else f"{ratio:.3g}×"


def outputs_view(row: Any) -> list[dict]:
    """[{name, diff, tol, ratio}] as display text: o's and lse's own max |diff|, each with its
    own tolerance and ratio ([] for a row from before the per-output columns)."""
    return [{"name": n["name"], "diff": fmt_diff(n["diff"]),
             "tol": fmt_diff(n["tol"]) if n["tol"] is not None else "",
             "ratio": fmt_ratio(n["ratio"])} for n in output_numbers(row)]


def sanitizer_view(row: Any) -> dict | None:
    """The row's compute-sanitizer report (`check --sanitizer`) as display text; None without one."""
    report = report_of(row.get("sanitizer"))
    if report is None:
        return None
    return {"tool": text(report.get("tool")), "kernel": text(report.get("kernel")),
            "kind": text(report.get("kind")), "where": where_text(report),
            "source": text(report.get("source")), "summary": text(report.get("summary"))}


def row_view(row: Any) -> dict:
    return {
        "case_id": row["case_id"], "route": row["route"], "family": row["family"],
        "arch": row["arch"], "target": row["target"], "outcome": row["outcome"],
        "severity": text(row.get("severity")), "signal": crash_signal(row),
        "expect": text(row["expect"]), "pass": bool(row["pass"]),
        "max_abs_diff": fmt_diff(row["max_abs_diff"]), "wrong": fmt_wrong(row),
        "tolerance": fmt_diff(row.get("tolerance")), "ratio": fmt_ratio(error_ratio(row)),
        "outputs": outputs_view(row),
        "rel_error": fmt_diff(row.get("rel_error")),
        "first_bad_index": text(row["first_bad_index"]), "message": text(row["message"]),
        "error_type": text(row["error_type"]), "stage": text(row["stage"]),
        "params": params_text(row["params"]), "reruns": text(row["reruns"]),
        "flaky": text(row.get("flaky")), "worker": text(row["worker"]),
        "isolation": text(row.get("isolation")), "attempts": attempts_of(row),
        "repeat": whole(row.get("repeat")), "profile": text(row.get("profile")),
        "guards": ",".join(guards_of(row)), "ledger": text(row["ledger"]),
        "repro": repro_command(row), "sanitizer": sanitizer_view(row),
    }
