"""Crash recovery time and throughput of the pytest-xdist engine on this machine.

  python benchmarks/isolation_bench.py [--crashes 6] [--normal 24] [--skip-matrix]

1. Crash recovery: N crashing cases (SIGSEGV) spread between normal ones,
   `-n 2`, no reruns; the same run with every crash replaced by a normal case
   is the baseline. (with - without) / N is the cost of one crash: a worker
   dies, xdist starts a fresh one (interpreter + torch import), the row is
   written. Measured with and without culprit replay (one fresh process per
   crash that follows earlier cases in its worker).
2. Throughput: cases/second of the default host matrix (`cases.generate()`
   on the bundled target; the faults target's "none" cases when that fails)
   with -n 1 and -n 2, wall time of the whole pytest session.

Figures are printed, never asserted: they depend on the machine's load.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.engine import pytest_root  # noqa: E402


def run(cases_file: Path | None, target: str, n: int, *extra: str) -> tuple[float, int, int]:
    """(wall seconds, rows written, pytest exit code)."""
    with tempfile.TemporaryDirectory(prefix="isobench-") as tmp:
        results = Path(tmp) / "r.jsonl"
        cmd = [sys.executable, "-m", "pytest", str(pytest_root.PATH), "-p", "no:cacheprovider",
               "-q", "--target", target, "--results", str(results), "-n", str(n), *extra]
        if cases_file is not None:
            cmd += ["--cases-file", str(cases_file)]
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - start
        rows = sum(1 for line in results.read_text().splitlines() if line.strip()) \
            if results.exists() else 0
        return wall, rows, proc.returncode


def crash_recovery(crashes: int, normal: int, replay: bool) -> dict:
    """Prints the figures and returns them (benchmarks/crash.py puts them in the bench table)."""
    from fault_target import fault_case

    every = max(1, normal // crashes)
    with_crashes, without = [], []
    k = 0
    for i in range(normal + crashes):
        is_crash = k < crashes and i % (every + 1) == every
        with_crashes.append(fault_case("segv" if is_crash else "none", i))
        without.append(fault_case("none", i))
        k += is_crash
    with tempfile.TemporaryDirectory(prefix="isobench-") as tmp:
        files = []
        for name, cases in (("crash", with_crashes), ("base", without)):
            path = Path(tmp) / f"{name}.json"
            path.write_text(json.dumps([c.to_json() for c in cases]))
            files.append(path)
        extra = () if replay else ("--no-replay",)
        from benchmarks.common import children_cpu  # CPU seconds barely move with other load
        cpu0 = children_cpu()
        t_crash, rows_c, rc_c = run(files[0], "faults", 2, *extra)
        cpu1 = children_cpu()
        t_base, rows_b, rc_b = run(files[1], "faults", 2, *extra)
        cpu_crash, cpu_base = cpu1 - cpu0, children_cpu() - cpu1
    label = "with culprit replay" if replay else "without replay"
    print(f"crash recovery ({label}): {k} crashes among {len(with_crashes)} cases, -n 2: "
          f"{t_crash:.1f} s vs {t_base:.1f} s without crashes -> "
          f"{(t_crash - t_base) / k:.2f} s per crash "
          f"(rows {rows_c}/{len(with_crashes)}, exit {rc_c}; baseline rows {rows_b}, exit {rc_b})")
    return {"replay": replay, "crashes": k, "cases": len(with_crashes), "wall_crash_s": t_crash,
            "wall_base_s": t_base, "per_crash_s": (t_crash - t_base) / k,
            "cpu_crash_s": cpu_crash, "cpu_base_s": cpu_base,
            "rows": rows_c, "exit": rc_c, "baseline_rows": rows_b, "baseline_exit": rc_b}


def throughput(ns=(1, 2)) -> None:
    try:
        import cases
        from harness.targets import load_target
        matrix = cases.generate(routes=load_target("bundled").routes)
        count, first = len(matrix), matrix[0].id
        target, cases_file = "bundled", None
    except Exception as e:  # no bundled target/library here: measure the engine alone
        print(f"(bundled matrix unavailable: {type(e).__name__}: {e}; using faults 'none' cases)")
        from fault_target import fault_case
        tmp = Path(tempfile.mkdtemp(prefix="isobench-"))
        cases_file = tmp / "none.json"
        count, first = 200, fault_case("none", 0).id
        cases_file.write_text(json.dumps([fault_case("none", i).to_json() for i in range(count)]))
        target = "faults"
    run(cases_file, target, 1, "--case-id", first)  # warm caches (the library build)
    for n in ns:
        wall, rows, rc = run(cases_file, target, n)
        print(f"throughput -n {n}: {count} cases ({target}) in {wall:.1f} s -> "
              f"{count / wall:.1f} cases/s (rows {rows}, exit {rc})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--crashes", type=int, default=6)
    ap.add_argument("--normal", type=int, default=24)
    ap.add_argument("--skip-matrix", action="store_true")
    args = ap.parse_args()
    crash_recovery(args.crashes, args.normal, replay=False)
    crash_recovery(args.crashes, args.normal, replay=True)
    if not args.skip_matrix:
        throughput()
    return 0


if __name__ == "__main__":
    sys.exit(main())
