"""The features production attention ships, on the bundled library (host platform): logit soft
cap, attention sinks, ALiBi, fp8 KV caches, multi-token decode and custom masks, each against an
fp64 reference; and each test-only defect (kernels.testonly) caught only by its feature."""
from __future__ import annotations

import math

import pytest
import torch

import kernels
from kernels import testonly
from kernels.build import detect
from test_kernels_routes import assert_close, close, close_lse, make_paged, rand, workspace

pytestmark = pytest.mark.skipif(detect()[0] != "host", reason="host-platform library tests")

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def ref(q, k, v, causal=False, window_left=-1, sm_scale=None, cap=0.0, sinks=None, alibi=None, mask=None,
        k_scale=1.0, v_scale=1.0):
    """q [L, Hq, D], k/v [S, Hkv, D] -> o [L, Hq, Dv], lse [L, Hq] (fp64). Query i sits at key
    position i + S - L. Logit = q.k * scale, then cap * tanh(. / cap), then + slope * (j - pos),
    then the masks; the sink joins the denominator only."""
    q, k, v = q.double(), k.double() * k_scale, v.double() * v_scale
    L, hq, d = q.shape
    S, hkv = k.shape[0], k.shape[1]
    g = hq // hkv
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) * (sm_scale if sm_scale is not None else 1 / math.sqrt(d))
    if cap:
        s = cap * torch.tanh(s / cap)
    i, j = torch.arange(L)[:, None], torch.arange(S)[None]
    pos = i + S - L
    if alibi is not None:
        s = s + alibi.double()[:, None, None] * (j - pos)[None]
    keep = torch.ones(L, S, dtype=torch.bool)
    if causal:
        keep &= j <= pos
    if window_left >= 0:
        keep &= j >= pos - window_left
    if mask is not None:
        keep &= mask
    s = s.masked_fill(~keep, -math.inf)
    if sinks is not None:
        s = torch.cat([s, sinks.double()[:, None, None].expand(hq, L, 1)], -1)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)[..., :S]
    return torch.einsum("hqk,khd->qhd", p, v), lse.T.contiguous()


def gen(seed):
    return torch.Generator().manual_seed(seed)


def sinks_for(hq, seed=7):
    return torch.randn(hq, generator=gen(seed)) * 2


def slopes_for(hq):
    # A distinct slope per q head (so one indexed by kv head differs).
    return torch.tensor([2.0 ** (-(h + 1) / 2) for h in range(hq)], dtype=torch.float32)


def qkv(L, S, hq, hkv, d, dtype=torch.float16, seed=0, q_scale=1.0):
    g = gen(seed)
    q = (torch.randn(L, hq, d, generator=g) * q_scale).to(dtype)
    return q, rand(S, hkv, d, dtype=dtype, gen=g), rand(S, hkv, d, dtype=dtype, gen=g)


# ---- single prefill / decode -------------------------------------------------------------------

# (kwargs of the call, of the reference); L > S with causal leaves the first rows fully masked.
SINGLE = {
    "softcap": (dict(logits_soft_cap=3.0), dict(cap=3.0)),
    "sinks": (dict(sinks=sinks_for(4)), dict(sinks=sinks_for(4))),
    "alibi": (dict(alibi_slopes=slopes_for(4)), dict(alibi=slopes_for(4))),
    "all": (dict(logits_soft_cap=3.0, sinks=sinks_for(4), alibi_slopes=slopes_for(4)),
            dict(cap=3.0, sinks=sinks_for(4), alibi=slopes_for(4))),
}


def _single_prefill(feature, causal=True, window=-1, L=9, S=7):
    kw, rkw = SINGLE[feature]
    q, k, v = qkv(L, S, 4, 2, 32, q_scale=3.0)
    o, lse = kernels.single_prefill_with_kv_cache(q, k, v, causal=causal, window_left=window, return_lse=True, **kw)
    return (o, lse), ref(q, k, v, causal, window, **rkw)


