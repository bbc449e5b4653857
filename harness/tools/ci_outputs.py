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
import sys
from typing import Mapping

from harness.results.junit import write_junit
from harness.results.summary_json import annotations, step_summary, summary, write_summary
from harness.results.repro_command import repro_args, typed


def row_repro(row: Mapping) -> str:
    guards = row.get("disable_guards")
    guards = guards if isinstance(guards, str) and guards else None
    target = row.get("target") if isinstance(row.get("target"), str) else None
    return typed(repro_args(str(row.get("case_id", "")), target, guards))


def write_ci_outputs(df, *, results=None, blocking=None, exit_code: int | None = None,
                     junitxml: str | None = None, summary_json: str | None = None,
                     step_summary_path: str | None = None, env: Mapping | None = None,
                     stream=None) -> dict:
    """Write what was asked for; returns the summary document. blocking: the rows that fail
    the run (harness/results/summary.py gating), None when every failing row does."""
    env = os.environ if env is None else env
    stream = sys.stdout if stream is None else stream
    gating_ids = None if blocking is None else set(blocking["case_id"])
    rows = df.to_dict("records") if len(df) else []
    doc = summary(df, table=str(results) if results is not None else None,
                  gating_ids=gating_ids, exit_code=exit_code, repro=row_repro)
    if junitxml:
        write_junit(rows, junitxml, gating_ids=gating_ids, repro=row_repro)
    if summary_json:
        write_summary(doc, summary_json)
    if env.get("GITHUB_ACTIONS") == "true":
        for line in annotations(doc):
            print(line, file=stream)
        step_summary_path = step_summary_path or env.get("GITHUB_STEP_SUMMARY")
    if step_summary_path:
        with open(step_summary_path, "a", encoding="utf-8") as f:
            f.write(step_summary(doc))
    return doc


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
