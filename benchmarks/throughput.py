"""Throughput against xdist workers: cases per second of one `python -m harness check` run,
start-up included, at -n 1 and -n 2 on a CPU-only machine (1, 4, 8 and 16 with a GPU).

The speed-up is the ratio to the first worker count's run, so a machine's general slowness
cancels out of it (its load while the runs go on does not). Threads are as a user gets them:
-n 1 keeps torch's and the host kernels' default threads; above one worker the plugin sets
OMP_NUM_THREADS to cores / workers.
"""
from __future__ import annotations

import sys

from benchmarks.common import (Section, Selection, add_selection_arguments, engine_run,
                               selection_from)

CPU_WORKERS = (1, 2)
GPU_WORKERS = (1, 4, 8, 16)


def default_workers() -> tuple[int, ...]:
    import torch
    return GPU_WORKERS if torch.cuda.is_available() else CPU_WORKERS


def measure(cases: Selection, workers=None) -> Section:
    workers = tuple(workers or default_workers())
    sec = Section("throughput")
    label = cases.label
    base = None
    raw = []
    for n in workers:
        run = engine_run(cases.args, n)
        rate = len(run.rows) / run.wall_s if run.wall_s else None
        base = base or rate
        speedup = f"; x{rate / base:.2f} of -n {workers[0]}" if rate and base else ""
        sec.add(f"-n {n}", rate, "cases/s", f"{len(run.rows)} rows in {run.wall_s:.1f} s, "
                f"exit {run.exit_code}{speedup}; {label}")
        raw.append({"workers": n, "rows": len(run.rows), "wall_s": run.wall_s,
                    "exit": run.exit_code, "cases_per_s": rate})
    sec.raw = {"cases": label, "runs": raw}
    return sec


def main(argv=None) -> int:
    import argparse

    from benchmarks.record import print_sections
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_selection_arguments(ap)
    ap.add_argument("-n", default=None, help="worker counts, comma-separated [1,2 or 1,4,8,16]")
    args = ap.parse_args(argv)
    workers = [int(n) for n in args.n.split(",")] if args.n else None
    print_sections([measure(selection_from(args), workers)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
