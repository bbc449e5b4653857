"""Big cases hold shares of the device's memory: never more than USABLE at once, freed with
the holder, and no small case (every ci case) ever waits for one."""
from __future__ import annotations

import fcntl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.engine import device_memory as dm
from harness.targets import load_target

GIB = 1 << 30
H200 = 140 * GIB
LONG = {"dtype": "bf16", "head_dim": 128, "num_qo_heads": 32, "num_kv_heads": 8,
        "qo_lens": [1] * 4, "kv_lens": [32768, 65536, 131072, 7]}


def test_no_ci_case_holds_a_share_and_the_full_profile_giants_do():
    cases = load_target("bundled").cases(None, "ci")
    # Only ci's offsets past 2^31 are big on a device: their pools are lazy on the host alone.
    assert all(dm.shares_for(c.params, H200) == 0 for c in cases
               if c.variant != "offset_past_2_31_host")
    assert all(dm.shares_for(c.params, H200) for c in cases
               if c.variant == "offset_past_2_31_host")
    full = load_target("bundled").cases(["scale"], "full")
    holders = {c.id for c in full if dm.shares_for(c.params, H200)}
    assert any("long_kv_full" in i for i in holders)
    assert any("offset_past_2_31" in i for i in holders)


def test_the_estimate_grows_with_the_page_pool_and_the_gqa_group():
    base = dm.estimate_bytes(LONG)
    assert base > dm.BIG_BYTES
    assert dm.estimate_bytes(dict(LONG, page_id_offset=1 << 17, page_size=16)) > base + 8 * GIB
    assert dm.estimate_bytes(dict(LONG, num_qo_heads=64)) > base   # k, v widened to 64 heads
    assert dm.shares_for(dict(LONG, kv_lens=[1 << 24]), H200) == dm.USABLE   # capped


def _hold_then_note(folder, count, seconds, log, name):
    with dm.held(folder, count):
        log.append((name, "in", time.monotonic()))
        time.sleep(seconds)
        log.append((name, "out", time.monotonic()))


def test_holders_never_exceed_the_usable_shares(tmp_path):
    log: list = []
    big = threading.Thread(target=_hold_then_note, args=(tmp_path, dm.USABLE, 0.4, log, "big"))
    big.start()
    while not log:
        time.sleep(0.01)
    small = threading.Thread(target=_hold_then_note, args=(tmp_path, 1, 0.0, log, "small"))
    small.start()
    big.join()
    small.join()
    at = {(name, what): t for name, what, t in log}
    assert at[("small", "in")] >= at[("big", "out")]
    # Two that fit together run together: each waits inside for the other to come in,
    # which only two holders at once can do (the timeout only ends a failing run).
    both_in = threading.Barrier(2, timeout=60)
    met: list = []

    def hold_half(name):
        with dm.held(tmp_path, dm.USABLE // 2):
            both_in.wait()
            met.append(name)
    pair = [threading.Thread(target=hold_half, args=(n,)) for n in ("a", "b")]
    for t in pair:
        t.start()
    for t in pair:
        t.join()
    assert sorted(met) == ["a", "b"] and not both_in.broken


@pytest.mark.system
def test_a_dead_holder_frees_its_shares(tmp_path):
    script = ("import sys, time\nfrom harness.engine import device_memory as dm\n"
              f"with dm.held({str(tmp_path)!r}, dm.USABLE):\n"
              "    print('held', flush=True)\n    time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parent.parent)
    try:
        assert proc.stdout.readline().strip() == "held"
        # Every usable share is held by the live process: none can be taken without waiting.
        for i in range(dm.USABLE):
            with open(tmp_path / f"share.{i}", "a") as f:
                with pytest.raises(BlockingIOError):
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        waited: list = []
        t = threading.Thread(target=lambda: waited.append(dm._take(tmp_path, 1)))
        t.start()
        assert not waited          # it cannot have one while the holder lives
        proc.kill()
        proc.wait()
        t.join(timeout=10)
        assert waited and len(waited[0]) == 1
        for f in waited[0]:
            f.close()
    finally:
        proc.kill()
