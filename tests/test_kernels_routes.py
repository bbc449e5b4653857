"""Every route of the bundled library against a tiny fp64 reference (host platform)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

import kernels
from kernels.build import detect

# CPU tensors on the host platform; tests/test_kernels_gpu.py covers the GPU platforms.
pytestmark = pytest.mark.skipif(detect()[0] != "host", reason="host-platform library tests")

TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def ref_attention(q, k, v, causal=False, window_left=-1, sm_scale=None):
    """q [L, Hq, D], k/v [S, Hkv, D] -> o [L, Hq, Dv] fp64, lse [L, Hq]; bottom-right causal;
    a fully masked row gives o = 0, lse = -inf."""
    q, k, v = q.double(), k.double(), v.double()
    L, hq, d = q.shape
    S, hkv = k.shape[0], k.shape[1]
    g = hq // hkv
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) * (sm_scale if sm_scale is not None else 1 / math.sqrt(d))
    i, j = torch.arange(L)[:, None], torch.arange(S)[None]
    keep = torch.ones(L, S, dtype=torch.bool)
    if causal:
        keep &= j <= i + S - L
    if window_left >= 0:
        keep &= j >= i + S - L - window_left
    s = s.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, v), lse.T.contiguous()


# torch.testing.assert_close's default (rtol, atol) per dtype.
DEFAULT_TOL = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5),
               torch.float32: (1.3e-6, 1e-5), torch.float64: (1e-7, 1e-7)}


def assert_close(got, want, rtol=None, atol=None):
    """torch.testing.assert_close's check of the CPU tensors compared here: the same shape,
    dtype and device, and |got - want| <= atol + rtol * |want| at every element (a NaN is
    never close; equal infinities are). Its first call imports torch.distributed.tensor
    and sympy, ~0.9 CPU-s in every process that calls it; torch.isclose is the same test."""
    assert (got.shape, got.dtype, got.device) == (want.shape, want.dtype, want.device), \
        ((got.shape, got.dtype, got.device), (want.shape, want.dtype, want.device))
    if rtol is None:
        rtol, atol = DEFAULT_TOL[want.dtype]
    ok = torch.isclose(got, want, rtol=rtol, atol=atol)
    if not bool(ok.all()):
        bad = (~ok).nonzero()
        first = tuple(bad[0].tolist())
        diff = (got.double() - want.double()).abs()[~ok].nan_to_num(float("inf"))
        raise AssertionError(f"tensors not close: {len(bad)} of {ok.numel()} elements differ, "
                             f"the first at {first} (got {got[first].item()}, want "
                             f"{want[first].item()}); greatest |diff| {diff.max().item()} "
                             f"(rtol {rtol}, atol {atol})")


def close(got, want, dtype):
    tol = TOL[dtype]
    assert_close(got.double(), want, rtol=tol, atol=tol)


def close_lse(got, want):
    fin = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), fin)
    assert_close(got.double()[fin], want[fin], rtol=1e-4, atol=1e-4)


def rand(*shape, dtype=torch.float16, gen=None):
    return torch.randn(*shape, generator=gen).to(dtype)


@dataclass(frozen=True)
class Paged:
    cache: object
    indptr: torch.Tensor
    indices: torch.Tensor
    last: torch.Tensor
    ks: list
    vs: list


def make_paged(kv_lens, page_size, hkv, d, layout="NHD", dtype=torch.float16, form="tuple", seed=0, extra_pages=3,
               dv=None):
    """A paged cache holding each request's k/v, pages in shuffled order."""
    gen = torch.Generator().manual_seed(seed)
    dv = dv or d
    ks = [rand(n, hkv, d, dtype=dtype, gen=gen) for n in kv_lens]
    vs = [rand(n, hkv, dv, dtype=dtype, gen=gen) for n in kv_lens]
    npages = [max(1, -(-n // page_size)) if n > 0 else 0 for n in kv_lens]
    total = sum(npages) + extra_pages
    perm = torch.randperm(total, generator=gen)
    shape = (total, page_size, hkv) if layout == "NHD" else (total, hkv, page_size)
    kc = torch.full(shape + (d,), float("nan"), dtype=dtype)
    vc = torch.full(shape + (dv,), float("nan"), dtype=dtype)
    indices, indptr, last, at = [], [0], [], 0
    for n, k, v, np_ in zip(kv_lens, ks, vs, npages):
        for p in range(np_):
            page = int(perm[at]); at += 1
            indices.append(page)
            sl = slice(p * page_size, min(n, (p + 1) * page_size))
            m = sl.stop - sl.start
            if layout == "NHD":
                kc[page, :m], vc[page, :m] = k[sl], v[sl]
            else:
                kc[page, :, :m], vc[page, :, :m] = k[sl].transpose(0, 1), v[sl].transpose(0, 1)
        indptr.append(len(indices))
        last.append(n - (np_ - 1) * page_size if np_ else 0)
    cache = (kc, vc) if form == "tuple" else torch.stack([kc, vc], 1)
    return Paged(cache, torch.tensor(indptr, dtype=torch.int32), torch.tensor(indices, dtype=torch.int32),
                 torch.tensor(last, dtype=torch.int32), ks, vs)


def workspace(mb=8):
    return torch.empty(mb << 20, dtype=torch.uint8)


# ---- single ----------------------------------------------------------------------------------

SINGLE = [
    dict(dtype=torch.float16, L=7, S=13, hq=8, hkv=2, d=64, causal=True),
    dict(dtype=torch.bfloat16, L=1, S=33, hq=4, hkv=4, d=128, causal=False, window=5),
    dict(dtype=torch.float32, L=17, S=17, hq=7, hkv=1, d=32, causal=True, window=3),
    dict(dtype=torch.float16, L=9, S=5, hq=4, hkv=2, d=256, causal=True),  # rows fully masked
    dict(dtype=torch.float16, L=5, S=11, hq=2, hkv=1, d=64, dv=32, causal=False, layout="HND"),
]


@pytest.mark.parametrize("c", SINGLE, ids=lambda c: "-".join(f"{k}{v}".replace("torch.", "") for k, v in c.items()))
def test_single_prefill_matches_reference(c):
    gen = torch.Generator().manual_seed(1)
    dt, layout = c["dtype"], c.get("layout", "NHD")
    q = rand(c["L"], c["hq"], c["d"], dtype=dt, gen=gen)
    k = rand(c["S"], c["hkv"], c["d"], dtype=dt, gen=gen)
    v = rand(c["S"], c["hkv"], c.get("dv", c["d"]), dtype=dt, gen=gen)
    kk, vv = (k, v) if layout == "NHD" else (k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous())
    o, lse = kernels.single_prefill_with_kv_cache(q, kk, vv, causal=c["causal"], kv_layout=layout,
                                                  window_left=c.get("window", -1), return_lse=True)
    ro, rl = ref_attention(q, k, v, c["causal"], c.get("window", -1))
    close(o, ro, dt)
    close_lse(lse, rl)


@pytest.mark.parametrize("tiles_given", [None, 65], ids=["as_planned", "fewer_than_the_rows"])
def test_prefill_row_tiles_cover_every_row(monkeypatch, tiles_given):
    # 300 query rows are 5 row tiles of 64. Given fewer (a graph captured for shorter
    # requests), the tiles' threads stride over the rest: every row is still written.
    import kernels.single as single
    if tiles_given is not None:
        real = single.launch

        def fewer(entry, p, like):
            p.max_qo_len = tiles_given
            real(entry, p, like)
        monkeypatch.setattr(single, "launch", fewer)
    gen = torch.Generator().manual_seed(3)
    q, k, v = rand(300, 4, 32, gen=gen), rand(310, 2, 32, gen=gen), rand(310, 2, 32, gen=gen)
    o, lse = kernels.single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True)
    ro, rl = ref_attention(q, k, v, True)
    close(o, ro, torch.float16)
    close_lse(lse, rl)


@pytest.mark.parametrize("tc", [False, True], ids=["fa2", "tensor_cores"])
def test_single_decode_copies_strided_q(tc):
    gen = torch.Generator().manual_seed(2)
    big = rand(8, 128, gen=gen)
    q = big[:, ::2]  # stride(-1) == 2: copied, not refused
    k, v = rand(40, 2, 64, gen=gen), rand(40, 2, 64, gen=gen)
    o, lse = kernels.single_decode_with_kv_cache(q, k, v, return_lse=True, use_tensor_cores=tc, window_left=9)
    ro, rl = ref_attention(q[None], k, v, window_left=9)
    close(o, ro[0], torch.float16)
    close_lse(lse, rl[0])


def test_head_sliced_q_matches():
    gen = torch.Generator().manual_seed(3)
    big = rand(6, 12, 64, gen=gen)
    q = big[:, 2:10]  # rows strided, last dim packed
    k, v = rand(9, 4, 64, gen=gen), rand(9, 4, 64, gen=gen)
    o = kernels.single_prefill_with_kv_cache(q, k, v, causal=True)
    close(o, ref_attention(q, k, v, True)[0], torch.float16)


# ---- paged and ragged prefill ----------------------------------------------------------------

PAGED = [
    dict(page_size=16, layout="NHD", form="tuple", qo=[3, 1, 7], kv=[20, 9, 40]),
    dict(page_size=1, layout="HND", form="tensor", qo=[2, 5], kv=[7, 5]),
    dict(page_size=16, layout="HND", form="tuple", qo=[4, 1, 2], kv=[1300, 33, 600], chunk=256),
    dict(page_size=16, layout="NHD", form="tensor", qo=[6, 2], kv=[700, 17], window=40),
    dict(page_size=4, layout="NHD", form="tuple", qo=[3, 0, 2], kv=[9, 4, 0]),
]


def _paged_id(c):
    return f"p{c['page_size']}-{c['layout']}-{c['form']}-kv{max(c['kv'])}" + (f"-w{c['window']}" if "window" in c else "")


@pytest.mark.parametrize("c", PAGED, ids=_paged_id)
def test_paged_prefill_matches_reference(c):
    hq, hkv, d = 4, 2, 64
    pg = make_paged(c["kv"], c["page_size"], hkv, d, c["layout"], form=c["form"])
    qo_indptr = torch.tensor([0] + list(torch.tensor(c["qo"]).cumsum(0)), dtype=torch.int32)
    q = rand(int(qo_indptr[-1]), hq, d, gen=torch.Generator().manual_seed(5))
    w = kernels.BatchPrefillWithPagedKVCacheWrapper(workspace(), c["layout"])
    w.plan(qo_indptr, pg.indptr, pg.indices, pg.last, hq, hkv, d, c["page_size"], causal=True,
           window_left=c.get("window", -1), max_kv_chunk=c.get("chunk"))
    o, lse = w.run(q, pg.cache, return_lse=True)
    for r in range(len(c["qo"])):
        a, b = int(qo_indptr[r]), int(qo_indptr[r + 1])
        if b == a:
            continue
        ro, rl = ref_attention(q[a:b], pg.ks[r], pg.vs[r], True, c.get("window", -1))
        close(o[a:b], ro, torch.float16)
        close_lse(lse[a:b], rl)


def test_split_kv_matches_unsplit():
    hq, hkv, d = 4, 4, 64
    pg = make_paged([900, 1500], 16, hkv, d)
    qo_indptr = torch.tensor([0, 3, 5], dtype=torch.int32)
    q = rand(5, hq, d, gen=torch.Generator().manual_seed(6))
    outs = []
    for chunk in (100, 1 << 20):
        w = kernels.BatchPrefillWithPagedKVCacheWrapper(workspace())
        w.plan(qo_indptr, pg.indptr, pg.indices, pg.last, hq, hkv, d, 16, causal=True, max_kv_chunk=chunk)
        outs.append(w.run(q, pg.cache, return_lse=True))
        assert w._plan_sched["split"] == (chunk == 100)
    assert_close(outs[0][0].float(), outs[1][0].float(), rtol=2e-3, atol=2e-3)
    assert_close(outs[0][1], outs[1][1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_ragged_prefill_matches_reference(layout):
    gen = torch.Generator().manual_seed(7)
    qo, kv, hq, hkv, d, dv = [3, 1, 4], [5, 700, 4], 6, 2, 64, 32
    qo_indptr = torch.tensor([0, 3, 4, 8], dtype=torch.int64)
    kv_indptr = torch.tensor([0, 5, 705, 709], dtype=torch.int32)
    q = rand(8, hq, d, dtype=torch.bfloat16, gen=gen)
    k, v = rand(709, hkv, d, dtype=torch.bfloat16, gen=gen), rand(709, hkv, dv, dtype=torch.bfloat16, gen=gen)
    kk, vv = (k, v) if layout == "NHD" else (k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous())
    w = kernels.BatchPrefillWithRaggedKVCacheWrapper(workspace(), layout)
    w.plan(qo_indptr, kv_indptr, hq, hkv, d, head_dim_vo=dv, causal=True, q_data_type=torch.bfloat16)
    o, lse = w.run(q, kk, vv, return_lse=True)
    for r in range(3):
        a, b, c0, c1 = int(qo_indptr[r]), int(qo_indptr[r + 1]), int(kv_indptr[r]), int(kv_indptr[r + 1])
        ro, rl = ref_attention(q[a:b], k[c0:c1], v[c0:c1], True)
        close(o[a:b], ro, torch.bfloat16)
        close_lse(lse[a:b], rl)


def test_page_ids_past_65535():
    page_size, hkv, d, pages = 1, 1, 32, 65_600
    kc = torch.zeros(pages, page_size, hkv, d, dtype=torch.float16)
    vc = torch.zeros_like(kc)
    gen = torch.Generator().manual_seed(8)
    ids = torch.tensor([65_599, 3, 65_540, 70, 65_536], dtype=torch.int32)
    k, v = rand(5, hkv, d, gen=gen), rand(5, hkv, d, gen=gen)
    kc[ids.long(), 0], vc[ids.long(), 0] = k, v
    q = rand(2, 2, d, gen=gen)
    w = kernels.BatchPrefillWithPagedKVCacheWrapper(workspace(1))
    w.plan(torch.tensor([0, 2]), torch.tensor([0, 5]), ids, torch.tensor([1]), 2, 1, d, 1, causal=True)
    close(w.run(q, (kc, vc)), ref_attention(q, k, v, True)[0], torch.float16)


# ---- batch decode ----------------------------------------------------------------------------

DECODE = [
    ("fa2", False, 64, -1), ("fa2", True, 128, 30), ("aiter", False, 64, -1),
    ("ll4mi", False, 64, -1), ("ll4mi", False, 128, -1), ("ll4mi", False, 32, -1), ("ll4mi", False, 48, -1),
    ("ll4mi", False, 128, 20),
]


@pytest.mark.parametrize("backend,tc,d,window", DECODE,
                         ids=[f"{b}{'_tc' if tc else ''}-d{d}" + (f"-w{w}" if w >= 0 else "") for b, tc, d, w in DECODE])
@pytest.mark.parametrize("return_lse", [False, True], ids=["o", "lse"])
def test_batch_decode_matches_reference(backend, tc, d, window, return_lse):
    kv, hq, hkv = [1, 40, 600, 17], 8, 2
    pg = make_paged(kv, 16, hkv, d, "NHD", form="tensor")
    q = rand(len(kv), hq, d, gen=torch.Generator().manual_seed(9))
    w = kernels.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD", use_tensor_cores=tc, backend=backend)
    w.plan(pg.indptr, pg.indices, pg.last, hq, hkv, d, 16, window_left=window, max_kv_chunk=128)
    res = w.run(q, pg.cache, return_lse=return_lse)
    o, lse = res if return_lse else (res, None)
    for r in range(len(kv)):
        ro, rl = ref_attention(q[r:r + 1], pg.ks[r], pg.vs[r], window_left=window)
        close(o[r:r + 1], ro, torch.float16)
        if return_lse:
            close_lse(lse[r:r + 1], rl)


# ---- merge and mixed batch -------------------------------------------------------------------

def test_merge_state_handles_minus_inf():
    gen = torch.Generator().manual_seed(10)
    va, vb = rand(4, 2, 16, dtype=torch.float32, gen=gen), rand(4, 2, 16, dtype=torch.float32, gen=gen)
    sa, sb = torch.randn(4, 2, generator=gen), torch.randn(4, 2, generator=gen)
    sa[0, 0] = sb[0, 0] = -math.inf
    sa[1, 1] = -math.inf
    v, s = kernels.merge_state(va, sa, vb, sb)
    m = torch.maximum(sa, sb)
    wa, wb = (sa - m).exp().nan_to_num(0), (sb - m).exp().nan_to_num(0)
    want = (va * wa[..., None] + vb * wb[..., None]) / (wa + wb)[..., None]
    want[0, 0] = 0
    assert_close(v, want, rtol=1e-5, atol=1e-5)
    assert s[0, 0] == -math.inf and torch.allclose(s[1, 1], sb[1, 1])
    kernels.merge_state_in_place(va, sa, vb, sb)
    assert_close(va, v)


def test_decode_first_mixed_batch():
    gen = torch.Generator().manual_seed(11)
    hq, hkv, d, bs = 4, 2, 64, 16
    qlens, kvlens = [1, 1, 1, 5, 3], [30, 1, 70, 40, 3]
    nblocks = 30
    kc, vc = rand(nblocks, bs, hkv, d, gen=gen), rand(nblocks, bs, hkv, d, gen=gen)
    table = torch.randperm(nblocks, generator=gen)[:25].view(5, 5).int()
    qsl = torch.tensor([0] + list(torch.tensor(qlens).cumsum(0)), dtype=torch.int32)
    query = rand(int(qsl[-1]), hq, d, gen=gen)
    out = torch.full_like(query, float("nan"))
    kernels.decode_first_attention(query, kc, vc, qsl, torch.tensor(kvlens, dtype=torch.int32), table, 3, 3, out)
    for r in range(5):
        pages = table[r].long()
        k = kc[pages].reshape(-1, hkv, d)[:kvlens[r]]
        v = vc[pages].reshape(-1, hkv, d)[:kvlens[r]]
        a, b = int(qsl[r]), int(qsl[r + 1])
        close(out[a:b], ref_attention(query[a:b], k, v, True)[0], torch.float16)
