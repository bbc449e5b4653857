"""When each process of a real `harness check` reaches each step before the first rows come.

    python -m benchmarks.startup_chain [-n 16] [--family F] [CHECK OPTIONS]

startup.py times a worker's phases in isolation; this times the chain as a run meets it: the
check's parent (which plans the run), its pytest child (the xdist controller) and every
worker, each stamped against the moment the command was started. As a pytest plugin (`-p benchmarks.startup_chain`, which
xdist hands to every worker) this module appends one line per step to a file per process:
the process's start (from /proc), this module's import (pytest's plugin loading: the harness
plugin and torch come after it), configure, the end of collection, the first case's start and
its row, and in the controller the moment each worker reports ready.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ENV_DIR = "BENCH_CHAIN_DIR"
_IMPORTED = time.time()
_seen: set[str] = set()


def _process_start() -> float | None:
    """The process's start in seconds since the epoch (Linux only: /proc), else None: its
    age (uptime now less its start in ticks after boot) back from now."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def _stamp(config, step: str, once: bool = True, at: float | None = None) -> None:
    folder = os.environ.get(ENV_DIR)
    if not folder or (once and step in _seen):
        return
    _seen.add(step)
    who = getattr(config, "workerinput", {}).get("workerid", "controller")
    line = json.dumps({"who": who, "pid": os.getpid(), "step": step, "t": at or time.time()})
    with open(Path(folder) / f"{who}.{os.getpid()}.jsonl", "a") as f:
        f.write(line + "\n")


# ------------------------------------------------------------------ as a pytest plugin

def pytest_configure(config):
    _stamp(config, "process start", at=_process_start())
    _stamp(config, "plugins loading", at=_IMPORTED)
    _stamp(config, "configure")
    config.pluginmanager.register(_Steps(config), "startup-chain-steps")


class _Steps:
    def __init__(self, config):
        self.config = config

    def pytest_collection_finish(self, session):
        _stamp(self.config, "collected")

    def pytest_runtest_logstart(self, nodeid, location):
        _stamp(self.config, "first case starts")

    def pytest_runtest_logfinish(self, nodeid, location):
        _stamp(self.config, "first case done")

    def pytest_xdist_setupnodes(self, config, specs):
        _stamp(self.config, "workers spawned")

    def pytest_testnodeready(self, node):
        _stamp(self.config, "a worker ready", once=False)


# ------------------------------------------------------------------ the report

STEPS = ("process start", "plugins loading", "configure", "workers spawned", "a worker ready",
         "collected", "first case starts", "first case done")


def report(folder: Path, t0: float, first_row_s: float | None) -> str:
    """Per step, when processes reached it (s after the command started): the controller's
    own times, and over the workers the first, median and last."""
    stamps: dict[str, dict[str, list[float]]] = {}
    for path in folder.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            s = json.loads(line)
            if s["t"] is None:
                continue
            role = "controller" if s["who"] == "controller" else "workers"
            stamps.setdefault(role, {}).setdefault(s["step"], []).append(s["t"] - t0)
    lines = [f"{'step':<20} {'controller':>10} {'workers: first':>15} {'median':>8} {'last':>8}"]
    for step in STEPS:
        c = stamps.get("controller", {}).get(step, [])
        w = sorted(stamps.get("workers", {}).get(step, []))
        ctl = f"{min(c):10.2f}" if c else f"{'':10}"
        if step == "a worker ready" and c:
            c = sorted(c)
            ctl = f"{c[0]:.2f}-{c[-1]:.2f}".rjust(10)
        work = (f"{w[0]:15.2f} {statistics.median(w):8.2f} {w[-1]:8.2f}" if w else "")
        if c or w:
            lines.append(f"{step:<20} {ctl} {work}")
    if first_row_s is not None:
        lines.append(f"{'first row written':<20} {first_row_s:10.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    from benchmarks.common import child_env, rows_of
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", default="16", help="xdist workers [16]")
    # Anything else goes to `harness check` as it is (--family valid, --profile ci, --repeat 1).
    args, check_options = ap.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-chain-") as tmp:
        folder, results = Path(tmp) / "stamps", Path(tmp) / "rows.jsonl"
        folder.mkdir()
        import subprocess
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-m", "harness", "check", "--target", "bundled",
                               "-n", args.n, "--results", str(results), *check_options,
                               "--", "-p", "benchmarks.startup_chain"],
                              env=child_env(**{ENV_DIR: str(folder)}), capture_output=True, text=True)
        wall = time.time() - t0
        rows = rows_of(results)
        from datetime import datetime
        first = min((datetime.fromisoformat(r["timestamp"]).timestamp() for r in rows), default=None)
        print(f"check -n {args.n} {' '.join(check_options)}: {len(rows)} rows, {wall:.2f} s, "
              f"exit {proc.returncode}")
        print(report(folder, t0, first - t0 if first else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
