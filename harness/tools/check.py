"""`harness check`: the parent that starts the pytest session, shows its progress, and
turns its table into a summary and an exit status."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.engine import check_options, pytest_root
from harness.results.summary import gating, summary_text
from harness.tools.options import (EXIT_EMPTY, EXIT_FAIL, EXIT_NOT_TESTED, EXIT_PASS,
                                   EXIT_USAGE, ROOT, child_env, options_said, target_options)

# ------------------------------------------------------------------ check

def pytest_command(args, results: Path | None = None) -> list[str]:
    """The child pytest's command, writing the table `results` (else its default one)."""
    # Plugins a case run never uses, each loaded by every process: hypothesis's (it imports
    # all of hypothesis at the end of a run), log capture (~10% of a 750-case run), and the
    # unraisable/thread exception warnings (two full gc.collect passes at the end of every
    # process, 0.2-0.8 s with torch loaded; they only ever warn, never change a row).
    cmd = [sys.executable, "-m", "pytest", str(pytest_root.PATH), "-p", "no:cacheprovider",
           "-p", "no:hypothesispytest", "-p", "no:logging", "-p", "no:unraisableexception",
           "-p", "no:threadexception",
           "-q", "--no-header", "-rN"]
    if results is not None:
        cmd.append(f"--results={results}")
    if args.n not in (None, "0"):
        cmd += ["-n", str(args.n)]
    if args.reruns:
        cmd += ["--reruns", str(args.reruns)]
    # Every option both take (harness/engine/check_options.py), then the target's own.
    cmd += check_options.child_args(args)
    for opt, value in target_options(args).items():
        # One token, option=value: a value that starts with "-" must not read as an option.
        cmd.append(f"--{opt.replace('_', '-')}={value}")
    return cmd + list(args.pytest_args or [])


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
                 interval: float | None = None, costs: dict | None = None):
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
        # case id -> estimated cost (the run's plan): the ETA weighs what is left by
        # it, so a few long cases still running are not read as a few seconds of work.
        self.costs = dict(costs or {})
        self.expected = set(self.costs)

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
            text += f", about {_clock(self.seconds_left(now, left))} left"
        return text

    def seconds_left(self, now: float, left: int) -> float:
        """Rows left at the rate rows came; with the cases' costs, the cost left (the long
        cases still running included) at the rate cost was done."""
        elapsed = now - self.started
        done_cost = sum(self.costs.get(i, 0) for i in self.ids)
        if self.costs and done_cost > 0:
            left_cost = sum(c for i, c in self.costs.items()
                            if i not in self.ids and i not in self.before)
            return left_cost * elapsed / done_cost
        return (now - self.first_row_at) / (len(self.ids) - 1) * left

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


def _wait(proc: subprocess.Popen, progress: Progress | None, watch=None) -> int:
    while True:
        try:
            return proc.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            if progress is not None:
                progress.tick()
            if watch is not None:
                watch.tick()   # ends a stopped controller (harness/tools/controller_watch.py)


class Terminated(KeyboardInterrupt):
    """SIGTERM to `harness check`: handled as Ctrl-C (rows kept, the resume command said)."""


def _sigterm(signum, frame):
    raise Terminated("SIGTERM")


