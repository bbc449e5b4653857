"""Each guard refuses (or fixes) with the field named; with it disabled, the documented
consequence comes from the kernels themselves (wrong answer, unwritten output, overwritten
canary, or a dead process, which runs in a child forked from this one)."""
from __future__ import annotations

import math
import os
import signal
import sys

import pytest
import torch

import kernels
from kernels.build import detect

# CPU tensors on the host platform; tests/test_kernels_gpu.py covers the GPU platforms.
pytestmark = pytest.mark.skipif(detect()[0] != "host", reason="host-platform library tests")
from kernels import guards
from test_kernels_routes import close, make_paged, rand, ref_attention, workspace

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def max_diff(got, want) -> float:
    d = (got.double() - want).abs()
    return math.inf if d.isnan().any() else d.max().item()


def paged_setup(hq=4, hkv=2, d=64, kv=(20, 9), qo=(3, 2), page_size=16, dtype=torch.float16, **plan):
    pg = make_paged(list(kv), page_size, hkv, d, dtype=dtype)
    qo_indptr = torch.tensor([0] + list(torch.tensor(qo).cumsum(0)), dtype=torch.int32)
    q = rand(int(qo_indptr[-1]), hq, d, dtype=dtype, gen=gen(1))
    w = kernels.BatchPrefillWithPagedKVCacheWrapper(workspace(1))
    w.plan(qo_indptr, pg.indptr, pg.indices, pg.last, hq, hkv, d, page_size, causal=True, q_data_type=dtype, **plan)
    return w, q, pg, qo_indptr


def paged_ref(q, pg, qo_indptr):
    outs = [ref_attention(q[int(a):int(b)], pg.ks[r], pg.vs[r], True)[0]
            for r, (a, b) in enumerate(zip(qo_indptr, qo_indptr[1:]))]
    return torch.cat(outs)


def single_inputs(hq, hkv, d=64, L=5, S=9, dtype=torch.float16):
    g = gen(2)
    return rand(L, hq, d, dtype=dtype, gen=g), rand(S, hkv, d, dtype=dtype, gen=g), rand(S, hkv, d, dtype=dtype, gen=g)


# ---- refusals: (guard, call, words the ValueError names) -------------------------------------

def _strided_q():
    q, k, v = single_inputs(4, 2)
    kernels.single_prefill_with_kv_cache(torch.cat([q, q], -1)[..., ::2], k, v)


def _strided_cache():
    w, q, pg, _ = paged_setup()
    kc, vc = pg.cache
    w.run(q, (torch.cat([kc, kc], -1)[..., ::2], vc))


def _strided_out():
    w, q, pg, _ = paged_setup()
    w.run(q, pg.cache, out=torch.empty(q.shape[0], 4, 128, dtype=q.dtype)[..., ::2])


def _partial_state_strided():
    w, q, pg, _ = paged_setup()
    v = torch.empty(q.shape[0], 4, 128, dtype=q.dtype)[..., ::2]
    w.run(q, pg.cache, return_lse=True, partial_state=(v, torch.zeros(q.shape[0], 4)))


def _mismatch(**run_change):
    def call():
        w, q, pg, _ = paged_setup()
        kc, vc = pg.cache
        if "heads" in run_change:
            q = q[:, :2]
        if "dim" in run_change:
            q = q[..., :32].contiguous()
        if "dtype" in run_change:
            q = q.to(torch.bfloat16)
        if "rows" in run_change:
            q = q[:2]
        if "rank" in run_change:
            q = q[None]
        if "page_size" in run_change:
            kc, vc = kc[:, :8], vc[:, :8]
        w.run(q, (kc, vc))
    return call


def _ragged_kv_rows():
    w = kernels.BatchPrefillWithRaggedKVCacheWrapper(workspace(1))
    w.plan(torch.tensor([0, 2]), torch.tensor([0, 10]), 2, 2, 32)
    q, k, v = single_inputs(2, 2, d=32, L=2, S=6)
    w.run(q, k, v)


def _decode_kv_heads():
    pg = make_paged([10, 3], 16, 2, 64)
    w = kernels.BatchDecodeWithPagedKVCacheWrapper(workspace(1))
    w.plan(pg.indptr, pg.indices, pg.last, 4, 2, 64, 16)
    kc, vc = pg.cache
    w.run(rand(2, 4, 64), (kc[:, :, :1], vc[:, :, :1]))


def _gqa_single(hq, hkv):
    return lambda: kernels.single_prefill_with_kv_cache(*single_inputs(hq, hkv))


def _gqa_plan(hq, hkv):
    def call():
        pg = make_paged([10], 16, 2, 64)
        kernels.BatchDecodeWithPagedKVCacheWrapper(workspace(1)).plan(pg.indptr, pg.indices, pg.last, hq, hkv, 64, 16)
    return call


def _graph_wrapper():
    bufs = dict(qo_indptr_buf=torch.zeros(5, dtype=torch.int32), paged_kv_indptr_buf=torch.zeros(5, dtype=torch.int32),
                paged_kv_indices_buf=torch.zeros(64, dtype=torch.int32),
                paged_kv_last_page_len_buf=torch.zeros(4, dtype=torch.int32))
    return kernels.BatchPrefillWithPagedKVCacheWrapper(workspace(4), use_cuda_graph=True, **bufs)


