"""A soak of the table's promises: repeated `harness check` runs of a small selection with
random SIGKILL / SIGTERM / SIGSTOP of the parent, its pytest child or a worker, and random
`--resume`s; afterwards every table must be complete, hold no duplicate case id, and give
every case the outcome a clean run gives it.

    python -m benchmarks.soak [--minutes 10] [--seed 0]

Prints one line per round and the totals; exits 1 when any table breaks a promise.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SELECTION = ["--family", "gqa,edge_rows,strided", "--route", "fa2.single_prefill,fa2.batch_decode"]


def check(results: Path, resume: bool) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "harness", "check", *SELECTION, "-n", "2",
           "--results", str(results)] + (["--resume"] if resume else [])
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


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


def disturb(proc: subprocess.Popen, rng: random.Random) -> str:
    """One random blow to the run while it works: whom, and with what."""
    time.sleep(rng.uniform(0.5, 6.0))   # a run of the selection takes 5-10 s
    if proc.poll() is not None:
        return "none (finished first)"
    family = [proc.pid] + descendants(proc.pid)
    who = rng.choice(["parent", "child", "worker"])
    pid = {"parent": proc.pid, "child": family[1] if len(family) > 1 else proc.pid,
           "worker": family[-1]}[who]
    sig = rng.choice([signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP])
    try:
        os.kill(pid, sig)
        if sig == signal.SIGSTOP:
            time.sleep(rng.uniform(1.0, 4.0))
            if who != "worker":   # a stopped worker is the watchdog's to end
                os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        return f"{who} gone before {sig.name}"
    return f"{sig.name} to the {who}"


def finish(results: Path, expected: int) -> list[dict]:
    """--resume until the table holds every case (a held table waits for its holder)."""
    for _ in range(6):
        proc = check(results, resume=results.exists())
        proc.wait(timeout=900)
        rows = rows_of(results)
        if len({r["case_id"] for r in rows}) >= expected:
            return rows
        time.sleep(1)
    return rows_of(results)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.soak")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="harness-soak-"))
    clean_path = work / "clean.jsonl"
    check(clean_path, resume=False).wait(timeout=900)
    clean = {r["case_id"]: r["outcome"] for r in rows_of(clean_path)}
    print(f"soak: clean run {len(clean)} cases")
    end = time.monotonic() + args.minutes * 60
    rounds = broken = 0
    while time.monotonic() < end:
        rounds += 1
        table = work / f"round{rounds}.jsonl"
        proc = check(table, resume=False)
        blows = [disturb(proc, rng)]
        if rng.random() < 0.5:   # a second run on the held table, or a resume, meanwhile
            other = check(table, resume=rng.random() < 0.5)
            other.wait(timeout=900)
            blows.append(f"a second run on it (exit {other.returncode})")
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            blows.append("killed after 120 s")
        rows = finish(table, len(clean))
        ids = [r["case_id"] for r in rows]
        dupes = len(ids) - len(set(ids))
        missing = set(clean) - set(ids)
        changed = [i for i in set(ids) if i in clean and
                   {r["outcome"] for r in rows if r["case_id"] == i} != {clean[i]}]
        ok = not dupes and not missing and not changed
        broken += not ok
        print(f"round {rounds}: {'; '.join(blows)} -> {len(set(ids))}/{len(clean)} cases, "
              f"{dupes} duplicate ids, {len(missing)} missing, {len(changed)} changed outcomes"
              + ("" if ok else "  BROKEN"), flush=True)
    print(f"soak: {rounds} rounds in {args.minutes:g} min, {broken} broken tables")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
