"""A results table as JUnit XML, the format every CI system shows as tests.

One <testcase> per row, named by its case id, with the route as its classname (CI
systems group by classname, so each route reads as a test class). A failing row has a
<failure> whose text carries what a person needs without opening the table: the outcome,
the signal of a crash, the stage reached, the message and the command that reproduces it.
A skipped row has <skipped> with its reason. Rows that fail without gating the run (a
capability or clarity finding on a library that does not own the cases' contract) are
passing testcases that say so in <system-out>, so the XML agrees with the exit status.

The elements and attributes are those of the common JUnit schema (Ant's, as Jenkins,
GitLab and the GitHub test-report actions read it): <testsuites> holding one <testsuite>
with name, tests, failures, errors, skipped, time and timestamp.
"""
from __future__ import annotations

import math
import re
import shlex
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Mapping

from harness.model.target_options import as_args
from harness.results.columns import run_columns
from harness.results.repro_command import options_of
from harness.results.summary import output_numbers, output_text

# Characters XML 1.0 cannot carry at all (a library's message may hold any byte), and the
# bidi controls that would show a reader of the CI page text in another order than it is.
_NOT_XML = re.compile("[^\u0009\u000A\u000D\u0020-\uD7FF\uE000-\uFFFD\U00010000-\U0010FFFF]"
                      "|[\u061C\u200E\u200F\u202A-\u202E\u2066-\u2069]")
_SIGNAL = re.compile(r"\bSIG[A-Z]{2,7}\b")


def _clean(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and math.isnan(value):
        return ""
    return _NOT_XML.sub("\ufffd", str(value))


def _seconds(value) -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "0"
    return f"{v:.3f}" if math.isfinite(v) and v >= 0 else "0"


def default_repro(row: Mapping) -> str:
    """`harness repro CASE_ID` with the row's target and options (reports and check pass
    the project's own builder, harness/results/repro_command.py; this is for a bare table)."""
    args = ["harness", "repro", str(row.get("case_id", ""))]
    if row.get("target") and row.get("target") != "bundled":
        args += ["--target", str(row["target"])]
    return shlex.join(args + as_args(options_of(row)))


def signal_of(row: Mapping) -> str:
    """The signal a crash row names (SIGFPE, SIGSEGV, ...), or ''."""
    if row.get("outcome") != "crash":
        return ""
    found = _SIGNAL.search(_clean(row.get("message")))
    return found.group(0) if found else ""


def failure_text(row: Mapping, repro: str) -> str:
    lines = [f"outcome: {_clean(row.get('outcome'))}"]
    if row.get("severity"):
        lines.append(f"severity: {_clean(row.get('severity'))}")
    sig = signal_of(row)
    if sig:
        lines.append(f"signal: {sig}")
    lines.append(f"stage: {_clean(row.get('stage')) or '-'}")
    lines.append(f"message: {_clean(row.get('message')) or '-'}")
    per = output_numbers(row)
    # Each output's max |diff| beside its own tolerance; a row from before the per-output
    # columns has the max over its outputs and o's tolerance, named as such.
    keys = ("max_abs_diff", "n_wrong", "n_total") if per else (
        "max_abs_diff", "tolerance", "n_wrong", "n_total")
    for key in keys:
        if row.get(key) is not None and _clean(row.get(key)):
            lines.append(f"{key}: {_clean(row.get(key))}")
    for n in per:
        lines.append(f"{n['name']}: {output_text(n)[len(n['name']) + 1:]}")
    lines.append(f"repro: {repro}")
    # Every line holds a table's or a library's text: cleaned as a whole, the repro
    # command and the per-output lines included.
    return _clean("\n".join(lines))


def _is_true(value) -> bool:
    return bool(value) and not (isinstance(value, float) and math.isnan(value))


def junit_tree(rows: Iterable[Mapping], *, suite: str = "attention-harness",
               gating_ids: set | None = None,
               repro: Callable[[Mapping], str] | None = None) -> ET.ElementTree:
    """The XML tree of `rows`. gating_ids: the failing rows that fail the run (None: every
    failing row does). The suite's properties are the first row's run columns
    (harness/results/columns.py), in the run's order."""
    rows = list(rows)
    repro = repro or default_repro
    root = ET.Element("testsuites", name=_clean(suite))
    ts = ET.SubElement(root, "testsuite", name=_clean(suite))
    props = ET.SubElement(ts, "properties")
    first = rows[0] if rows else {}
    for key in (c.name for c in run_columns()):
        if first.get(key):
            ET.SubElement(props, "property", name=key, value=_clean(first.get(key)))
    failures = skipped = 0
    total = 0.0
    for row in rows:
        case = ET.SubElement(ts, "testcase", name=_clean(row.get("case_id")),
                             classname=_clean(row.get("route")) or "harness",
                             time=_seconds(row.get("duration_s")))
        total += float(_seconds(row.get("duration_s")))
        outcome = _clean(row.get("outcome"))
        if outcome == "skipped":
            skipped += 1
            ET.SubElement(case, "skipped", message=_clean(row.get("message")) or "skipped")
            continue
        if _is_true(row.get("pass")):
            continue
        command = repro(row)
        if gating_ids is not None and row.get("case_id") not in gating_ids:
            out = ET.SubElement(case, "system-out")
            out.text = ("finding (does not fail the run without --strict)\n"
                        + failure_text(row, command))
            continue
        failures += 1
        sig = signal_of(row)
        headline = f"{outcome}{' ' + sig if sig else ''}: {_clean(row.get('message'))}"
        failure = ET.SubElement(case, "failure", message=headline[:500], type=outcome)
        failure.text = failure_text(row, command)
    for el in (root, ts):
        el.set("tests", str(len(rows)))
        el.set("failures", str(failures))
        el.set("errors", "0")
        el.set("skipped", str(skipped))
        el.set("time", f"{total:.3f}")
    stamp = _clean(first.get("timestamp")) or datetime.now(timezone.utc).isoformat(timespec="seconds")
    ts.set("timestamp", stamp[:19])
    ET.indent(root)
    return ET.ElementTree(root)


def junit_xml(rows: Iterable[Mapping], **kw) -> str:
    return ET.tostring(junit_tree(rows, **kw).getroot(), encoding="unicode", xml_declaration=True)


def write_junit(rows: Iterable[Mapping], path, **kw) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    junit_tree(rows, **kw).write(path, encoding="utf-8", xml_declaration=True)
    return path
