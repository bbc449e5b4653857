"""Big cases hold shares of the device's memory, so parallel workers never overcommit it.

Every worker of a run shares one GPU. Most cases need megabytes, but a long context or a
page pool past 2^31 elements needs gigabytes: its inputs, the library's copy of them (a
paged cache), the snapshot of watched inputs and, when the reference runs on the device,
fp64 copies of k and v widened to every q head. In the H200's full profile, 16 workers that
each started such a case at once ran the device out of memory (four `harness_error` rows,
"CUDA out of memory", in a run whose cases all pass alone).

So the device's memory is cut into SHARES equal shares, of which USABLE can be held (the rest
is left to small cases and the workers' allocator caches), and a case estimated at BIG_BYTES
or more holds enough of them (all USABLE at most: it then runs alone among big ones) from before it starts until its attempts are done and its worker has
handed its cached blocks back to the device. A share is an flock on a file in the run's state
folder, so a worker that dies frees its shares with it. Waiting is not part of a case's
time: the hang timer starts after the shares are held.
"""
from __future__ import annotations

import fcntl
import functools
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path

SHARES = 8
USABLE = 6
BIG_BYTES = 1 << 30
WAIT_STEP_S = 0.05


def estimate_bytes(params: dict) -> int:
    """A case's device memory at its peak, from its params, erring on the large side."""
    from harness.model.sizes import qkv_elements
    from harness.model.problem import DTYPES
    try:
        hq, d = int(params["num_qo_heads"]), int(params["head_dim"])
        hkv = int(params.get("num_kv_heads") or hq)
        dv = int(params.get("head_dim_vo") or d)
        q_elems = sum(int(n) for n in params["qo_lens"]) * hq * d
        b = DTYPES[params.get("dtype", "bf16")].itemsize
    except (KeyError, TypeError, ValueError):
        return 0
    kv_elems = qkv_elements(params) - q_elems
    # The paged pool's unused pages before the first real one (page ids past 2^31 elements).
    pad = int(params.get("page_id_offset") or 0) * int(params.get("page_size") or 1) * hkv * (d + dv)
    group = max(1, -(-hq // max(hkv, 1)))
    dtype_copies = 3 * b * (q_elems + kv_elems + pad)   # the problem, the library's, a snapshot
    reference = 8 * (q_elems + group * kv_elems)         # fp64, k and v widened to the q heads
    return dtype_copies + reference


def shares_for(params: dict, total_bytes: int, extra: int = 0) -> int:
    """How many shares a case holds: none below BIG_BYTES, at most USABLE. `extra`: what the
    adapter declares it allocates for the case (Target.estimate_bytes)."""
    need = estimate_bytes(params) + extra
    if need < BIG_BYTES or total_bytes <= 0:
        return 0
    return min(USABLE, max(1, math.ceil(need * SHARES / total_bytes)))


@contextmanager
def held(folder: str | os.PathLike | None, count: int):
    """Hold `count` shares (files share.0..USABLE-1 under folder) while the body runs."""
    if not count or folder is None:
        yield
        return
    folder = Path(folder)
    files = _take(folder, count)
    try:
        yield
    finally:
        for f in files:
            f.close()   # closing the file releases its lock


def _take(folder: Path, count: int) -> list:
    """Blocks until `count` shares are free, then holds them. One worker at a time picks
    (the pick lock), so two big cases never each hold half of what both need."""
    while True:
        with open(folder / "shares.pick", "a") as pick:
            fcntl.flock(pick, fcntl.LOCK_EX)
            taken = []
            for i in range(USABLE):
                f = open(folder / f"share.{i}", "a")
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    f.close()
                    continue
                taken.append(f)
                if len(taken) == count:
                    return taken
            for f in taken:
                f.close()
        time.sleep(WAIT_STEP_S)


def release_cached() -> None:
    """Hand the caching allocator's free blocks back to the device (after a big case)."""
    import torch
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@functools.lru_cache(maxsize=None)
def total_device_bytes() -> int:
    """The current device's memory, or 0 where there is no GPU (no shares then)."""
    import torch
    if not torch.cuda.is_available():
        return 0
    return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
