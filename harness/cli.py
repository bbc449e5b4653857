"""`harness list | check | repro | report | compare | bisect | shrink`.

`harness` is the console script `make setup` installs (the same as
`python -m harness`); it runs this checkout from any folder and resolves
every path option and the results folder against the current folder.

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
  repro   0 pass, 1 fail (a crash or hang in its child process included), 2 bad
          option, 4 unknown case id, 5 library build failure
  list    0, 2 bad option, or 4 when the selection is empty
  any     2 a usage error (one line on stderr: what, which option or file, what
          to do), 130 interrupted, 141 stdout closed early (`harness list | head`)
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_UNKNOWN_CASE, EXIT_BUILD = 0, 1, 2, 4, 5
EXIT_INTERRUPTED, EXIT_PIPE = 130, 141   # the shell's codes for SIGINT and SIGPIPE


def input_errors() -> tuple:
    """What reading the options raises on bad input: an unknown name (ValueError,
    pytest.UsageError) or a missing or unreadable file (OSError). Caught only
    around that reading, so a harness bug elsewhere keeps its traceback."""
    import pytest
    return (ValueError, OSError, pytest.UsageError)


def selection_errors() -> tuple:
    """input_errors(), plus a target whose library is missing or cannot run here
    (the flashinfer target without FlashInfer or a GPU): its message says what to install."""
    return (RuntimeError, ImportError, *input_errors())


def absolute_path(text: str) -> str:
    """argparse type for paths a child process reads from another folder."""
    return os.path.abspath(os.path.expanduser(text))


def child_env() -> dict:
    """The environment of a child `python -m ...`: this checkout first on the path, so
    it runs the same code from any folder, installed or not."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _add_selection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="bundled", help="library under test [bundled]")
    p.add_argument("--family", default=None, help="families, comma-separated [all]")
    p.add_argument("--route", default=None, help="routes, comma-separated [all]")
    p.add_argument("--case-id", default=None, help="only ids containing this substring")
    p.add_argument("--cases-file", default=None, type=absolute_path,
                   help="a JSON list of cases instead of families")
    p.add_argument("--profile", default=None, choices=("ci", "full"),
                   help="how many cases: ci (minutes on 2 cores) or full (thousands, for a GPU) "
                        "[full with a GPU, else ci]")


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
                        args.cases_file, getattr(args, "profile", None))


# ------------------------------------------------------------------ list

def cmd_list(args) -> int:
    try:
        cases = _select(args)
    except selection_errors() as why:
        print(f"list: {why}", file=sys.stderr)
        return EXIT_USAGE
    for case in cases:
        print(case.id)
    print(f"{len(cases)} cases", file=sys.stderr)
    return 0 if cases else 4


# ------------------------------------------------------------------ check

def pytest_command(args, results: Path | None = None) -> list[str]:
    """The child pytest's command; without `results`, its table's path comes with go()."""
    # Plugins a case run never uses, each loaded by every process: hypothesis's (it imports
    # all of hypothesis at the end of a run), log capture (~10% of a 750-case run), and the
    # unraisable/thread exception warnings (two full gc.collect passes at the end of every
    # process, 0.2-0.8 s with torch loaded; they only ever warn, never change a row).
    cmd = [sys.executable, "-m", "pytest", str(ROOT / "cases"), "-p", "no:cacheprovider",
           "-p", "no:hypothesispytest", "-p", "no:logging", "-p", "no:unraisableexception",
           "-p", "no:threadexception",
           "-q", "--no-header", "-rN", "--target", args.target]
    if results is not None:
        cmd += ["--results", str(results)]
    if args.n not in (None, "0"):
        cmd += ["-n", str(args.n)]
    if args.reruns:
        cmd += ["--reruns", str(args.reruns)]
    for opt in ("family", "route", "case_id", "cases_file", "disable_guards", "case_timeout",
                "run_id", "repeat", "profile"):
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


