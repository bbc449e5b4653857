"""`harness list | check | repro | report | compare | bisect | shrink`.

`harness` is the console script `make setup` installs (the same as
`python -m harness`); it runs this checkout from any folder and resolves
every path option and the results folder against the current folder.

`check` runs the same pytest session as `pytest harness/engine/pytest_root -n auto`
(in a child process, so the plugin's controller owns the run exactly as it does under
plain pytest), then reads the table it wrote and summarizes it. No case is
rerun unless --reruns asks, and then every attempt is kept on the row: a
failing attempt fails the row (harness/engine/attempts.py).

Exit codes (stable: bisect and CI read them; docs/ci.md has the table, tests/test_exit_codes.py
checks it):
  check   0 no gating row fails (after the ledger); 1 a gating row fails, the
          ledger has errors, or rows are missing; 2 the run did not complete: a usage
          error before any case, or a stop (Ctrl-C, SIGTERM, a full disk, the pytest
          child killed or stalled, an output that could not be written), said in one
          line with the rows kept and the --resume command; 3 nothing was tested (every
          selected case was skipped); 4 the selection is empty. Correctness and
          harness rows always gate; capability and clarity rows gate for a
          target that owns its contract (the bundled library) and, for any
          other target, only with --strict.
  repro   0 pass, 1 fail (a crash or hang in its child process included), 2 bad
          option (or --standalone for a case its target cannot write as a script),
          4 unknown case id, 5 library build failure
  list    0, 2 bad option, or 4 when the selection is empty
  any     2 a usage error (one line on stderr: what, which option or file, what
          to do), 130 interrupted, 141 stdout closed early (`harness list | head`)
"""
from __future__ import annotations

import argparse
import os
import sys

from harness.tools.options import (EXIT_INTERRUPTED, EXIT_PIPE, EXIT_USAGE, DEFAULT_TARGET,
                                   EXIT_EMPTY, add_run_options, add_selection,
                                   add_target_options, positive_seconds, select,
                                   selection_errors)


# ------------------------------------------------------------------ list

def cmd_list(args) -> int:
    try:
        cases = select(args)
    except selection_errors() as why:
        print(f"list: {why}", file=sys.stderr)
        return EXIT_USAGE
    for case in cases:
        print(case.id)
    print(f"{len(cases)} cases", file=sys.stderr)
    return 0 if cases else EXIT_EMPTY


def _command(module: str, name: str):
    """A subcommand whose module loads only when it runs."""
    def run(args) -> int:
        return getattr(__import__(module, fromlist=[name]), name)(args)
    return run


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
    "bisect": ("harness.tools.bisect", "add_arguments", "main", "the commit that changed a case"),
    "shrink": ("harness.tools.shrink", "add_arguments", "main", "the smallest case that still fails"),
    "explore": ("harness.tools.explore", "add_arguments", "main",
                "property-based search that shrinks failures to saved case files"),
    "check-target": ("harness.tools.check_target", "add_arguments", "main",
                     "what an adapter does wrong, before its rows are trusted"),
}


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line: what is wrong, and where the options are."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (`{self.prog} --help` lists the options)\n")


def build_parser(argv=None) -> argparse.ArgumentParser:
    ap = Parser(prog="harness",
                description="Differential correctness harness for attention kernels")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="case ids, one per line")
    add_selection(p)
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("check", help="run the case matrix under pytest-xdist and summarize")
    add_selection(p)
    add_target_options(p)
    add_run_options(p)   # every other option of check's (engine/check_options.py TABLE)
    p.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    p.set_defaults(func=_command("harness.tools.check", "cmd_check"))

    p = sub.add_parser("repro", help="run one case in a child process and print its row")
    p.add_argument("case_id")
    p.add_argument("--target", default=DEFAULT_TARGET)
    add_target_options(p)
    p.add_argument("--case-json", default=None, help="a JSON case file (from shrink)")
    p.add_argument("--cases-file", default=None, help="a JSON list of cases")
    p.add_argument("--json", action="store_true", help="print the row as one JSON line")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print each stage, and where a crash or hang happened")
    p.add_argument("--in-process", action="store_true",
                   help="run the case in this process (for a debugger): a crash then ends it")
    p.add_argument("--case-timeout", type=positive_seconds, default=None,
                   help="seconds before a hang, in the child [as check]")
    p.add_argument("--standalone", action="store_true",
                   help="also write a script that reproduces the row with torch and the "
                        "library alone (needs -o)")
    p.add_argument("-o", "--output", default=None, metavar="FILE.py",
                   help="where --standalone writes its script")
    p.set_defaults(func=_command("harness.tools.repro", "cmd_repro"))

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


# Tables `report` and `compare` read, by option: one with no rows is a usage error.
TABLE_OPTIONS = {"report": ("results", "base"), "compare": ("base", "head")}