def _stop(proc: subprocess.Popen, alone: bool = False) -> None:
    """End the child pytest after Ctrl-C. From a terminal it has the SIGINT too and
    writes what is pending; one that has not (a signal sent to this process alone:
    `alone`, a SIGTERM) gets it now; one that lingers, or a second Ctrl-C, is
    terminated, then killed."""
    steps = ((signal.SIGINT, 15.0), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0))
    for sig, wait in (steps if alone else ((None, 5.0),) + steps):
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
    from harness.results import table

    try:
        before = table.done_case_ids(results) & expected if args.resume else set()
    except (OSError, ValueError):
        before = set()   # the child says what is wrong with the table
    costs = {i: c for i, c in (getattr(args, "costs", None) or {}).items() if i in expected}
    progress = Progress(results, len(expected), before, costs=costs)
    log, proc = child.log, child.proc
    from harness.tools.environment import limits, limits_text
    overrides = limits_text(limits(args))
    print(f"check: {len(expected)} cases on {args.target}"
          + (f" ({len(before)} done already)" if before else "")
          + f"; rows go to {results}"
          + (f"; limits: {overrides}" if overrides else ""), file=sys.stderr, flush=True)
    if getattr(args, "replacing", None):
        print(f"check: {args.replacing}", file=sys.stderr, flush=True)
    # This process only waits now: the tables' reader (pandas) loads while the child runs.
    import pandas  # noqa: F401
    from harness.engine.isolation import TIMEOUT_BASE_S
    from harness.tools.controller_watch import ControllerWatch
    watch = ControllerWatch(proc, args.case_timeout or TIMEOUT_BASE_S)
    try:
        rc = _wait(proc, None if log is None else progress, watch)
    except KeyboardInterrupt as stop:
        _stop(proc, alone=isinstance(stop, Terminated))
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
    if rc == 5 and args.resume:
        rc = 0   # pytest's "no tests collected": every case of the selection had its row
    completed = rc in (0, 1) and watch.reason is None
    if log is not None:
        log.close()
        stops = [] if completed or watch.reason else stop_lines(log.name)
        if completed and results.exists():
            os.unlink(log.name)
        elif stops:
            # The run said why it stopped, in one line: that line, not pytest's log.
            for line in stops:
                print(f"check: {line}", file=sys.stderr)
            os.unlink(log.name)
            args.stopped = stops[-1]
            return rc
        elif rc > 0 and not watch.reason:
            show_log_tail(log.name, rc)
        else:
            os.unlink(log.name)   # killed: its log ends mid-run and says nothing of why
    if not completed:
        progress.poll()
        why = watch.reason or (
            f"the pytest run (pid {proc.pid}) was killed by {_signal_name(-rc)}" if rc < 0
            else f"pytest exited {rc} before the run ended")
        args.stopped = why
        print(f"check: {why}; {progress.done} of {progress.total} rows kept in {results}; "
              f"continue with: {resume_command(getattr(args, 'argv', sys.argv[1:]))}",
              file=sys.stderr)
    return rc


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def stop_lines(log_name: str) -> list[str]:
    """The lines a run that could not go on left in pytest's log (plugin.STOP_PREFIX)."""
    from harness.engine.plugins.lifecycle import STOP_PREFIX
    try:
        text = Path(log_name).read_text(errors="replace")
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        at = line.find(STOP_PREFIX)   # pytest's progress dots may precede it on its line
        if at >= 0 and line[at + len(STOP_PREFIX):] not in found:
            found.append(line[at + len(STOP_PREFIX):])
    return found


def show_log_tail(log_name: str, rc: int) -> None:
    lines = Path(log_name).read_text(errors="replace").splitlines()[-LOG_TAIL:]
    print(f"check: pytest exited {rc}; the end of its output (all of it: {log_name}):",
          file=sys.stderr)
    for line in lines:
        print("  " + line, file=sys.stderr)


class CheckChild:
    """The pytest child of a planned run, its table's path on its command line. quiet:
    pytest's console goes to a log file (shown only when pytest itself fails)."""

    def __init__(self, cmd: list[str], env: dict, quiet: bool):
        import tempfile
        self.log = tempfile.NamedTemporaryFile(prefix="harness-check-", suffix=".log",
                                               delete=False) if quiet else None
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log,
                                     stderr=None if self.log is None else subprocess.STDOUT)


def start_child(args, results: Path) -> CheckChild:
    """The run's pytest child, started: it dies with this process (PARENT_PID_ENV) and adopts
    the table's lock this process holds; --shard is handed to it alone."""
    from harness.engine import fast_exit
    from harness.engine.plugins.lifecycle import PARENT_PID_ENV
    from harness.model.shard import SHARD_ENV
    env = dict(child_env(), **{fast_exit.ENV: "1", PARENT_PID_ENV: str(os.getpid())})
    env.pop(SHARD_ENV, None)   # the shard is --shard's alone, never one left in the environment
    if getattr(args, "shard", None):
        env[SHARD_ENV] = args.shard
    return CheckChild(pytest_command(args, results), env, quiet=not args.pytest_args)


