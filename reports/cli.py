"""`python -m harness report` and `python -m harness compare`.

harness/cli.py registers these through add_*_arguments / *_main.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from harness.results.ledger import apply_ledger_per_arch

from . import is_missing, load_results
from .compare import compare, summary
from .cross import pairs
from .groups import differing, side_by_side


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", nargs="+", required=True, metavar="PATH",
                        help="results tables (JSON lines or CSV); several arches merge by case id")
    parser.add_argument("--out", default=None, metavar="HTML",
                        help="HTML report path (default reports/out/<first table's file name>.html)")
    parser.add_argument("--markdown", default=None, metavar="PATH",
                        help="also write a Markdown summary for a PR comment")
    parser.add_argument("--base", nargs="+", default=None, metavar="PATH",
                        help="base tables: add a base-vs-head view")
    parser.add_argument("--ledger", default=None, metavar="JSON",
                        help="apply a known-failures ledger (cases/known_failures.json) per arch")
    parser.add_argument("--fail-on-failures", action="store_true",
                        help="exit 1 when any row fails or the ledger has errors")
    parser.add_argument("--disable-guards", default=None, metavar="NAMES",
                        help="guards the run had off, for rows that do not record them: "
                             "repro commands then carry --disable-guards")
    parser.add_argument("--merge-different", action="store_true",
                        help="merge tables that differ in target, guards or library commit, "
                             "and show each (target, guards, commit) group's counts side by side")
    parser.add_argument("--repros", default=None, metavar="DIR",
                        help="write one standalone repro script per failure class into DIR "
                             "and link each class to it from the HTML")
    parser.add_argument("--title", default=None)


def _load(option: str, paths) -> pd.DataFrame:
    """The tables an option names; a missing or corrupt file is a usage error naming both,
    and so are the shards of a run with one missing or two that overlap."""
    try:
        shards_of(paths)
        return load_results(paths)
    except (OSError, ValueError) as why:
        # Exit 2, not 1: compare's 1 means "a regression", report's "a failing row".
        print(f"{option}: {why}", file=sys.stderr)
        raise SystemExit(2) from None


def shards_of(paths) -> str | None:
    """ShardError when the tables are shards of a run that leave a gap or overlap (a case in
    two of them); a note when they are a whole sharded run; None when none is a shard."""
    if len(paths) < 2:
        return None   # one table, sharded or not, is read as it is (a partial table)
    from harness.model.shard import check_merge
    from harness.results.table import read_rows
    return check_merge({str(p): read_rows(p, torn_note=lambda _: None) for p in paths})


def default_out(paths) -> Path:
    """reports/out/<the first table's file stem>.html: never a name from the table's rows,
    which are the table's own (hostile) content."""
    stem = Path(str(paths[0])).stem or "report"
    return Path("reports/out") / (stem + ".html")


def _write_text(path, text: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text, encoding="utf-8")


def _write(option: str, write) -> None:
    """A report that cannot be written is one line naming the option and why, exit 2."""
    try:
        write()
    except OSError as e:
        print(f"{option}: cannot write {e.filename or 'the report'} ({e.strerror or e})",
              file=sys.stderr)
        raise SystemExit(2) from None


def default_title(df: pd.DataFrame) -> str:
    """`Attention correctness: gfx942`; with several targets, `…: bundled vs torch-sdpa on gfx942`."""
    names = ", ".join(sorted(a for a in df["arch"].unique() if a)) or "no rows"
    targets = sorted(t for t in df["target"].unique() if t)
    if len(targets) > 1:
        names = " vs ".join(targets) + " on " + names
    return "Attention correctness: " + names


def _groups(paths, merge_different: bool) -> dict | None:
    """The side-by-side counts of tables that differ in what they tested; None when they
    agree. Without --merge-different such tables are a usage error: one merged report of
    two commits or guard settings would pass one run's rows off as the other's."""
    if len(paths) < 2:
        return None
    tables = [_load("--results", [p]) for p in paths]
    cols = differing(tables)
    if not cols:
        return None
    if not merge_different:
        print(f"--results: the tables differ in {', '.join(cols)}; pass --merge-different "
              "to report them side by side", file=sys.stderr)
        raise SystemExit(2)
    return side_by_side(tables)


