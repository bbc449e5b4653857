"""A finished run's timeline from its table: when each worker's rows came, and the steady rate.

    python -m benchmarks.timeline RESULTS.jsonl [--start EPOCH_S]

A run's wall time mixes three things: start-up (interpreters, torch, a device context per
worker), the steady stream of rows, and a tail (the last, longest cases). The rows' own
timestamps (milliseconds) separate them: per worker, its first and last row and the sum of
its cases' duration_s (busy time inside execute_case); overall, the rate between the 10th
and the 90th percentile row, which no start-up or tail reaches. --start (the run's start,
seconds since the epoch) measures the first row's delay from it; without it, times are
from the first row.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from datetime import datetime


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def timeline(rows: list[dict], start: float | None = None) -> dict:
    stamped = sorted(((_seconds(r["timestamp"]), r) for r in rows if r.get("timestamp")),
                     key=lambda pair: pair[0])
    if not stamped:
        return {"rows": 0}
    t0 = start if start is not None else stamped[0][0]
    times = [t for t, _ in stamped]
    lo, hi = times[len(times) // 10], times[(len(times) * 9) // 10]
    steady = ((len(times) * 9) // 10 - len(times) // 10) / (hi - lo) if hi > lo else None
    workers = defaultdict(list)
    for t, r in stamped:
        workers[r.get("worker") or "?"].append((t, r))
    per_worker = {
        w: {"rows": len(items), "first_s": items[0][0] - t0, "last_s": items[-1][0] - t0,
            "busy_s": sum(float(r.get("duration_s") or 0) for _, r in items)}
        for w, items in sorted(workers.items())}
    return {"rows": len(stamped), "first_row_s": times[0] - t0, "last_row_s": times[-1] - t0,
            "steady_rows_per_s": steady, "busy_s": sum(v["busy_s"] for v in per_worker.values()),
            "workers": per_worker}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--start", type=float, default=None, help="the run's start, epoch seconds")
    args = ap.parse_args(argv)
    try:
        with open(args.results) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        print(f"timeline: cannot read {args.results}: {e}", file=sys.stderr)
        return 2
    t = timeline(rows, args.start)
    if not t["rows"]:
        print(f"timeline: {args.results} has no timestamped rows", file=sys.stderr)
        return 2
    steady = t["steady_rows_per_s"]
    print(f"{t['rows']} rows; first at {t['first_row_s']:.2f} s, last at {t['last_row_s']:.2f} s; "
          f"steady {steady:.1f} rows/s (10th-90th percentile row)" if steady else "")
    print(f"busy in execute_case: {t['busy_s']:.2f} s summed over workers")
    for w, v in t["workers"].items():
        print(f"  {w:>6}: {v['rows']:5d} rows, first {v['first_s']:7.2f} s, last {v['last_s']:7.2f} s, "
              f"busy {v['busy_s']:6.2f} s")
    print(json.dumps({k: v for k, v in t.items() if k != "workers"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
