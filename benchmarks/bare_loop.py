"""The engine's per-case work without the engine: execute_case in a plain loop, one process.

    python -m benchmarks.bare_loop [--family F,G | --cases-file CASES.json]  -> one JSON line

Each case runs through harness.engine.execute.execute_case, the function a pytest worker calls, so
the loop does exactly the engine's per-case work (build inputs, adapter + library call, canary
check, reference, compare, classify) and nothing else. Its stages are timed by wrapping the
names execute_case looks up in its module, never by copying its steps, so the breakdown
follows execute_case as it changes.

Two engine costs are timed after each case and kept out of the loop's total: the worker's
breadcrumbs (harness.engine.isolation.WorkerState: begin, one write per stage the case reached, end,
in a state directory made as the plugin makes it) and the row write (case_row, then
table.append_row).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

# Stage -> the names execute_case (and its helpers in harness.engine.execute) call for it. A name the
# module no longer has is skipped; its time then shows up under "other".
STAGE_NAMES = {
    "build inputs": ("build_problem",),
    "reference": ("attention_reference", "attention_baseline"),
    "compare": ("compare", "missing", "summarize", "output_tolerance", "lse_tolerance"),
    "classify": ("classify", "crash_verdict"),
}
STAGES = ("build inputs", "library call", "canary check", "reference", "compare", "classify",
          "other", "breadcrumbs", "row write")
ENGINE_ONLY = ("breadcrumbs", "row write")


class StageClock:
    """Seconds per stage, accumulated by wrapped callables."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self._undo: list = []

    def wrap(self, stage: str, fn):
        seconds = self.seconds

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[stage] += time.perf_counter() - start
        return timed

    def patch(self, owner, name: str, stage: str) -> None:
        if hasattr(owner, name):
            original = getattr(owner, name)
            setattr(owner, name, self.wrap(stage, original))
            self._undo.append((owner, name, original))

    def restore(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()


def instrument(clock: StageClock, target) -> None:
    from harness.model import builders
    from harness.engine import execute
    for stage, names in STAGE_NAMES.items():
        for name in names:
            clock.patch(execute, name, stage)
    clock.patch(builders.Buffers, "check", "canary check")
    # The instance attribute shadows the method: execute_case's target.run(...) is timed.
    target.run = clock.wrap("library call", target.run)


def breadcrumbs(state_dir: str):
    """The worker's writes around one case, as harness.engine.plugin.run_case makes them."""
    from harness.engine import isolation
    state = isolation.WorkerState(state_dir, "gw0")

    def write(case, stages: list[str]) -> None:
        state.begin(case.id, isolation.case_timeout(dict(case.params)))
        for name in stages:
            state.stage(name)
        state.end(case.id)
    return write


def row_writer(target, results: Path):
    """The engine's row path for one finished case: case_row, then the durable append."""
    from harness.model import platform_info
    from harness.results import table
    from harness.engine.row import case_row
    context = {"arch": platform_info.arch(), "target": target.name}

    def write(case, result) -> None:
        table.append_row(results, case_row(case, result, **context))
    return write


def run_loop(families=None, cases_file: str | None = None, case_id: str | None = None,
             per_case=None) -> dict:
    """The loop's totals; per_case(case, seconds, stage seconds) after each case when given."""
    from harness.engine import isolation
    from harness.engine.execute import execute_case
    from harness.engine.session import select_cases
    from harness.targets import load_target

    cases = select_cases("bundled", families, case_id=case_id, cases_file=cases_file)
    target = load_target("bundled")
    clock = StageClock()
    instrument(clock, target)
    outcomes: Counter = Counter()
    loop_s = 0.0
    with tempfile.TemporaryDirectory(prefix="bench-bare-") as tmp:
        write_row = row_writer(target, Path(tmp) / "rows.jsonl")
        # Where the engine keeps them (in memory where the system has it), not under tmp.
        crumbs_dir = isolation.state_tempdir()
        write_crumbs = breadcrumbs(crumbs_dir)
        for case in cases:
            stages: list[str] = []
            before = dict(clock.seconds)
            start = time.perf_counter()
            result = execute_case(case, target, on_stage=stages.append)
            took = time.perf_counter() - start
            loop_s += took
            if per_case:
                per_case(case, took, {k: v - before.get(k, 0.0) for k, v in clock.seconds.items()
                                      if v - before.get(k, 0.0) > 0})
            outcomes[result.outcome] += 1
            for name, write, arg in (("breadcrumbs", write_crumbs, stages),
                                     ("row write", write_row, result)):
                mark = time.perf_counter()
                write(case, arg)
                clock.seconds[name] += time.perf_counter() - mark
    clock.restore()
    timed_stages = sum(v for k, v in clock.seconds.items() if k not in ENGINE_ONLY)
    clock.seconds["other"] = max(0.0, loop_s - timed_stages)
    return {"cases": len(cases), "loop_s": loop_s, "outcomes": dict(outcomes),
            "stages": {s: clock.seconds.get(s, 0.0) for s in STAGES}}


def _memory_note(case) -> str:
    """On a GPU: the case's peak device memory against harness.engine.device_memory's estimate
    (the peak counter is reset for the next case)."""
    import torch
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return ""
    from harness.engine import device_memory
    peak = torch.cuda.max_memory_reserved()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return (f"; device memory peak {peak / 2**30:.2f} GiB, estimated "
            f"{device_memory.estimate_bytes(case.params) / 2**30:.2f} GiB")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default=None, help="families, comma-separated [all]")
    ap.add_argument("--cases-file", default=None, help="a JSON list of cases instead of families")
    ap.add_argument("--case-id", default=None, help="only ids containing this substring")
    ap.add_argument("--per-case", action="store_true",
                    help="also one line per case on stderr: its seconds, stage by stage")
    args = ap.parse_args(argv)
    families = [f for f in (args.family or "").split(",") if f] or None

    def show(case, seconds, stages):
        parts = ", ".join(f"{k} {v:.3f}" for k, v in stages.items())
        print(f"{seconds:8.3f} s  {case.id}: {parts}{_memory_note(case)}", file=sys.stderr,
              flush=True)
    print(json.dumps(run_loop(families, args.cases_file, args.case_id,
                              show if args.per_case else None)))
    return 0


if __name__ == "__main__":
    # As the engine's processes do (harness/engine/fast_exit.py): the ratio compares the work, not
    # which side pays the interpreter's 0.35-0.55 s teardown with torch loaded.
    from harness.engine.fast_exit import exit_now
    exit_now(main())