def _graph_replan(qo, kv):
    def call():
        w = _graph_wrapper()
        pg = make_paged([40, 30, 20, 10], 16, 2, 64)
        w.plan(torch.tensor([0, 4, 8, 12, 16]), pg.indptr, pg.indices, pg.last, 4, 2, 64, 16, causal=True)
        pg = make_paged(kv, 16, 2, 64)
        w.plan(torch.tensor([0] + list(torch.tensor(qo).cumsum(0))), pg.indptr, pg.indices, pg.last, 4, 2, 64, 16)
    return call


def _partial_state_without_lse():
    w, q, pg, _ = paged_setup(max_kv_chunk=8)
    w.run(q, pg.cache, partial_state=(torch.zeros(q.shape[0], 4, 64, dtype=q.dtype), torch.zeros(q.shape[0], 4)))


def _half_planned():
    w, q, pg, qo = paged_setup()
    big = make_paged([4000], 16, 2, 64)
    with pytest.raises(ValueError, match="float_workspace_buffer"):
        w.plan(torch.tensor([0, 64]), big.indptr, big.indices, big.last, 4, 2, 64, 16, max_kv_chunk=16)
    w.run(q, pg.cache)


REFUSALS = [
    ("last_dim_contiguous", "strided_q", _strided_q, ["q", "stride(-1)"]),
    ("last_dim_contiguous", "strided_cache", _strided_cache, ["k_cache"]),
    ("out_contiguous", "strided_out", _strided_out, ["out", "contiguous"]),
    ("out_contiguous", "strided_partial_state", _partial_state_strided, ["partial_state_v"]),
    ("run_matches_plan", "num_qo_heads", _mismatch(heads=1), ["num_qo_heads is 4 in plan() but q has 2"]),
    ("run_matches_plan", "head_dim_qk", _mismatch(dim=1), ["head_dim_qk is 64", "q has 32"]),
    ("run_matches_plan", "dtype", _mismatch(dtype=1), ["dtype is float16", "bfloat16"]),
    ("run_matches_plan", "rows", _mismatch(rows=1), ["rows is at least 5", "q has 2"]),
    ("run_matches_plan", "rank", _mismatch(rank=1), ["rank is 3", "q has 4"]),
    ("run_matches_plan", "page_size", _mismatch(page_size=1), ["page_size is 16", "has 8"]),
    ("run_matches_plan", "ragged_kv_rows", _ragged_kv_rows, ["kv_rows is at least 10", "k has 6"]),
    ("run_matches_plan", "decode_num_kv_heads", _decode_kv_heads, ["num_kv_heads is 2", "has 1"]),
    ("gqa_divisible", "12_over_8", _gqa_single(12, 8), ["num_qo_heads", "num_kv_heads"]),
    ("gqa_divisible", "4_over_8", _gqa_single(4, 8), ["num_kv_heads"]),
    ("gqa_divisible", "0_kv_heads", _gqa_single(4, 0), ["num_kv_heads is 0"]),
    ("gqa_divisible", "plan_12_over_8", _gqa_plan(12, 8), ["num_qo_heads"]),
    ("graph_capacity", "batch_size", _graph_replan([4, 4, 4], [10, 10, 10]), ["batch_size is 4", "has 3"]),
    ("graph_capacity", "total_num_rows", _graph_replan([8, 8, 4, 4], [10, 10, 10, 10]), ["total_num_rows", "24"]),
    ("max_kv_chunk_positive", "zero", lambda: paged_setup(max_kv_chunk=0), ["max_kv_chunk is 0"]),
    ("max_kv_chunk_positive", "negative", lambda: paged_setup(max_kv_chunk=-8), ["max_kv_chunk is -8"]),
    ("partial_state_needs_lse", "split_without_lse", _partial_state_without_lse, ["lse", "partial_state"]),
    ("half_planned_refuses", "after_failed_plan", _half_planned, ["plan()", "again"]),
    ("head_dim_supported", "d512", lambda: kernels.single_prefill_with_kv_cache(*single_inputs(2, 2, d=512)),
     ["head_dim_qk is 512"]),
    ("dtype_supported", "int8_q", lambda: kernels.single_prefill_with_kv_cache(
        torch.zeros(2, 2, 8, dtype=torch.int8), *single_inputs(2, 2, d=8)[1:]), ["q dtype"]),
    ("device_matches", "meta_q", lambda: kernels.single_prefill_with_kv_cache(
        torch.empty(2, 2, 8, device="meta", dtype=torch.float16), *single_inputs(2, 2, d=8)[1:]), ["q is on meta"]),
    ("kv_shapes_agree", "kv_len", lambda: kernels.single_prefill_with_kv_cache(
        *single_inputs(2, 2)[:2], rand(3, 2, 64)), ["kv_len"]),
    ("rank_expected", "q_2d", lambda: kernels.single_prefill_with_kv_cache(rand(2, 64), *single_inputs(2, 2)[1:]),
     ["q must have rank 3"]),
    ("layout_known", "kv_layout", lambda: kernels.BatchPrefillWithPagedKVCacheWrapper(workspace(1), "NDH"),
     ["kv_layout"]),
    ("batch_consistent", "last_page_len", lambda: kernels.BatchDecodeWithPagedKVCacheWrapper(workspace(1)).plan(
        torch.tensor([0, 1, 2]), torch.tensor([0, 1]), torch.tensor([3]), 2, 2, 64, 16), ["paged_kv_last_page_len"]),
    ("state_contiguous", "strided_v", lambda: kernels.merge_state(
        torch.zeros(2, 2, 16)[..., ::2], torch.zeros(2, 2), torch.zeros(2, 2, 8), torch.zeros(2, 2)), ["v_a"]),
    ("fp8_kv_route", "single_fp8", lambda: kernels.single_prefill_with_kv_cache(
        single_inputs(2, 2)[0], *(t.to(torch.float8_e4m3fn) for t in single_inputs(2, 2)[1:])),
     ["k dtype is float8_e4m3fn"]),
    ("logits_soft_cap_valid", "negative", lambda: kernels.single_prefill_with_kv_cache(
        *single_inputs(2, 2), logits_soft_cap=-2.0), ["logits_soft_cap is -2.0"]),
    ("per_head_vector", "slopes_per_kv_head", lambda: kernels.single_decode_with_kv_cache(
        single_inputs(4, 2, L=1)[0][0], *single_inputs(4, 2)[1:], alibi_slopes=torch.ones(2)),
     ["alibi_slopes has shape (2,)", "num_qo_heads is 4"]),
    ("kv_scale_scalar", "k_scale_2", lambda: paged_setup()[0].run(paged_setup()[1], paged_setup()[2].cache,
                                                                   k_scale=torch.ones(2)), ["k_scale has shape (2,)"]),
    ("custom_mask_shape", "wrong_size", lambda: kernels.single_prefill_with_kv_cache(
        *single_inputs(2, 2), custom_mask=torch.ones(5, 8, dtype=torch.bool)), ["custom_mask has shape (5, 8)"]),
    ("custom_mask_replaces_causal", "both", lambda: kernels.single_prefill_with_kv_cache(
        *single_inputs(2, 2), causal=True, custom_mask=torch.ones(5, 9, dtype=torch.bool)), ["causal is True"]),
    ("multi_token_decode_rows", "plan_zero", lambda: kernels.BatchDecodeWithPagedKVCacheWrapper(workspace(1)).plan(
        torch.tensor([0, 1]), torch.tensor([0]), torch.tensor([3]), 2, 2, 64, 16, q_len_per_req=0),
     ["q_len_per_req is 0"]),
]


