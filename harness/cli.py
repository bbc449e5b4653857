"""`python -m harness list | check | repro | report | compare | bisect | shrink`.

`check` runs the same pytest session as `pytest cases/ -n auto` (in a child
process, so the plugin's controller owns the run exactly as it does under
plain pytest), then reads the table it wrote and summarizes it. No case is
rerun unless --reruns asks, and then every attempt is kept on the row: a
failing attempt fails the row (harness/attempts.py).

Exit codes (stable: bisect and CI read them):
  check   0 no gating row fails (after the ledger); 1 a gating row fails, the
          ledger has errors, or rows are missing; otherwise pytest's own code
          (2 interrupted or a usage error, 4 usage error). Correctness and
          harness rows always gate; capability and clarity rows gate for a
          target that owns its contract (the bundled library) and, for any
          other target, only with --strict.
  repro   0 pass, 1 fail, 2 bad option, 4 unknown case id, 5 library build failure
  list    0, 2 bad option, or 4 when the selection is empty
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_UNKNOWN_CASE, EXIT_BUILD = 0, 1, 2, 4, 5


def input_errors() -> tuple:
    """What reading the options raises on bad input: an unknown name (ValueError,
    pytest.UsageError) or a missing or unreadable file (OSError). Caught only
    around that reading, so a harness bug elsewhere keeps its traceback."""
    import pytest
    return (ValueError, OSError, pytest.UsageError)


def _add_selection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="bundled", help="library under test [bundled]")
    p.add_argument("--family", default=None, help="families, comma-separated [all]")
    p.add_argument("--route", default=None, help="routes, comma-separated [all]")
    p.add_argument("--case-id", default=None, help="only ids containing this substring")
    p.add_argument("--cases-file", default=None, help="a JSON list of cases instead of families")


def positive_seconds(text: str) -> float:
    """argparse type for --case-timeout: a number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0 seconds, got {text!r}")
    return value