def results_folder_error(results: Path) -> str | None:
    """Why the table cannot be written there, as one line; None when it can. Asked before
    the run: the child would otherwise stop at its first row with pytest's INTERNALERROR."""
    if results.is_dir():
        return (f"the results table {results} is a folder; give --results a file path, or "
                f"the folder as --results-dir")
    try:
        results.parent.mkdir(parents=True, exist_ok=True)
        if os.access(results.parent, os.W_OK):
            return None
        why = "the folder is not writable"
    except OSError as e:
        why = e.strerror or str(e)
    return (f"cannot write the results table {results} ({why}); choose another --results "
            f"or --results-dir")


def output_error(option: str, path: str | None) -> str | None:
    """Why a report cannot be written at `path`, in one line; None when it can (or no path).
    Asked before the run, so a run of minutes never ends in a traceback over its report."""
    if not path:
        return None
    out = Path(path)
    if out.is_dir():
        return f"{option} {path}: is a folder; give the report's file path"
    folder = out.parent
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{option} {path}: {existing} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        return f"{option} {path}: not writable here; choose another path"
    # Permission bits do not say everything (root, /proc, a read-only mount): the file is
    # opened for appending now, and removed again when this made it.
    made = not out.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(out, "ab"):
            pass
        if made:
            out.unlink()
    except OSError as e:
        return f"{option} {path}: cannot be written ({e.strerror or e}); choose another path"
    return None


def ledger_error(path: str | None) -> str | None:
    """A malformed ledger, in one line, before the run (it is applied after it)."""
    from harness.results.ledger import load_ledger
    try:
        load_ledger(path)
    except OSError as e:
        return f"--ledger {path}: {e.strerror or e}"
    except ValueError as e:
        return f"ledger: {e}"
    return None


def _check_run(args, report: dict) -> str | None:
    """Why the run must not start, in one line; None when it may. Sets args.expected_ids
    from the run's plan (harness/engine/run_plan.py), and args.why_code to EXIT_EMPTY for
    an empty selection (docs/ci.md)."""
    if "error" in report:
        # Unknown names, or a target whose library is missing: say so, run nothing.
        return str(report["error"])
    args.expected_ids = set(report.get("ids") or ())
    args.costs = report.get("costs") if isinstance(report.get("costs"), dict) else None
    if not args.expected_ids and not args.resume:
        args.why_code = EXIT_EMPTY
        return (f"no cases selected (--target {args.target}, --family {args.family or 'all'}, "
                f"--route {args.route or 'all'}, --case-id {args.case_id or 'any'}"
                + (f", --cases-file {args.cases_file}" if args.cases_file else "")
                + (f", --shard {args.shard}" if getattr(args, "shard", None) else "") + ")")
    return None


def selection_of(args) -> str:
    """What a partial run selected, as its table's name says it ("" for a full run)."""
    from harness.engine.run_plan import selection_of as selected
    return selected(lambda name: getattr(args, name, None), getattr(args, "shard", None))


def library_name(args, report: dict | None = None) -> tuple[str, str | None]:
    """(the target's declared name, the library's commit or version) that name its tables,
    from the run's plan (engine/identity.py); a plan without them gives the spec's label
    and this checkout's commit."""
    report = report or {}
    if report.get("target_name"):
        from harness.engine.identity import table_key
        return str(report["target_name"]), table_key(report)
    from harness.targets import label
    return label(args.target), None


def results_of(args, arch: str | None = None, report: dict | None = None) -> Path:
    """The table's path: --results, or the default one under --results-dir (or ./results),
    named by the library (its declared name), arch (the plan's, when given), the
    library's commit and the selection."""
    if args.results:
        return Path(args.results).resolve()
    from harness.results import table
    name, key = library_name(args, report)
    return table.default_results_path(name, selection_of(args), args.results_dir, arch, key)


