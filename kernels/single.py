"""fa2 single-request prefill and decode (no plan)."""
from __future__ import annotations

import torch

from . import guards
from . import _lib
from ._launch import LAYOUTS, check_device, dense_dims, dense_kv_dims, launch, params, run_features

_T = torch.Tensor
# where -> the key of the last call whose checks all passed: the guard switch, kv_layout,
# return_lse, and every tensor's shape, stride (contiguity for out and lse), dtype and device,
# which is everything the checks read (none reads a tensor's values). A call with an equal key
# skips them (the batch wrappers' run() does the same: prefill._BatchRun._prepare_paged).
_MEMO: dict = {}


def _fast_path(where, q, k, v, kv_layout, out, lse, return_lse):
    """(key, fast) of a single-request call. fast is (kd, vd, q.dtype, k.dtype, q.shape,
    q.stride()) when its checks can be skipped: every guard is off, or the memo holds this very
    key; else None. key is what to remember once the checks pass (None: not memoized: every
    guard off, or an argument that is not a plain tensor or layout name, checked at every call).

    What the launch reads of q, k and v (shapes, strides, q's and k's dtypes) is read once, here,
    guards on or off, and serves the key too: the key adds only the devices, v's dtype, out's and
    lse's shape, contiguity, dtype and device, one tuple and its comparison. A device is keyed as
    `t.is_cpu or t.device`: True for a CPU tensor (whose device is exactly cpu), else the device
    itself, so two keys are equal exactly when the devices are, at a bool's price on the host."""
    # Reachable by a q, k or v that is not a plain tensor (subclass, None); no ci case yet.
    if not (_T is type(q) is type(k) is type(v)):
        return None, None
    qs, qst, qt, ks, kst, kt, vs, vst = q.shape, q.stride(), q.dtype, k.shape, k.stride(), k.dtype, v.shape, v.stride()
    sw = guards.switch()
    # sw is None only with every guard off (KERNELS_DISABLE_GUARDS=all); ci disables none.
    if sw is None:  # every guard off: nothing to check, nothing to remember
        key = None
    else:
        # Reachable by a non-str kv_layout (e.g. None); no ci case yet.
        if type(kv_layout) is not str:
            return None, None
        # out and lse as prefill.out_sig reads them (shape, contiguity, dtype, device), flat.
        if out is None:
            key = None
        # Reachable by an out that is a tensor subclass; no ci case yet.
        elif type(out) is _T:
            # The `or device` arms (here and below) need a non-CPU tensor; ci runs the host library on the CPU.
            key = (out.shape, out.is_contiguous(), out.dtype, out.is_cpu or out.device)
        else:
            return None, None
        if lse is not None:
            # Reachable by an lse that is a tensor subclass; no ci case yet.
            if type(lse) is not _T:
                return None, None
            key = (key, lse.shape, lse.is_contiguous(), lse.dtype, lse.is_cpu or lse.device)
        key = (sw, kv_layout, not return_lse, qs, qst, qt, q.is_cpu or q.device, ks, kst, kt, k.is_cpu or k.device,
               vs, vst, v.dtype, v.is_cpu or v.device, key)
        if key != _MEMO.get(where):
            return key, None
    return key, (dense_dims(ks, kst, kv_layout), dense_dims(vs, vst, kv_layout), qt, kt, qs, qst)


def soft_cap(where, logits_soft_cap) -> float:
    c = guards.logits_soft_cap_valid(where, logits_soft_cap)
    # c is None only with logits_soft_cap_valid disabled (KERNELS_DISABLE_GUARDS); ci disables none.
    return float(logits_soft_cap or 0.0) if c is None else c


def _feature_fields(where, hq, qo_len, kv_len, causal, f: dict) -> dict:
    """AttnParams fields of a single call's features (f: the caller's feature arguments)."""
    fields = run_features(where, hq, f.get("sinks"), f.get("alibi_slopes"))
    if f.get("logits_soft_cap"):
        fields["logits_soft_cap"] = soft_cap(where, f["logits_soft_cap"])
    mask = f.get("custom_mask")
    if mask is not None:
        guards.custom_mask_replaces_causal(where, causal, mask)
        guards.custom_mask_shape(where, mask, (qo_len, kv_len))
        guards.device_matches(where, _lib.platform(), {"custom_mask": mask})
        fields["custom_mask"] = mask.data_ptr()
    return fields


def _single(where, q, k, v, *, causal, kv_layout, window_left, sm_scale, return_lse, out, lse,
            entry, out_shape, lse_shape, fast=None, own_q=True, features=None):
    """fast None: every check, in order; fast given (_fast_path's): the caller's memo says they
    passed, and it holds what the launch reads of q, k and v (of q only when own_q: q is the
    tensor _fast_path saw, not a view of it)."""
    check = fast is None
    if check:
        guards.layout_known(where, "kv_layout", kv_layout, LAYOUTS)
        check_device(where, {"q": q, "k": k, "v": v, "out": out, "lse": lse})
        guards.rank_expected(where, {"k": (k, 3), "v": (v, 3)})
        kd, vd = dense_kv_dims(k, kv_layout), dense_kv_dims(v, kv_layout)
        qs, qst, qt, kt = q.shape, None, q.dtype, k.dtype
    else:
        kd, vd, qt, kt, qs, qst = fast
        # own_q is False only on single_decode's memo hit: reachable by a repeated identical decode call; no ci case yet.
        if not own_q:
            qs, qst = q.shape, None
    hq, dqk, dvo = qs[1], qs[2], vd["dim"]
    if check:
        guards.kv_shapes_agree(where, {"head_dim_qk": (dqk, kd["dim"]), "kv_len": (kd["len"], vd["len"]),
                                       "num_kv_heads": (kd["heads"], vd["heads"])})
        guards.gqa_divisible(where, hq, kd["heads"])
        guards.head_dim_supported(where, dqk, dvo)
    if out is None:
        out = torch.empty(out_shape(hq, dvo), dtype=qt, device=q.device)
    if lse is None and return_lse:
        lse = torch.empty(lse_shape(hq), dtype=torch.float32, device=q.device)
    if check:
        guards.out_contiguous(where, {"out": out, "lse": lse}, {"out": out_shape(hq, dvo), "lse": lse_shape(hq)})
    feat = _feature_fields(where, hq, qs[0], kd["len"], causal, features) if features else {}
    p = params(q=q, k=k, v=v, kd=kd, vd=vd, o=out, lse=lse, num_qo_heads=hq, num_kv_heads=kd["heads"],
               head_dim_qk=dqk, head_dim_vo=dvo, causal=causal, window_left=window_left, sm_scale=sm_scale,
               q_dtype=qt, kv_dtype=kt, o_dtype=out.dtype,
               num_work=1, qo_len=qs[0], kv_len=kd["len"], q_stride=qst, max_qo_len=qs[0], **feat)
    launch(entry, p, q)
    return (out, lse) if return_lse else out


