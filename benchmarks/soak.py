"""A soak of the table's promises: repeated `harness check` runs of a small selection with
random SIGKILL / SIGTERM / SIGSTOP of the parent, its pytest child or a worker, a second run
started on the table while the first holds it, and random `--resume`s; afterwards every
table must be complete, hold no duplicate case id, and give every case the outcome a clean
run gives it (a stopped worker's case excepted: its row is the `hang` the watchdog records).

    python -m benchmarks.soak [--minutes 10] [--seed 0] [--case-timeout 20] [--family F,F]

Prints one line per round, then per blow (signal and whom) how many rounds it struck while
the run was working (alive, its table not yet complete) and how many it missed (the run had
finished, the process was gone), and the totals: rows lost, duplicated, falsely passing.
Exits 1 when any table breaks a promise or a second run on a held table was not refused.

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
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = "gqa,edge_rows,strided"
SELECTION = ["--family", FAMILIES, "--route", "fa2.single_prefill,fa2.batch_decode"]
EXIT_USAGE = 2          # harness/tools/options.py: a held table is refused before the run
POLL_S = 0.05


def check(results: Path, resume: bool, case_timeout: float,
          stderr=subprocess.PIPE) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "harness", "check", *SELECTION, "-n", "2",
           "--case-timeout", str(case_timeout), "--results", str(results)] \
        + (["--resume"] if resume else [])
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr,
                            text=True, start_new_session=True)


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


def descendants(pid: int) -> list[int]:
    try:
        kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    except OSError:
        return []
    found = [int(k) for k in kids.split()]
    return found + [d for k in found for d in descendants(k)]


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


def second_run(table: Path, proc: subprocess.Popen, rng: random.Random,
               case_timeout: float) -> tuple[str, bool]:
    """A second run (or resume) on the table while the first holds it: it must be refused,
    exit 2, naming the holder. Returns (what happened, whether a promise broke)."""
    if not wait_for_lock(table, proc):
        return "a second run: not tried (the first ended before it held the table)", False
    resume = rng.random() < 0.5
    other = check(table, resume=resume, case_timeout=case_timeout)
    _, err = other.communicate(timeout=300)
    first_alive = proc.poll() is None
    kind = "a second --resume" if resume else "a second run"
    if other.returncode == EXIT_USAGE and "being written by another run" in err:
        return f"{kind} on the held table: refused (exit 2)", False
    if not first_alive:
        # The first ended while the second started: no promise was tested either way.
        return f"{kind}: inconclusive (the first ended meanwhile, exit {other.returncode})", False
    return (f"{kind} on the held table was NOT refused (exit {other.returncode}: "
            f"{err.strip()[-200:]!r})"), True


def disturb(proc: subprocess.Popen, table: Path, expected: int,
            rng: random.Random) -> dict:
    """One random blow to the run while it works: whom, with what, and whether it struck a
    working run (the process alive and the table not yet complete when it landed)."""
    # Strike at a random point of the run's progress (its rows so far), not after a guessed
    # delay: a second run's refusal or a loaded machine would put a timed blow past the end.
    rows_at = rng.randint(0, max(0, int(expected * 0.9)))
    while proc.poll() is None and len(rows_of(table)) < rows_at:
        time.sleep(POLL_S * 2)
    who = rng.choice(["parent", "child", "worker"])
    sig = rng.choice([signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP])
    blow = {"kind": f"{sig.name} to the {who}", "struck": False, "stopped_worker": False}
    if proc.poll() is not None:
        blow["note"] = "finished first"
        return blow
    family = [proc.pid] + descendants(proc.pid)
    targets = {"parent": family[0], "child": family[1] if len(family) > 1 else None,
               "worker": family[-1] if len(family) > 2 else None}
    pid = targets[who]
    if pid is None:
        blow["note"] = f"no {who} process yet"
        return blow
    working = len({r.get("case_id") for r in rows_of(table)}) < expected
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        blow["note"] = f"the {who} was gone"
        return blow
    blow["struck"] = working
    blow["note"] = "struck a working run" if working else "landed after the last row"
    if sig == signal.SIGSTOP:
        time.sleep(rng.uniform(1.0, 4.0))
        if who == "worker":   # a stopped worker is the watchdog's to end
            blow["stopped_worker"] = True
        else:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    return blow


def finish(results: Path, expected: int, case_timeout: float, limit_s: float) -> list[dict]:
    """--resume until the table holds every case (a held table waits for its holder)."""
    for _ in range(6):
        end = time.monotonic() + limit_s
        while holder_of(results) is not None and time.monotonic() < end:
            time.sleep(POLL_S * 10)     # a run still holds it (an orphan ending): wait
        proc = check(results, resume=results.exists(), case_timeout=case_timeout,
                     stderr=subprocess.DEVNULL)
        proc.wait(timeout=limit_s)
        rows = rows_of(results)
        if len({r["case_id"] for r in rows}) >= expected:
            return rows
    return rows_of(results)


def judge(rows: list[dict], clean: dict, stopped_worker: bool) -> dict:
    ids = [r["case_id"] for r in rows]
    outcomes: dict[str, set] = {}
    passes: dict[str, set] = {}
    for r in rows:
        outcomes.setdefault(r["case_id"], set()).add(r["outcome"])
        passes.setdefault(r["case_id"], set()).add(bool(r.get("pass")))
    changed = [i for i in outcomes if i in clean and outcomes[i] != {clean[i]["outcome"]}]
    # A stopped worker's case is a hang: the truth of that run, allowed once.
    hangs = [i for i in changed if outcomes[i] == {"hang"}]
    allowed = hangs[:1] if stopped_worker else []
    return {
        "dupes": len(ids) - len(set(ids)),
        "missing": len(set(clean) - set(ids)),
        "changed": [i for i in changed if i not in allowed],
        "false_passes": sum(1 for i in passes if i in clean and not clean[i]["pass"]
                            and True in passes[i]),
        "stopped_hang": len(allowed),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.soak")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--case-timeout", type=float, default=20.0,
                    help="each run's --case-timeout: how long a stopped worker holds its round")
    ap.add_argument("--family", default=FAMILIES,
                    help=f"the selection's families [{FAMILIES}]: fewer for more rounds a minute")
    args = ap.parse_args(argv)
    SELECTION[1] = args.family
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="harness-soak-"))
    clean_path = work / "clean.jsonl"
    began = time.monotonic()
    check(clean_path, resume=False, case_timeout=args.case_timeout,
          stderr=subprocess.DEVNULL).wait(timeout=900)
    clean_s = time.monotonic() - began
    clean = {r["case_id"]: r for r in rows_of(clean_path)}
    limit = round_limit(clean_s, args.case_timeout)
    print(f"soak: clean run {len(clean)} cases in {clean_s:.0f} s; a round may take {limit:.0f} s",
          flush=True)
    end = time.monotonic() + args.minutes * 60
    rounds = broken = 0
    totals = Counter()
    struck, missed = Counter(), Counter()
    while time.monotonic() < end:
        rounds += 1
        table = work / f"round{rounds}.jsonl"
        start = time.monotonic()
        proc = check(table, resume=False, case_timeout=args.case_timeout,
                     stderr=subprocess.DEVNULL)
        said, bad_second = [], False
        if rng.random() < 0.5:
            text, bad_second = second_run(table, proc, rng, args.case_timeout)
            said.append(text)
            totals["second runs"] += 1
            totals["second runs refused"] += "refused" in text
        blow = disturb(proc, table, len(clean), rng)
        (struck if blow["struck"] else missed)[blow["kind"]] += 1
        said.append(f"{blow['kind']} at {time.monotonic() - start:.0f} s ({blow['note']})")
        try:
            proc.wait(timeout=limit)
            said.append(f"the run's exit {proc.returncode} at {time.monotonic() - start:.0f} s")
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            said.append(f"killed after {limit:.0f} s")
            totals["rounds over their limit"] += 1
        rows = finish(table, len(clean), args.case_timeout, limit)
        got = judge(rows, clean, blow["stopped_worker"])
        ok = not (got["dupes"] or got["missing"] or got["changed"] or got["false_passes"]
                  or bad_second)
        broken += not ok
        for key in ("dupes", "missing", "false_passes", "stopped_hang"):
            totals[key] += got[key]
        totals["changed"] += len(got["changed"])
        print(f"round {rounds}: {'; '.join(said)} -> {len(rows) - got['dupes']}/{len(clean)} "
              f"cases, {got['dupes']} duplicate ids, {got['missing']} missing, "
              f"{len(got['changed'])} changed outcomes, {got['false_passes']} false passes"
              + (f", the stopped worker's case a hang" if got["stopped_hang"] else "")
              + ("" if ok else "  BROKEN"), flush=True)
    print(f"soak: {rounds} rounds in {args.minutes:g} min, {broken} broken tables; "
          f"{totals['missing']} rows lost, {totals['dupes']} duplicated, "
          f"{totals['false_passes']} false passes, {totals['changed']} changed outcomes; "
          f"{totals['second runs refused']}/{totals['second runs']} second runs on a held "
          f"table refused; {totals['rounds over their limit']} rounds over their limit")
    print("soak: blows that struck a working run (struck / landed):")
    for kind in sorted(set(struck) | set(missed)):
        print(f"  {kind:<22} {struck[kind]} / {struck[kind] + missed[kind]}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
