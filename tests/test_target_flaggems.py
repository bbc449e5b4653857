"""The flaggems adapter's own plumbing, over a stand-in for FlagGems' API.

No GPU here, so FlagGems' Triton kernels cannot run. `FakeFlagGems` implements
flash_attn_varlen_func with plain torch math and the conventions of the real
one's documented API (vLLM's flash-attn varlen: dense k/v split by
cu_seqlens_k or a [blocks, block_size, Hkv, D] cache read through block_table
and seqused_k, bottom-right causal, window_size=(left, right) with -1
unbounded, LSE [Hq, total_q] in natural log and +inf on rows that see
nothing, `assert` on its inputs), so a case matches only if the adapter lays
the problem out, and reads the LSE back, the way that API expects. It reads
every tensor through its strides, as a correct implementation would.

PYTEST_DONT_REWRITE: the stand-in's bare asserts must stay bare, as FlagGems' are.
"""
from __future__ import annotations

import math

import pytest
import torch

import cases as families
from stand_in_helpers import assert_all_match, sample
from harness.model.case import Case
from harness.engine.execute import execute_case
from harness.targets import flaggems as fg_target


def _attend(q, k, v, scale, causal, left, right):
    """q [L, H, D], k/v [S, Hkv, D] -> o [L, H, D] float, lse [H, L] natural (+inf if empty)."""
    L, h, d = q.shape
    S, hkv = k.shape[0], k.shape[1]
    kf = k.float().repeat_interleave(h // hkv, 1)
    vf = v.float().repeat_interleave(h // hkv, 1)
    s = torch.einsum("lhd,shd->hls", q.float(), kf) * scale
    i = torch.arange(L).unsqueeze(1) + (S - L)
    j = torch.arange(S).unsqueeze(0)
    if causal:
        right = 0
    keep = torch.ones(L, S, dtype=torch.bool)
    if right >= 0:
        keep &= j <= i + right
    if left >= 0:
        keep &= j >= i - left
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.einsum("hls,shd->lhd", torch.softmax(s, -1).nan_to_num(0.0), vf)
    return o, lse.masked_fill(torch.isneginf(lse), float("inf"))


class FakeFlagGems:
    """flag_gems.flash_attn_varlen_func's API and input checks, in torch math."""
    __version__ = "0.0-fake"

    def __init__(self):
        self.calls = []

    def flash_attn_varlen_func(self, q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k,
                               cu_seqlens_k=None, seqused_k=None, q_v=None, dropout_p=0.0,
                               softmax_scale=None, causal=False, window_size=None, softcap=0.0,
                               alibi_slopes=None, deterministic=False, return_attn_probs=False,
                               block_table=None, return_softmax_lse=False, out=None, **fa3):
        self.calls.append(dict(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q,
                               cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k,
                               block_table=block_table, causal=causal,
                               window_size=window_size, out=out, max_seqlen_q=max_seqlen_q,
                               max_seqlen_k=max_seqlen_k))
        assert cu_seqlens_k is not None or seqused_k is not None, \
            "cu_seqlens_k or seqused_k must be provided"
        assert cu_seqlens_k is None or seqused_k is None, \
            "cu_seqlens_k and seqused_k cannot be provided at the same time"
        assert block_table is None or seqused_k is not None, \
            "seqused_k must be provided if block_table is provided"
        q, k, v = [x.contiguous() if x.stride(-1) != 1 else x for x in (q, k, v)]
        assert q.dtype in (torch.float16, torch.bfloat16), \
            "FlashAttention only support fp16 and bf16 data type"
        assert q.dtype == k.dtype
        assert q.dtype == v.dtype
        assert cu_seqlens_q.dtype == torch.int32
        assert cu_seqlens_q.is_contiguous()
        paged = block_table is not None
        total_q, heads, d = q.size()
        hkv = k.size(2) if paged else k.size(1)
        batch = cu_seqlens_q.numel() - 1
        assert k.size() == v.size()
        if out is not None:
            assert out.stride(-1) == 1
            assert out.dtype == q.dtype
            assert out.size() == (total_q, heads, d)
        if seqused_k is not None:
            assert seqused_k.is_contiguous()
            assert seqused_k.size() == (batch,)
        groups = heads // hkv             # before the divisibility check, as in FlagGems
        assert d <= 256, "FlashAttention forward only supports head dimension at most 256"
        assert d % 8 == 0, "head_size must be a multiple of 8, this is ensured by padding!"
        assert heads % hkv == 0, "Number of heads in key/value must divide number of heads in query"
        del groups
        scale = softmax_scale if softmax_scale is not None else d ** -0.5
        left, right = window_size if window_size is not None else (-1, -1)
        o = torch.zeros(total_q, heads, d, dtype=torch.float32)
        lse = torch.full((heads, total_q), float("inf"))
        cu_q = [int(x) for x in cu_seqlens_q]
        for b in range(batch):
            qs, qe = cu_q[b], cu_q[b + 1]
            if paged:
                n = int(seqused_k[b])
                pages = block_table[b].long()
                kb = k[pages].reshape(-1, hkv, d)[:n]
                vb = v[pages].reshape(-1, hkv, d)[:n]
            else:
                ks, ke = int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])
                kb, vb = k[ks:ke], v[ks:ke]
            ob, sb = _attend(q[qs:qe], kb, vb, scale, causal, left, right)
            o[qs:qe] = ob
            lse[:, qs:qe] = sb
        dst = out if out is not None else torch.empty_like(q)
        dst.copy_(o.to(q.dtype))
        return (dst, lse) if return_softmax_lse else dst


