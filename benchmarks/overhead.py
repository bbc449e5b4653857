"""Harness overhead: the same cases through the engine and through a bare loop, and where a
case's time goes.

Engine: `python -m harness check --target bundled -n 0` (pytest in one process: collection,
the plugin, breadcrumbs, one durable row per case). Bare: benchmarks/bare_loop.py, the same
execute_case calls in a plain loop. Both are timed from a fresh process start to its exit,
alternately, and the best round of each is kept. The ratio engine / bare is the overhead; the
goal is 1.25 or below (reported, not asserted).

Both sides run with one intra-op thread (OMP_NUM_THREADS=1 unless already set): on a shared
machine torch's default threads make these small problems' compute swing by 10x from minute
to minute, which would drown the harness's own cost. One more bare run with the default
threads shows what they cost.

The engine's fixed cost is a run of one case; what the engine adds per case is its wall time
less that fixed cost, per further case, less the bare loop's time per case.
"""
from __future__ import annotations

import sys

from benchmarks.bare_loop import ENGINE_ONLY, STAGES
from benchmarks.common import (Section, Selection, add_selection_arguments, engine_run,
                               one_thread_env, python_json, selection_from)

GOAL_RATIO = 1.25


def measure(cases: Selection, rounds: int = 1) -> list[Section]:
    label = cases.label
    env = one_thread_env()
    threads = env["OMP_NUM_THREADS"]
    engines, bares = [], []
    for _ in range(rounds):  # alternate, so slow spells on a shared machine hit both
        engines.append(engine_run(cases.args, 0, env))
        bares.append(python_json("benchmarks.bare_loop", *cases.args, env=env))
    engine = min(engines, key=lambda e: e.wall_s)
    bare_run, bare = min(bares, key=lambda b: b[0].wall_s)
    default_threads = python_json("benchmarks.bare_loop", *cases.args)[1]
    n = bare["cases"]
    first = engine.rows[0]["case_id"] if engine.rows else None
    fixed = engine_run(["--case-id", first], 0, env) if first else None

    sec = Section("harness overhead")
    sec.add("cases", n, "", f"{label}; OMP_NUM_THREADS={threads}; engine rows "
            f"{len(engine.rows)}, exit {engine.exit_code}")
    sec.add("bare loop, process wall", bare_run.wall_s, "s", "python -m benchmarks.bare_loop")
    sec.add("engine -n 0, process wall", engine.wall_s, "s", "python -m harness check -n 0")
    ratio = engine.wall_s / bare_run.wall_s
    sec.add("engine / bare, wall", ratio, "x",
            f"goal <= {GOAL_RATIO}" + ("" if ratio <= GOAL_RATIO else " (not met)")
            + f"; best of {rounds} alternated round(s)")
    sec.add("engine / bare, CPU", engine.cpu_s / bare_run.cpu_s if bare_run.cpu_s else None, "x",
            f"{engine.cpu_s:.1f} s vs {bare_run.cpu_s:.1f} s; blind to disk waits")
    sec.add("bare: execute_case total", bare["loop_s"], "s")
    sec.add("engine: execute_case total", engine.case_seconds, "s",
            "the rows' duration_s (stage breadcrumbs are written inside execute_case)")
    per_case = None
    if fixed is not None and n > 1:
        sec.add("engine fixed cost (1 case)", fixed.wall_s, "s",
                f"bare fixed cost {bare_run.wall_s - bare['loop_s']:.2f} s")
        marginal = (engine.wall_s - fixed.wall_s) / (n - 1) * 1e3
        per_case = marginal - bare["loop_s"] / n * 1e3
        sec.add("engine cost per case, over the bare loop's", per_case, "ms/case",
                f"engine {marginal:.1f} ms per extra case, bare {bare['loop_s'] / n * 1e3:.1f} ms")
    sec.add("bare loop, default threads / one thread", default_threads["loop_s"] / bare["loop_s"],
            "x", f"execute_case total {default_threads['loop_s']:.2f} s vs {bare['loop_s']:.2f} s")
    sec.raw = {"cases": label, "rounds": rounds, "omp_num_threads": threads,
               "engine": [(e.wall_s, e.cpu_s) for e in engines],
               "bare": [(b.wall_s, b.cpu_s) for b, _ in bares], "bare_result": bare,
               "bare_default_threads": default_threads, "engine_case_s": engine.case_seconds,
               "engine_fixed_s": fixed.wall_s if fixed else None, "per_case_ms": per_case}
    return [sec, breakdown(bare, label)]


def breakdown(bare: dict, label: str) -> Section:
    """The bare run's stages, summed over its cases."""
    sec = Section("per-case breakdown")
    n = max(1, bare["cases"])
    for stage in STAGES:
        seconds = bare["stages"].get(stage, 0.0)
        where = "; the engine's, outside execute_case" if stage in ENGINE_ONLY else ""
        sec.add(stage, seconds * 1e3 / n, "ms/case",
                f"{seconds:.2f} s over {bare['cases']} cases{where}")
    sec.raw = {"label": label, **bare}
    return sec


def main(argv=None) -> int:
    import argparse

    from benchmarks.record import print_sections
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_selection_arguments(ap)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args(argv)
    print_sections(measure(selection_from(args), args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
