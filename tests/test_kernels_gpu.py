"""The GPU platforms (nvidia/amd): every route on the device against the fp64 reference, and a
CUDA-graph capture that replays a later plan. Skipped where torch sees no GPU."""
from __future__ import annotations

import pytest
import torch

import kernels
from test_kernels_routes import close, close_lse, make_paged, rand, ref_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
DEV = "cuda"


def ws():
    return torch.empty(64 << 20, dtype=torch.uint8, device=DEV)


def to_dev(cache):
    return tuple(t.to(DEV) for t in cache) if isinstance(cache, tuple) else cache.to(DEV)


def batch_ref(q, pg, qo, causal=True, window=-1):
    o, l = zip(*[ref_attention(q[int(a):int(b)], pg.ks[r], pg.vs[r], causal, window)
                 for r, (a, b) in enumerate(zip(qo, qo[1:]))])
    return torch.cat(o), torch.cat(l)


def test_platform_is_gpu():
    assert kernels.build_info()["platform"] in ("nvidia", "amd")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_single_routes(dtype):
    g = torch.Generator().manual_seed(0)
    q, k, v = rand(9, 8, 128, dtype=dtype, gen=g), rand(700, 2, 128, dtype=dtype, gen=g), rand(700, 2, 128, dtype=dtype, gen=g)
    o, lse = kernels.single_prefill_with_kv_cache(q.to(DEV), k.to(DEV), v.to(DEV), causal=True, window_left=300,
                                                  return_lse=True)
    ro, rl = ref_attention(q, k, v, True, 300)
    close(o.cpu(), ro, dtype)
    close_lse(lse.cpu(), rl)
    o = kernels.single_decode_with_kv_cache(q[0].to(DEV), k.to(DEV), v.to(DEV))
    close(o.cpu(), ref_attention(q[:1], k, v)[0][0], dtype)


@pytest.mark.parametrize("layout,form,chunk", [("NHD", "tuple", None), ("HND", "tensor", 64)])
def test_paged_and_ragged_prefill(layout, form, chunk):
    kv, qo_lens = [1300, 33, 600, 1], [4, 1, 9, 1]
    pg = make_paged(kv, 16, 2, 64, layout, form=form)
    qo = torch.tensor([0] + list(torch.tensor(qo_lens).cumsum(0)), dtype=torch.int32)
    q = rand(int(qo[-1]), 8, 64, gen=torch.Generator().manual_seed(1))
    w = kernels.BatchPrefillWithPagedKVCacheWrapper(ws(), layout)
    w.plan(qo.to(DEV), pg.indptr.to(DEV), pg.indices.to(DEV), pg.last.to(DEV), 8, 2, 64, 16, causal=True,
           max_kv_chunk=chunk)
    o, lse = w.run(q.to(DEV), to_dev(pg.cache), return_lse=True)
    ro, rl = batch_ref(q, pg, qo)
    close(o.cpu(), ro, torch.float16)
    close_lse(lse.cpu(), rl)
    k, v = torch.cat(pg.ks), torch.cat(pg.vs)
    kv_indptr = torch.tensor([0] + list(torch.tensor(kv).cumsum(0)))
    r = kernels.BatchPrefillWithRaggedKVCacheWrapper(ws())
    r.plan(qo, kv_indptr, 8, 2, 64, causal=True, max_kv_chunk=chunk)
    close(r.run(q.to(DEV), k.to(DEV), v.to(DEV)).cpu(), ro, torch.float16)


@pytest.mark.parametrize("backend,tc,d,window", [("fa2", False, 128, -1), ("fa2", True, 64, 20),
                                                 ("aiter", False, 128, -1), ("ll4mi", False, 128, -1),
                                                 ("ll4mi", False, 32, -1), ("ll4mi", False, 64, 20)])
def test_batch_decode(backend, tc, d, window):
    kv = [1, 40, 1600, 17]
    pg = make_paged(kv, 16, 2, d, form="tensor")
    q = rand(4, 8, d, gen=torch.Generator().manual_seed(2))
    w = kernels.BatchDecodeWithPagedKVCacheWrapper(ws(), use_tensor_cores=tc, backend=backend)
    w.plan(pg.indptr, pg.indices, pg.last, 8, 2, d, 16, window_left=window)
    o, lse = w.run(q.to(DEV), to_dev(pg.cache), return_lse=True)
    ro, rl = batch_ref(q, pg, list(range(5)), False, window)
    close(o.cpu(), ro, torch.float16)
    close_lse(lse.cpu(), rl)
    o = w.run(q.to(DEV), to_dev(pg.cache))
    close(o.cpu(), ro, torch.float16)