class FreshOutputFake(FakeFlagGems):
    """Computes the right answer into a tensor of its own and leaves out= alone."""

    def flash_attn_varlen_func(self, *args, out=None, **kw):
        return super().flash_attn_varlen_func(*args, out=None, **kw)


@pytest.fixture()
def fake():
    return FakeFlagGems()


@pytest.fixture()
def target(fake):
    return fg_target.make_target(fake, device="cpu")


def _lacks(c) -> bool:
    p = c.params
    return bool(c.requires or fg_target.CAPABILITIES.lacks(c.op, p, c.requires)
                or any(p.get(k) for k in ("use_cuda_graph", "partial_state", "scenario"))
                or p.get("head_dim_vo", p["head_dim"]) != p["head_dim"])


def _sample(route, family="valid", limit=8):
    """A few cases of one route the target can take, one per layout / form / mask / LSE mix."""
    return sample(route, lambda p: (p.get("layout"), p.get("cache_form"), p["return_lse"],
                                    p.get("causal"), p.get("window_left", -1) >= 0,
                                    p["num_qo_heads"] != p.get("num_kv_heads")),
                  _lacks, family, limit)


def _case(route, **params):
    base = {"dtype": "bf16", "head_dim": 64, "num_qo_heads": 4, "num_kv_heads": 2,
            "qo_lens": [5, 11], "kv_lens": [21, 40], "causal": True, "return_lse": True,
            "page_size": 16}
    return Case(route, "t", "case", {**base, **params})


@pytest.mark.parametrize("route", fg_target.ROUTES)
def test_valid_cases_match_through_the_stand_in(target, route):
    assert_all_match(target, _sample(route), route)


def test_lse_is_read_back_from_heads_by_rows(target):
    case = _case("fg.ragged_prefill", num_qo_heads=8, num_kv_heads=2, qo_lens=[3, 9],
                 kv_lens=[17, 30])
    result = execute_case(case, target, device="cpu")
    assert result.outcome == "match", result.message


@pytest.mark.parametrize("causal", [False, True])
def test_windowed_cases_match(target, fake, causal):
    case = _case("fg.paged_prefill", causal=causal, window_left=7, qo_lens=[9, 4],
                 kv_lens=[30, 20])
    result = execute_case(case, target, device="cpu")
    assert result.outcome == "match", result.message
    assert fake.calls[-1]["window_size"] == (7, 0 if causal else -1)


def test_library_asserts_become_refusals(target):
    gqa = next(c for c in families.generate(["gqa"], routes=("fg.paged_prefill",))
               if c.variant == "q12_over_kv8")
    result = execute_case(gqa, target, device="cpu")
    assert result.outcome == "refused", result.message
    assert result.error_type == "LibraryAssertionError"
    assert "Number of heads in key/value" in result.message
    # A bare assert is refused with the statement that failed and where.
    bare = _case("fg.paged_prefill", index_dtype={"qo_indptr": "int64"})
    result = execute_case(bare, target, device="cpu")
    assert result.outcome == "unexpected_refusal", result.message
    assert "bare assert" in result.message and "cu_seqlens_q.dtype == torch.int32" in result.message
    assert "test_target_flaggems.py:" in result.message


def test_zero_kv_heads_is_refused_not_a_harness_error(target):
    kv0 = next(c for c in families.generate(["gqa"], routes=("fg.batch_decode",))
               if c.variant == "kv0")
    result = execute_case(kv0, target, device="cpu")
    assert result.outcome == "refused" and result.error_type == "ZeroDivisionError"


def test_layouts_are_passed_as_stride_views(target, fake):
    hnd = _case("fg.paged_prefill", layout="HND")
    assert execute_case(hnd, target, device="cpu").outcome == "match"
    k = fake.calls[-1]["k"]
    assert k.shape[1:] == (16, 2, 64) and k.stride()[1:] == (64, 16 * 64, 1)
    single = _case("fg.batch_decode", qo_lens=[1, 1, 1], kv_lens=[17, 40, 5], causal=False,
                   cache_form="single")
    assert execute_case(single, target, device="cpu").outcome == "match"
    k, v = fake.calls[-1]["k"], fake.calls[-1]["v"]
    assert k.stride(0) == 2 * 16 * 2 * 64 and v.data_ptr() - k.data_ptr() == 16 * 2 * 64 * 2
    dense = _case("fg.single_prefill", qo_lens=[13], kv_lens=[29], layout="HND")
    assert execute_case(dense, target, device="cpu").outcome == "match"
    k = fake.calls[-1]["k"]
    assert k.shape == (29, 2, 64) and k.stride() == (64, 29 * 64, 1)


