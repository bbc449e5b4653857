"""merge_state: each request's KV split in two, both halves' states merged back.

The halves run through the library's single_prefill(return_lse=True); the
merge is merge_state (params["merge"] = "out_of_place", the default) or
merge_state_in_place ("in_place"). The answer is compared with the whole
problem's reference. FlashInfer's adapter computes its halves its own way
and shares the checks and the merge.
"""
from __future__ import annotations

import torch

from harness.targets.base import Skip


def check_splits(p, params=None) -> None:
    """Both halves non-empty (unless params["merge_empty"] asks for an empty one), and no
    mask that would not split with them."""
    if p.causal or p.window_left >= 0:
        raise Skip("merge cases split KV in halves; a mask would not split with it")
    empty = (params or {}).get("merge_empty")
    if empty not in (None, "a", "b"):
        raise Skip(f"merge_empty must be a or b, got {empty!r}")
    if empty is None and any(n < 2 for n in p.kv_lens):
        raise Skip("merge cases need kv_len >= 2 so both halves are non-empty")


def cut(params, kv_len: int) -> int:
    """Where a request's KV splits into the two states: its middle, or (merge_empty) 0 so
    state a is over no key (o 0, LSE -inf), or kv_len so state b is."""
    empty = params.get("merge_empty")
    return 0 if empty == "a" else kv_len if empty == "b" else kv_len // 2


def merged(c, halves) -> dict:
    """Merge the halves' states ((v_a, s_a), (v_b, s_b)) with c.lib, as params["merge"] says."""
    p = c.problem
    rows, hq, dv = sum(p.qo_lens), p.num_qo_heads, p.head_dim_vo
    (va, sa), (vb, sb) = halves
    fill = c.params.get("empty_state_values")
    if fill:
        # An outside caller's empty state may hold any output: only its LSE says it is empty.
        for v_half, s_half in halves:
            v_half[torch.isneginf(s_half)] = float(fill)
    merge = c.params.get("merge", "out_of_place")
    if merge == "out_of_place":
        va, sa = c.views.input("v_a", va), c.views.input("s_a", sa)
        vb, sb = c.views.input("v_b", vb), c.views.input("s_b", sb)
        c.ready("run")
        v, s = c.lib.merge_state(va, sa, vb, sb)
    elif merge == "in_place":
        v = c.views.output("v", (rows, hq, dv), p.dtype)
        s = c.views.output("s", (rows, hq), torch.float32)
        v.copy_(va)
        s.copy_(sa)
        vb, sb = c.views.input("v_other", vb), c.views.input("s_other", sb)
        c.ready("run")
        c.lib.merge_state_in_place(v, s, vb, sb)
    else:
        raise Skip(f"merge must be out_of_place or in_place, got {merge!r}")
    return c.result(v, s)


def merge_state(c) -> dict:
    """Two partial states per request (KV halves, through the library), merged back."""
    p = c.problem
    check_splits(p, c.params)
    rows, hq, dv = sum(p.qo_lens), p.num_qo_heads, p.head_dim_vo
    halves = []
    c.buffers.stage("partial")
    for half in (0, 1):
        o_half = c.buffers.output((rows, hq, dv), p.dtype, f"o_{'ab'[half]}")
        s_half = c.buffers.output((rows, hq), torch.float32, f"lse_{'ab'[half]}")
        for r, (q, k, v, lq, lk) in enumerate(zip(p.q, p.k, p.v, p.qo_lens, p.kv_lens)):
            at = cut(c.params, lk)
            sl = slice(0, at) if half == 0 else slice(at, lk)
            lo = int(p.qo_indptr[r])
            c.lib.single_prefill_with_kv_cache(
                q.contiguous(), k[sl].contiguous(), v[sl].contiguous(), causal=False,
                kv_layout="NHD", window_left=-1, sm_scale=c.sm_scale, return_lse=True,
                out=o_half[lo:lo + lq], lse=s_half[lo:lo + lq])
        halves.append((o_half, s_half))
    return merged(c, halves)
