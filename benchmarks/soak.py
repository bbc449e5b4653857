"""A soak of the table's promises: repeated `harness check` runs of a small selection, each
dealt one blow: SIGKILL, SIGTERM or SIGSTOP to the parent (`harness check`), its pytest
controller or an xdist worker, or a second run started on the table while the first holds
it (it must be refused, exit 2, naming the holder), the first running on or paused (its
parent stopped, as Ctrl-Z stops it, until the second is answered: the second's start-up
takes 8-30 s on a loaded host, and a short first run has often ended by then); then `--resume` until the table is
complete; afterwards every table must hold every case once, with the
outcome a clean run gives it, and no run may say PASS.

The selection is written to a cases file with one planted failing case (a valid input
expected to be refused: the library computes it, so its row fails), so every run that
reaches its end must exit non-zero; a run that exits 0 or prints "PASS:" is a false pass,
as is a row that passes where the clean run's fails.

A struck case's own row may tell the blow, once per round: a stopped worker's case is the
`hang` the watchdog records; a killed worker's case is the `harness_error` row naming the
signal from outside (its case completed alone in a fresh process), or the `crash` of its
death had it died so again. Any other changed outcome
breaks the round. A stopped worker or controller is left stopped (the watchdog and the
parent watch them); a stopped parent is continued after 1-4 s (nothing watches it).

    python -m benchmarks.soak [--minutes 10] [--seed 0] [--case-timeout 20] [--family F,F]
                              [--markdown benchmarks/soak_results.md] [--blows B,B]

Prints one line per round, then per blow (signal and whom, and the second run) how many
rounds it struck while the run was working (alive, its table not yet complete) and how many
it missed (the run had finished, or the process was not there), with what those rounds
lost, duplicated and passed falsely; then the totals. Exits 1 when any table breaks a
promise, a run passes falsely, or a second run on a held table was not refused naming the
holder.

A round waits for its run as long as the harness may legitimately take: the clean run's
time twice, plus a stopped worker's case timeout, the watchdog's grace and the culprit
replay (round_limit); a round cut shorter would read as clean without the stopped
worker's `hang` row.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = "bundled"
FAMILIES = "gqa,edge_rows,strided"
ROUTES = "fa2.single_prefill,fa2.batch_decode"
EXIT_USAGE = 2          # harness/tools/options.py: a held table is refused before the run
POLL_S = 0.05
WHOM = ("worker", "controller", "parent")
SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP)
BLOWS = [f"{sig.name} to the {who}" for who in WHOM for sig in SIGNALS]
SECOND = "a second run on the held table"
PAUSED = "a second run, the first paused"
# Each round is dealt one blow, the ones the table's promises are most about twice as often.
WEIGHTS = {k: 2 if k in ("SIGKILL to the worker", "SIGSTOP to the worker",
                         "SIGKILL to the parent", "SIGSTOP to the controller",
                         PAUSED) else 1
           for k in BLOWS + [SECOND, PAUSED]}
# Short names for --blows: kill-worker, stop-controller, term-parent, ..., second-run.
SHORT = {**{f"{k.split()[0][3:].lower()}-{k.split()[-1]}": k for k in BLOWS},
         "second-run": SECOND, "second-run-paused": PAUSED}
PLANTED_TAG = "-planted-failure"
SAID_PASS = re.compile(r"^\W*PASS\b", re.M)   # check's verdict line: "PASS: 159 rows, ..."


def check(results: Path, cases: Path, resume: bool, case_timeout: float,
          log: Path | None = None) -> subprocess.Popen:
    """A `harness check` of the soak's cases file; its output to `log` (appended), or piped
    when None (a second run, whose refusal is read)."""
    cmd = [sys.executable, "-m", "harness", "check", "--target", TARGET, "--cases-file",
           str(cases), "-n", "2", "--case-timeout", str(case_timeout), "--results", str(results)] \
        + (["--resume"] if resume else [])
    out = open(log, "a") if log is not None else subprocess.PIPE
    try:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT if log
                                else subprocess.PIPE, text=True, start_new_session=True)
    finally:
        if log is not None:
            out.close()


def write_cases(path: Path, families: str, routes: str) -> str:
    """The selection as a cases file, with one planted failing case in its middle: a copy of
    a case that must compute, now expected to be refused. Returns the planted case's id."""
    from dataclasses import replace
    from harness.engine.session import select_cases
    cases = select_cases(TARGET, families.split(","), routes.split(","))
    middle = len(cases) // 2
    good = next(c for c in cases[middle:] + cases if c.expect == "match")
    planted = replace(good, expect="refuse", refuse_words=["planted"],
                      tag=good.tag + PLANTED_TAG)
    cases.insert(middle, planted)
    path.write_text(json.dumps([c.to_json() for c in cases]))
    return planted.id