def test_what_has_no_analogue_is_skipped(target):
    for params in ({"use_cuda_graph": True}, {"partial_state": True},
                   {"scenario": "plan_rejected_first"}, {"strided": "lse"},
                   {"strided": "kv_indices"}, {"index_dtype": {"last_page_len": "int64"}},
                   {"mismatch": {"field": "num_kv_heads", "value": 1}},
                   {"mismatch": {"field": "page_size", "value": 8}}):
        result = execute_case(_case("fg.paged_prefill", **params), target, device="cpu")
        assert result.outcome == "skipped", (params, result.message)
    ragged_hnd = _case("fg.ragged_prefill", layout="HND")
    assert execute_case(ragged_hnd, target, device="cpu").outcome == "skipped"
    vo = _case("fg.single_prefill", qo_lens=[3], kv_lens=[9], head_dim_vo=32)
    result = execute_case(vo, target, device="cpu")
    assert result.outcome == "skipped" and "head_dim" in result.message


def test_capabilities_skip_fp32_and_plan_run(target):
    fp32 = _case("fg.single_prefill", qo_lens=[3], kv_lens=[9], dtype="fp32")
    result = execute_case(fp32, target, device="cpu")
    assert result.outcome == "skipped" and "fp32" in result.message
    planned = families.generate(["misplanned"], routes=("fg.paged_prefill",))
    scripted = [c for c in planned if "plan_run" in c.requires]
    assert scripted
    result = execute_case(scripted[0], target, device="cpu")
    assert result.outcome == "skipped" and "plan_run" in result.message


def test_the_metadata_family_reaches_its_call_in_every_dtype_it_takes(target, fake):
    """misplanned asks for metadata fields, not plan(): the fields flash_attn_varlen_func's
    metadata states reach it, in fp16 and bf16; the ones no argument states are skipped."""
    planned = [c for c in families.generate(["misplanned"], routes=("fg.paged_prefill",))
               if c.params.get("mismatch") and c.params["dtype"] in ("fp16", "bf16")
               and not c.params.get("return_lse")]
    reached, dtypes = set(), set()
    for case in planned:
        before = len(fake.calls)
        result = execute_case(case, target, device="cpu")
        field = case.params["mismatch"]["field"]
        if field in target.capabilities.metadata:
            assert result.outcome != "skipped", (case.id, result.message)
            if len(fake.calls) > before:
                reached.add(field)
                dtypes.add(case.params["dtype"])
        else:
            assert result.outcome == "skipped", case.id
    assert {"num_qo_heads", "head_dim_qk", "q_rows", "dtype", "rank"} <= reached
    assert dtypes == {"fp16", "bf16"}


def test_mismatched_tensors_reach_the_library(target, fake):
    def refuse(**params):
        return Case("fg.paged_prefill", "t", "mm", _case("fg.paged_prefill", **params).params,
                    expect="refuse")

    execute_case(refuse(mismatch={"field": "q_rows", "value": 15}), target, device="cpu")
    call = fake.calls[-1]
    assert call["q"].shape[0] == 15 and call["cu_seqlens_q"].tolist() == [0, 5, 16]
    assert call["out"].shape[0] == 15
    for field, value in (("head_dim_vo", 32), ("dtype", "fp16"), ("rank", 2),
                         ("num_qo_heads", 2)):
        result = execute_case(refuse(mismatch={"field": field, "value": value}), target,
                              device="cpu")
        assert result.outcome == "refused", (field, result.message)
    padded = _case("fg.paged_prefill", mismatch={"field": "q_rows", "value": 21})
    assert execute_case(padded, target, device="cpu").outcome == "match"


def test_mixed_batch_is_one_call(target, fake):
    case = next(c for c in families.generate(["mixed_batch"], routes=("fg.mixed_batch",))
                if c.variant == "decodes3_window")
    result = execute_case(case, target, device="cpu")
    assert result.outcome == "match", result.message
    assert len(fake.calls) == 1
    call = fake.calls[0]
    assert call["cu_seqlens_q"].tolist() == case_qsl(case)
    assert call["seqused_k"].tolist() == case.params["kv_lens"]
    assert call["window_size"] == (case.params["window_left"], 0)


def case_qsl(case):
    out = [0]
    for n in case.params["qo_lens"]:
        out.append(out[-1] + n)
    return out


def test_rows_come_from_the_callers_out():
    target = fg_target.make_target(FreshOutputFake(), device="cpu")
    result = execute_case(_case("fg.paged_prefill", return_lse=False), target, device="cpu")
    assert result.outcome == "wrong"


def test_empty_rows_keep_the_libraries_plus_inf_lse(target):
    case = _case("fg.ragged_prefill", qo_lens=[3, 4], kv_lens=[0, 6], causal=False)
    result = execute_case(case, target, device="cpu")
    assert result.outcome == "wrong" and result.n_wrong == 3 * 4 and math.isinf(result.max_abs_diff)


def test_make_target_without_a_gpu_names_what_to_install(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="pip install flag-gems"):
        fg_target.make_target()
