"""Where the engine spends its fixed per-case time: cProfile in every pytest process of a run.

    python -m benchmarks.engine_profile [--family F,G] [--sample N] [-n 1] [--top 25] [CHECK OPTIONS]

Runs `python -m harness check -n N ... -- -p benchmarks.engine_profile`; as a pytest plugin
this module profiles each process it is loaded in (the controller and every xdist worker)
from configure to unconfigure and leaves one .prof file per process. The report lists, per
process, the functions with the most cumulative time per case, and how much of a worker's
per-test time lies outside execute_case.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
from pathlib import Path

ENV_DIR = "BENCH_PROFILE_DIR"
_profiler: cProfile.Profile | None = None


# ------------------------------------------------------------------ as a pytest plugin

def pytest_configure(config):
    global _profiler
    if os.environ.get(ENV_DIR):
        _profiler = cProfile.Profile()
        _profiler.enable()


def pytest_unconfigure(config):
    if _profiler is None:
        return
    _profiler.disable()
    worker = getattr(config, "workerinput", {}).get("workerid", "controller")
    _profiler.dump_stats(str(Path(os.environ[ENV_DIR]) / f"{worker}.{os.getpid()}.prof"))


# ------------------------------------------------------------------ the report

def cumulative(stats: pstats.Stats, name: str, file_part: str = "") -> tuple[int, float]:
    """(primitive calls, cumulative seconds) of the functions called `name` in files matching."""
    calls, seconds = 0, 0.0
    for (file, _, func), (cc, _, _, ct, _) in stats.stats.items():
        if func == name and file_part in file:
            calls, seconds = calls + cc, seconds + ct
    return calls, seconds


def report(prof: Path, top: int) -> str:
    stats = pstats.Stats(str(prof))
    tests, per_test = cumulative(stats, "pytest_runtest_protocol", "_pytest/runner.py")
    cases, in_case = cumulative(stats, "execute_case", "harness/engine/execute.py")
    n = max(cases, tests, 1)
    lines = [f"{prof.name}: {tests} tests, {cases} execute_case calls"]
    if tests:
        lines.append(f"  per test {per_test / n * 1e3:.2f} ms, of which execute_case "
                     f"{in_case / n * 1e3:.2f} ms; outside it {(per_test - in_case) / n * 1e3:.2f} ms")
    rows = []
    for (file, line, func), (cc, _, tt, ct, _) in stats.stats.items():
        rows.append((ct, tt, cc, f"{Path(file).parent.name}/{Path(file).name}:{line}({func})"))
    lines.append(f"  {'cum ms/case':>11}  {'own ms/case':>11}  {'calls':>7}  function")
    for ct, tt, cc, where in sorted(rows, reverse=True)[:top]:
        lines.append(f"  {ct / n * 1e3:11.3f}  {tt / n * 1e3:11.3f}  {cc:7d}  {where}")
    return "\n".join(lines)


def main(argv=None) -> int:
    from benchmarks.common import (QUICK_CASES, add_selection_arguments, child_env,
                                   selection_from, timed)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_selection_arguments(ap)
    ap.set_defaults(sample=QUICK_CASES)
    ap.add_argument("-n", default="1", help="xdist workers [1]")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--keep", default=None, help="directory to keep the .prof files in")
    # Anything else goes to `harness check` as it is (--profile ci, --repeat 1, --case-id X).
    args, check_options = ap.parse_known_args(argv)
    out = Path(args.keep or tempfile.mkdtemp(prefix="bench-prof-"))
    out.mkdir(parents=True, exist_ok=True)
    cases = selection_from(args)
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        run = timed([sys.executable, "-m", "harness", "check", "--target", "bundled",
                     "-n", args.n, "--results", str(Path(tmp) / "rows.jsonl"),
                     *cases.args, *check_options, "--", "-p", "benchmarks.engine_profile"],
                    env=child_env(**{ENV_DIR: str(out)}))
    print(f"check -n {args.n} ({cases.label}): {run.wall_s:.1f} s, exit {run.proc.returncode}")
    for prof in sorted(out.glob("*.prof")):
        print(report(prof, args.top))
    print(f"profiles: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