def round_limit(clean_s: float, case_timeout: float) -> float:
    """Seconds a disturbed round may take before the soak gives up on it: the clean run
    twice (a resume re-runs part of it), a stopped worker's case timeout and the watchdog's
    grace, then the culprit replay of the worker's recent cases in a child, each with its
    own timeout, and the child's start-up allowance (harness/engine/child.py)."""
    from harness.engine.isolation import RECENT
    from harness.engine.plugins.watchdog import watchdog_grace
    return 2 * clean_s + case_timeout + watchdog_grace(case_timeout) \
        + RECENT * case_timeout + 60


def rows_of(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass   # a torn last line: the loader treats it as unwritten, so do we
    return out


def children(pid: int) -> list[int]:
    try:
        kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    except OSError:
        return []
    return [int(k) for k in kids.split()]


def descendants(pid: int) -> list[int]:
    found = children(pid)
    return found + [d for k in found for d in descendants(k)]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return ""


def whom(proc: subprocess.Popen, who: str, rng: random.Random) -> int | None:
    """The pid of the run's parent, its pytest controller or one of its xdist workers (an
    execnet interpreter; a culprit replay's child is none of these), or None."""
    if who == "parent":
        return proc.pid
    controllers = [c for c in children(proc.pid) if " pytest " in cmdline(c)]
    if not controllers:
        return None
    if who == "controller":
        return controllers[0]
    workers = [w for w in children(controllers[0]) if "sys.stdin.readline" in cmdline(w)]
    return rng.choice(workers) if workers else None


def holder_of(table: Path) -> str | None:
    from harness.results.table import holder_of as held_by
    return held_by(table)


def wait_for_lock(table: Path, proc: subprocess.Popen, limit_s: float = 120.0) -> bool:
    """Poll until the run holds the table's lock (True) or ends first (False)."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if holder_of(table) is not None:
            return True
        if proc.poll() is not None:
            return False
        time.sleep(POLL_S)
    return False


def refusal_verdict(code: int, err: str, family: set[int], first_alive: bool) -> tuple[bool, bool]:
    """(struck, broken) for a second run on a table the first held when it started: refused
    with exit 2 naming a pid of the first run is the promise kept; not refused while the
    first still ran is a broken promise; not refused after the first ended tested nothing."""
    named = re.search(r"being written by another run \(pid (\d+)\)", err)
    if code == EXIT_USAGE and named and int(named.group(1)) in family:
        return True, False
    if not first_alive:
        return False, False
    return True, True


def second_run(table: Path, cases: Path, proc: subprocess.Popen, rng: random.Random,
               case_timeout: float, paused: bool = False) -> dict:
    """A second run (or resume) on the table while the first holds it: it must be refused,
    exit 2, naming the holder. A round where the first ended before the second could be
    refused does not count as this strike, and says so. `paused`: the first's parent is
    stopped (as Ctrl-Z stops it) until the second is answered, so the first still holds the
    table however long the second takes to reach its lock (its start-up, 8-30 s here)."""
    blow = {"kind": PAUSED if paused else SECOND, "struck": False, "broken": False}
    if not wait_for_lock(table, proc):
        blow["note"] = "not tried: the first ended before it held the table"
        return blow
    family = {proc.pid, *descendants(proc.pid)}
    if paused:
        os.kill(proc.pid, signal.SIGSTOP)
    try:
        resume = rng.random() < 0.5
        other = check(table, cases, resume=resume, case_timeout=case_timeout)
        _, err = other.communicate(timeout=300)
        first_alive = proc.poll() is None
    finally:
        if paused:
            os.kill(proc.pid, signal.SIGCONT)
    blow["struck"], blow["broken"] = refusal_verdict(other.returncode, err, family, first_alive)
    what = "--resume" if resume else "run"
    if blow["struck"] and not blow["broken"]:
        blow["note"] = f"{what} refused, exit 2, naming the holder"
    elif blow["broken"]:
        blow["note"] = (f"{what} NOT refused naming the holder (exit {other.returncode}: "
                        f"{err.strip()[-200:]!r})")
    else:
        blow["note"] = (f"{what} not counted: the first ended meanwhile "
                        f"(exit {other.returncode})")
    return blow


def disturb(proc: subprocess.Popen, table: Path, expected: int,
            rng: random.Random, kind: str) -> dict:
    """One random blow to the run while it works: whom, with what, and whether it struck a
    working run (the process alive and the table not yet complete when it landed)."""
    # Strike at a random point of the run's progress (its rows so far), not after a guessed
    # delay: a second run's refusal or a loaded machine would put a timed blow past the end.
    rows_at = rng.randint(0, max(0, int(expected * 0.9)))
    while proc.poll() is None and len(rows_of(table)) < rows_at:
        time.sleep(POLL_S * 2)
    sig = getattr(signal, kind.split()[0])
    who = kind.split()[-1]
    blow = {"kind": kind, "who": who, "sig": sig.name, "struck": False, "broken": False}
    if proc.poll() is not None:
        blow["note"] = "the run finished first"
        return blow
    pid = whom(proc, who, rng)
    if pid is None:
        blow["note"] = f"no {who} process then"
        return blow
    working = len({r.get("case_id") for r in rows_of(table)}) < expected
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        blow["note"] = f"the {who} was gone"
        return blow
    blow["struck"] = working
    blow["note"] = "struck a working run" if working else "landed after the last row"
    if sig == signal.SIGSTOP and who == "parent":
        time.sleep(rng.uniform(1.0, 4.0))     # nothing watches the parent: continue it
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    return blow


def leftover(pgid: int, limit_s: float = 60.0) -> bool:
    """Whether a process of the run's group (its parent, controller, workers and their
    children) outlives it: polled for `limit_s` (a controller notices its parent's death at
    its next poll), then killed, and reported."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        time.sleep(POLL_S * 10)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True


