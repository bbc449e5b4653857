"""Merging attention states: v [rows, H, D], s [rows, H] fp32 natural-log LSE."""
from __future__ import annotations

import torch

from . import guards
from ._launch import check_device, code
from ._lib import call, stream_of


def merge_state(v_a, s_a, v_b, s_b):
    """(v, s) of the union of two states; two -inf states give v = 0, s = -inf."""
    where = "merge_state()"
    check_device(where, {"v_a": v_a, "v_b": v_b})
    guards.state_contiguous(where, {"v_a": v_a, "v_b": v_b}, {"s_a": s_a, "s_b": s_b})
    guards.dtype_supported(where, {"v_a": v_a, "v_b": v_b})
    guards.run_matches_plan(where, [("dtype", v_a.dtype, v_b.dtype, "v_b")])
    v = torch.empty_like(v_a)
    s = torch.empty(v_a.shape[:2], dtype=torch.float32, device=v_a.device)
    rows, heads, dim = v_a.shape
    call("kernels_merge_state", v_a.data_ptr(), s_a.data_ptr(), v_b.data_ptr(), s_b.data_ptr(), v.data_ptr(),
         s.data_ptr(), rows, heads, dim, code(v_a.dtype), stream_of(v_a))
    return v, s


def merge_state_in_place(v, s, v_other, s_other, num_rows=None):
    """Merge (v_other, s_other) into (v, s) over the first num_rows rows (default: all)."""
    where = "merge_state_in_place()"
    check_device(where, {"v": v, "v_other": v_other})
    guards.state_contiguous(where, {"v": v, "v_other": v_other}, {"s": s, "s_other": s_other})
    guards.dtype_supported(where, {"v": v, "v_other": v_other})
    guards.run_matches_plan(where, [("dtype", v.dtype, v_other.dtype, "v_other")])
    rows, heads, dim = v.shape
    # Reachable by merge_state_in_place(num_rows=...); no ci case yet.
    n = rows if num_rows is None else int(num_rows)
    call("kernels_merge_state_in_place", v.data_ptr(), s.data_ptr(), v_other.data_ptr(), s_other.data_ptr(), n,
         None, heads, dim, code(v.dtype), stream_of(v))
