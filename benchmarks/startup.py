"""What a fresh worker pays before its first case, phase by phase.

    python -m benchmarks.startup --child    -> one JSON line: seconds per phase, in order

Phases, each timed inside one fresh process in the order a worker meets them: import torch,
the device context (a first tensor on the device), the bundled library (kernels' build-cache
lookup and dlopen; a warm cache, as every worker but the first sees), pytest with xdist and the
harness plugin, and the case selection a worker makes when it collects. The interpreter's own
start is the wall time of `python -c pass`.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from benchmarks.common import Section, best, python_json, timed

PHASES = ("import torch", "device context", "library load", "pytest + plugin import",
          "case selection")


def child() -> dict:
    out = {}
    mark = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        out[name] = now - mark
        mark = now

    import torch
    lap("import torch")
    from harness.model import platform_info
    torch.zeros(1, device=platform_info.device()).sum().item()
    lap("device context")
    from kernels import _lib
    _lib.lib()
    lap("library load")
    import pytest  # noqa: F401
    import xdist  # noqa: F401
    import harness.engine.plugin
    import harness.engine.session
    lap("pytest + plugin import")
    harness.engine.session.select_cases("bundled")
    lap("case selection")
    return out


def measure(rounds: int = 3) -> Section:
    sec = Section("worker start-up")
    interp = best(timed([sys.executable, "-c", "pass"]).wall_s for _ in range(rounds))
    runs = [python_json("benchmarks.startup", "--child")[1] for _ in range(rounds)]
    phases = {name: best(r[name] for r in runs) for name in PHASES}
    sec.add("interpreter start", interp * 1e3, "ms", "python -c pass")
    for name in PHASES:
        sec.add(name, phases[name] * 1e3, "ms")
    total = interp + sum(phases.values())
    sec.add("total before the first case", total * 1e3, "ms",
            f"best of {rounds} fresh processes per phase")
    sec.raw = {"interpreter_s": interp, "phases_s": phases, "rounds": runs}
    return sec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", action="store_true", help="time the phases in this process")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child()))
    else:
        from benchmarks.record import print_sections
        print_sections([measure()])
    return 0


if __name__ == "__main__":
    sys.exit(main())
