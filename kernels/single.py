"""fa2 single-request prefill and decode (no plan)."""
from __future__ import annotations

import torch

from . import guards
from ._launch import LAYOUTS, check_device, dense_kv_dims, launch, params


def _single(where, q, k, v, *, causal, kv_layout, window_left, sm_scale, return_lse, out, lse,
            entry, out_shape, lse_shape):
    guards.layout_known(where, "kv_layout", kv_layout, LAYOUTS)
    check_device(where, {"q": q, "k": k, "v": v, "out": out, "lse": lse})
    guards.rank_expected(where, {"k": (k, 3), "v": (v, 3)})
    kd, vd = dense_kv_dims(k, kv_layout), dense_kv_dims(v, kv_layout)
    hq, dqk, dvo = q.shape[1], q.shape[2], vd["dim"]
    guards.kv_shapes_agree(where, {"head_dim_qk": (dqk, kd["dim"]), "kv_len": (kd["len"], vd["len"]),
                                   "num_kv_heads": (kd["heads"], vd["heads"])})
    guards.gqa_divisible(where, hq, kd["heads"])
    guards.head_dim_supported(where, dqk, dvo)
    if out is None:
        out = torch.empty(out_shape(hq, dvo), dtype=q.dtype, device=q.device)
    if lse is None and return_lse:
        lse = torch.empty(lse_shape(hq), dtype=torch.float32, device=q.device)
    guards.out_contiguous(where, {"out": out, "lse": lse}, {"out": out_shape(hq, dvo), "lse": lse_shape(hq)})
    p = params(q=q, k=k, v=v, kd=kd, vd=vd, o=out, lse=lse, num_qo_heads=hq, num_kv_heads=kd["heads"],
               head_dim_qk=dqk, head_dim_vo=dvo, causal=causal, window_left=window_left, sm_scale=sm_scale,
               q_dtype=q.dtype, kv_dtype=k.dtype, o_dtype=out.dtype,
               num_work=1, qo_len=q.shape[0], kv_len=kd["len"])
    launch(entry, p, q)
    return (out, lse) if return_lse else out


def single_prefill_with_kv_cache(q, k, v, causal=False, kv_layout="NHD", window_left=-1, sm_scale=None,
                                 return_lse=False, out=None, lse=None):
    """q [qo_len, Hq, Dqk]; k [kv_len, Hkv, Dqk], v [kv_len, Hkv, Dvo] (NHD) or head-major (HND)."""
    where = "single_prefill_with_kv_cache()"
    guards.rank_expected(where, {"q": (q, 3)})
    t = guards.last_dim_contiguous(where, {"q": q, "k": k, "v": v})
    rows = q.shape[0]
    return _single(where, t["q"], t["k"], t["v"], causal=causal, kv_layout=kv_layout, window_left=window_left,
                   sm_scale=sm_scale, return_lse=return_lse, out=out, lse=lse, entry="kernels_prefill",
                   out_shape=lambda h, d: (rows, h, d), lse_shape=lambda h: (rows, h))


def single_decode_with_kv_cache(q, k, v, kv_layout="NHD", window_left=-1, sm_scale=None, return_lse=False,
                                use_tensor_cores=False, out=None, lse=None):
    """q [Hq, Dqk], one token; it is copied when its last dim is strided (a few KB)."""
    where = "single_decode_with_kv_cache()"
    guards.rank_expected(where, {"q": (q, 2)})
    t = guards.last_dim_contiguous(where, {"q": q, "k": k, "v": v}, copy=("q",))
    q1 = t["q"].unsqueeze(0)
    res = _single(where, q1, t["k"], t["v"], causal=False, kv_layout=kv_layout, window_left=window_left,
                  sm_scale=sm_scale, return_lse=return_lse, out=out, lse=lse,
                  entry="kernels_prefill" if use_tensor_cores else "kernels_decode",
                  out_shape=lambda h, d: (h, d), lse_shape=lambda h: (h,))
    return res
