"""`make bench`: the harness's speed on this machine, as one table and one JSON record.

    python -m benchmarks.bench [--quick | --full] [--only SECTION,...] [--out DIR]

Sections: overhead (engine -n 0 against a bare execute_case loop, and the per-case
breakdown), startup (a worker's fixed cost, phase by phase), guards (the bundled library's
guard cost per run() call), throughput (cases/s against xdist workers) and crash (recovery
time after a worker dies). Quick (the default, or BENCH_QUICK=1) measures an even sample of
150 cases of the default set and small crash runs, about three minutes on two cores; --full
(or BENCH_QUICK=0) the whole default case set, more rounds and the larger crash run.

Nothing here fails on a number: the exit status is 0, and a section that breaks gets a
"not measured" row naming why (its traceback goes into the record). Figures are written to results/bench/<UTC date-time>-<commit>.json with the machine, the
commit and the date.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import time
import traceback
from pathlib import Path

from benchmarks.common import QUICK_CASES, Section, selection

SECTIONS = ("overhead", "startup", "guards", "throughput", "crash")

# mode -> the knobs each section gets
MODES = {
    "quick": dict(sample=QUICK_CASES, overhead_rounds=2, startup_rounds=3,
                  guard_rounds=15, crashes=(3, 9), crash_rounds=1),
    "full": dict(sample=None, overhead_rounds=3, startup_rounds=5,
                 guard_rounds=40, crashes=(6, 24), crash_rounds=2),
}


@functools.lru_cache(maxsize=None)
def cases_of(sample: int | None):
    """One case selection for every section of a run (a sample is drawn once)."""
    return selection(sample=sample)


def run_section(name: str, knobs: dict) -> list[Section]:
    if name == "overhead":
        from benchmarks import overhead
        return overhead.measure(cases_of(knobs["sample"]), knobs["overhead_rounds"])
    if name == "startup":
        from benchmarks import startup
        return [startup.measure(knobs["startup_rounds"])]
    if name == "guards":
        from benchmarks import guard_cost
        return [guard_cost.measure_in_child(knobs["guard_rounds"])]
    if name == "throughput":
        from benchmarks import throughput
        return [throughput.measure(cases_of(knobs["sample"]))]
    if name == "crash":
        from benchmarks import crash
        return [crash.measure(*knobs["crashes"], rounds=knobs["crash_rounds"])]
    raise ValueError(f"unknown section {name!r}; known: {', '.join(SECTIONS)}")


def failed(name: str, error: BaseException) -> Section:
    """A section that broke still gets a row (and its traceback in the record)."""
    sec = Section(name)
    text = " ".join(str(error).split())  # one line; the end says why a child failed
    sec.add("not measured", None, "", f"{type(error).__name__}: ...{text[-140:]}")
    sec.raw = {"error": traceback.format_exception(error)}
    return sec


def mode_from(args) -> str:
    if args.full:
        return "full"
    if args.quick:
        return "quick"
    return "full" if os.environ.get("BENCH_QUICK", "1").strip() in ("0", "no", "false") else "quick"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench",
                                 description=__doc__.splitlines()[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help=f"{QUICK_CASES} cases of the default set [default]")
    size.add_argument("--full", action="store_true", help="the default case set, more rounds")
    ap.add_argument("--only", default=None, help=f"sections, comma-separated [{','.join(SECTIONS)}]")
    ap.add_argument("--out", default=None, help="record directory [results/bench]")
    args = ap.parse_args(argv)
    mode = mode_from(args)
    names = [s.strip() for s in (args.only or ",".join(SECTIONS)).split(",") if s.strip()]
    unknown = sorted(set(names) - set(SECTIONS))
    if unknown:
        ap.error(f"--only: unknown section(s) {unknown}; known: {', '.join(SECTIONS)}")

    from benchmarks.record import RESULTS, print_sections, write_record
    start = time.perf_counter()
    sections: list[Section] = []
    for name in names:
        print(f"bench ({mode}): {name} ...", file=sys.stderr, flush=True)
        began = time.perf_counter()
        try:
            done = run_section(name, MODES[mode])
        except Exception as error:  # noqa: BLE001 - one broken section must not hide the rest
            done = [failed(name, error)]
        done[0].raw["section_wall_s"] = time.perf_counter() - began
        sections += done
    wall = time.perf_counter() - start
    print_sections(sections)
    path = write_record(sections, mode, wall, Path(args.out) if args.out else RESULTS)
    print(f"\n{mode} run, {wall:.0f} s; record: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
