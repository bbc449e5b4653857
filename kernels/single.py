"""fa2 single-request prefill and decode (no plan)."""
from __future__ import annotations

import torch

from . import guards
from ._launch import LAYOUTS, check_device, dense_dims, dense_kv_dims, launch, params
from .prefill import out_sig

_T = torch.Tensor
# where -> the key of the last call whose checks all passed: the guard switch, kv_layout,
# return_lse, and every tensor's shape, stride (contiguity for out and lse), dtype and device,
# which is everything the checks read. A call with an equal key skips them (the batch wrappers'
# run() does the same: prefill._BatchRun._prepare_paged).
_MEMO: dict = {}


def _key(sw, kv_layout, q, k, v, out, lse, return_lse):
    """The memo key of a single-request call (see _MEMO); None when it is not memoized (every
    guard off, or an argument that is not a plain tensor or layout name)."""
    if sw is None or type(kv_layout) is not str:
        return None
    osig, lsig = out_sig(out), out_sig(lse)
    if osig is False or lsig is False:
        return None
    return (sw, kv_layout, q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
            v.shape, v.stride(), v.dtype, v.device, osig, lsig, not return_lse)


def _fast_path(where, q, k, v, kv_layout, out, lse, return_lse):
    """(key, dims) of a single-request call. dims (k's and v's) when its checks can be skipped:
    every guard is off, or the memo holds this very key; else None. key is what to remember
    once the checks pass (None: not memoized)."""
    if not (_T is type(q) is type(k) is type(v)):
        return None, None
    sw = guards.switch()
    key = _key(sw, kv_layout, q, k, v, out, lse, return_lse)
    if sw is None or key is not None and key == _MEMO.get(where):
        return key, (dense_dims(k.shape, k.stride(), kv_layout), dense_dims(v.shape, v.stride(), kv_layout))
    return key, None


def _single(where, q, k, v, *, causal, kv_layout, window_left, sm_scale, return_lse, out, lse,
            entry, out_shape, lse_shape, dims=None, q_stride=None):
    """dims None: every check, in order; dims (kd, vd) given: the caller's memo says they passed."""
    check = dims is None
    if check:
        guards.layout_known(where, "kv_layout", kv_layout, LAYOUTS)
        check_device(where, {"q": q, "k": k, "v": v, "out": out, "lse": lse})
        guards.rank_expected(where, {"k": (k, 3), "v": (v, 3)})
        kd, vd = dense_kv_dims(k, kv_layout), dense_kv_dims(v, kv_layout)
    else:
        kd, vd = dims
    hq, dqk, dvo = q.shape[1], q.shape[2], vd["dim"]
    if check:
        guards.kv_shapes_agree(where, {"head_dim_qk": (dqk, kd["dim"]), "kv_len": (kd["len"], vd["len"]),
                                       "num_kv_heads": (kd["heads"], vd["heads"])})
        guards.gqa_divisible(where, hq, kd["heads"])
        guards.head_dim_supported(where, dqk, dvo)
    if out is None:
        out = torch.empty(out_shape(hq, dvo), dtype=q.dtype, device=q.device)
    if lse is None and return_lse:
        lse = torch.empty(lse_shape(hq), dtype=torch.float32, device=q.device)
    if check:
        guards.out_contiguous(where, {"out": out, "lse": lse}, {"out": out_shape(hq, dvo), "lse": lse_shape(hq)})
    p = params(q=q, k=k, v=v, kd=kd, vd=vd, o=out, lse=lse, num_qo_heads=hq, num_kv_heads=kd["heads"],
               head_dim_qk=dqk, head_dim_vo=dvo, causal=causal, window_left=window_left, sm_scale=sm_scale,
               q_dtype=q.dtype, kv_dtype=k.dtype, o_dtype=out.dtype,
               num_work=1, qo_len=q.shape[0], kv_len=kd["len"], q_stride=q_stride)
    launch(entry, p, q)
    return (out, lse) if return_lse else out


def single_prefill_with_kv_cache(q, k, v, causal=False, kv_layout="NHD", window_left=-1, sm_scale=None,
                                 return_lse=False, out=None, lse=None):
    """q [qo_len, Hq, Dqk]; k [kv_len, Hkv, Dqk], v [kv_len, Hkv, Dvo] (NHD) or head-major (HND)."""
    where = "single_prefill_with_kv_cache()"
    key, dims = _fast_path(where, q, k, v, kv_layout, out, lse, return_lse)
    if dims is not None:
        rows = q.shape[0]
        return _single(where, q, k, v, causal=causal, kv_layout=kv_layout, window_left=window_left,
                       sm_scale=sm_scale, return_lse=return_lse, out=out, lse=lse, entry="kernels_prefill",
                       out_shape=lambda h, d: (rows, h, d), lse_shape=lambda h: (rows, h),
                       dims=dims, q_stride=q.stride())
    guards.rank_expected(where, {"q": (q, 3)})
    t = guards.last_dim_contiguous(where, {"q": q, "k": k, "v": v})
    rows = q.shape[0]
    res = _single(where, t["q"], t["k"], t["v"], causal=causal, kv_layout=kv_layout, window_left=window_left,
                  sm_scale=sm_scale, return_lse=return_lse, out=out, lse=lse, entry="kernels_prefill",
                  out_shape=lambda h, d: (rows, h, d), lse_shape=lambda h: (rows, h))
    if key is not None:
        _MEMO[where] = key
    return res


def single_decode_with_kv_cache(q, k, v, kv_layout="NHD", window_left=-1, sm_scale=None, return_lse=False,
                                use_tensor_cores=False, out=None, lse=None):
    """q [Hq, Dqk], one token; it is copied when its last dim is strided (a few KB)."""
    where = "single_decode_with_kv_cache()"
    entry = "kernels_prefill" if use_tensor_cores else "kernels_decode"
    key, dims = _fast_path(where, q, k, v, kv_layout, out, lse, return_lse)
    if dims is not None:
        return _single(where, q.unsqueeze(0), k, v, causal=False, kv_layout=kv_layout, window_left=window_left,
                       sm_scale=sm_scale, return_lse=return_lse, out=out, lse=lse, entry=entry,
                       out_shape=lambda h, d: (h, d), lse_shape=lambda h: (h,), dims=dims)
    guards.rank_expected(where, {"q": (q, 2)})
    t = guards.last_dim_contiguous(where, {"q": q, "k": k, "v": v}, copy=("q",))
    q1 = t["q"].unsqueeze(0)
    res = _single(where, q1, t["k"], t["v"], causal=False, kv_layout=kv_layout, window_left=window_left,
                  sm_scale=sm_scale, return_lse=return_lse, out=out, lse=lse, entry=entry,
                  out_shape=lambda h, d: (h, d), lse_shape=lambda h: (h,))
    if key is not None and t["q"] is q:  # a copied q (the fix) is copied again at every call
        _MEMO[where] = key
    return res