@pytest.mark.parametrize("name,call,words", [(g, c, w) for g, _, c, w in REFUSALS],
                         ids=[f"{g}/{v}" for g, v, _, _ in REFUSALS])
def test_guard_refuses_naming_the_field(name, call, words):
    assert name in guards.NAMES
    with pytest.raises(ValueError) as e:
        call()
    for word in words:
        assert word in str(e.value), str(e.value)


def test_every_guard_is_documented_and_exercised():
    assert all(guards.NAMES.values())
    covered = {g for g, *_ in REFUSALS} | {"plan_validates_first", "plan_copies_indptr", "merge_live_rows",
                                           "ll4mi_route_selector", "decode_cu_seqlens_slice"}
    assert covered == set(guards.NAMES)


# ---- fixes with the guard on, and what the library did before them ---------------------------

@pytest.fixture
def off(monkeypatch):
    def disable(*names):
        monkeypatch.setenv("KERNELS_DISABLE_GUARDS", ",".join(names))
    return disable


def test_rejected_plan_leaves_previous_plan_usable(off):
    w, q, pg, qo = paged_setup()
    want = paged_ref(q, pg, qo)
    with pytest.raises(ValueError, match="num_qo_heads"):
        w.plan(qo, pg.indptr, pg.indices, pg.last, 12, 8, 64, 16, causal=True)
    close(w.run(q, pg.cache), want, torch.float16)
    off("plan_validates_first")
    with pytest.raises(ValueError, match="num_qo_heads"):
        w.plan(qo, pg.indptr, pg.indices, pg.last, 12, 8, 64, 16, causal=True)
    with pytest.raises(ValueError, match="plan\\(\\) again"):
        w.run(q, pg.cache)


def test_half_planned_off_runs_a_mixed_plan(off):
    w, q, pg, qo = paged_setup()
    want = paged_ref(q, pg, qo)
    big = make_paged([3000, 9], 16, 2, 64)
    with pytest.raises(ValueError, match="float_workspace_buffer"):
        w.plan(qo, big.indptr, big.indices, big.last, 4, 2, 64, 16, causal=True, max_kv_chunk=1)
    off("half_planned_refuses")
    assert max_diff(w.run(q, pg.cache), want) > 0.1  # new page table, old schedule


def test_strided_q_read_packed_when_off(off):
    q, k, v = single_inputs(4, 2)
    qs = torch.stack([q, torch.full_like(q, float("nan"))], -1).flatten(-2)[..., ::2]
    close(kernels.single_prefill_with_kv_cache(qs.contiguous(), k, v), ref_attention(q, k, v)[0], torch.float16)
    off("last_dim_contiguous")
    assert max_diff(kernels.single_prefill_with_kv_cache(qs, k, v), ref_attention(q, k, v)[0]) > 0.5


def test_strided_out_written_packed_when_off(off):
    w, q, pg, qo = paged_setup()
    off("out_contiguous")
    out = torch.zeros(q.shape[0], 4, 128, dtype=q.dtype)[..., ::2]
    w.run(q, pg.cache, out=out)
    assert max_diff(out, paged_ref(q, pg, qo)) > 0.1


