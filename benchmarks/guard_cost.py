"""Guard cost: host time the bundled library's guards add to one run() call, and what each costs.

For a few small planned problems, in this process:
1. run() per call with every guard on and with every guard off (KERNELS_DISABLE_GUARDS=all,
   with which run() checks nothing and keeps no memo), in interleaved timings of 20 calls,
   best of each. "On" repeats one call, so after the first every call takes the fast path:
   run() keys a memo on everything the checks read (guard switch, shapes, strides, dtypes,
   devices; plan() clears it) and skips the checks when the key matches the last call that
   passed them. On - off is then the fast path's whole cost: the key and its comparison.
2. The same with the memo forgotten before every call: the miss, which checks in full.
3. The guard calls one run() makes on the fast path (none, but for the fixes a route applies
   at every call) and on a miss, recorded with their arguments, each then timed alone on
   those same arguments: µs per call, per guard, and their sum per run().

The bar is 1 µs per run() call on the fast path (reported, not asserted). bench.py runs this in
a child process with one OpenMP thread (measure_in_child).
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
    """name -> a zero-argument call of one planned run() (or an unplanned single call); each
    call's `forget` attribute clears the memo it keys, so that its next call checks in full."""
    import torch

    import kernels
    from kernels import _lib, single
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

    def keyed(call, forget):
        call.forget = forget
        return call

    def wrapper_memo(w):
        return lambda: setattr(w, "_memo", None)
    return {
        "paged prefill run()": keyed(lambda: paged.run(q1, cache, out=out1), wrapper_memo(paged)),
        "batch decode run()": keyed(lambda: decode.run(q1, cache, out=out1), wrapper_memo(decode)),
        "ragged prefill run()": keyed(lambda: ragged.run(q1, k8, v8, out=out1), wrapper_memo(ragged)),
        "single_prefill_with_kv_cache()": keyed(lambda: kernels.single_prefill_with_kv_cache(
            q1, k8, v8, out=out1), single._MEMO.clear),
    }


def missing(call):
    """call, with its memo forgotten first: a run() that checks in full."""
    forget = call.forget
    return lambda: (forget(), call())


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
    """rounds: of each on/off comparison, each ten short on/off pairs (timings short enough to
    fall between other processes' time slices); number: calls per isolated guard timing / 10."""
    sec = Section("guard cost")
    fast: dict[str, list[float]] = defaultdict(list)
    miss: dict[str, list[tuple[float, float]]] = defaultdict(list)
    raw = {}
    for label, call in scenarios().items():
        for _ in range(100):
            call()  # warm: first calls allocate and fill caches
        on, off = on_off_us(call, rounds * 10, 20)
        miss_on, miss_off = on_off_us(missing(call), rounds * 10, 20)
        call()  # the memo again, for the recording of the fast path
        hit_calls = record_calls(call)
        alone_hit = isolated_us(hit_calls, number * 10)
        alone_miss = isolated_us(record_calls(missing(call)), number * 10)
        hit_us = sum(t_on for _, t_on, _ in alone_hit)
        miss_us = sum(t_on for _, t_on, _ in alone_miss)
        miss_off_us = sum(t_off for _, _, t_off in alone_miss)
        for name, t_on, _ in alone_hit:
            fast[name].append(t_on)
        for name, t_on, t_off in alone_miss:
            miss[name].append((t_on, t_off))
        flag = "" if on - off <= BAR_US else ", over the bar"
        sec.add(f"{label}: run() on - off", on - off, "µs/call",
                f"{on:.1f} µs on (memo hit), {off:.1f} µs off; bar {BAR_US} µs{flag}; "
                f"best of {rounds * 10} interleaved timings")
        sec.add(f"{label}: run() on - off, memo miss", miss_on - miss_off, "µs/call",
                f"{miss_on:.1f} µs on, {miss_off:.1f} µs off; memo forgotten before every call")
        sec.add(f"{label}: guard calls, fast path", hit_us, "µs/call",
                f"{len(alone_hit)} calls" + (f" ({', '.join(n for n, *_ in alone_hit)})" if alone_hit else ""))
        sec.add(f"{label}: guard calls, miss", miss_us, "µs/call",
                f"{len(alone_miss)} calls; switched off {miss_off_us:.2f} µs")
        raw[label] = {"on_us": on, "off_us": off, "miss_on_us": miss_on, "miss_off_us": miss_off,
                      "fast_guards_us": hit_us, "miss_guards_us": miss_us, "miss_guards_off_us": miss_off_us,
                      "fast_calls": alone_hit, "miss_calls": alone_miss}
    for name in sorted(set(miss) | set(fast)):
        ons, offs = [t for t, _ in miss[name]], [t for _, t in miss[name]]
        hits = fast.get(name, [])
        on_fast = f"fast path {median(hits):.2f} µs ({len(hits)} calls)" if hits else "fast path: not called"
        sec.add(f"guard {name}", median(ons) if ons else None, "µs/call",
                f"miss: median of {len(ons)} calls ({min(ons, default=0):.2f}..{max(ons, default=0):.2f}), "
                f"off {median(offs) if offs else 0:.2f}; {on_fast}")
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