def summary_text(df, wall_s: float | None = None, max_classes: int = 60) -> str:
    """What `check` prints once, at the end: the failure classes (worst first, each
    once, a message printed once: harness/failure_classes.py), the route x outcome
    counts, then one line of totals. Each row's own numbers are in its message
    already, so nothing here repeats them."""
    import pandas as pd

    from harness.failure_classes import classes_text, failure_classes

    out = []
    failing = df[~df["pass"].astype(bool)] if len(df) else df
    classes = failure_classes(df) if len(failing) else []
    if classes:
        out.append(classes_text(classes, max_classes=max_classes) + "\n")
    if len(df):
        counts = pd.crosstab(df["route"], df["outcome"], margins=True, margins_name="total")
        out.append(counts.to_string())
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


# ------------------------------------------------------------------ check: the child pytest

POLL_S = 2.0          # how often the table is read for progress
LOG_TAIL = 25         # lines of pytest's own output shown when pytest itself fails


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
        else f"{seconds // 60}:{seconds % 60:02d}"


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Progress:
    """Rows done out of the run's total, read from the table the child pytest appends to.

    Rows stamped before the run started are an earlier run's (the child replaces that
    table when it starts); with --resume the rows already there count as done. On a
    terminal the line is redrawn every POLL_S; elsewhere (CI logs) a line is printed
    every 10 s, so a short run prints none.
    """

    def __init__(self, path: Path, total: int, done_before=(), stream=None,
                 interval: float | None = None):
        from datetime import datetime, timezone
        self.path, self.total, self.before = Path(path), total, set(done_before)
        self.stream = stream if stream is not None else sys.stderr
        self.tty = _isatty(self.stream)
        self.interval = interval if interval is not None else (POLL_S if self.tty else 10.0)
        self.since = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.started = self.last_shown = time.monotonic()
        self.first_row_at: float | None = None
        self.offset, self.ids, self.failing, self.drawn = 0, set(), 0, False
        self.inode: int | None = None

    @property
    def done(self) -> int:
        return len(self.before | self.ids)

    def poll(self) -> None:
        try:
            stat = self.path.stat()
        except OSError:
            return
        size = stat.st_size
        if size < self.offset or stat.st_ino != self.inode:  # replaced since the last read
            self.offset, self.ids, self.failing, self.inode = 0, set(), 0, stat.st_ino
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read(size - self.offset)
        complete = chunk.rfind(b"\n") + 1   # a line still being written waits
        self.offset += complete
        for line in chunk[:complete].splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if not isinstance(row, dict) or str(row.get("timestamp") or "") < self.since \
                    or row.get("case_id") in self.ids:
                continue
            self.ids.add(row.get("case_id"))
            self.failing += not row.get("pass")
            if self.first_row_at is None:
                self.first_row_at = time.monotonic()

    def line(self) -> str:
        now = time.monotonic()
        text = (f"check: {self.done}/{self.total} rows, {self.failing} failing, "
                f"{_clock(now - self.started)} elapsed")
        left = self.total - self.done
        # The rate from rows seen over a few seconds: workers start slowly, then finish
        # cases in bursts.
        if left > 0 and len(self.ids) >= 3 and now - (self.first_row_at or now) >= 2 * POLL_S:
            per_row = (now - self.first_row_at) / (len(self.ids) - 1)
            text += f", about {_clock(per_row * left)} left"
        return text

    def tick(self) -> None:
        self.poll()
        if time.monotonic() - self.last_shown < self.interval:
            return
        self.last_shown = time.monotonic()
        if self.tty:
            self.stream.write("\r" + self.line() + "\x1b[K")
            self.drawn = True
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def clear(self) -> None:
        if self.drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.drawn = False


def resume_command(argv) -> str:
    """The command that continues an interrupted check: the same one, with --resume."""
    import shlex
    argv = list(argv)
    if "--resume" not in argv:
        cut = argv.index("--") if "--" in argv else len(argv)
        argv[cut:cut] = ["--resume"]
    return shlex.join(["harness", *argv])


def _wait(proc: subprocess.Popen, progress: Progress | None) -> int:
    while True:
        try:
            return proc.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            if progress is not None:
                progress.tick()