def said_pass(code: int | None, log: Path) -> bool:
    """Whether a run told its user PASS (exit 0 or a "PASS:" line): false for every run of
    the soak's cases, whose planted case fails."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        text = ""
    return code == 0 or bool(SAID_PASS.search(text))


def finish(results: Path, cases: Path, expected: int, case_timeout: float, limit_s: float,
           log: Path) -> tuple[list[dict], int]:
    """--resume until the table holds every case (a held table waits for its holder).
    Returns the rows and how many of the resumes said PASS."""
    passes = 0
    for _ in range(6):
        end = time.monotonic() + limit_s
        while holder_of(results) is not None and time.monotonic() < end:
            time.sleep(POLL_S * 10)     # a run still holds it (an orphan ending): wait
        log.write_text("")
        proc = check(results, cases, resume=results.exists(), case_timeout=case_timeout,
                     log=log)
        try:
            proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        passes += said_pass(proc.returncode, log)
        rows = rows_of(results)
        if len({r["case_id"] for r in rows}) >= expected:
            return rows, passes
    return rows_of(results), passes


def judge(rows: list[dict], clean: dict, blow: dict) -> dict:
    """What a finished table lost, duplicated, changed and passed falsely against the clean
    run. The struck case's own row may tell the blow, once: a stopped worker's `hang`, a
    killed worker's `harness_error` naming the signal (or `crash`, had its replay died)."""
    ids = [r["case_id"] for r in rows]
    outcomes: dict[str, set] = {}
    passes: dict[str, set] = {}
    for r in rows:
        outcomes.setdefault(r["case_id"], set()).add(r["outcome"])
        passes.setdefault(r["case_id"], set()).add(bool(r.get("pass")))
    changed = [i for i in outcomes if i in clean and outcomes[i] != {clean[i]["outcome"]}]
    told = None
    if blow.get("struck") and blow.get("who") == "worker":
        told = {"SIGSTOP": ("hang",), "SIGKILL": ("harness_error", "crash"),
                "SIGTERM": ("harness_error", "crash")}[blow["sig"]]
    allowed = [i for i in changed
               if len(outcomes[i]) == 1 and outcomes[i] <= set(told or ())][:1]
    notes = [r.get("message", "") for r in rows if r["case_id"] in allowed]
    return {
        "dupes": len(ids) - len(set(ids)),
        "missing": len(set(clean) - set(ids)),
        "changed": [i for i in changed if i not in allowed],
        "false_passes": sum(1 for i in passes if i in clean and not clean[i]["pass"]
                            and True in passes[i]),
        "blow_row": f"{'/'.join(told)}: {notes[0][-160:]}" if notes else "",
    }