def replacing_note(results: Path, expected: set) -> str | None:
    """One line when this run will replace a table that holds rows: whose, and whether they
    are of another selection (a different set of cases); None when there is none."""
    from harness.results import table
    try:
        rows = table.read_rows(results, torn_note=lambda _: None) if results.exists() else []
    except (OSError, ValueError):
        return None   # a table that cannot be read is replaced whole; the run says nothing new
    if not rows:
        return None
    ids = {r["case_id"] for r in rows}
    runs = sorted({str(r.get("run_id") or "?") for r in rows})
    whose = f"{len(rows)} rows of run {', '.join(runs[:2])}" + (" ..." if len(runs) > 2 else "")
    if ids == expected:
        return f"replacing {results} ({whose}, the same cases); --resume continues it instead"
    gone = sorted(ids - expected)
    return (f"replacing {results}, a table of another selection ({whose}; "
            f"{len(gone)} of its cases are not in this run"
            + (f", e.g. {gone[0]}" if gone else "") + f", {len(expected - ids)} of this run's "
            f"are not in it); --results FILE writes this run elsewhere")


def cmd_check(args) -> int:
    held: list = []
    try:
        return _cmd_check(args, held)
    finally:
        for lock in held:   # the table's lock, for this process's next run (and the next run's)
            lock.release()