def _stop(proc: subprocess.Popen) -> None:
    """End the child pytest after Ctrl-C. From a terminal it has the SIGINT too and
    writes what is pending; one that has not (a signal sent to this process alone)
    gets it now; one that lingers, or a second Ctrl-C, is terminated, then killed."""
    for sig, wait in ((None, 5.0), (signal.SIGINT, 15.0), (signal.SIGTERM, 5.0),
                      (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        if sig is not None:
            proc.send_signal(sig)
        try:
            proc.wait(timeout=wait)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            continue


def run_check_child(child, args, results: Path, expected: set) -> int | None:
    """Run the child pytest and return its exit code; None when Ctrl-C stopped it, after
    one line saying how many rows are kept and how to continue.

    pytest's own console (dots, its FAILURES section, which repeats each row's message,
    a KeyboardInterrupt traceback, plugin warnings) goes to a log file instead: every
    row is in the table and the summary says it once. The log's end is shown when
    pytest itself fails. With pytest options after `--`, pytest's console is shown.
    """
    from harness import table

    try:
        before = table.done_case_ids(results) & expected if args.resume else set()
    except (OSError, ValueError):
        before = set()   # the child says what is wrong with the table
    progress = Progress(results, len(expected), before)
    log, proc = child.log, child.proc
    print(f"check: {len(expected)} cases on {args.target}"
          + (f" ({len(before)} done already)" if before else "")
          + f"; rows go to {results}", file=sys.stderr, flush=True)
    child.go(results)
    # This process only waits now: the tables' reader (pandas) loads while the child runs.
    import pandas  # noqa: F401
    try:
        rc = _wait(proc, None if log is None else progress)
    except KeyboardInterrupt:
        _stop(proc)
        progress.poll()
        progress.clear()
        print(f"check: interrupted; {progress.done} of {progress.total} rows kept in "
              f"{results}; continue with: {resume_command(getattr(args, 'argv', sys.argv[1:]))}",
              file=sys.stderr)
        if log is not None:
            log.close()
            os.unlink(log.name)
        return None
    progress.clear()
    if log is not None:
        log.close()
        if rc in (0, 1) and results.exists():
            os.unlink(log.name)
        else:
            show_log_tail(log.name, rc)
    return rc


def show_log_tail(log_name: str, rc: int) -> None:
    lines = Path(log_name).read_text(errors="replace").splitlines()[-LOG_TAIL:]
    print(f"check: pytest exited {rc}; the end of its output (all of it: {log_name}):",
          file=sys.stderr)
    for line in lines:
        print("  " + line, file=sys.stderr)


def child_failed(child) -> int:
    """A child that ended before its report (a bad pytest option after `--`, a plugin that
    cannot load): its exit status, and the end of its output when that went to a log."""
    rc = child.proc.wait()
    if child.log is not None:
        child.log.close()
        show_log_tail(child.log.name, rc)
    return rc or EXIT_FAIL


def results_folder_error(results: Path) -> str | None:
    """Why the table cannot be written there, as one line; None when it can. Asked before
    the run: the child would otherwise stop at its first row with pytest's INTERNALERROR."""
    try:
        results.parent.mkdir(parents=True, exist_ok=True)
        if os.access(results.parent, os.W_OK):
            return None
        why = "the folder is not writable"
    except OSError as e:
        why = e.strerror or str(e)
    return (f"cannot write the results table {results} ({why}); choose another --results "
            f"or --results-dir")


def _check_run(args, report: dict | None) -> str | None:
    """Why the run must not start, in one line; None when it may. Sets args.expected_ids
    from the held child's report (harness/held_start.py)."""
    if report is None:
        return None   # the child ended without a report: its own output says why
    if "error" in report:
        # Unknown names, or a target whose library is missing: say so, run nothing.
        return str(report["error"])
    args.expected_ids = set(report.get("ids") or ())
    if not args.expected_ids and not args.resume:
        return (f"no cases selected (--target {args.target}, --family {args.family or 'all'}, "
                f"--route {args.route or 'all'}, --case-id {args.case_id or 'any'})")
    return None


def selection_of(args) -> str:
    """What a partial run selected, as its table's name says it ("" for a full run)."""
    from harness import table
    return table.selection_slug(args.family, args.route, args.case_id, args.cases_file,
                                args.profile)


def results_of(args, arch: str | None = None) -> Path:
    """The table's path: --results, or the default one under --results-dir (or ./results),
    named by target, arch (the held child's, when given), commit and selection."""
    if args.results:
        return Path(args.results).resolve()
    from harness import table
    return table.default_results_path(args.target, selection_of(args), args.results_dir, arch)


def cmd_check(args) -> int:
    from harness import table

    sanitizer_path, why = sanitizer_preflight(args)
    if why:  # before any case runs: a run whose rows cannot be replayed is not started
        print(f"check: {why}", file=sys.stderr)
        return EXIT_USAGE
    start = time.perf_counter()
    # Started at once and held until go(): it works out the run (this process never loads
    # torch or a target) and says so in its report; a bad option calls it off.
    from harness import fast_exit
    from harness.held_start import HeldChild
    child = HeldChild(pytest_command(args), ROOT, dict(child_env(), **{fast_exit.ENV: "1"}),
                      quiet=not args.pytest_args)
    try:
        report = child.report()
        why = _check_run(args, report)
        results = None if why or report is None else results_of(args, report.get("arch"))
        why = why or (results_folder_error(results) if results is not None else None)
    except BaseException:
        child.call_off()
        raise
    if why:  # before the run: bad options fail here, with the field and the values
        child.call_off()
        print(f"check: {why}", file=sys.stderr)
        return EXIT_USAGE
    if report is None:   # it ended before it could say what the run is: pytest's own error
        return child_failed(child)
    rc = run_check_child(child, args, results, args.expected_ids)
    if rc is None:  # Ctrl-C: what is kept and how to go on are said already
        return EXIT_USAGE
    wall = time.perf_counter() - start
    if not results.exists():
        print(f"check: no results table at {results} (pytest exit {rc})", file=sys.stderr)
        return rc or EXIT_FAIL
    if sanitizer_path:
        # Before the table is read, copied or rendered, so all of them carry the reports.
        sanitize(args, results, sanitizer_path)
    df = table.load_table(results)
    selection = selection_of(args)
    if not args.results and not selection and len(df):
        table.copy_latest(results, args.target, str(df["arch"].iloc[-1]))
    from harness.ledger import apply_ledger_per_arch
    df, ledger_errors = apply_ledger_per_arch(df, args.ledger)
    if args.disable_guards:
        # Before the summary, so the summary stays the last thing on the console.
        print(f"\nWith guards disabled ({args.disable_guards}):\n")
        print(before_after_table(df))
    print()
    print(summary_text(df, wall))
    for err in ledger_errors:
        print(f"ledger: {err}", file=sys.stderr)
    print(f"results: {results}" + (f" (partial run: {selection}; the full table is untouched)"
                                   if selection else ""))
    if args.html or args.markdown:
        _render(results, args.html, args.markdown)
    if rc not in (0, 1):
        return rc
    missing = args.expected_ids - set(df["case_id"])
    if missing:
        print(f"check: {len(missing)} case(s) have no row, e.g. {sorted(missing)[:3]}",
              file=sys.stderr)
        return EXIT_FAIL
    owns = bool(report.get("owns_contract"))
    blocking = gating(df, owns, args.strict) if len(df) else df
    findings = int((~df["pass"].astype(bool)).sum()) - len(blocking) if len(df) else 0
    if findings:
        print(f"check: {findings} capability/clarity finding(s) on {args.target} do not fail "
              f"the run (--strict makes them fail)")
    return EXIT_FAIL if len(blocking) or ledger_errors else EXIT_PASS


def sanitizer_preflight(args) -> tuple[str | None, str | None]:
    """(compute-sanitizer's path, None) when --sanitizer can run here; (None, one line) when
    it cannot; (None, None) without --sanitizer."""
    if not (args.sanitizer or args.sanitizer_all):
        return None, None
    from harness import sanitizer
    return sanitizer.preflight(args.sanitizer, args.sanitizer_all)


def sanitize(args, results: Path, tool_path: str) -> None:
    """Replay the run's rows under the tool and write its reports into the table. Adds
    information only: a failure here is one line, and the exit status stays the rows'."""
    from harness import sanitizer
    try:
        sanitizer.replay_table(results, args.sanitizer, tool_path, args.target,
                               replay_all=args.sanitizer_all, cases_file=args.cases_file)
    except (OSError, ValueError) as e:
        print(f"check: --sanitizer {args.sanitizer}: the reports were not written to {results} "
              f"({e})", file=sys.stderr)


def _render(results: Path, html: str | None, markdown: str | None) -> None:
    """The report of this run's own table (never a stale full table)."""
    cmd = [sys.executable, "-m", "harness", "report", "--results", str(results)]
    if html:
        cmd += ["--out", html]
    if markdown:
        cmd += ["--markdown", markdown]
    if subprocess.call(cmd, env=child_env()) != 0:
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


REPRO_WORKER = "repro"   # the name of the child's breadcrumbs (harness/isolation.py)


def cmd_repro(args) -> int:
    """One case in a child process (its crash or hang becomes a row, as in `check`),
    or, with --in-process, here (for a debugger)."""
    if not args.in_process:
        return repro_isolated(args)
    import faulthandler

    if not args.state_dir and not faulthandler.is_enabled():
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
            # The full profile holds every ci case too: any case id a table shows is found.
            argparse.Namespace(target=args.target, family=None, route=None, case_id=None,
                               cases_file=None, profile="full"))
    except Exception as e:
        if _is_build_error(e):
            print(f"repro: library build failed: {e}", file=sys.stderr)
            return EXIT_BUILD
        if isinstance(e, selection_errors()):
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

    extra = {"target": target.name, "disable_guards": os.environ.get("KERNELS_DISABLE_GUARDS", "")}
    stages = [lambda s: print(f"stage: {s}", file=sys.stderr, flush=True)] if args.verbose else []
    state = None
    if args.state_dir:
        # Breadcrumbs for the parent: the case, then each stage; faulthandler's dump of
        # a fatal signal or of the timeout goes to a file beside them (isolation.py).
        from harness import isolation
        state = isolation.WorkerState(args.state_dir, REPRO_WORKER)
        (Path(args.state_dir) / "case.json").write_text(json.dumps(case.to_json()))
        state.set_context(extra)
        stages.append(state.stage)
        state.begin(case.id, isolation.case_timeout(dict(case.params), args.case_timeout))
    try:
        result = execute_case(case, target, on_stage=(
            (lambda s: [f(s) for f in stages]) if stages else None))
    except Exception as e:
        if _is_build_error(e):
            print(f"repro: library build failed: {e}", file=sys.stderr)
            return EXIT_BUILD
        raise
    finally:  # an exception is the harness's, with its traceback: never a crash row
        if state is not None:
            state.end(case.id)
    row = case_row(case, result, **extra)
    print_row(row, args.json)
    return EXIT_PASS if row["pass"] else EXIT_FAIL


def print_row(row: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(row, allow_nan=True, default=str))
        return
    width = max(len(k) for k in row)
    for key, value in row.items():
        print(f"{key:<{width}}  {value}")


def repro_argv(args) -> list[str]:
    """repro's own arguments, for the child that runs the case."""
    argv = ["repro", args.case_id, "--target", args.target]
    for opt in ("disable_guards", "case_json", "cases_file", "case_timeout"):
        if getattr(args, opt, None) is not None:
            argv += ["--" + opt.replace("_", "-"), str(getattr(args, opt))]
    return argv + ["--json"] * bool(args.json) + ["--verbose"] * bool(args.verbose)


def relay(cmd: list[str], env: dict) -> int:
    """Run a child, copying its stdout and stderr line by line to this process's
    sys.stdout and sys.stderr (a terminal, a pipe, or a caller's capture alike)."""
    import threading

    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace")

    def copy(source, sink) -> None:
        for line in source:
            try:
                sink.write(line)
                sink.flush()
            except (OSError, ValueError):   # the reader went away: keep draining
                pass

    threads = [threading.Thread(target=copy, args=(proc.stdout, sys.stdout), daemon=True),
               threading.Thread(target=copy, args=(proc.stderr, sys.stderr), daemon=True)]
    for thread in threads:
        thread.start()
    try:
        proc.wait()
    except BaseException:   # Ctrl-C: the child goes too
        proc.kill()
        proc.wait()
        raise
    for thread in threads:
        thread.join()
    return proc.returncode


def repro_isolated(args) -> int:
    """Run `repro --in-process` in a child; when the child dies in the case (a signal,
    or faulthandler's timeout), print the crash or hang row `check` would record."""
    import tempfile

    from harness import isolation

    with tempfile.TemporaryDirectory(prefix="harness-repro-") as state_dir:
        cmd = [sys.executable, "-m", "harness", *repro_argv(args), "--in-process",
               "--state-dir", state_dir]
        rc = relay(cmd, child_env())
        if rc == EXIT_INTERRUPTED or not isolation.read_state(state_dir, REPRO_WORKER).get("case_id"):
            # The child finished the case (or never began one): its output and code stand.
            return rc if rc >= 0 else 128 - rc
        death = isolation.diagnose(state_dir, REPRO_WORKER, rc)
        case_json = json.loads((Path(state_dir) / "case.json").read_text())
    from harness import classify
    from harness.case import Case
    from harness.plugin import case_row

    case = Case.from_json(case_json)
    verdict = (classify.hang_verdict(case, round(death.timeout_s or 0, 1), death.stage)
               if death.kind == "hang" else classify.crash_verdict(case, death.cause, death.stage))
    row = case_row(case, outcome=verdict.outcome, **{"pass": False}, message=verdict.message,
                   error_type=death.cause, stage=death.stage, isolation="alone",
                   **(death.context or {}))
    print_row(row, args.json)
    if args.verbose and death.fault_text.strip():
        print(death.fault_text.rstrip(), file=sys.stderr)
    print(f"repro: the case killed its process ({verdict.message}); "
          + ("" if args.verbose else "--verbose prints where, ")
          + "--in-process runs it in this process", file=sys.stderr)
    return EXIT_FAIL


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
    "explore": ("harness.explore", "add_arguments", "main",
                "property-based search that shrinks failures to saved case files"),
}


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line: what is wrong, and where the options are."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (`{self.prog} --help` lists the options)\n")


