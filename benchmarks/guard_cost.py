"""Guard cost: host time the bundled library's guards add to one run() call, and what each costs.

For a few small planned problems, in this process:
1. run() per call with every guard on and with every guard off (KERNELS_DISABLE_GUARDS=all,
   which guards.py reads at every call), in interleaved timings of 20 calls, best of each;
2. the guard calls one run() makes, recorded with their arguments, each then timed alone on
   those same arguments: µs per call, per guard, and their sum per run().

The sum in 2 is the whole cost (the on/off switch included); 1 only shows what the guards'
bodies add over the switched-off guards. The bar is 1 µs per run() call (reported, not
asserted). bench.py runs this in a child process with one OpenMP thread (measure_in_child).
"""
from __future__ import annotations

import os
import sys
import timeit
from collections import defaultdict
from contextlib import contextmanager

from benchmarks.common import Section, best, median, one_thread_env, python_json

ENV = "KERNELS_DISABLE_GUARDS"
BAR_US = 1.0


@contextmanager
def guards_env(value: str | None):
    before = os.environ.get(ENV)
    if value is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


def scenarios() -> dict:
    """name -> a zero-argument call of one planned run() (or an unplanned single call)."""
    import torch

    import kernels
    from kernels import _lib
    dev = torch.device("cpu" if _lib.platform() == "host" else "cuda")
    gen = torch.Generator().manual_seed(0)
    hq, hkv, d, page, dt = 4, 2, 64, 16, torch.float16

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dev, dt)

    ws = torch.empty(8 << 20, dtype=torch.uint8, device=dev)
    ints = lambda *v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    cache = (rand(4, page, hkv, d), rand(4, page, hkv, d))
    q1 = rand(1, hq, d)
    out1 = torch.empty(1, hq, d, dtype=dt, device=dev)

    paged = kernels.BatchPrefillWithPagedKVCacheWrapper(ws)
    paged.plan(ints(0, 1), ints(0, 1), ints(2), ints(8), hq, hkv, d, page, q_data_type=dt)
    decode = kernels.BatchDecodeWithPagedKVCacheWrapper(ws)
    decode.plan(ints(0, 1), ints(2), ints(8), hq, hkv, d, page, q_data_type=dt)
    ragged = kernels.BatchPrefillWithRaggedKVCacheWrapper(ws)
    ragged.plan(ints(0, 1), ints(0, 8), hq, hkv, d, q_data_type=dt)
    k8, v8 = rand(8, hkv, d), rand(8, hkv, d)
    return {
        "paged prefill run()": lambda: paged.run(q1, cache, out=out1),
        "batch decode run()": lambda: decode.run(q1, cache, out=out1),
        "ragged prefill run()": lambda: ragged.run(q1, k8, v8, out=out1),
        "single_prefill_with_kv_cache()": lambda: kernels.single_prefill_with_kv_cache(
            q1, k8, v8, out=out1),
    }


def guard_functions() -> dict:
    """attribute name in kernels.guards -> the registered guard (what callers look up)."""
    from kernels import guards
    return {name: fn for name, fn in vars(guards).items() if hasattr(fn, "guard_name")}


def record_calls(call) -> list[tuple]:
    """(guard name, guard, args, kwargs) of every guard call that `call` makes, in order."""
    from kernels import guards
    seen: list[tuple] = []
    originals = guard_functions()

    def recorder(fn):
        def rec(*args, **kwargs):
            seen.append((fn.guard_name, fn, args, kwargs))
            return fn(*args, **kwargs)
        return rec
    for attr, fn in originals.items():
        setattr(guards, attr, recorder(fn))
    try:
        with guards_env(None):
            call()
    finally:
        for attr, fn in originals.items():
            setattr(guards, attr, fn)
    return seen


def per_call_us(fn, number: int, repeat: int = 3) -> float:
    """Host µs per call; on a GPU the launches queued by one timing drain before the next."""
    times = []
    for _ in range(repeat):
        times.append(timeit.timeit(fn, number=number))
        _drain()
    return best(times) / number * 1e6


def _drain() -> None:
    import torch
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def on_off_us(call, rounds: int, number: int) -> tuple[float, float]:
    """Best µs per call with every guard on, and with every guard off, rounds interleaved."""
    on, off = [], []
    for _ in range(rounds):
        with guards_env(None):
            on.append(per_call_us(call, number, 1))
        with guards_env("all"):
            off.append(per_call_us(call, number, 1))
    return best(on), best(off)


def isolated_us(calls: list[tuple], number: int) -> list[tuple[str, float, float]]:
    """(guard name, µs on, µs off) of each recorded call, alone on its own arguments, less
    the timing loop's own call of an empty function."""
    loop = per_call_us(lambda: None, number)
    out = []
    for name, fn, args, kwargs in calls:
        timings = []
        for env in (None, "all"):
            with guards_env(env):
                timings.append(per_call_us(lambda: fn(*args, **kwargs), number) - loop)
        out.append((name, *timings))
    return out


def measure(rounds: int = 15, number: int = 200) -> Section:
    """rounds: of the on/off comparison, each ten short on/off pairs (timings short enough to
    fall between other processes' time slices); number: calls per isolated guard timing / 10."""
    sec = Section("guard cost")
    per_guard: dict[str, list[tuple[float, float]]] = defaultdict(list)
    raw = {}
    for label, call in scenarios().items():
        for _ in range(100):
            call()  # warm: first calls allocate and fill caches
        on, off = on_off_us(call, rounds * 10, 20)
        calls = record_calls(call)
        alone = isolated_us(calls, number * 10)
        total_on = sum(t_on for _, t_on, _ in alone)
        total_off = sum(t_off for _, _, t_off in alone)
        for name, t_on, t_off in alone:
            per_guard[name].append((t_on, t_off))
        flag = "" if total_on <= BAR_US else ", over the bar"
        sec.add(f"{label}: its guard calls", total_on, "µs/call",
                f"{len(calls)} calls; switched off {total_off:.2f} µs; bar {BAR_US} µs{flag}")
        sec.add(f"{label}: run() on - off", on - off, "µs/call",
                f"{on:.1f} µs on, {off:.1f} µs off; best of {rounds * 10} interleaved timings")
        raw[label] = {"on_us": on, "off_us": off, "guards_on_us": total_on,
                      "guards_off_us": total_off, "calls": alone}
    for name in sorted(per_guard):
        ons, offs = [t for t, _ in per_guard[name]], [t for _, t in per_guard[name]]
        sec.add(f"guard {name}", median(ons), "µs/call",
                f"median of {len(ons)} calls ({min(ons):.2f}..{max(ons):.2f}); off {median(offs):.2f}")
    sec.raw = raw
    return sec


def measure_in_child(rounds: int = 15) -> Section:
    """measure() in a fresh process with one OpenMP thread, so the kernels' own time holds still
    while guards are switched on and off."""
    return Section.from_json(python_json("benchmarks.guard_cost", "--json", "--rounds",
                                         str(rounds), env=one_thread_env())[1])


def main(argv=None) -> int:
    import argparse
    import json

    from benchmarks.record import print_sections
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", action="store_true", help="print the section as one JSON line")
    args = ap.parse_args(argv)
    sec = measure(args.rounds)
    if args.json:
        print(json.dumps(sec.to_json()))
    else:
        print_sections([sec])
    return 0


if __name__ == "__main__":
    sys.exit(main())