def _cmd_check(args, held: list) -> int:
    from harness.results import table

    sanitizer_path, why = sanitizer_preflight(args)
    why = why or output_error("--html", args.html) or output_error("--markdown", args.markdown) \
        or output_error("--junitxml", getattr(args, "junitxml", None)) \
        or output_error("--summary-json", getattr(args, "summary_json", None)) \
        or ledger_error(args.ledger)
    if why:  # before any case runs: a run whose rows cannot be replayed is not started
        print(f"check: {why}", file=sys.stderr)
        return EXIT_USAGE
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _sigterm)
    lock = None
    named = Path(args.results).resolve() if args.results else None
    if named is not None and named.parent.is_dir():
        # A named table is locked before the pytest child starts (seconds of start-up): a
        # second run on it stops at once, naming the run that holds it.
        try:
            lock = table.TableLock.acquire(named)
            held.append(lock)
        except table.TableBusy as busy:
            print(f"check: {busy}", file=sys.stderr)
            return EXIT_USAGE
        except OSError:
            lock = None              # said below, with the folder's own error
    start = time.perf_counter()
    # The run is worked out here, before any child starts: an in-tree target with a
    # descriptor is planned without torch or the library (harness/engine/run_plan.py).
    from harness.engine import run_plan
    report = run_plan.plan(lambda name: getattr(args, name, None), getattr(args, "shard", None))
    why = _check_run(args, report)
    results = None if why else results_of(args, report.get("arch"), report)
    why = why or (results_folder_error(results) if results is not None else None)
    if results is not None and not why and lock is None:
        # Held for this process's life, before the child may write: a second run on the
        # table stops here, with the pid of the one that holds it. The child adopts it.
        try:
            lock = table.TableLock.acquire(results)
            held.append(lock)
        except table.TableBusy as busy:
            why = str(busy)
        except OSError as e:
            why = f"cannot lock the results table {results} ({e.strerror or e})"
    if lock is not None and args.resume and results.exists():
        try:   # a table that cannot be read is not resumed: one line, before the run
            table.read_rows(results, torn_note=lambda _: None)
        except (OSError, ValueError) as e:
            why = f"{e}; fix or move the table, or run without --resume"
    if why:  # before the run: bad options fail here, with the field and the values
        print(f"check: {why}", file=sys.stderr)
        return getattr(args, "why_code", EXIT_USAGE)
    args.replacing = None if args.resume else replacing_note(results, args.expected_ids)
    args.stopped = None
    rc = run_check_child(start_child(args, results), args, results, args.expected_ids)
    if rc is None:  # Ctrl-C: what is kept and how to go on are said already
        return EXIT_USAGE
    wall = time.perf_counter() - start
    if not results.exists():
        print(f"check: no results table at {results} (pytest exit {rc})", file=sys.stderr)
        return EXIT_USAGE if args.stopped else rc or EXIT_FAIL
    if sanitizer_path and not args.stopped:
        # Before the table is read, copied or rendered, so all of them carry the reports.
        sanitize(args, results, sanitizer_path)
    try:
        df = table.load_table(results)
    except (OSError, ValueError) as e:
        print(f"check: {e}", file=sys.stderr)
        return EXIT_USAGE
    selection = selection_of(args)
    from harness.results.ledger import apply_ledger_per_arch
    df, ledger_errors = apply_ledger_per_arch(df, args.ledger)
    if args.stopped:
        # Never a verdict of a run that did not finish: the one line said what stopped it,
        # how many rows are kept and how to go on; CI's outputs say STOPPED.
        write_outputs(args, df, results, None, EXIT_USAGE,
                      {"verdict_line": f"STOPPED: {args.stopped}; {len(df)} rows kept",
                       "stopped": args.stopped})
        return EXIT_USAGE
    try:
        if not args.results and not selection and len(df):
            table.copy_latest(results, library_name(args, report)[0], str(df["arch"].iloc[-1]))
    except (OSError, ValueError) as e:
        print(f"check: {e}; the rows are kept in {results}", file=sys.stderr)
        return EXIT_USAGE
    print()
    # The verdict and one line per failure class, never one per row: a guards-off run fails
    # hundreds of rows, and their table is the Markdown report's (--markdown, "Failures").
    text = summary_text(df, wall)
    untested = not_tested_line(df)
    if untested:   # a run that tested nothing never reads PASS
        text = untested + "\n" + text.split("\n", 1)[-1]
    print(text)
    skipped = skipped_line(df)
    if skipped and not untested:
        print(skipped)
    said = options_said(target_options(args))
    if said:   # a run with a target option set (guards off, say) fails many rows
        print(said + ("" if args.markdown else "; --markdown FILE writes every failing row"))
    for err in ledger_errors:
        print(f"ledger: {err}", file=sys.stderr)
    print(f"results: {results}" + (f" (partial run: {selection}; the full table is untouched)"
                                   if selection else ""))
    if report.get("library_commit") == "unknown":   # said once, where the table is named
        print(f"library commit: unknown ({report.get('commit_source')})"
              + ("" if args.results else "; the table is named by the library's version"))
    if (args.html or args.markdown) and not _render(results, args.html, args.markdown, args.ledger):
        return EXIT_USAGE
    extra = {"verdict_line": untested} if untested else {}
    missing = args.expected_ids - set(df["case_id"])
    if missing:
        print(f"check: {len(missing)} case(s) have no row, e.g. {sorted(missing)[:3]}",
              file=sys.stderr)
        return write_outputs(args, df, results, None, EXIT_FAIL, extra)
    owns = bool(report.get("owns_contract"))
    blocking = gating(df, owns, args.strict) if len(df) else df
    findings = int((~df["pass"].astype(bool)).sum()) - len(blocking) if len(df) else 0
    if findings:
        print(f"check: {findings} capability/clarity finding(s) on {args.target} do not fail "
              f"the run (--strict makes them fail)")
    code = EXIT_FAIL if len(blocking) or ledger_errors else EXIT_PASS
    if untested and code == EXIT_PASS:
        code = EXIT_NOT_TESTED
    return write_outputs(args, df, results, blocking, code, extra)


def not_tested_line(df) -> str | None:
    """The verdict of a table whose every row is skipped: NOT TESTED, with why."""
    if not len(df) or not (df["outcome"] == "skipped").all():
        return None
    return (f"NOT TESTED: all {len(df)} cases were skipped ({_reasons(df)}); nothing ran, so "
            f"nothing passed")


def skipped_line(df) -> str | None:
    """What was skipped and why, when some rows were: `skipped: 3 of 40 cases (...)`."""
    if not len(df):
        return None
    skipped = df[df["outcome"] == "skipped"]
    if not len(skipped):
        return None
    return f"skipped: {len(skipped)} of {len(df)} cases ({_reasons(skipped)})"