def report_main(args: argparse.Namespace) -> int:
    from .html import render_html
    from .markdown import render_markdown
    df = _load("--results", args.results)
    groups = _groups(args.results, getattr(args, "merge_different", False))
    base = _load("--base", args.base) if getattr(args, "base", None) else None
    errors: list[str] = []
    guards = getattr(args, "disable_guards", None)
    if guards:
        unset = df["disable_guards"].isna() | (df["disable_guards"].astype(str) == "")
        df.loc[unset, "disable_guards"] = guards
    if getattr(args, "ledger", None):
        df, errors = apply_ledger_per_arch(df, args.ledger)
        if base is not None:
            base, _ = apply_ledger_per_arch(base, args.ledger)
    title = getattr(args, "title", None) or default_title(df)
    out = Path(args.out) if getattr(args, "out", None) else default_out(args.results)
    repros = getattr(args, "repros", None)
    _write("--out", lambda: render_html(df, out, base_df=base, title=title,
                                        groups=groups, repros=repros))
    n_fail = int((~df["pass"]).sum())
    print(f"report: {len(df)} rows, {n_fail} failing -> {out}")
    columns = pairs(df)
    if len(columns) > 1:
        print(f"report: cross-target section (#cross-target) over {len(columns)} (target, arch) "
              "columns: " + ", ".join(f"{t}/{a}" for t, a in columns))
    if getattr(args, "markdown", None):
        _write("--markdown", lambda: _write_text(args.markdown, render_markdown(
            df, base, title=title, groups=groups, repros=repros, md_path=args.markdown)))
        print(f"report: markdown -> {args.markdown}")
    for err in errors:
        print(f"ledger: {err}", file=sys.stderr)
    if getattr(args, "fail_on_failures", False) and (n_fail or errors):
        return 1
    return 0


def _text(value) -> str:
    return "-" if is_missing(value) or value == "" else str(value)


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base", nargs="+", required=True, metavar="PATH")
    parser.add_argument("--head", nargs="+", required=True, metavar="PATH")
    parser.add_argument("--out", default=None, metavar="HTML",
                        help="write the head report with a base-vs-head view")
    parser.add_argument("--markdown", default=None, metavar="PATH")
    parser.add_argument("--ledger", default=None, metavar="JSON",
                        help="apply the known-failures ledger to both sides first")


def compare_main(args: argparse.Namespace) -> int:
    """Print the regressions and fixes among the cases both tables hold; exit 1 on a regression."""
    base, head = _load("--base", args.base), _load("--head", args.head)
    if getattr(args, "ledger", None):
        base, _ = apply_ledger_per_arch(base, args.ledger)
        head, _ = apply_ledger_per_arch(head, args.ledger)
    changes = compare(base, head)
    # Only cases both tables ran are compared: a case one side lacks says nothing about a
    # change, and listing each would bury the regressions under a selection's difference.
    only_base, only_head = (int((changes["change"] == k).sum()) for k in ("removed", "new"))
    changes = changes[~changes["change"].isin(("removed", "new"))]
    counts = {k: n for k, n in summary(changes).items() if k not in ("removed", "new")}
    print("compare: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    if only_base or only_head:
        print(f"compare: left out {only_base} only in base, {only_head} only in head")
    for kind in ("regression", "fix"):
        for _, r in changes[changes["change"] == kind].iterrows():
            arch = f" [{r['arch']}]" if "arch" in changes.columns else ""
            print(f"  {kind:<10} {r['case_id']}{arch}: {_text(r['base_outcome'])} -> "
                  f"{_text(r['head_outcome'])}")
    if getattr(args, "out", None):
        from .html import render_html
        _write("--out", lambda: render_html(head, args.out, base_df=base,
                                            title="Attention correctness: base vs head"))
        print(f"compare: report -> {args.out}")
    if getattr(args, "markdown", None):
        from .markdown import render_markdown
        _write("--markdown", lambda: _write_text(args.markdown,
                                                 render_markdown(head, base, title="Base vs head")))
    return 1 if counts["regression"] else 0


def main(argv: list[str] | None = None) -> int:
    """`python -m reports.cli report|compare ...`, usable before harness/cli.py wires it."""
    parser = argparse.ArgumentParser(prog="reports")
    sub = parser.add_subparsers(dest="command", required=True)
    add_report_arguments(sub.add_parser("report"))
    add_compare_arguments(sub.add_parser("compare"))
    args = parser.parse_args(argv)
    return report_main(args) if args.command == "report" else compare_main(args)


if __name__ == "__main__":
    sys.exit(main())