@pytest.mark.parametrize("feature", list(SINGLE))
@pytest.mark.parametrize("causal,window", [(True, -1), (False, 3), (True, 2)])
def test_single_prefill_features(feature, causal, window):
    (o, lse), (ro, rl) = _single_prefill(feature, causal, window)
    close(o, ro, torch.float16)
    close_lse(lse, rl)


def test_fully_masked_row_with_a_sink_gives_zero_and_the_sink():
    (o, lse), (ro, rl) = _single_prefill("sinks", True, -1, L=9, S=7)
    # rows 0 and 1 sit before key 0: nothing to attend.
    assert torch.equal(o[:2].float(), torch.zeros_like(o[:2].float()))
    assert_close(lse[:2], sinks_for(4).expand(2, 4))
    close(o, ro, torch.float16)
    close_lse(lse, rl)


@pytest.mark.parametrize("feature", list(SINGLE))
@pytest.mark.parametrize("tc", [False, True], ids=["fa2", "tensor_cores"])
def test_single_decode_features(feature, tc):
    kw, rkw = SINGLE[feature]
    q, k, v = qkv(1, 23, 4, 2, 64, q_scale=3.0)
    o, lse = kernels.single_decode_with_kv_cache(q[0], k, v, return_lse=True, use_tensor_cores=tc, window_left=11,
                                                 **kw)
    ro, rl = ref(q, k, v, window_left=11, **rkw)
    close(o, ro[0], torch.float16)
    close_lse(lse, rl[0])


def _mask(L, S, seed=3, p=0.6):
    m = torch.rand(L, S, generator=gen(seed)) < p
    m[1] = False  # one row masked out whole
    return m


@pytest.mark.parametrize("window", [-1, 4])
def test_single_prefill_custom_mask(window):
    q, k, v = qkv(6, 11, 4, 2, 32)
    m = _mask(6, 11)
    o, lse = kernels.single_prefill_with_kv_cache(q, k, v, window_left=window, custom_mask=m, return_lse=True)
    ro, rl = ref(q, k, v, window_left=window, mask=m)
    close(o, ro, torch.float16)
    close_lse(lse, rl)
    assert torch.equal(o[1].float(), torch.zeros_like(o[1].float()))


def test_custom_mask_with_sinks_and_softcap():
    q, k, v = qkv(6, 11, 4, 2, 32, q_scale=3.0)
    m = _mask(6, 11)
    o, lse = kernels.single_prefill_with_kv_cache(q, k, v, custom_mask=m, sinks=sinks_for(4), logits_soft_cap=2.0,
                                                  return_lse=True)
    ro, rl = ref(q, k, v, mask=m, sinks=sinks_for(4), cap=2.0)
    close(o, ro, torch.float16)
    close_lse(lse, rl)


# ---- paged / ragged prefill --------------------------------------------------------------------