def _reasons(skipped, most: int = 3) -> str:
    """The skips' reasons, most common first, numbers and sizes folded together."""
    import re
    folded = skipped["message"].fillna("").astype(str).map(
        # A number standing alone is folded, not digits inside a name (fp8_kv, int64, d128).
        lambda m: re.sub(r"(?<![A-Za-z0-9_])[0-9][0-9,.]*(?![A-Za-z_])", "N",
                         " ".join(m.split()))[:160] or "no reason given")
    counts = folded.value_counts()
    parts = [f"{n}: {why}" for why, n in counts.head(most).items()]
    if len(counts) > most:
        parts.append(f"{len(counts) - most} other reasons")
    return "; ".join(parts)


def write_outputs(args, df, results: Path, blocking, code: int, extra: dict | None = None) -> int:
    """ci_outputs, and the exit status: `code`, or 2 with one line when an output could not
    be written (its path and why, and that the rows are kept)."""
    from harness.tools.environment import limits
    try:
        ci_outputs(args, df, results, blocking, code, {**(extra or {}), "limits": limits(args)})
    except OSError as e:
        where = e.filename or getattr(args, "junitxml", None) or getattr(args, "summary_json", None)
        print(f"check: cannot write {where} ({e.strerror or e}); the run's {len(df)} rows are "
              f"kept in {results}, and `python -m harness.tools.ci_outputs {results}` writes "
              f"the outputs again", file=sys.stderr)
        return EXIT_USAGE
    return code


def ci_outputs(args, df, results: Path, blocking, code: int, extra: dict | None = None) -> None:
    """--junitxml, --summary-json and, on GitHub Actions, the annotations and step summary:
    written once the exit status is known, so they say what it says (docs/ci.md). `extra`:
    fields the summary document carries besides the table's (a run's limits, a stop)."""
    junitxml, summary_json = getattr(args, "junitxml", None), getattr(args, "summary_json", None)
    if junitxml or summary_json or os.environ.get("GITHUB_ACTIONS") == "true":
        from harness.tools.ci_outputs import write_ci_outputs
        write_ci_outputs(df, results=results, blocking=blocking, exit_code=code,
                         junitxml=junitxml, summary_json=summary_json, extra=extra)


def sanitizer_preflight(args) -> tuple[str | None, str | None]:
    """(compute-sanitizer's path, None) when --sanitizer can run here; (None, one line) when
    it cannot; (None, None) without --sanitizer."""
    if not (args.sanitizer or args.sanitizer_all):
        return None, None
    from harness.tools import sanitizer
    return sanitizer.preflight(args.sanitizer, args.sanitizer_all)


def sanitize(args, results: Path, tool_path: str) -> None:
    """Replay the run's rows under the tool and write its reports into the table. Adds
    information only: a failure here is one line, and the exit status stays the rows'."""
    from harness.tools import sanitizer
    try:
        sanitizer.replay_table(results, args.sanitizer, tool_path, args.target,
                               replay_all=args.sanitizer_all, cases_file=args.cases_file)
    except (OSError, ValueError) as e:
        print(f"check: --sanitizer {args.sanitizer}: the reports were not written to {results} "
              f"({e})", file=sys.stderr)


def _render(results: Path, html: str | None, markdown: str | None,
            ledger: str | None = None) -> bool:
    """The report of this run's own table (never a stale full table); False, after one
    line, when it could not be written."""
    cmd = [sys.executable, "-m", "harness", "report", "--results", str(results)]
    # Always with the ledger: known rows marked with their reason and counted apart, as the
    # exit status counts them (harness/results/ledger.py).
    from harness.results.ledger import DEFAULT_PATH
    cmd += ["--ledger", str(ledger or DEFAULT_PATH)]
    if html:
        cmd += ["--out", html]
    if markdown:
        cmd += ["--markdown", markdown]
    if subprocess.call(cmd, env=child_env()) != 0:
        print(f"check: the report of {results} could not be rendered; the rows are kept there "
              f"(`harness report --results {results}` renders it again)", file=sys.stderr)
        return False
    return True