def count(minimum: int):
    """argparse type: an int >= minimum, or one line naming the value."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {value}")
        return value
    return parse


def _select(args):
    from harness.plugin import csv_list, select_cases
    return select_cases(args.target, csv_list(args.family), csv_list(args.route), args.case_id,
                        args.cases_file)


# ------------------------------------------------------------------ list

def cmd_list(args) -> int:
    try:
        cases = _select(args)
    except input_errors() as why:
        print(f"list: {why}", file=sys.stderr)
        return EXIT_USAGE
    for case in cases:
        print(case.id)
    print(f"{len(cases)} cases", file=sys.stderr)
    return 0 if cases else 4


# ------------------------------------------------------------------ check

def pytest_command(args, results: Path) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", str(ROOT / "cases"), "-p", "no:cacheprovider",
           "-q", "--no-header", "-rN", "--target", args.target, "--results", str(results)]
    if args.n not in (None, "0"):
        cmd += ["-n", str(args.n)]
    if args.reruns:
        cmd += ["--reruns", str(args.reruns)]
    for opt in ("family", "route", "case_id", "cases_file", "disable_guards", "case_timeout",
                "run_id", "repeat"):
        value = getattr(args, opt, None)
        if value is not None:
            cmd += ["--" + opt.replace("_", "-"), str(value)]
    if args.resume:
        cmd.append("--resume")
    return cmd + list(args.pytest_args or [])


def _fmt_diff(v) -> str:
    try:
        v = float(v)
    except (TypeError, ValueError):
        return ""
    return "" if v != v else f"{v:.3g}"


def _fmt_wrong(row) -> str:
    n_wrong, n_total = row.get("n_wrong"), row.get("n_total")
    if n_total is None or n_total != n_total:
        return ""
    return f"{int(n_wrong or 0)}/{int(n_total)}"


def _md_cell(text) -> str:
    return str("" if text is None else text).replace("|", "\\|").replace("\n", " ")


def before_after_table(df, failing_only: bool = True, max_message: int = 120) -> str:
    """Markdown in the style of a PR's "Before this PR" table.

    One line per (route, case): outcome, max |diff|, wrong/total and the
    message, failing rows first (all of them when failing_only is False).
    """
    if failing_only:
        df = df[~df["pass"].astype(bool)]
    if not len(df):
        return "_No failing rows._\n"
    df = df.sort_values(["route", "case_id"])
    lines = ["| Route | Case | Result | max \\|diff\\| | wrong/total | Message |",
             "|---|---|---|---|---|---|"]
    for _, row in df.iterrows():
        case = str(row["case_id"]).split("/", 1)[-1]
        msg = str(row.get("message") or "")
        if len(msg) > max_message:
            msg = msg[:max_message - 1] + "…"
        lines.append(f"| {_md_cell(row['route'])} | {_md_cell(case)} | {_md_cell(row['outcome'])} "
                     f"| {_fmt_diff(row.get('max_abs_diff'))} | {_fmt_wrong(row)} | {_md_cell(msg)} |")
    return "\n".join(lines) + "\n"


def summary_text(df, wall_s: float | None = None, max_failures: int = 200) -> str:
    import pandas as pd

    out = []
    if len(df):
        counts = pd.crosstab(df["route"], df["outcome"], margins=True, margins_name="total")
        out.append(counts.to_string())
    failing = df[~df["pass"].astype(bool)] if len(df) else df
    if len(failing):
        out.append(f"\n{len(failing)} failing row(s):")
        for _, row in failing.head(max_failures).iterrows():
            bits = [str(row["outcome"])]
            if _fmt_diff(row.get("max_abs_diff")):
                bits.append(f"max|diff| {_fmt_diff(row.get('max_abs_diff'))}")
            if _fmt_wrong(row):
                bits.append(f"wrong {_fmt_wrong(row)}")
            if row.get("isolation"):
                bits.append(str(row["isolation"]))
            msg = str(row.get("message") or "")[:200]
            out.append(f"  {row['case_id']}: {', '.join(bits)}" + (f": {msg}" if msg else ""))
        if len(failing) > max_failures:
            out.append(f"  ... and {len(failing) - max_failures} more")
    tail = f"\n{len(df)} cases, {len(failing)} failing"
    if len(failing):
        by = failing["severity"].fillna("").replace("", "unrated").value_counts()
        tail += " (" + ", ".join(f"{n} {sev}" for sev, n in by.items()) + ")"
    if wall_s is not None:
        tail += f", wall time {wall_s:.1f} s"
    out.append(tail)
    return "\n".join(out)


def gating(df, target_owns_contract: bool, strict: bool):
    """The failing rows that decide the exit status (see the module docstring)."""
    failing = ~df["pass"].astype(bool)
    if strict or target_owns_contract:
        return df[failing]
    return df[failing & df["severity"].isin(["correctness", "harness", ""])]


def cmd_check(args) -> int:
    from harness import table
    from harness.plugin import default_results_path

    selection = table.selection_slug(args.family, args.route, args.case_id, args.cases_file)
    results = (Path(args.results).resolve() if args.results else
               default_results_path(args.target, selection, args.results_dir))
    cmd = pytest_command(args, results)
    from harness.plugin import check_guard_names
    try:  # before the run: bad options fail here, with the field and the values
        check_guard_names(args.disable_guards, args.target)
        expected = {c.id for c in _select(args)}
    except (RuntimeError, ImportError, *input_errors()) as why:
        # Unknown names, or a target whose library is missing: say so, run nothing.
        print(f"check: {why}", file=sys.stderr)
        return EXIT_USAGE
    if not expected and not args.resume:
        print(f"check: no cases selected (--target {args.target}, --family {args.family or 'all'}, "
              f"--route {args.route or 'all'}, --case-id {args.case_id or 'any'})", file=sys.stderr)
        return EXIT_USAGE
    start = time.perf_counter()
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", str(ROOT))
    rc = subprocess.call(cmd, cwd=ROOT, env=env)
    wall = time.perf_counter() - start
    if not results.exists():
        print(f"check: no results table at {results} (pytest exit {rc})", file=sys.stderr)
        return rc or EXIT_FAIL
    df = table.load_table(results)
    if not args.results and not selection and len(df):
        table.copy_latest(results, args.target, str(df["arch"].iloc[-1]))
    from harness.ledger import apply_ledger_per_arch
    df, ledger_errors = apply_ledger_per_arch(df, args.ledger)
    print()
    print(summary_text(df, wall))
    if args.disable_guards:
        print(f"\nWith guards disabled ({args.disable_guards}):\n")
        print(before_after_table(df))
    for err in ledger_errors:
        print(f"ledger: {err}", file=sys.stderr)
    print(f"results: {results}" + (f" (partial run: {selection}; the full table is untouched)"
                                   if selection else ""))
    if args.html or args.markdown:
        _render(results, args.html, args.markdown)
    if rc not in (0, 1):
        return rc
    missing = expected - set(df["case_id"])
    if missing:
        print(f"check: {len(missing)} case(s) have no row, e.g. {sorted(missing)[:3]}",
              file=sys.stderr)
        return EXIT_FAIL
    from harness.targets import load_target
    owns = bool(getattr(load_target(args.target), "owns_contract", False))
    blocking = gating(df, owns, args.strict) if len(df) else df
    findings = int((~df["pass"].astype(bool)).sum()) - len(blocking) if len(df) else 0
    if findings:
        print(f"check: {findings} capability/clarity finding(s) on {args.target} do not fail "
              f"the run (--strict makes them fail)")
    return EXIT_FAIL if len(blocking) or ledger_errors else EXIT_PASS


def _render(results: Path, html: str | None, markdown: str | None) -> None:
    """The report of this run's own table (never a stale full table)."""
    cmd = [sys.executable, "-m", "harness", "report", "--results", str(results)]
    if html:
        cmd += ["--out", html]
    if markdown:
        cmd += ["--markdown", markdown]
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", str(ROOT))
    if subprocess.call(cmd, env=env) != 0:
        print(f"check: the report of {results} could not be rendered", file=sys.stderr)