def _indptr(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


def _paged_prefill(qo=(3, 1, 5), kv=(20, 9, 40), chunk=None, window=-1, causal=True, plan_kw=None, run_kw=None,
                   rkw=None, masks=None, dtype=torch.float16, fp8=None, k_scale=1.0, v_scale=1.0, q_scale=3.0):
    hq, hkv, d, ps = 4, 2, 32, 8
    pg = make_paged(list(kv), ps, hkv, d, dtype=dtype)
    cache, ks, vs = pg.cache, pg.ks, pg.vs
    if fp8 is not None:
        kc, vc = (c.to(fp8) for c in cache)
        cache = (kc, vc)
        # the reference reads what the cache holds, dequantized
        ks, vs = [x.to(fp8).double() for x in ks], [x.to(fp8).double() for x in vs]
    qo_indptr = _indptr(qo)
    q = (torch.randn(int(qo_indptr[-1]), hq, d, generator=gen(5)) * q_scale).to(dtype)
    w = kernels.BatchPrefillWithPagedKVCacheWrapper(workspace())
    plan_kw = dict(plan_kw or {})
    if masks is not None:
        plan_kw["custom_mask"] = torch.cat([m.reshape(-1) for m in masks])
    w.plan(qo_indptr, pg.indptr, pg.indices, pg.last, hq, hkv, d, ps, causal=causal, window_left=window,
           max_kv_chunk=chunk, q_data_type=dtype, kv_data_type=fp8, **plan_kw)
    o, lse = w.run(q, cache, return_lse=True, **(run_kw or {}))
    outs = []
    for r in range(len(qo)):
        a, b = int(qo_indptr[r]), int(qo_indptr[r + 1])
        extra = dict(rkw or {})
        if masks is not None:
            extra["mask"] = masks[r]
        outs.append(ref(q[a:b], ks[r], vs[r], causal, window, k_scale=k_scale, v_scale=v_scale, **extra))
    return (o, lse), (torch.cat([x[0] for x in outs]), torch.cat([x[1] for x in outs]))


PAGED_FEATURES = {
    "softcap": dict(plan_kw=dict(logits_soft_cap=3.0), rkw=dict(cap=3.0)),
    "sinks": dict(run_kw=dict(sinks=sinks_for(4)), rkw=dict(sinks=sinks_for(4))),
    "alibi": dict(run_kw=dict(alibi_slopes=slopes_for(4)), rkw=dict(alibi=slopes_for(4))),
}


@pytest.mark.parametrize("feature", list(PAGED_FEATURES))
@pytest.mark.parametrize("chunk,window", [(None, -1), (8, -1), (8, 6)], ids=["unsplit", "split", "split_window"])
def test_paged_prefill_features(feature, chunk, window):
    (o, lse), (ro, rl) = _paged_prefill(chunk=chunk, window=window, **PAGED_FEATURES[feature])
    close(o, ro, torch.float16)
    close_lse(lse, rl)


def test_paged_prefill_sink_on_a_fully_masked_row_and_an_empty_request():
    s = sinks_for(4)
    (o, lse), (ro, rl) = _paged_prefill(qo=(6, 2), kv=(4, 0), chunk=2, run_kw=dict(sinks=s), rkw=dict(sinks=s))
    close(o, ro, torch.float16)
    close_lse(lse, rl)
    assert_close(lse[6:], s.expand(2, 4))  # the empty request: lse is the sink


@pytest.mark.parametrize("fp8", FP8, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("chunk", [None, 8], ids=["unsplit", "split"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_paged_prefill_fp8_cache(fp8, chunk, dtype):
    (o, lse), (ro, rl) = _paged_prefill(chunk=chunk, fp8=fp8, dtype=dtype, run_kw=dict(k_scale=0.5, v_scale=2.0),
                                        k_scale=0.5, v_scale=2.0, q_scale=1.0)
    close(o, ro, dtype)
    close_lse(lse, rl)


def _paged_masks(qo, kv, seed=11):
    return [torch.rand(a, b, generator=gen(seed + r)) < 0.6 for r, (a, b) in enumerate(zip(qo, kv))]


@pytest.mark.parametrize("chunk,window", [(None, -1), (8, -1), (8, 5)], ids=["unsplit", "split", "split_window"])
def test_paged_prefill_custom_mask(chunk, window):
    qo, kv = (3, 1, 5), (20, 9, 14)
    (o, lse), (ro, rl) = _paged_prefill(qo, kv, chunk=chunk, window=window, causal=False, masks=_paged_masks(qo, kv))
    close(o, ro, torch.float16)
    close_lse(lse, rl)


@pytest.mark.parametrize("feature", ["softcap", "sinks", "alibi"])
def test_ragged_prefill_features(feature):
    qo, kv, hq, hkv, d = (3, 4), (9, 6), 4, 2, 32
    qi, ki = _indptr(qo), _indptr(kv)
    g = gen(8)
    q = (torch.randn(7, hq, d, generator=g) * 3).half()
    k, v = rand(15, hkv, d, gen=g), rand(15, hkv, d, gen=g)
    w = kernels.BatchPrefillWithRaggedKVCacheWrapper(workspace())
    spec = PAGED_FEATURES[feature]
    w.plan(qi, ki, hq, hkv, d, causal=True, max_kv_chunk=4, **spec.get("plan_kw", {}))
    o, lse = w.run(q, k, v, return_lse=True, **spec.get("run_kw", {}))
    for r in range(2):
        a, b, c, e = int(qi[r]), int(qi[r + 1]), int(ki[r]), int(ki[r + 1])
        ro, rl = ref(q[a:b], k[c:e], v[c:e], True, **spec["rkw"])
        close(o[a:b], ro, torch.float16)
        close_lse(lse[a:b], rl)


# ---- batch decode ------------------------------------------------------------------------------

DECODE_BACKENDS = [("fa2", False), ("fa2", True), ("aiter", False), ("ll4mi", False)]


def _decode(backend="fa2", tc=False, kv=(20, 9, 33), q_len=1, window=-1, chunk=None, plan_kw=None, run_kw=None,
            rkw=None, fp8=None, k_scale=1.0, v_scale=1.0, q_scale=3.0, return_lse=True, d=64):
    hq, hkv, ps = 4, 2, 8
    pg = make_paged(list(kv), ps, hkv, d)
    cache, ks, vs = pg.cache, pg.ks, pg.vs
    if fp8 is not None:
        cache = tuple(c.to(fp8) for c in cache)
        ks, vs = [x.to(fp8).double() for x in ks], [x.to(fp8).double() for x in vs]
    q = (torch.randn(len(kv) * q_len, hq, d, generator=gen(6)) * q_scale).half()
    w = kernels.BatchDecodeWithPagedKVCacheWrapper(workspace(), use_tensor_cores=tc, backend=backend)
    w.plan(pg.indptr, pg.indices, pg.last, hq, hkv, d, ps, window_left=window, max_kv_chunk=chunk, kv_data_type=fp8,
           q_len_per_req=q_len, **(plan_kw or {}))
    res = w.run(q, cache, return_lse=return_lse, **(run_kw or {}))
    o, lse = res if return_lse else (res, None)
    outs = [ref(q[r * q_len:(r + 1) * q_len], ks[r], vs[r], q_len > 1, window, k_scale=k_scale, v_scale=v_scale,
                **(rkw or {})) for r in range(len(kv))]
    return (o, lse), (torch.cat([x[0] for x in outs]), torch.cat([x[1] for x in outs]))


DECODE_FEATURES = {
    "softcap": dict(plan_kw=dict(logits_soft_cap=3.0), rkw=dict(cap=3.0)),
    "sinks": dict(run_kw=dict(sinks=sinks_for(4)), rkw=dict(sinks=sinks_for(4))),
    "alibi": dict(run_kw=dict(alibi_slopes=slopes_for(4)), rkw=dict(alibi=slopes_for(4))),
}


@pytest.mark.parametrize("feature", list(DECODE_FEATURES))
@pytest.mark.parametrize("backend,tc", DECODE_BACKENDS, ids=["fa2", "tensor_cores", "aiter", "ll4mi"])
def test_batch_decode_features(feature, backend, tc):
    lse_out = backend == "fa2"
    (o, lse), (ro, rl) = _decode(backend, tc, chunk=8, return_lse=lse_out, **DECODE_FEATURES[feature])
    close(o, ro, torch.float16)
    if lse_out:
        close_lse(lse, rl)


def test_batch_decode_sink_on_an_empty_request_and_a_window():
    s = sinks_for(4)
    (o, lse), (ro, rl) = _decode(kv=(20, 0, 9), window=5, chunk=8, run_kw=dict(sinks=s), rkw=dict(sinks=s))
    close(o, ro, torch.float16)
    close_lse(lse, rl)
    assert_close(lse[1], s)


@pytest.mark.parametrize("fp8", FP8, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("backend,tc", DECODE_BACKENDS, ids=["fa2", "tensor_cores", "aiter", "ll4mi"])
def test_batch_decode_fp8_cache(fp8, backend, tc):
    lse_out = backend == "fa2"
    (o, lse), (ro, rl) = _decode(backend, tc, chunk=8, fp8=fp8, run_kw=dict(k_scale=0.5, v_scale=torch.tensor(2.0)),
                                 k_scale=0.5, v_scale=2.0, q_scale=1.0, return_lse=lse_out)
    close(o, ro, torch.float16)
    if lse_out:
        close_lse(lse, rl)


@pytest.mark.parametrize("backend,tc", DECODE_BACKENDS, ids=["fa2", "tensor_cores", "aiter", "ll4mi"])
@pytest.mark.parametrize("window,chunk", [(-1, None), (-1, 8), (4, 8)], ids=["unsplit", "split", "split_window"])
def test_multi_token_decode(backend, tc, window, chunk):
    lse_out = backend == "fa2"
    (o, lse), (ro, rl) = _decode(backend, tc, kv=(20, 3, 33), q_len=4, window=window, chunk=chunk,
                                 return_lse=lse_out)
    close(o, ro, torch.float16)
    if lse_out:
        close_lse(lse, rl)


def test_multi_token_decode_with_every_feature():
    s, a = sinks_for(4), slopes_for(4)
    (o, lse), (ro, rl) = _decode(q_len=3, chunk=8, plan_kw=dict(logits_soft_cap=3.0),
                                 run_kw=dict(sinks=s, alibi_slopes=a), rkw=dict(cap=3.0, sinks=s, alibi=a))
    close(o, ro, torch.float16)
    close_lse(lse, rl)


def test_multi_token_decode_skips_the_ll4mi_kernel():
    w = kernels.BatchDecodeWithPagedKVCacheWrapper(workspace(), backend="ll4mi")
    pg = make_paged([9], 8, 2, 64)
    w.plan(pg.indptr, pg.indices, pg.last, 4, 2, 64, 8, q_len_per_req=2)
    assert w._route == "fa2"
    w.plan(pg.indptr, pg.indices, pg.last, 4, 2, 64, 8)
    assert w._route == "ll4mi"


# ---- refusals ----------------------------------------------------------------------------------

def _refused(call, *words):
    with pytest.raises(ValueError) as e:
        call()
    for w in words:
        assert w in str(e.value), str(e.value)


def test_feature_refusals_name_the_field():
    q, k, v = qkv(3, 5, 4, 2, 16)
    single = kernels.single_prefill_with_kv_cache
    _refused(lambda: single(q, k, v, sinks=torch.zeros(2)), "sinks has shape (2,)", "num_qo_heads is 4")
    _refused(lambda: single(q, k, v, alibi_slopes=torch.zeros(2)), "alibi_slopes has shape (2,)",
             "num_qo_heads is 4", "per q head")
    _refused(lambda: single(q, k, v, sinks=torch.zeros(4, dtype=torch.float16)), "sinks dtype is float16")
    _refused(lambda: single(q, k, v, logits_soft_cap=-1.0), "logits_soft_cap is -1.0")
    _refused(lambda: single(q, k, v, custom_mask=torch.ones(3, 4, dtype=torch.bool)),
             "custom_mask has shape (3, 4)", "(3, 5)")
    _refused(lambda: single(q, k, v, custom_mask=torch.ones(3, 5)), "custom_mask dtype is float32")
    _refused(lambda: single(q, k, v, causal=True, custom_mask=torch.ones(3, 5, dtype=torch.bool)),
             "causal is True", "custom_mask")
    _refused(lambda: single(q, k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)), "k dtype is float8_e4m3fn",
             "paged prefill and batch decode")
    _refused(lambda: kernels.single_decode_with_kv_cache(q[0], k, v, alibi_slopes=torch.zeros(2)),
             "alibi_slopes has shape (2,)")


def test_batch_feature_refusals_name_the_field():
    pg = make_paged([9, 5], 8, 2, 64)
    w = kernels.BatchDecodeWithPagedKVCacheWrapper(workspace())
    _refused(lambda: w.plan(pg.indptr, pg.indices, pg.last, 4, 2, 64, 8, q_len_per_req=0), "q_len_per_req is 0")
    w.plan(pg.indptr, pg.indices, pg.last, 4, 2, 64, 8, q_len_per_req=2)
    q = rand(5, 4, 64)
    _refused(lambda: w.run(q, pg.cache), "q has 5 rows", "q_len_per_req 2")
    q = rand(4, 4, 64)
    _refused(lambda: w.run(q, pg.cache, k_scale=torch.ones(2)), "k_scale has shape (2,)", "per-tensor")
    _refused(lambda: w.run(q, pg.cache, v_scale="x"), "v_scale is 'x'")
    _refused(lambda: w.run(q, pg.cache, sinks=torch.zeros(2)), "sinks has shape (2,)")
    w.run(q, pg.cache, k_scale=torch.tensor([1.0]), v_scale=1.0)
    p = kernels.BatchPrefillWithPagedKVCacheWrapper(workspace())
    qo = torch.tensor([0, 2, 3], dtype=torch.int32)
    _refused(lambda: p.plan(qo, pg.indptr, pg.indices, pg.last, 4, 2, 64, 8,
                            custom_mask=torch.ones(2 * 9 + 5 - 1, dtype=torch.bool)),
             "custom_mask has shape (22,)", "23 elements")
    _refused(lambda: p.plan(qo, pg.indptr, pg.indices, pg.last, 4, 2, 64, 8, causal=True,
                            custom_mask=torch.ones(23, dtype=torch.bool)), "causal is True")
    r = kernels.BatchPrefillWithRaggedKVCacheWrapper(workspace())
    r.plan(qo, torch.tensor([0, 4, 9], dtype=torch.int32), 4, 2, 64)
    k8 = rand(9, 2, 64).to(torch.float8_e5m2)
    _refused(lambda: r.run(rand(3, 4, 64), k8, k8), "k dtype is float8_e5m2")


# ---- the test-only defects -----------------------------------------------------------------------

def _mt_decode(**kw):
    return _decode(q_len=3, chunk=8, **kw)


# fault -> (the feature's check, the same route without the feature); each returns ((o, lse), (ro, rl)).
DEFECTS = {
    "softcap_after_mask": (lambda: _single_prefill("softcap", True, 2),
                           lambda: _paged_prefill(window=3)),
    "sink_in_numerator": (lambda: _paged_prefill(chunk=8, **PAGED_FEATURES["sinks"]),
                          lambda: _paged_prefill(chunk=8)),
    "alibi_kv_head": (lambda: _decode(chunk=8, **DECODE_FEATURES["alibi"]),
                      lambda: _decode(chunk=8)),
    "fp8_scale_twice": (lambda: _decode(fp8=torch.float8_e4m3fn, run_kw=dict(k_scale=0.5, v_scale=2.0),
                                        k_scale=0.5, v_scale=2.0, q_scale=1.0),
                        lambda: _decode(run_kw=dict(k_scale=0.5, v_scale=2.0), k_scale=0.5, v_scale=2.0)),
    "decode_rows_at_last_position": (lambda: _mt_decode(), lambda: _decode(chunk=8)),
    "custom_mask_transposed": (lambda: _paged_prefill((3, 4), (7, 6), causal=False, masks=_paged_masks((3, 4), (7, 6))),
                               lambda: _paged_prefill((3, 4), (7, 6), causal=True)),
}


def _matches(result) -> bool:
    (o, lse), (ro, rl) = result
    try:
        close(o, ro, torch.float16)
        close_lse(lse, rl)
    except AssertionError:
        return False
    return True


def test_every_feature_defect_is_in_the_test_only_library(monkeypatch):
    monkeypatch.setenv("KERNELS_TESTONLY", "1")
    assert set(testonly.KERNEL_FAULTS) | set(DEFECTS) | set(testonly.REACH_FAULTS) == \
        set(testonly.kernel_faults())
    assert set(testonly.FEATURE_FAULTS) == set(DEFECTS)


@pytest.mark.parametrize("fault", list(DEFECTS))
def test_defect_breaks_only_its_feature(fault, monkeypatch):
    feature, plain = DEFECTS[fault]
    assert _matches(feature()) and _matches(plain())  # the shipped library
    monkeypatch.setenv("KERNELS_TESTONLY", "1")
    with testonly.fault_library(fault):
        assert not _matches(feature()), f"{fault} not caught by its feature's test"
        assert _matches(plain()), f"{fault} changed an input without the feature"
    assert _matches(feature())