def markdown(path: Path, command: str, began: str, head: str, lines: list[str],
             table: list[str], totals: str) -> None:
    path.write_text("\n".join([
        "# Soak of the table's promises", "",
        f"`{command}`, started {began}; `nproc` {os.cpu_count()}, load average at the end "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}.", "",
        f"{head}", "",
        "Per blow, the rounds it struck while the run was working (alive, its table not yet "
        "complete) out of the rounds it was dealt, and what those rounds' tables and runs "
        "lost, duplicated and passed falsely:", "",
        *table, "", totals, "", "Rounds:", "",
        *[f"- {line}" for line in lines], ""]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.soak")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--case-timeout", type=float, default=20.0,
                    help="each run's --case-timeout: how long a stopped worker holds its round")
    ap.add_argument("--family", default=FAMILIES,
                    help=f"the selection's families [{FAMILIES}]: fewer for more rounds a minute")
    ap.add_argument("--markdown", default=None, help="also write the report to this file")
    ap.add_argument("--blows", default=None,
                    help=f"deal only these blows, comma-separated: {', '.join(SHORT)} [all]")
    args = ap.parse_args(argv)
    weights = dict(WEIGHTS)
    if args.blows:
        unknown = [b for b in args.blows.split(",") if b not in SHORT]
        if unknown:
            print(f"soak: --blows: unknown {', '.join(unknown)}; blows: {', '.join(SHORT)}",
                  file=sys.stderr)
            return EXIT_USAGE
        weights = {SHORT[b]: WEIGHTS[SHORT[b]] for b in args.blows.split(",")}
    command = "python -m benchmarks.soak " + " ".join(argv if argv is not None else sys.argv[1:])
    began = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="harness-soak-"))
    cases = work / "cases.json"
    planted = write_cases(cases, args.family, ROUTES)
    clean_path, log = work / "clean.jsonl", work / "run.log"
    start = time.monotonic()
    first = check(clean_path, cases, resume=False, case_timeout=args.case_timeout, log=log)
    first.wait(timeout=900)
    clean_s = time.monotonic() - start
    clean = {r["case_id"]: r for r in rows_of(clean_path)}
    if planted not in clean or clean[planted]["pass"] or said_pass(first.returncode, log):
        print(f"soak: the clean run did not fail its planted case (exit {first.returncode}); "
              f"false passes cannot be told: see {log}", file=sys.stderr)
        return 1
    limit = round_limit(clean_s, args.case_timeout)
    head = (f"Clean run: {len(clean)} cases ({args.family} on {ROUTES}, one planted failing "
            f"case) in {clean_s:.0f} s, exit {first.returncode}; a round may take {limit:.0f} s.")
    print(f"soak: {head} Tables and logs in {work}.", flush=True)
    end = time.monotonic() + args.minutes * 60
    rounds = broken = 0
    totals = Counter()
    per = {k: Counter() for k in BLOWS + [SECOND, PAUSED]}
    lines = []
    while time.monotonic() < end:
        rounds += 1
        table = work / f"round{rounds}.jsonl"
        start = time.monotonic()
        log.write_text("")
        proc = check(table, cases, resume=False, case_timeout=args.case_timeout, log=log)
        kind = rng.choices(list(weights), weights=list(weights.values()))[0]
        # A second run alone: a blow meanwhile could end the first before the second (8 s
        # of start-up on a loaded host) reaches the lock, and a blow held back for it lands
        # after the run.
        blow = (second_run(table, cases, proc, rng, args.case_timeout, kind == PAUSED)
                if kind in (SECOND, PAUSED) else disturb(proc, table, len(clean), rng, kind))
        said = [f"{blow['kind']} at {time.monotonic() - start:.0f} s ({blow['note']})"]
        over = False
        try:
            proc.wait(timeout=limit)
            said.append(f"the run's exit {proc.returncode} at {time.monotonic() - start:.0f} s")
        except subprocess.TimeoutExpired:   # longer than the harness may take: a stalled run
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            said.append(f"killed after {limit:.0f} s")
            totals["rounds over their limit"] += 1
            over = True
        run_passed = said_pass(proc.returncode, log)
        rows, resume_passes = finish(table, cases, len(clean), args.case_timeout, limit, log)
        got = judge(rows, clean, blow)
        stray = leftover(proc.pid)
        totals["rounds with a process left"] += stray
        false = got["false_passes"] + run_passed + resume_passes
        bad = bool(got["dupes"] or got["missing"] or got["changed"] or false
                   or blow["broken"] or stray or over)
        broken += bad
        for counts in (totals, per[kind]):
            counts["lost"] += got["missing"]
            counts["dupes"] += got["dupes"]
            counts["false passes"] += false
            counts["changed"] += len(got["changed"])
            counts["broken"] += bad
        per[kind]["rounds"] += 1
        per[kind]["struck"] += blow["struck"]
        totals["blow rows"] += bool(got["blow_row"])
        line = (f"round {rounds}: {'; '.join(said)} -> {len(rows) - got['dupes']}/{len(clean)} "
                f"cases, {got['dupes']} duplicate ids, {got['missing']} missing, "
                f"{len(got['changed'])} changed outcomes, {false} false passes"
                + (f"; the struck case's row: {got['blow_row']!r}" if got["blow_row"] else "")
                + ("; a process of the run outlived it" if stray else "")
                + ("" if not bad else "  BROKEN"))
        lines.append(line)
        print(line, flush=True)
    total = (f"Totals: {rounds} rounds in {args.minutes:g} min, {broken} broken; "
             f"{totals['lost']} rows lost, {totals['dupes']} duplicated, "
             f"{totals['false passes']} false passes, {totals['changed']} changed outcomes; "
             f"{totals['blow rows']} struck case(s) whose row tells the blow; "
             f"{totals['rounds over their limit']} rounds over their limit, "
             f"{totals['rounds with a process left']} with a process of the run left behind.")
    table = ["| blow | struck a working run / rounds | lost | duplicated | false passes | "
             "broken rounds |", "|---|---|---|---|---|---|"]
    for kind in BLOWS + [SECOND, PAUSED]:
        c = per[kind]
        table.append(f"| {kind} | {c['struck']} / {c['rounds']} | {c['lost']} | {c['dupes']} "
                     f"| {c['false passes']} | {c['broken']} |")
    print("soak: per blow (struck a working run / rounds dealt, lost, duplicated, false "
          "passes, broken rounds):")
    for kind in BLOWS + [SECOND, PAUSED]:
        c = per[kind]
        print(f"  {kind:<32} {c['struck']:>3} / {c['rounds']:<3} {c['lost']:>4} {c['dupes']:>4} "
              f"{c['false passes']:>4} {c['broken']:>4}")
    print(f"soak: {total}")
    if args.markdown:
        markdown(Path(args.markdown), command, began, head, lines, table, total)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
