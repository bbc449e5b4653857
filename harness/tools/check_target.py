"""`harness check-target SPEC`: what an adapter does wrong, before anyone trusts its rows.

A short selection (the first few ci cases of every family on every route) runs through the
one child runner, and the rows are read for the adapter's mistakes rather than the
library's: a harness_error (a param it never read, a strided view it never passed on, an
exception before the library was called, a leaked AssertionError or KeyError), a case its
capabilities say it can express but it skips, an output the engine could not compare (the
wrong shape), a valid case refused with an exception type an adapter bug raises.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict

from harness.tools.options import DEFAULT_TARGET, EXIT_FAIL, EXIT_PASS, EXIT_USAGE, count

PER_FAMILY_ROUTE = 3
# Exception types a library seldom refuses with but an adapter's slip raises.
ADAPTER_LIKE = ("TypeError", "IndexError")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="?", default=DEFAULT_TARGET,
                        help="a target spec: name, package.module:factory or path/to/file.py")
    parser.add_argument("--per-family", type=count(1), default=PER_FAMILY_ROUTE,
                        help=f"cases per family and route [{PER_FAMILY_ROUTE}]")


def selection(target, per: int) -> list:
    taken: dict = defaultdict(int)
    out = []
    for case in target.cases(None, "ci"):
        key = (case.family, case.route)
        if taken[key] < per:
            taken[key] += 1
            out.append(case)
    return out


def run_all(spec: str, cases: list) -> list[dict]:
    """Every case's row; a death ends one child and the rest go on in the next."""
    from harness.engine import child
    rows: list[dict] = []
    left = list(cases)
    while left:
        out = child.run(child.Spec(target=spec, cases=left), budget_s=60.0 * len(left) + 60)
        rows.extend(out.rows)
        if not out.rows:
            break
        done = {r["case_id"] for r in rows}
        left = [c for c in left if c.id not in done]
    return rows


def findings(target, rows: list[dict]) -> list[str]:
    said = []
    for row in rows:
        outcome, msg = row.get("outcome"), row.get("message") or ""
        if outcome == "harness_error":
            said.append(f"harness_error  {row['case_id']}: {msg[:240]}")
        elif outcome == "unexpected_refusal" and any(t in (row.get("error_type") or "")
                                                     for t in ADAPTER_LIKE):
            said.append(f"refused valid  {row['case_id']} with {row['error_type']} (an "
                        f"adapter's slip raises these): {msg[:200]}")
    lacks = f"{target.name} lacks "
    skipped = Counter(r.get("message") or "skipped by the adapter" for r in rows
                      if r.get("outcome") == "skipped"
                      and not (r.get("message") or "").startswith(lacks))
    for why, n in skipped.most_common():
        said.append(f"adapter skip   {n} case(s) its capabilities say it can express: {why[:200]}")
    return said


def main(args: argparse.Namespace) -> int:
    from harness.targets import load_target
    try:
        target = load_target(args.target)
        cases = selection(target, max(1, args.per_family))
    except (ValueError, OSError, RuntimeError, ImportError) as why:
        print(f"check-target: {why}", file=sys.stderr)
        return EXIT_USAGE
    rows = run_all(args.target, cases)
    said = findings(target, rows)
    errors = [s for s in said if not s.startswith("adapter skip")]
    outcomes = Counter(r.get("outcome") for r in rows)
    print(f"check-target {args.target}: {len(rows)} of {len(cases)} cases ran: "
          + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    signature = getattr(target.capabilities, "signature", None)
    for line in (signature.reach_lines() if signature is not None else []):
        print(f"  {line}")
    for line in said:
        print(f"  {line}")
    # Every other failing row by its case id: the library's findings (or the adapter's,
    # for its writer to judge), each a `harness repro` away.
    named = {r["case_id"] for r in rows if any(r["case_id"] in line for line in said)}
    for row in rows:
        if not row.get("pass") and row["case_id"] not in named:
            message = " ".join(str(row.get("message") or "").split())
            print(f"  {row.get('outcome'):<14} {row['case_id']}: {message[:200]}")
    if len(rows) < len(cases):
        print(f"  {len(cases) - len(rows)} case(s) have no row", file=sys.stderr)
    if errors or len(rows) < len(cases):
        print(f"check-target: {len(errors)} adapter error(s): fix them before trusting its rows")
        return EXIT_FAIL
    failing = sum(1 for r in rows if not r.get("pass"))
    print("check-target: no adapter error found" + (
        f" ({len(said)} skip reason(s) to review)" if said else "")
        + (f"; {failing} failing row(s), named above, are the library's findings"
           if failing else ""))
    return EXIT_PASS
