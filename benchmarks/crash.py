"""Crash recovery: seconds from a worker's death to the next case running, without and with
culprit replay. The measurement is benchmarks/isolation_bench.py's crash_recovery (faults
target, SIGSEGV cases among normal ones, -n 2, against the same run without crashes); this
module only repeats it and puts its figures in the table. With several rounds, the best run
with crashes and the best without are compared.
"""
from __future__ import annotations

import contextlib
import io
import sys

from benchmarks.common import Section, best


def measure(crashes: int, normal: int, rounds: int = 1) -> Section:
    from benchmarks.isolation_bench import crash_recovery

    sec = Section("crash recovery")
    raw = []
    for replay in (False, True):
        figs = []
        for _ in range(rounds):
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):  # bench.py prints one table, nothing else
                fig = crash_recovery(crashes, normal, replay=replay)
            figs.append(dict(fig, line=printed.getvalue().strip()))
        with_crashes = best(f["wall_crash_s"] for f in figs)
        without = best(f["wall_base_s"] for f in figs)
        cpu = best(f["cpu_crash_s"] - f["cpu_base_s"] for f in figs)
        k, cases = figs[0]["crashes"], figs[0]["cases"]
        label = "with culprit replay" if replay else "without replay"
        sec.add(f"per crash, {label}", (with_crashes - without) / k, "s",
                f"{k} crashes in {cases} cases, -n 2: {with_crashes:.1f} s vs {without:.1f} s "
                f"without; rows {figs[0]['rows']}/{cases}; best of {rounds}")
        sec.add(f"per crash, {label}, CPU", cpu / k, "s",
                "CPU seconds of every process, with crashes less without; steady under load")
        raw += figs
    sec.raw = {"runs": raw}
    return sec


if __name__ == "__main__":
    from benchmarks.record import print_sections
    print_sections([measure(3, 9)])
    sys.exit(0)