def _given(**f):
    """The feature arguments given (a call with none keeps the memoized fast path)."""
    # Only a feature argument passed as False (e.g. sinks=False) takes the filtered arm; no ci case does.
    return {k: v for k, v in f.items() if v is not None and v is not False and not (k == "logits_soft_cap" and v == 0)}


def single_prefill_with_kv_cache(q, k, v, causal=False, kv_layout="NHD", window_left=-1, sm_scale=None,
                                 return_lse=False, out=None, lse=None, logits_soft_cap=0.0, sinks=None,
                                 alibi_slopes=None, custom_mask=None):
    """q [qo_len, Hq, Dqk]; k [kv_len, Hkv, Dqk], v [kv_len, Hkv, Dvo] (NHD) or head-major (HND).
    Features (kernels/README.md): logits_soft_cap, sinks [Hq], alibi_slopes [Hq], custom_mask
    [qo_len, kv_len] bool (replaces causal)."""
    where = "single_prefill_with_kv_cache()"
    features = _given(logits_soft_cap=logits_soft_cap, sinks=sinks, alibi_slopes=alibi_slopes,
                      custom_mask=custom_mask)
    key, fast = _fast_path(where, q, k, v, kv_layout, out, lse, return_lse) if not features else (None, None)
    if fast is not None:
        rows = fast[4][0]
        return _single(where, q, k, v, causal=causal, kv_layout=kv_layout, window_left=window_left,
                       sm_scale=sm_scale, return_lse=return_lse, out=out, lse=lse, entry="kernels_prefill",
                       out_shape=lambda h, d: (rows, h, d), lse_shape=lambda h: (rows, h), fast=fast)
    guards.rank_expected(where, {"q": (q, 3)})
    t = guards.last_dim_contiguous(where, {"q": q, "k": k, "v": v})
    rows = q.shape[0]
    res = _single(where, t["q"], t["k"], t["v"], causal=causal, kv_layout=kv_layout, window_left=window_left,
                  sm_scale=sm_scale, return_lse=return_lse, out=out, lse=lse, entry="kernels_prefill",
                  out_shape=lambda h, d: (rows, h, d), lse_shape=lambda h: (rows, h), features=features)
    if key is not None:
        _MEMO[where] = key
    return res


def single_decode_with_kv_cache(q, k, v, kv_layout="NHD", window_left=-1, sm_scale=None, return_lse=False,
                                use_tensor_cores=False, out=None, lse=None, logits_soft_cap=0.0, sinks=None,
                                alibi_slopes=None):
    """q [Hq, Dqk], one token; it is copied when its last dim is strided (a few KB).
    Features: logits_soft_cap, sinks [Hq], alibi_slopes [Hq] (the query sits at kv_len - 1)."""
    where = "single_decode_with_kv_cache()"
    # Reachable by single_decode_with_kv_cache(use_tensor_cores=True); no ci case yet.
    entry = "kernels_prefill" if use_tensor_cores else "kernels_decode"
    features = _given(logits_soft_cap=logits_soft_cap, sinks=sinks, alibi_slopes=alibi_slopes)
    key, fast = _fast_path(where, q, k, v, kv_layout, out, lse, return_lse) if not features else (None, None)
    # The decode memo hit: reachable by a repeated identical decode call; no ci case yet.
    if fast is not None:  # q [Hq, D] is read as [1, Hq, D]: its own stride() is not q1's
        return _single(where, q.unsqueeze(0), k, v, causal=False, kv_layout=kv_layout, window_left=window_left,
                       sm_scale=sm_scale, return_lse=return_lse, out=out, lse=lse, entry=entry,
                       out_shape=lambda h, d: (h, d), lse_shape=lambda h: (h,), fast=fast,
                       own_q=False)
    guards.rank_expected(where, {"q": (q, 2)})
    t = guards.last_dim_contiguous(where, {"q": q, "k": k, "v": v}, copy=("q",))
    q1 = t["q"].unsqueeze(0)
    res = _single(where, q1, t["k"], t["v"], causal=False, kv_layout=kv_layout, window_left=window_left,
                  sm_scale=sm_scale, return_lse=return_lse, out=out, lse=lse, entry=entry,
                  out_shape=lambda h, d: (h, d), lse_shape=lambda h: (h,), features=features)
    if key is not None and t["q"] is q:  # a copied q (the fix) is copied again at every call
        _MEMO[where] = key
    return res