def build_parser(argv=None) -> argparse.ArgumentParser:
    from harness.sanitizer import TOOLS as SANITIZER_TOOLS
    ap = Parser(prog="harness",
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
    p.add_argument("--results-dir", default=None, type=absolute_path,
                   help="folder for tables [./results]")
    p.add_argument("--html", default=None, help="render this run's HTML report here")
    p.add_argument("--markdown", default=None, help="render this run's Markdown summary here")
    p.add_argument("--case-timeout", type=positive_seconds, default=None, help="seconds before a hang")
    p.add_argument("--run-id", default=None)
    p.add_argument("--ledger", default=None, help="known-failures ledger [cases/known_failures.json]")
    p.add_argument("--sanitizer", default=None, choices=SANITIZER_TOOLS,
                   help="after the run, replay each failing row under NVIDIA compute-sanitizer "
                        "with this tool and keep its first report in the row (GPU only)")
    p.add_argument("--sanitizer-all", action="store_true",
                   help="with --sanitizer: replay every row, not only the failing ones")
    p.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("repro", help="run one case in a child process and print its row")
    p.add_argument("case_id")
    p.add_argument("--target", default="bundled")
    p.add_argument("--disable-guards", default=None)
    p.add_argument("--case-json", default=None, help="a JSON case file (from shrink)")
    p.add_argument("--cases-file", default=None, help="a JSON list of cases")
    p.add_argument("--json", action="store_true", help="print the row as one JSON line")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print each stage, and where a crash or hang happened")
    p.add_argument("--in-process", action="store_true",
                   help="run the case in this process (for a debugger): a crash then ends it")
    p.add_argument("--case-timeout", type=positive_seconds, default=None,
                   help="seconds before a hang, in the child [as check]")
    p.add_argument("--state-dir", default=None, help=argparse.SUPPRESS)
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


def _dispatch(args) -> int:
    if getattr(args, "_missing", None):
        print(f"{args.command}: {args._missing}", file=sys.stderr)
        return EXIT_USAGE
    empty = empty_table(args)
    if empty:
        print(f"{args.command}: {empty}", file=sys.stderr)
        return EXIT_USAGE
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
        code = _dispatch(args)
        sys.stdout.flush()   # a reader that went away (`| head`) shows here, not at exit
        return code
    except BrokenPipeError:
        _stdout_to_devnull()
        return EXIT_PIPE
    except KeyboardInterrupt:
        print(f"\n{command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