def test_merge_and_mixed_batch():
    g = torch.Generator().manual_seed(3)
    va, vb = rand(5, 2, 64, gen=g), rand(5, 2, 64, gen=g)
    sa, sb = torch.randn(5, 2, generator=g), torch.randn(5, 2, generator=g)
    v, s = kernels.merge_state(va.to(DEV), sa.to(DEV), vb.to(DEV), sb.to(DEV))
    m = torch.maximum(sa, sb)
    want = (va.double() * (sa - m).exp()[..., None] + vb.double() * (sb - m).exp()[..., None]) / \
        ((sa - m).exp() + (sb - m).exp())[..., None]
    close(v.cpu(), want, torch.float16)
    kc, vc = rand(30, 16, 2, 64, gen=g), rand(30, 16, 2, 64, gen=g)
    table = torch.randperm(30, generator=g)[:25].view(5, 5).int()
    qsl = torch.tensor([0, 1, 2, 3, 8, 11], dtype=torch.int32)
    lens = torch.tensor([30, 1, 70, 40, 3], dtype=torch.int32)
    query = rand(11, 4, 64, gen=g)
    out = torch.full((11, 4, 64), float("nan"), dtype=torch.float16, device=DEV)
    kernels.decode_first_attention(query.to(DEV), kc.to(DEV), vc.to(DEV), qsl.to(DEV), lens.to(DEV), table.to(DEV),
                                   3, 3, out)
    for r in range(5):
        k = kc[table[r].long()].reshape(-1, 2, 64)[:lens[r]]
        v_ = vc[table[r].long()].reshape(-1, 2, 64)[:lens[r]]
        close(out[qsl[r]:qsl[r + 1]].cpu(), ref_attention(query[qsl[r]:qsl[r + 1]], k, v_, True)[0], torch.float16)


def test_cuda_graph_replays_a_later_plan_and_keeps_canaries():
    hq, hkv, d, batch = 4, 2, 64, 4
    bufs = dict(qo_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32, device=DEV),
                paged_kv_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32, device=DEV),
                paged_kv_indices_buf=torch.zeros(512, dtype=torch.int32, device=DEV),
                paged_kv_last_page_len_buf=torch.zeros(batch, dtype=torch.int32, device=DEV))
    w = kernels.BatchPrefillWithPagedKVCacheWrapper(ws(), use_cuda_graph=True, **bufs)
    pg_a = make_paged([400, 300, 200, 100], 16, hkv, d, seed=1, extra_pages=400)
    pg_b = make_paged([900, 33, 20, 600], 16, hkv, d, seed=2, extra_pages=100)
    P = max(pg_a.cache[0].shape[0], pg_b.cache[0].shape[0])
    kc = torch.zeros(P, 16, hkv, d, dtype=torch.float16, device=DEV)
    vc = torch.zeros_like(kc)
    q_buf = torch.zeros(16, hq, d, dtype=torch.float16, device=DEV)
    buf = torch.full((16, hq, d), 7.0, dtype=torch.float16, device=DEV)
    lse = torch.zeros(16, hq, device=DEV)
    v_other = torch.zeros(16, hq, d, dtype=torch.float16, device=DEV)
    s_other = torch.full((16, hq), -float("inf"), device=DEV)

    def load(pg, qo, q):
        n = pg.cache[0].shape[0]
        kc[:n].copy_(pg.cache[0]); vc[:n].copy_(pg.cache[1])
        q_buf[:q.shape[0]].copy_(q)
        w.plan(qo, pg.indptr, pg.indices, pg.last, hq, hkv, d, 16, causal=True)

    qo_a = torch.tensor([0, 4, 8, 12, 16])
    q_a = rand(16, hq, d, gen=torch.Generator().manual_seed(4))
    load(pg_a, qo_a, q_a)
    assert w.plan_info.split and w.plan_info.total_num_rows == 16
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        w.run(q_buf, (kc, vc), out=buf, lse=lse, partial_state=(v_other, s_other))
        with torch.cuda.graph(g, stream=s):
            w.run(q_buf, (kc, vc), out=buf, lse=lse, partial_state=(v_other, s_other))
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    torch.cuda.synchronize()
    close(buf.cpu(), batch_ref(q_a, pg_a, qo_a)[0], torch.float16)
    # Re-plan for 8 live rows (same batch); replay the same graph.
    qo_b = torch.tensor([0, 2, 4, 6, 8])
    q_b = rand(8, hq, d, gen=torch.Generator().manual_seed(5))
    buf.fill_(7.0)
    load(pg_b, qo_b, q_b)
    assert w.plan_info.total_num_rows == 16 and w.plan_info.live_rows == 8
    g.replay()
    torch.cuda.synchronize()
    close(buf[:8].cpu(), batch_ref(q_b, pg_b, qo_b)[0], torch.float16)
    assert (buf[8:] == 7.0).all()
