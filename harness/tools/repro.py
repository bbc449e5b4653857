"""`harness repro CASE_ID`: one case, in the one child runner (a crash or hang is the row
`check` would record) or, with --in-process, here for a debugger.

The case is found by id in every profile (or read from --case-json / --cases-file), so any
id a table shows reproduces."""
from __future__ import annotations

import difflib
import json
import sys

from harness.tools.options import (EXIT_BUILD, EXIT_FAIL, EXIT_PASS, EXIT_UNKNOWN_CASE,
                                   EXIT_USAGE, check_target_options, selection_errors,
                                   target_options)


def load_case_json(path: str, target: str | None = None, option: str = "--case-json") -> list:
    """The cases of a --case-json / --cases-file file, checked as `check --cases-file`
    checks them (routes of `target`, features, types, ids): a misspelt route is one line,
    exit 2, before any case runs, not a skipped row."""
    from harness.model import cases_file
    from harness.targets import load_target
    loaded = load_target(target) if target else None
    return cases_file.load_file(path, f"{option} {path}", loaded.routes if loaded else None,
                                f"target {loaded.name!r}" if loaded else "the target")


def closest_ids(case_id: str, ids, n: int = 5) -> list[str]:
    close = difflib.get_close_matches(case_id, ids, n=n, cutoff=0.4)
    if not close:
        close = [i for i in ids if case_id in i][:n]
    return close


def _is_build_error(error: BaseException) -> bool:
    chain, e = [], error
    while e is not None and len(chain) < 8:
        chain.append(e)
        e = e.__cause__
    return any(t.__name__ == "BuildError" for x in chain for t in type(x).__mro__)


def _unknown(case_id: str, close: list[str]) -> int:
    print(f"repro: unknown case id {case_id!r}", file=sys.stderr)
    if close:
        print("closest ids:", file=sys.stderr)
        for cid in close:
            print(f"  {cid}", file=sys.stderr)
    return EXIT_UNKNOWN_CASE


def print_row(row: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(row, allow_nan=True, default=str))
        return
    width = max(len(k) for k in row)
    for key, value in row.items():
        print(f"{key:<{width}}  {value}")


def _case_file_cases(args):
    path = args.case_json or args.cases_file
    option = "--case-json" if args.case_json else "--cases-file"
    return load_case_json(path, args.target, option) if path else None


def _setup_error(e: Exception) -> int:
    """The exit status of a failure to set the case up (one line on stderr), or the
    exception again when it is the harness's own bug (its traceback is the report)."""
    if _is_build_error(e):
        print(f"repro: library build failed: {e}", file=sys.stderr)
        return EXIT_BUILD
    if isinstance(e, selection_errors()):
        print(f"repro: {e}", file=sys.stderr)
        return EXIT_USAGE
    raise e


def cmd_repro(args) -> int:
    try:
        # A value the target cannot honour (an unknown guard name) would otherwise reach
        # the library, whose refusal of it the row would record as the case's own refusal.
        check_target_options(args)
        given = _case_file_cases(args)
    except Exception as e:
        return _setup_error(e)
    if given is not None:
        case = next((c for c in given if c.id == args.case_id), None)
        if case is None:
            return _unknown(args.case_id, closest_ids(args.case_id, [c.id for c in given]))
        given = [case]
    if getattr(args, "standalone", False):
        return repro_standalone(args, given)
    if args.in_process:
        return repro_here(args, given)
    return repro_in_child(args, given)


def repro_standalone(args, given) -> int:
    """The case's row as usual, then a script that reproduces it with torch and the library
    alone (harness/tools/standalone.py). Exit 2, one line, when none can be written."""
    from harness.results.repro_command import repro_args, typed
    from harness.tools.standalone import Unavailable, shown, write_standalone
    out_path = getattr(args, "output", None)
    if not out_path:
        print("repro: --standalone needs -o FILE.py (where the script goes)", file=sys.stderr)
        return EXIT_USAGE
    if given is None:
        from harness.engine.session import all_cases
        from harness.targets import load_target
        by_id = {c.id: c for c in all_cases(load_target(args.target))}
        if args.case_id not in by_id:
            return _unknown(args.case_id, closest_ids(args.case_id, list(by_id)))
        given = [by_id[args.case_id]]
    from harness.tools.standalone import over_budget
    too_big = over_budget(given[0])
    if too_big:      # refused before a tensor is made, here or in the child
        print(f"repro: {too_big}", file=sys.stderr)
        return EXIT_USAGE
    rows = []
    code = repro_in_child(args, given, rows.append)
    if not rows:
        return code
    command = typed(repro_args(args.case_id, args.target, target_options(args),
                               args.case_json or args.cases_file)
                    + ["--standalone", "-o", str(out_path)])
    try:
        path = write_standalone(given[0], args.target, rows[-1], out_path, command=command)
    except Unavailable as why:
        print(f"repro: {shown(why)}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as why:
        print(f"repro: cannot write the script to {shown(out_path)}: "
              f"{shown(why.strerror or why)}", file=sys.stderr)
        return EXIT_USAGE
    print(f"repro: wrote {path}; `python {path}` prints the verdict and exits "
          f"{0 if rows[-1].get('pass') else 1} as this row did", file=sys.stderr)
    return code


def repro_here(args, given) -> int:
    """The case in this process: a crash ends the command, where a debugger sees it."""
    import faulthandler

    if not faulthandler.is_enabled():
        try:  # a crash in the case still prints where it happened
            faulthandler.enable()
        except (OSError, ValueError, AttributeError):
            pass  # stderr without a file descriptor (captured)
    from harness.engine.perform import perform, row_context
    from harness.engine.session import all_cases, load_runner
    try:
        target = load_runner(args.target, target_options(args))
        if given is None:
            by_id = {c.id: c for c in all_cases(target)}
            if args.case_id not in by_id:
                return _unknown(args.case_id, closest_ids(args.case_id, list(by_id)))
            given = [by_id[args.case_id]]
        on_stage = ((lambda s: print(f"stage: {s}", file=sys.stderr, flush=True))
                    if args.verbose else None)
        row = perform(given[0], target, 1, row_context(target), on_stage=on_stage)
    except Exception as e:
        return _setup_error(e)
    print_row(row, args.json)
    return EXIT_PASS if row["pass"] else EXIT_FAIL


def repro_in_child(args, given, keep_row=None) -> int:
    """The case in the one child runner: its death is the row `check` would write."""
    from harness.engine import child
    spec = child.Spec(target=args.target, cases=given or [], case_id=None if given else args.case_id,
                      options=target_options(args), case_timeout=args.case_timeout)
    out = child.run(spec)
    if out.unknown is not None:
        return _unknown(args.case_id, out.unknown)
    if args.verbose and out.stderr:
        sys.stderr.write(out.stderr)
    if not out.rows:
        # The child could not load the target or build the library: our set-up, one line.
        last = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        build = "BuildError" in out.stderr
        print(f"repro: {'library build failed: ' if build else ''}{last}", file=sys.stderr)
        return EXIT_BUILD if build else EXIT_USAGE
    row = out.rows[-1]
    if keep_row is not None:
        keep_row(row)
    print_row(row, args.json)
    if out.died:
        if args.verbose and out.fault_text.strip():
            print(out.fault_text.rstrip(), file=sys.stderr)
        print(f"repro: the case killed its process ({row['message']}); "
              + ("" if args.verbose else "--verbose prints where, ")
              + "--in-process runs it in this process", file=sys.stderr)
    return EXIT_PASS if row.get("pass") else EXIT_FAIL