# ------------------------------------------------------------------ repro

def _load_case_json(path: str):
    from harness.case import Case
    data = json.loads(Path(path).read_text())
    return [Case.from_json(d) for d in (data if isinstance(data, list) else [data])]


def closest_ids(case_id: str, ids, n: int = 5) -> list[str]:
    close = difflib.get_close_matches(case_id, ids, n=n, cutoff=0.4)
    if not close:
        close = [i for i in ids if case_id in i][:n]
    return close


def _is_build_error(error: BaseException) -> bool:
    return any(t.__name__ == "BuildError" for t in type(error).__mro__)


def cmd_repro(args) -> int:
    import faulthandler

    if not faulthandler.is_enabled():
        try:  # a crash in the case still prints where it happened
            faulthandler.enable()
        except (OSError, ValueError, AttributeError):
            pass  # stderr without a file descriptor (captured)
    from harness.plugin import check_guard_names
    from harness.targets import load_target
    case_file = args.case_json or args.cases_file
    try:
        # An unknown guard name would otherwise reach the library, whose refusal
        # of it the row would record as the case's own refusal.
        check_guard_names(args.disable_guards, args.target)
        if args.disable_guards:
            os.environ["KERNELS_DISABLE_GUARDS"] = args.disable_guards
        target = load_target(args.target)
        cases = _load_case_json(case_file) if case_file else _select(
            argparse.Namespace(target=args.target, family=None, route=None, case_id=None,
                               cases_file=None))
    except Exception as e:
        if _is_build_error(e):
            print(f"repro: library build failed: {e}", file=sys.stderr)
            return EXIT_BUILD
        if isinstance(e, input_errors()):
            print(f"repro: {e}", file=sys.stderr)
            return EXIT_USAGE
        raise
    by_id = {c.id: c for c in cases}
    case = by_id.get(args.case_id)
    if case is None:
        print(f"repro: unknown case id {args.case_id!r}", file=sys.stderr)
        close = closest_ids(args.case_id, list(by_id))
        if close:
            print("closest ids:", file=sys.stderr)
            for cid in close:
                print(f"  {cid}", file=sys.stderr)
        return EXIT_UNKNOWN_CASE
    from harness.execute import execute_case
    from harness.plugin import case_row

    try:
        result = execute_case(case, target, on_stage=(
            (lambda s: print(f"stage: {s}", file=sys.stderr, flush=True)) if args.verbose else None))
    except Exception as e:
        if _is_build_error(e):
            print(f"repro: library build failed: {e}", file=sys.stderr)
            return EXIT_BUILD
        raise
    row = case_row(case, result, target=target.name,
                   disable_guards=os.environ.get("KERNELS_DISABLE_GUARDS", ""))
    if args.json:
        print(json.dumps(row, allow_nan=True, default=str))
    else:
        width = max(len(k) for k in row)
        for key, value in row.items():
            print(f"{key:<{width}}  {value}")
    return EXIT_PASS if row["pass"] else EXIT_FAIL