def test_run_dtype_mismatch_computes_wrong_when_off(off):
    w, q, pg, qo = paged_setup()
    off("run_matches_plan")
    assert max_diff(w.run(q.to(torch.bfloat16), pg.cache).to(torch.float16), paged_ref(q, pg, qo)) > 0.1


def test_gqa_12_over_8_reads_wrong_heads_when_off(off):
    q, k, v = single_inputs(12, 8)
    off("gqa_divisible")
    o = kernels.single_prefill_with_kv_cache(q, k, v)
    want = torch.cat([ref_attention(q[:, h:h + 1], k[:, h * 8 // 12:h * 8 // 12 + 1],
                                    v[:, h * 8 // 12:h * 8 // 12 + 1])[0] for h in range(12)], 1)
    assert max_diff(o, want) > 0.1


def _restaged_decode():
    """seed 002: requests of 128/256/512/1024 tokens restaged as 64/32/16/8 pages of 16."""
    pg = make_paged([128, 256, 512, 1024], 16, 2, 64)
    indptr = pg.indptr.clone()  # the caller's CPU buffer
    w = kernels.BatchDecodeWithPagedKVCacheWrapper(workspace(), backend="aiter")
    w.plan(indptr, pg.indices, pg.last, 4, 2, 64, 16)
    q = rand(4, 4, 64, gen=gen(3))
    indptr.copy_(torch.tensor([0, 64, 96, 112, 120]))
    o, _ = w.run(q, pg.cache, return_lse=True)
    want = torch.cat([ref_attention(q[r:r + 1], pg.ks[r], pg.vs[r])[0] for r in range(4)])
    return max_diff(o, want)


def test_aiter_shadow_plan_keeps_its_own_indptr(off):
    assert _restaged_decode() < 2e-3
    off("plan_copies_indptr")
    assert _restaged_decode() > 0.05


def _graph_merge(canary=7.0):
    """seed 002: graph-mode paged prefill planned for 16 rows, re-planned for 8, with partial_state."""
    w = _graph_wrapper()
    pg16 = make_paged([40, 30, 20, 10], 16, 2, 64, seed=1)
    w.plan(torch.tensor([0, 4, 8, 12, 16]), pg16.indptr, pg16.indices, pg16.last, 4, 2, 64, 16, causal=True)
    pg = make_paged([50, 33, 20, 600], 16, 2, 64, seed=2)
    qo = torch.tensor([0, 2, 4, 6, 8])
    w.plan(qo, pg.indptr, pg.indices, pg.last, 4, 2, 64, 16, causal=True)
    g = gen(4)
    q = rand(8, 4, 64, gen=g)
    buf = torch.full((16, 4, 64), canary, dtype=torch.float16)
    lse_buf = torch.zeros(16, 4)
    v_other = torch.zeros(16, 4, 64, dtype=torch.float16)
    v_other[:8] = rand(8, 4, 64, gen=g)
    s_other = torch.zeros(16, 4)
    s_other[:8] = torch.randn(8, 4, generator=g)
    out = w.run(q, pg.cache, out=buf[:8], lse=lse_buf[:8], partial_state=(v_other[:8], s_other[:8]))
    ro, rl = paged_ref(q, pg, qo), torch.cat([ref_attention(q[2 * r:2 * r + 2], pg.ks[r], pg.vs[r], True)[1]
                                              for r in range(4)])
    m = torch.maximum(rl, s_other[:8].double())
    wa, wb = (rl - m).exp(), (s_other[:8].double() - m).exp()
    want = (ro * wa[..., None] + v_other[:8].double() * wb[..., None]) / (wa + wb)[..., None]
    return max_diff(out, want), bool((buf[8:] == canary).all())


def test_graph_merge_stops_at_live_rows(off):
    diff, canary_intact = _graph_merge()
    assert diff < 2e-3 and canary_intact
    off("merge_live_rows")
    diff, canary_intact = _graph_merge()
    assert not canary_intact  # rows 8-15 of the buffer behind an 8-row out were overwritten


def _ll4mi(head, window, out_fill=float("nan")):
    pg = make_paged([30, 70], 16, 1, head)
    q = rand(2, 2, head, gen=gen(5))
    w = kernels.BatchDecodeWithPagedKVCacheWrapper(workspace(1), backend="ll4mi")
    w.plan(pg.indptr, pg.indices, pg.last, 2, 1, head, 16, window_left=window)
    out = w.run(q, pg.cache, out=torch.full((2, 2, head), out_fill, dtype=torch.float16))
    want = torch.cat([ref_attention(q[r:r + 1], pg.ks[r], pg.vs[r], window_left=window)[0] for r in range(2)])
    return out, max_diff(out, want)


@pytest.mark.parametrize("head,window", [(32, -1), (48, -1), (64, 10), (128, 5)])
def test_ll4mi_selector_falls_back(off, head, window):
    assert _ll4mi(head, window)[1] < 2e-3
    off("ll4mi_route_selector")
    out, diff = _ll4mi(head, window)
    assert diff > 0.01
    if head < 64:
        assert out.isnan().all()  # VHELOOP == 0: the value loop never ran


def _mixed(num_decodes=2):
    g = gen(6)
    kc, vc = rand(12, 16, 2, 64, gen=g), rand(12, 16, 2, 64, gen=g)
    table = torch.randperm(12, generator=g)[:12].view(3, 4).int()
    qsl = torch.tensor([0, 1, 2, 6], dtype=torch.int32)
    lens = torch.tensor([20, 33, 10], dtype=torch.int32)
    query = rand(6, 4, 64, gen=g)
    out = torch.full_like(query, float("nan"))
    kernels.decode_first_attention(query, kc, vc, qsl, lens, table, num_decodes, 2, out)
    want = []
    for r in range(3):
        k = kc[table[r].long()].reshape(-1, 2, 64)[:lens[r]]
        v = vc[table[r].long()].reshape(-1, 2, 64)[:lens[r]]
        want.append(ref_attention(query[qsl[r]:qsl[r + 1]], k, v, True)[0])
    return max_diff(out, torch.cat(want))


def test_mixed_batch_decode_slice(off):
    assert _mixed() < 2e-3
    off("decode_cu_seqlens_slice")
    assert _mixed() == math.inf  # the last decode request is never computed


# ---- guards whose absence kills the process --------------------------------------------------

def run_isolated(call, disable: str) -> tuple[int, str]:
    """call() with `disable` off, in a child forked from this process: (its exit status,
    negative for the signal that ended it, and the tail of its stderr). The death is the
    subject, not the interpreter: a fork is a process of its own that dies alone, without
    the 2-3 CPU-seconds a fresh interpreter pays for `import torch` and the kernels. The
    guard switch is read at call time (kernels/guards.py), so the child sets it itself."""
    import faulthandler
    import tempfile
    with tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns
            code = 1
            try:
                os.dup2(err.fileno(), 2)
                os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
                faulthandler.disable()          # pytest's handler: the default death is the subject
                torch.set_num_threads(1)        # a forked child has no OpenMP pool threads
                signal.alarm(120)               # a hung child dies of SIGALRM: a failure, not a hang
                os.environ["KERNELS_DISABLE_GUARDS"] = disable
                call()
                code = 0
            except BaseException as e:  # noqa: BLE001 - said on stderr, exit 1
                os.write(2, f"{type(e).__name__}: {e}".encode())
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        err.seek(0)
        tail = err.read().decode(errors="replace")[-2000:]
    return (-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)), tail


CRASHES = [
    ("gqa_divisible", "4_over_8",
     lambda: kernels.single_prefill_with_kv_cache(*single_inputs(4, 8)), -signal.SIGFPE),
    ("gqa_divisible", "0_kv_heads",
     lambda: kernels.single_prefill_with_kv_cache(*single_inputs(4, 0)), -signal.SIGFPE),
    ("partial_state_needs_lse", "split_without_lse", _partial_state_without_lse, -signal.SIGSEGV),
]


@pytest.mark.parametrize("name,call,rc", [(g, c, r) for g, _, c, r in CRASHES], ids=[f"{g}/{v}" for g, v, _, _ in CRASHES])
def test_guard_off_kills_the_process(name, call, rc):
    """The guard-on refusal of each is in test_guard_refuses_naming_the_field."""
    got, stderr = run_isolated(call, name)
    assert got == rc, stderr


# ---- the run() memo: a call that matches the last checked one skips the checks -----------------
# Every refusal below comes after a call that armed the memo (its repeat made no guard call), and
# must read exactly as it does on a wrapper (or a memo) that never saw a call. Each bad call
# differs from the checked one in one thing a key could leave out: strides with the same
# storage, shape and data_ptr; heads or rows of a view with the same data_ptr; the plan; the
# guard switch; lse; device; dtype; the same tensor object changed in place.

@pytest.fixture
def guard_calls(monkeypatch):
    """The names of the guards called from here on, in order (every guard recorded, none changed)."""
    seen = []
    for attr, fn in list(vars(guards).items()):
        if hasattr(fn, "guard_name"):
            def rec(*args, _fn=fn, **kwargs):
                seen.append(_fn.guard_name)
                return _fn(*args, **kwargs)
            monkeypatch.setattr(guards, attr, rec)
    return seen


def refusal(call) -> str:
    with pytest.raises(ValueError) as e:
        call()
    return str(e.value)


def memoized(call, guard_calls, still_called=()):
    """call() twice: the first checks in full, the repeat (an equal key) calls no check."""
    call()
    assert {"half_planned_refuses", "run_matches_plan"} & set(guard_calls) or \
        {"rank_expected", "kv_shapes_agree"} <= set(guard_calls), guard_calls
    del guard_calls[:]
    call()
    assert set(guard_calls) <= set(still_called), guard_calls
    del guard_calls[:]


def test_memo_rechecks_a_strided_view_of_the_same_storage(guard_calls):
    w, q, pg, _ = paged_setup()
    base = torch.zeros(q.shape[0], 4, 128, dtype=q.dtype)
    packed, strided = base[..., :64], base[..., ::2]
    packed.copy_(q)
    assert (packed.data_ptr(), packed.shape, packed.dtype) == (strided.data_ptr(), strided.shape, strided.dtype)
    memoized(lambda: w.run(packed, pg.cache), guard_calls)
    msg = refusal(lambda: w.run(strided, pg.cache))
    assert msg == refusal(lambda: paged_setup()[0].run(strided, pg.cache))
    assert "q has stride(-1) == 2" in msg


def test_memo_rechecks_q_with_fewer_heads(guard_calls):
    w, q, pg, _ = paged_setup()
    memoized(lambda: w.run(q, pg.cache), guard_calls)
    fewer = q[:, :2]  # the same data_ptr, dtype and device
    msg = refusal(lambda: w.run(fewer, pg.cache))
    assert msg == refusal(lambda: paged_setup()[0].run(fewer, pg.cache))
    assert "num_qo_heads is 4 in plan() but q has 2" in msg


def test_memo_rechecks_an_out_with_fewer_rows(guard_calls):
    w, q, pg, _ = paged_setup()
    out = torch.empty(q.shape[0], 4, 64, dtype=q.dtype)
    memoized(lambda: w.run(q, pg.cache, out=out), guard_calls)
    msg = refusal(lambda: w.run(q, pg.cache, out=out[:2]))
    assert msg == refusal(lambda: paged_setup()[0].run(q, pg.cache, out=out[:2]))
    assert "out must have shape (5, 4, 64) but has (2, 4, 64)" in msg


def test_memo_is_cleared_by_a_replan(guard_calls):
    w, q, pg, qo = paged_setup()
    memoized(lambda: w.run(q, pg.cache), guard_calls)
    replan = (qo, pg.indptr, pg.indices, pg.last, 2, 2, 64, 16)  # 2 query heads now
    w.plan(*replan, causal=True)
    msg = refusal(lambda: w.run(q, pg.cache))
    fresh = kernels.BatchPrefillWithPagedKVCacheWrapper(workspace(1))
    fresh.plan(*replan, causal=True)
    assert msg == refusal(lambda: fresh.run(q, pg.cache))
    assert "num_qo_heads is 2 in plan() but q has 4" in msg
    two = q[:, :2].contiguous()  # what the new plan takes
    close(w.run(two, pg.cache), paged_ref(two, pg, qo), torch.float16)


@pytest.mark.parametrize("disable", ["run_matches_plan", "all"])
def test_memo_rechecks_when_guards_are_switched_back_on(off, monkeypatch, guard_calls, disable):
    w, q, pg, _ = paged_setup()
    qb = q.to(torch.bfloat16)
    off(disable)
    w.run(qb, pg.cache)
    w.run(qb, pg.cache)  # let through (and, with one guard off, memoized) while it is off
    monkeypatch.delenv("KERNELS_DISABLE_GUARDS")
    msg = refusal(lambda: w.run(qb, pg.cache))
    assert msg == refusal(lambda: paged_setup()[0].run(qb, pg.cache))
    assert "dtype is float16 in plan() but q has bfloat16" in msg


def test_memo_rechecks_partial_state_without_lse(guard_calls):
    w, q, pg, _ = paged_setup(max_kv_chunk=8)
    assert w.plan_info.split
    state = (torch.zeros(q.shape[0], 4, 64, dtype=q.dtype), torch.zeros(q.shape[0], 4))
    memoized(lambda: w.run(q, pg.cache, return_lse=True, partial_state=state), guard_calls,
             still_called={"merge_live_rows"})  # a fix the merge applies at every call
    msg = refusal(lambda: w.run(q, pg.cache, partial_state=state))
    assert msg == refusal(lambda: paged_setup(max_kv_chunk=8)[0].run(q, pg.cache, partial_state=state))
    assert "partial_state on a split-KV plan needs lse" in msg


@pytest.mark.parametrize("change,words", [
    (lambda q: torch.empty_strided(q.shape, q.stride(), dtype=q.dtype, device="meta"), "q is on meta"),
    (lambda q: q.to(torch.bfloat16), "dtype is float16 in plan() but q has bfloat16"),
], ids=["device", "dtype"])
def test_memo_rechecks_another_device_or_dtype(guard_calls, change, words):
    w, q, pg, _ = paged_setup()
    memoized(lambda: w.run(q, pg.cache), guard_calls)
    other = change(q)
    assert (other.shape, other.stride()) == (q.shape, q.stride())
    msg = refusal(lambda: w.run(other, pg.cache))
    assert msg == refusal(lambda: paged_setup()[0].run(other, pg.cache))
    assert words in msg


def test_memo_rechecks_a_tensor_changed_in_place(guard_calls):
    w, q, pg, _ = paged_setup()
    qq = torch.zeros(q.shape[0], 4, 128, dtype=q.dtype)[..., :64]
    qq.copy_(q)
    memoized(lambda: w.run(qq, pg.cache), guard_calls)
    qq.as_strided_(qq.shape, (512, 128, 2))  # the same object (and id), its last dim strided now
    msg = refusal(lambda: w.run(qq, pg.cache))
    assert msg == refusal(lambda: paged_setup()[0].run(qq, pg.cache))
    assert "q has stride(-1) == 2" in msg


def test_ragged_and_decode_memos_recheck_fewer_heads(guard_calls):
    def ragged():
        w = kernels.BatchPrefillWithRaggedKVCacheWrapper(workspace(1))
        w.plan(torch.tensor([0, 5]), torch.tensor([0, 9]), 4, 2, 64)
        return w
    q, k, v = single_inputs(4, 2)
    w = ragged()
    memoized(lambda: w.run(q, k, v), guard_calls)
    msg = refusal(lambda: w.run(q, k, v[:, :1]))
    assert msg == refusal(lambda: ragged().run(q, k, v[:, :1]))
    assert "num_kv_heads is 2 in plan() but v has 1" in msg

    pg = make_paged([10, 3], 16, 2, 64, form="stacked")  # one [P, 2, ps, H, D] tensor

    def decode():
        w = kernels.BatchDecodeWithPagedKVCacheWrapper(workspace(1))
        w.plan(pg.indptr, pg.indices, pg.last, 4, 2, 64, 16)
        return w
    qd = rand(2, 4, 64, gen=gen(7))
    w = decode()
    memoized(lambda: w.run(qd, pg.cache), guard_calls)
    fewer = pg.cache[:, :, :, :1]
    msg = refusal(lambda: w.run(qd, fewer))
    assert msg == refusal(lambda: decode().run(qd, fewer))
    assert "num_kv_heads is 2 in plan() but k_cache has 1" in msg
    msg = refusal(lambda: w.run(qd, pg.cache[:, 0]))  # a 4-D tensor: the rank guard, not the memo
    assert "paged_kv_cache must have rank 5" in msg


def _meta(t):
    """t's shape, stride and dtype on another device (no data_ptr a kernel could read)."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _in_place_strided_k(q, k, v, out):
    k.as_strided_(k.shape, (256, 128, 2))  # the very object the memo saw (same id), strided now
    return q, k, v, {}


@pytest.mark.parametrize("bad,words", [
    (lambda q, k, v, out: (q, k, v[:3], {}), "kv_len is 9 for one tensor but 3"),
    (lambda q, k, v, out: (q[:, :3], k, v, {}), "num_qo_heads 3 is not a multiple of num_kv_heads 2"),
    (lambda q, k, v, out: (q, k, v, {"kv_layout": "NDH"}), "kv_layout is 'NDH'"),
    (lambda q, k, v, out: (q, k, v, {"out": torch.empty(5, 4, 128, dtype=q.dtype)[..., ::2]}),
     "out must be contiguous"),
    (lambda q, k, v, out: (q, k, v, {"out": out[:2]}), "out must have shape (5, 4, 64) but has (2, 4, 64)"),
    (lambda q, k, v, out: (q, k, v, {"out": out.view(4, 5, 64)}), "out must have shape (5, 4, 64) but has (4, 5, 64)"),
    (lambda q, k, v, out: (q, k.as_strided(k.shape, (256, 128, 2)), v, {}), "k has stride(-1) == 2"),
    (_in_place_strided_k, "k has stride(-1) == 2"),
    (lambda q, k, v, out: (q, k, torch.cat([v, v], -1)[..., ::2], {}), "v has stride(-1) == 2"),
    (lambda q, k, v, out: (torch.cat([q, q], -1)[..., ::2], k, v, {}), "q has stride(-1) == 2"),
    (lambda q, k, v, out: (q.to(torch.float64), k, v, {}), "q dtype is torch.float64"),
    (lambda q, k, v, out: (q, k, v.to(torch.float64), {}), "v dtype is torch.float64"),
    (lambda q, k, v, out: (q, k, v, {"out": out.to(torch.float64)}), "out dtype is torch.float64"),
    (lambda q, k, v, out: (_meta(q), k, v, {}), "q is on meta"),
    (lambda q, k, v, out: (q, k, _meta(v), {}), "v is on meta"),
    (lambda q, k, v, out: (q, k, v, {"out": _meta(out)}), "out is on meta"),
], ids=["kv_len", "heads", "layout", "strided_out", "short_out", "reshaped_out", "strided_k", "strided_k_in_place",
        "strided_v", "strided_q",
        "q_dtype", "v_dtype", "out_dtype", "q_device", "v_device", "out_device"])
def test_single_memo_rechecks(guard_calls, bad, words):
    """Each bad call differs from the memoized one in one thing the key reads (shape, stride,
    dtype, device, contiguity, layout), with everything else the same: the memo must miss and the
    refusal read as it does with no memo. Any key that left that thing out would let it through."""
    from kernels import single
    single._MEMO.clear()  # the single calls' memo is the module's: start from none
    q, k0, v = single_inputs(4, 2)
    k = torch.zeros(9, 2, 128, dtype=k0.dtype)[..., :64]  # packed rows of a wider buffer
    k.copy_(k0)
    out = torch.empty(5, 4, 64, dtype=q.dtype)
    memoized(lambda: kernels.single_prefill_with_kv_cache(q, k, v, out=out), guard_calls)
    bq, bk, bv, change = bad(q, k, v, out)
    kw = {"out": out, **change}  # one thing differs from the memoized call
    msg = refusal(lambda: kernels.single_prefill_with_kv_cache(bq, bk, bv, **kw))
    single._MEMO.clear()
    assert msg == refusal(lambda: kernels.single_prefill_with_kv_cache(bq, bk, bv, **kw))
    assert words in msg


@pytest.mark.parametrize("bad,words", [
    (lambda lse: lse[:2], "lse must have shape (5, 4) but has (2, 4)"),
    (lambda lse: torch.empty(4, 5).t(), "lse must be contiguous"),
    (lambda lse: lse.to(torch.float64), "lse dtype is torch.float64"),
    (lambda lse: _meta(lse), "lse is on meta"),
], ids=["short", "strided", "dtype", "device"])
def test_single_memo_rechecks_lse(guard_calls, bad, words):
    """The memoized call passed an lse of the right shape: one that differs only in shape,
    contiguity (same shape), dtype or device must still be refused."""
    from kernels import single
    single._MEMO.clear()
    q, k, v = single_inputs(4, 2)
    lse = torch.empty(5, 4)
    memoized(lambda: kernels.single_prefill_with_kv_cache(q, k, v, return_lse=True, lse=lse), guard_calls)
    other = bad(lse)
    msg = refusal(lambda: kernels.single_prefill_with_kv_cache(q, k, v, return_lse=True, lse=other))
    single._MEMO.clear()
    assert msg == refusal(lambda: kernels.single_prefill_with_kv_cache(q, k, v, return_lse=True, lse=other))
    assert words in msg


def test_single_memo_with_lse_rechecks_and_computes(guard_calls):
    """A memoized call with return_lse and a given lse, then without out: each repeat is right."""
    from kernels import single
    single._MEMO.clear()
    q, k, v = single_inputs(4, 2)
    want_o, want_lse = ref_attention(q, k, v, True)
    lse = torch.empty(5, 4)
    for kw in ({"lse": lse}, {}):
        for _ in range(2):
            o, l = kernels.single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True, **kw)
            close(o, want_o, torch.float16)
        memoized(lambda: kernels.single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True, **kw),
                 guard_calls)
    assert torch.isfinite(l).all() and torch.isfinite(lse).all()
    assert "lse must have shape (5, 4) but has (5, 3)" in refusal(
        lambda: kernels.single_prefill_with_kv_cache(q, k, v, return_lse=True, lse=torch.empty(5, 3)))


@pytest.mark.parametrize("disable", ["gqa_divisible", "all"])
def test_single_memo_rechecks_when_guards_are_switched_back_on(off, monkeypatch, guard_calls, disable):
    from kernels import single
    single._MEMO.clear()
    q, k, v = single_inputs(4, 2)
    q3 = q[:, :3]  # 3 query heads over 2 kv heads: let through while gqa_divisible is off
    off(disable)
    for _ in range(2):  # with one guard off, memoized under that switch
        kernels.single_prefill_with_kv_cache(q3, k, v)
    monkeypatch.delenv("KERNELS_DISABLE_GUARDS")
    msg = refusal(lambda: kernels.single_prefill_with_kv_cache(q3, k, v))
    assert "num_qo_heads 3 is not a multiple of num_kv_heads 2" in msg


@pytest.mark.parametrize("bad,words", [
    (lambda q, k, v: (q.to(torch.float64), k, v), "q dtype is torch.float64"),
    (lambda q, k, v: (_meta(q), k, v), "q is on meta"),
    (lambda q, k, v: (q[:3], k, v), "num_qo_heads 3 is not a multiple of num_kv_heads 2"),
    (lambda q, k, v: (q, k[:, :1], v), "num_kv_heads is 1 for one tensor but 2"),
], ids=["q_dtype", "q_device", "q_heads", "k_heads"])
def test_single_decode_memo_rechecks(guard_calls, bad, words):
    from kernels import single
    single._MEMO.clear()
    q, k, v = single_inputs(4, 2, L=1)
    q = q[0]
    want = ref_attention(q[None], k, v)[0][0]
    memoized(lambda: kernels.single_decode_with_kv_cache(q, k, v), guard_calls)
    close(kernels.single_decode_with_kv_cache(q, k, v), want, torch.float16)  # the fast path computes right
    args = bad(q, k, v)
    msg = refusal(lambda: kernels.single_decode_with_kv_cache(*args))
    single._MEMO.clear()
    assert msg == refusal(lambda: kernels.single_decode_with_kv_cache(*args))
    assert words in msg


def test_single_decode_memo_keeps_copying_a_strided_q(guard_calls):
    from kernels import single
    single._MEMO.clear()
    q, k, v = single_inputs(4, 2, L=1)
    qs = torch.stack([q[0], torch.full_like(q[0], float("nan"))], -1).flatten(-2)[..., ::2]
    want = ref_attention(q, k, v)[0][0]
    for _ in range(3):  # the copy is the fix: made at every call, never memoized away
        close(kernels.single_decode_with_kv_cache(qs, k, v), want, torch.float16)
        assert "last_dim_contiguous" in guard_calls
        del guard_calls[:]
    packed = qs.contiguous()
    memoized(lambda: kernels.single_decode_with_kv_cache(packed, k, v), guard_calls)
    close(kernels.single_decode_with_kv_cache(packed, k, v), want, torch.float16)


def test_memo_leaves_the_library_choice_alone(guard_calls, monkeypatch):
    """No check reads which library is loaded: a memoized run() launches on the library loaded
    at that moment, so a fault library chosen after the memo is armed still gets the launch."""
    from kernels import testonly
    w, q, pg, qo_indptr = paged_setup()
    big = q * 40  # logits past ~88.7: exp overflows without the running max
    memoized(lambda: w.run(big, pg.cache), guard_calls)
    want = paged_ref(big, pg, qo_indptr)
    close(w.run(big, pg.cache), want, torch.float16)
    del guard_calls[:]
    monkeypatch.setenv("KERNELS_TESTONLY", "1")
    with testonly.fault_library("softmax_no_max"):
        assert not torch.isfinite(w.run(big, pg.cache)).all()
    assert guard_calls == []  # the fault reached the kernels on the fast path
    close(w.run(big, pg.cache), want, torch.float16)