def empty_table(args) -> str | None:
    """The first table option naming a file without rows (a run stopped before its first
    case, a CSV header alone), as one line; None when every named table has a row. A
    missing or corrupt file is left to the loader, which names it."""
    for opt in TABLE_OPTIONS.get(args.command, ()):
        for path in getattr(args, opt, None) or ():
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    lines = sum(1 for _ in zip(range(2), (line for line in f if line.strip())))
            except OSError:
                continue
            if lines < (2 if str(path).lower().endswith(".csv") else 1):
                return (f"--{opt}: {path} has no rows; `harness check` writes a table "
                        f"(`--resume` continues one that stopped)")
    return None


def report_repros(args) -> None:
    """`report --repros DIR`: one standalone script per failure class of the tables,
    DIR/<class slug>.py (the name the HTML report links), before the report is rendered;
    one line per class: its slug, its example case and where the script went or why none
    did. Tables that do not load are left to the report, which names them."""
    try:
        from reports import load_results
        df = load_results(args.results)
    except (ImportError, OSError, ValueError):
        return
    from harness.tools.standalone import plain_row, write_class_repros
    rows = [plain_row(r) for r in df.to_dict("records")]
    for slug, case_id, where in write_class_repros(rows, args.repros):
        said = where if where.startswith("not written") else f"wrote {where}"
        print(f"repros: {slug}  {case_id}  {said}")


# Every option that names a file or folder, by its argparse dest. Each is made absolute
# against the folder the command was typed in, before any child (pytest, repro, a bisect
# step, the report renderer) sees it: those run in the harness's checkout or the bisected
# repository, where a relative path means another file.
PATH_OPTIONS = ("cases_file", "case_json", "results", "results_dir", "html", "markdown",
                "junitxml", "summary_json", "ledger", "output", "out", "out_dir", "repros",
                "base", "head", "repo", "cache_dir")


def _absolute(value):
    if isinstance(value, (list, tuple)):
        return type(value)(_absolute(v) for v in value)
    if not isinstance(value, str) or not value:
        return value
    return os.path.abspath(os.path.expanduser(value))


def absolute_target(spec):
    """`--target path/to/file.py[:func]` with the file made absolute; a registry name, an
    alias, an entry point or `package.module:factory` unchanged."""
    if not isinstance(spec, str) or not spec:
        return spec
    from harness import targets
    if not targets._is_path(spec) or spec in targets.TARGETS:
        return spec
    try:
        if spec in targets.aliases():
            return spec
    except targets.TargetLoadError:
        pass   # the loader names the bad alias
    where, sep, func = spec.partition(":")
    return _absolute(where) + sep + func


def resolve_paths(args) -> None:
    """Every path option, absolute where the user typed it (PATH_OPTIONS)."""
    for dest in PATH_OPTIONS:
        if getattr(args, dest, None):
            setattr(args, dest, _absolute(getattr(args, dest)))
    if getattr(args, "target", None):
        args.target = absolute_target(args.target)


# Commands that run cases: the environment that changes what they test is checked first.
RUNS_CASES = ("check", "repro", "shrink", "bisect", "explore", "check-target")


def expand_tables(args) -> str | None:
    """`report --results 'shard-*.jsonl'`: each table option's glob patterns expanded (the
    shell leaves a quoted one alone), sorted; one line when a pattern matches no file."""
    import glob
    for opt in TABLE_OPTIONS.get(args.command, ()):
        given = getattr(args, opt, None)
        if not given:
            continue
        paths = []
        for path in given:
            if glob.has_magic(path) and not os.path.exists(path):
                found = sorted(glob.glob(path))
                if not found:
                    return f"--{opt} {path!r}: no file matches"
                paths += found
            else:
                paths.append(path)
        setattr(args, opt, paths)
    return None


def _dispatch(args) -> int:
    if getattr(args, "_missing", None):
        print(f"{args.command}: {args._missing}", file=sys.stderr)
        return EXIT_USAGE
    unmatched = expand_tables(args)
    if unmatched:
        print(f"{args.command}: {unmatched}", file=sys.stderr)
        return EXIT_USAGE
    if args.command in RUNS_CASES:
        from harness.tools.environment import environment_error
        bad = environment_error()
        if bad:
            print(f"{args.command}: {bad}", file=sys.stderr)
            return EXIT_USAGE
    empty = empty_table(args)
    if empty:
        print(f"{args.command}: {empty}", file=sys.stderr)
        return EXIT_USAGE
    if args.command == "report" and getattr(args, "repros", None):
        report_repros(args)
    if getattr(args, "_lazy_main", None):
        module, main_name = args._lazy_main
        return int(getattr(__import__(module, fromlist=[main_name]), main_name)(args) or 0)
    return int(args.func(args) or 0)


def _stdout_to_devnull() -> None:
    """After a reader went away: the interpreter's last flush at exit then writes
    nowhere instead of printing a second BrokenPipeError."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass   # a stdout without a descriptor (captured) has nothing to flush


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), "harness")
    try:
        args = build_parser(argv).parse_args(argv)
        args.argv = argv   # check's --resume hint repeats the command as given
        resolve_paths(args)
        code = _dispatch(args)
        sys.stdout.flush()   # a reader that went away (`| head`) shows here, not at exit
        return code
    except BrokenPipeError:
        _stdout_to_devnull()
        return EXIT_PIPE
    except KeyboardInterrupt:
        print(f"\n{command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
