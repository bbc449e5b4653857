"""What CI reads of a run: JUnit XML, the summary JSON, GitHub annotations and a step summary.

`harness check --junitxml FILE --summary-json FILE` calls write_ci_outputs() after it has
read the table (and applied the ledger); `python -m harness.tools.ci_outputs TABLE ...`
writes the same files from a table a finished run left (a CI step after `make check`).
Every repro command in them is the one `harness repro` takes (harness/results/repro_command.py).
With GITHUB_ACTIONS=true, one annotation line per failure class goes to stdout, where
the runner turns it into an annotation on the run.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import unicodedata
from typing import Mapping

from harness.results.junit import write_junit
from harness.results.summary_json import annotations, summary, write_summary
from harness.results.repro_command import options_of, repro_args, typed


def row_repro(row: Mapping) -> str:
    target = row.get("target") if isinstance(row.get("target"), str) else None
    return typed(repro_args(str(row.get("case_id", "")), target, options_of(row)))


def write_ci_outputs(df, *, results=None, blocking=None, exit_code: int | None = None,
                     junitxml: str | None = None, summary_json: str | None = None,
                     step_summary_path: str | None = None, env: Mapping | None = None,
                     stream=None, extra: Mapping | None = None) -> dict:
    """Write what was asked for; returns the summary document. blocking: the rows that fail
    the run (harness/results/summary.py gating), None when every failing row does."""
    env = os.environ if env is None else env
    stream = sys.stdout if stream is None else stream
    gating_ids = None if blocking is None else set(blocking["case_id"])
    rows = df.to_dict("records") if len(df) else []
    doc = summary(df, table=str(results) if results is not None else None,
                  gating_ids=gating_ids, exit_code=exit_code, repro=row_repro)
    doc.update(extra or {})   # what `check` knows besides the table: its limits, a stop
    if junitxml:
        write_junit(rows, junitxml, gating_ids=gating_ids, repro=row_repro)
    if summary_json:
        write_summary(doc, summary_json)
    if env.get("GITHUB_ACTIONS") == "true":
        for line in annotations(inert_doc(doc)):
            print(line, file=stream)
        step_summary_path = step_summary_path or env.get("GITHUB_STEP_SUMMARY")
    if step_summary_path:
        with open(step_summary_path, "a", encoding="utf-8") as f:
            f.write(step_summary_markdown(doc))
    return doc


# ---- what CI shows a person: a table's text as text -------------------------------------
#
# The run's page shows annotations and the step summary to whoever opens it, and a table's
# case ids, messages and versions are anyone's text: a terminal escape, a bidi override
# (U+202E shows text in another order than it is), a line separator, or Markdown that
# becomes an image, a link or a broken code span. Each output is escaped for its reader.

def inert(text) -> str:
    """Text with no control, format (bidi, zero-width) or line/paragraph separator
    character: whitespace ones become a space, the others go."""
    out = []
    for c in str(text):
        kind = unicodedata.category(c)
        if kind in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            if c.isspace():
                out.append(" ")
            continue
        out.append(c)
    return "".join(out)


def inert_doc(value):
    """The summary document with every string made inert (what annotations print)."""
    if isinstance(value, str):
        return inert(value)
    if isinstance(value, dict):
        return {k: inert_doc(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [inert_doc(v) for v in value]
    return value


# What starts markup in (GitHub-flavoured) Markdown: emphasis, strikethrough, links, images,
# HTML, entities, code spans, table cells. Each is backslash-escaped (CommonMark: the
# character then means itself); `_` only where it could open or close emphasis (inside a
# word it cannot, and `cpu-x86_64` stays readable in the raw file).
_MD_PUNCT = re.compile(r"([\\`*\[\]<>!|~&#{}]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9]))")


def md_text(text, limit: int = 200) -> str:
    """A table's text for a Markdown line or table cell: one line, every punctuation
    character escaped, bare addresses and @mentions broken by a zero-width space (GitHub
    links those in plain text)."""
    text = " ".join(inert(text).split())
    if len(text) > limit:
        text = text[:limit - 3] + "..."
    text = text.replace("://", ":\u200b//").replace("www.", "www\u200b.").replace("@", "@\u200b")
    return _MD_PUNCT.sub(r"\\\1", text)


def md_code(text, limit: int = 300) -> str:
    """A code span holding the text as it is (a repro command), fenced by more backticks
    than any run inside it; its pipes escaped, as a GFM table cell needs even there."""
    text = " ".join(inert(text).split())
    if len(text) > limit:
        text = text[:limit - 3] + "..."
    if not text:
        return ""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if longest or text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text.replace('|', chr(92) + '|')}{pad}{fence}"


def step_summary_markdown(doc: Mapping, max_classes: int = 30) -> str:
    """Markdown for $GITHUB_STEP_SUMMARY: the verdict, the counts, the classes; every
    value from the table through md_text or md_code."""
    out = [f"### {md_text(doc['target'])} on {md_text(doc['arch'])}: "
           f"{md_text(doc['verdict_line'], 400)}", ""]
    counts = {k: v for k, v in doc["counts"]["by_outcome"].items() if v}
    out.append(" \\| ".join(f"{md_text(k)} {int(v)}" for k, v in counts.items()) or "no rows")
    classes = doc["failure_classes"]
    if classes:
        out += ["", "| class | outcome | severity | rows | example |",
                "| --- | --- | --- | --- | --- |"]
        for cls in classes[:max_classes]:
            out.append(f"| {md_text(cls['label'])} | {md_text(cls['outcome'])} | "
                       f"{md_text(cls['severity'])} | {int(cls['rows'])} | "
                       f"{md_code(cls['repro'])} |")
        if len(classes) > max_classes:
            out.append(f"| \u2026 {len(classes) - max_classes} more | | | | |")
    versions = ", ".join(f"{md_text(k)} {md_text(v)}" for k, v in doc["versions"].items() if v)
    out += ["", f"table: {md_code(doc['table'] or '-')}; commit {md_code(doc['commit'] or '-')}; "
            + versions]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.tools.ci_outputs",
                                 description="JUnit XML, summary JSON and annotations of a table")
    ap.add_argument("table", help="a results table (results/<target>-<arch>.jsonl)")
    ap.add_argument("--junitxml", default=None)
    ap.add_argument("--summary-json", default=None)
    ap.add_argument("--step-summary", default=None,
                    help="append the Markdown summary here [$GITHUB_STEP_SUMMARY on GitHub]")
    ap.add_argument("--ledger", default=None, help="known-failures ledger [cases/known_failures.json]")
    ap.add_argument("--strict", action="store_true",
                    help="capability and clarity findings fail the run for every target")
    args = ap.parse_args(argv)
    from harness.results import table
    from harness.results.ledger import apply_ledger_per_arch
    from harness.results.summary import gating
    try:
        df = table.load_table(args.table)
        df, ledger_errors = apply_ledger_per_arch(df, args.ledger)
    except (OSError, ValueError) as e:
        print(f"ci_outputs: {e}", file=sys.stderr)
        return 2
    # The bundled library owns the cases' contract (harness/targets/bundled.py); a table
    # says its target by name, and loading the adapter to ask would need the library.
    owns = len(df) and set(df["target"]) == {"bundled"}
    blocking = gating(df, bool(owns), args.strict) if len(df) else df
    code = 1 if len(blocking) or ledger_errors else 0
    doc = write_ci_outputs(df, results=args.table, blocking=blocking, exit_code=code,
                           junitxml=args.junitxml, summary_json=args.summary_json,
                           step_summary_path=args.step_summary)
    print(json.dumps({"verdict": doc["verdict"], "rows": doc["rows"], "gating": doc["gating"]}),
          file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
