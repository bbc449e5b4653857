"""Turning tensors into AttnParams: strides by layout, dtype codes, device pointers."""
from __future__ import annotations

import math

import torch

from . import _lib, guards
from ._lib import AttnParams, DTYPE_CODES, FP8_CODES

LAYOUTS = ("NHD", "HND")


def dense_kv_dims(t: torch.Tensor, layout: str) -> dict:
    """k/v [n, H, D] (NHD) or [H, n, D] (HND): length, heads, head_dim and strides."""
    return dense_dims(t.shape, t.stride(), layout)


def dense_dims(shape, stride, layout: str) -> dict:
    """dense_kv_dims from a tensor's shape and stride(), each read once by the caller."""
    if layout == "NHD":
        n, h = 0, 1
    else:
        n, h = 1, 0
    return dict(len=shape[n], heads=shape[h], dim=shape[-1],
                stride_page=0, stride_n=stride[n], stride_h=stride[h])


def paged_kv_dims(t: torch.Tensor, layout: str) -> dict:
    """A page tensor [P, ps, H, D] (NHD) or [P, H, ps, D] (HND)."""
    return paged_dims(t.shape, t.stride(), layout)


def paged_dims(shape, stride, layout: str) -> dict:
    """paged_kv_dims from a tensor's shape and stride(), each read once by the caller."""
    n, h = (1, 2) if layout == "NHD" else (2, 1)
    return dict(pages=shape[0], page_size=shape[n], heads=shape[h], dim=shape[-1],
                stride_page=stride[0], stride_n=stride[n], stride_h=stride[h])


def unpack_paged(cache, where: str):
    """(k, v) from a tuple or one [P, 2, ...] tensor."""
    if isinstance(cache, (tuple, list)):
        # Reachable by a paged_kv_cache tuple of other than two tensors; no ci case yet.
        if len(cache) != 2:
            raise ValueError(f"{where}: paged_kv_cache tuple has {len(cache)} tensors; expected (k, v)")
        return cache[0], cache[1]
    guards.rank_expected(where, {"paged_kv_cache": (cache, 5)})
    return cache[:, 0], cache[:, 1]


def default_scale(sm_scale, head_dim_qk: int) -> float:
    return float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(head_dim_qk)


def check_device(where: str, tensors: dict, fp8_ok=()) -> None:
    """fp8_ok: the names of the tensors that may be fp8 (the k/v caches of the routes that take them)."""
    guards.device_matches(where, _lib.platform(), tensors)
    given = {k: v for k, v in tensors.items() if v is not None}
    guards.fp8_kv_route(where, given, fp8_ok)
    guards.dtype_supported(where, {k: v for k, v in given.items() if v.dtype not in FP8_CODES})


def code(dtype: torch.dtype) -> int:
    # A dtype the guards let through but the ABI cannot name: the C shim refuses code -1.
    return DTYPE_CODES.get(dtype, FP8_CODES.get(dtype, -1))


def run_features(where: str, num_qo_heads: int, sinks=None, alibi_slopes=None, k_scale=None,
                 v_scale=None) -> dict:
    """AttnParams fields of run()'s per-call features, checked (nothing to check when none given)."""
    f = {}
    if sinks is not None or alibi_slopes is not None:
        vecs = {"sinks": sinks, "alibi_slopes": alibi_slopes}
        guards.per_head_vector(where, _lib.platform(), vecs, num_qo_heads)
        f.update({k: _lib.ptr(v) for k, v in vecs.items() if v is not None})
    if k_scale is not None or v_scale is not None:
        f["k_scale"] = guards.kv_scale_scalar(where, "k_scale", k_scale)
        f["v_scale"] = guards.kv_scale_scalar(where, "v_scale", v_scale)
    return f


def params(*, q, k, v, kd: dict, vd: dict, o, lse, num_qo_heads, num_kv_heads, head_dim_qk,
           head_dim_vo, causal, window_left, sm_scale, q_dtype, kv_dtype, o_dtype,
           page_size=0, q_stride=None, **rest) -> AttnParams:
    """q_stride: q.stride() where the caller has read it already."""
    p = AttnParams()
    if q_stride is None:
        q_stride = q.stride()
    p.q, p.q_stride_n, p.q_stride_h = q.data_ptr(), q_stride[0], q_stride[1]
    p.k, p.k_stride_page, p.k_stride_n, p.k_stride_h = k.data_ptr(), kd["stride_page"], kd["stride_n"], kd["stride_h"]
    p.v, p.v_stride_page, p.v_stride_n, p.v_stride_h = v.data_ptr(), vd["stride_page"], vd["stride_n"], vd["stride_h"]
    p.o, p.lse = o.data_ptr(), _lib.ptr(lse)
    p.num_qo_heads, p.num_kv_heads = num_qo_heads, num_kv_heads
    p.head_dim_qk, p.head_dim_vo = head_dim_qk, head_dim_vo
    p.page_size, p.causal, p.window_left = page_size, int(causal), window_left
    p.sm_scale = default_scale(sm_scale, head_dim_qk)
    p.k_scale = p.v_scale = 1.0
    p.q_dtype, p.kv_dtype, p.o_dtype = code(q_dtype), code(kv_dtype), code(o_dtype)
    for name, value in rest.items():
        setattr(p, name, value)
    return p


def launch(entry: str, p: AttnParams, like: torch.Tensor) -> None:
    _lib.call(entry, p, _lib.stream_of(like))