# ------------------------------------------------------------------ plug-ins

def _lazy(module: str, add: str, main: str):
    """A subcommand whose module is imported only when it runs (or is asked for help)."""
    def add_arguments(p):
        try:
            mod = __import__(module, fromlist=[add])
        except ImportError as e:
            p.set_defaults(_missing=f"{module} is not available ({e})")
            p.add_argument("rest", nargs=argparse.REMAINDER)
            return
        getattr(mod, add)(p)
        p.set_defaults(_lazy_main=(module, main))
    return add_arguments


SUBCOMMANDS = {
    "report": ("reports.cli", "add_report_arguments", "report_main",
               "HTML and Markdown report from results tables"),
    "compare": ("reports.cli", "add_compare_arguments", "compare_main",
                "base-vs-head or arch-vs-arch comparison of tables"),
    "bisect": ("harness.bisect", "add_arguments", "main", "the commit that changed a case"),
    "shrink": ("harness.shrink", "add_arguments", "main", "the smallest case that still fails"),
}


def build_parser(argv=None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m harness",
                                 description="Differential correctness harness for attention kernels")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="case ids, one per line")
    _add_selection(p)
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("check", help="run the case matrix under pytest-xdist and summarize")
    _add_selection(p)
    p.add_argument("--disable-guards", default=None, help="all|name,name (test use)")
    p.add_argument("--resume", action="store_true", help="continue a run; skip cases with rows")
    p.add_argument("-n", default="auto", help="xdist workers [auto]; 0 runs in this process")
    p.add_argument("--reruns", type=count(0), default=0,
                   help="reruns of a failing case [0]; every attempt is kept and a failing "
                        "attempt fails the row")
    p.add_argument("--repeat", type=count(1), default=None,
                   help="run each case N times per worker, answers compared bitwise "
                        "[1 on the host, 2 with a GPU]")
    p.add_argument("--strict", action="store_true",
                   help="capability and clarity findings fail the run for every target")
    p.add_argument("--results", default=None,
                   help="table path [results/<target>-<arch>-<commit>.jsonl under --results-dir]")
    p.add_argument("--results-dir", default=None, help="folder for tables [./results]")
    p.add_argument("--html", default=None, help="render this run's HTML report here")
    p.add_argument("--markdown", default=None, help="render this run's Markdown summary here")
    p.add_argument("--case-timeout", type=positive_seconds, default=None, help="seconds before a hang")
    p.add_argument("--run-id", default=None)
    p.add_argument("--ledger", default=None, help="known-failures ledger [cases/known_failures.json]")
    p.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("repro", help="run one case in this process and print its row")
    p.add_argument("case_id")
    p.add_argument("--target", default="bundled")
    p.add_argument("--disable-guards", default=None)
    p.add_argument("--case-json", default=None, help="a JSON case file (from shrink)")
    p.add_argument("--cases-file", default=None, help="a JSON list of cases")
    p.add_argument("--json", action="store_true", help="print the row as one JSON line")
    p.add_argument("-v", "--verbose", action="store_true", help="print each stage")
    p.set_defaults(func=cmd_repro)

    # Only the subcommand being run imports its module: a broken or missing
    # reports/bisect module costs that subcommand, never the whole CLI.
    wanted = next((a for a in (argv or []) if not a.startswith("-")), None)
    for name, (module, add, main, help_) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_, add_help=(name == wanted))
        if name == wanted:
            _lazy(module, add, main)(p)
        else:
            p.add_argument("rest", nargs=argparse.REMAINDER)
    return ap


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    if getattr(args, "_missing", None):
        print(f"{args.command}: {args._missing}", file=sys.stderr)
        return 2
    if getattr(args, "_lazy_main", None):
        module, main_name = args._lazy_main
        return int(getattr(__import__(module, fromlist=[main_name]), main_name)(args) or 0)
    return int(args.func(args) or 0)
