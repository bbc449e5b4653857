"""The flashinfer adapter's own plumbing, over a stand-in for FlashInfer's API.

No GPU here, so FlashInfer itself cannot run. `FakeFlashInfer` implements the
calls the adapter makes with plain torch math and FlashInfer's conventions
(NHD/HND, a (k, v) tuple or one [pages, 2, ...] cache, page tables with
last_page_len, base-2 LSE), so a case matches only if the adapter lays the
problem out, and converts the LSE back, the way FlashInfer expects.
"""
from __future__ import annotations

import math

import pytest
import torch

import cases as families
from stand_in_helpers import assert_all_match, sample
from harness.model.case import Case
from harness.engine.execute import execute_case
from harness.targets import flashinfer as fi_target

LOG2E = 1.0 / math.log(2.0)


def _attend(q, k, v, causal, window_left, sm_scale):
    """q [L, Hq, D], k/v [S, Hkv, D] -> o [L, Hq, Dv] (q's dtype), lse [L, Hq] base 2."""
    L, hq, d = q.shape
    S, hkv = k.shape[0], k.shape[1]
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)
    if hkv == 0 or hq % hkv:
        raise ValueError(f"num_qo_heads {hq} is not a multiple of num_kv_heads {hkv}")
    kf = k.float().repeat_interleave(hq // hkv, 1)
    vf = v.float().repeat_interleave(hq // hkv, 1)
    s = torch.einsum("lhd,shd->hls", q.float(), kf) * scale
    i = torch.arange(L).unsqueeze(1) + (S - L)
    j = torch.arange(S).unsqueeze(0)
    keep = torch.ones(L, S, dtype=torch.bool)
    if causal:
        keep &= j <= i
    if window_left >= 0:
        keep &= j >= i - window_left
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.einsum("hls,shd->lhd", torch.softmax(s, -1).nan_to_num(0.0), vf)
    return o.to(q.dtype), (lse * LOG2E).transpose(0, 1).contiguous()


def _dense(t, layout):
    return t if layout == "NHD" else t.transpose(0, 1)


def _pages(cache, layout, pages, kv_len, which):
    if isinstance(cache, tuple):
        c = cache[which]
    else:
        c = cache[:, which]
    c = c[pages]
    if layout == "HND":
        c = c.transpose(1, 2)
    return c.reshape(-1, *c.shape[2:])[:kv_len]


def _write(res, out, lse, return_lse):
    o, s = res
    if out is not None:
        out.copy_(o)
        o = out
    if lse is not None:
        lse.copy_(s)
        s = lse
    return (o, s) if return_lse else o


class _Wrapper:
    def __init__(self, workspace, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 backend="auto", **buffers):
        self.layout = kv_layout

    def _requests(self, q):
        for r in range(len(self.qo_indptr) - 1):
            yield r, q[self.qo_indptr[r]:self.qo_indptr[r + 1]]


class FakePaged(_Wrapper):
    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
             num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo=None,
             causal=False, window_left=-1, sm_scale=None, q_data_type=None, kv_data_type=None):
        self.qo_indptr = [int(x) for x in qo_indptr]
        self.indptr = [int(x) for x in paged_kv_indptr]
        self.indices = paged_kv_indices.clone().long()
        self.last = [int(x) for x in paged_kv_last_page_len]
        self.page_size, self.causal, self.window, self.scale = page_size, causal, window_left, sm_scale

    def run(self, q, cache, out=None, lse=None, return_lse=False):
        os, ss = [], []
        for r, qr in self._requests(q):
            pages = self.indices[self.indptr[r]:self.indptr[r + 1]]
            n = (len(pages) - 1) * self.page_size + self.last[r]
            k = _pages(cache, self.layout, pages, n, 0)
            v = _pages(cache, self.layout, pages, n, 1)
            o, s = _attend(qr, k, v, self.causal, self.window, self.scale)
            os.append(o)
            ss.append(s)
        return _write((torch.cat(os), torch.cat(ss)), out, lse, return_lse)


class FakeRagged(_Wrapper):
    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk,
             head_dim_vo=None, causal=False, window_left=-1, sm_scale=None, q_data_type=None,
             kv_data_type=None):
        self.qo_indptr = [int(x) for x in qo_indptr]
        self.kv_indptr = [int(x) for x in kv_indptr]
        self.causal, self.window, self.scale = causal, window_left, sm_scale

    def run(self, q, k, v, out=None, lse=None, return_lse=False):
        os, ss = [], []
        for r, qr in self._requests(q):
            sl = slice(self.kv_indptr[r], self.kv_indptr[r + 1])
            o, s = _attend(qr, k[sl], v[sl], self.causal, self.window, self.scale)
            os.append(o)
            ss.append(s)
        return _write((torch.cat(os), torch.cat(ss)), out, lse, return_lse)


class FakeDecode(FakePaged):
    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
             page_size, window_left=-1, q_data_type=None, kv_data_type=None, sm_scale=None):
        batch = len(indptr) - 1
        super().plan(torch.arange(batch + 1), indptr, indices, last_page_len, num_qo_heads,
                     num_kv_heads, head_dim, page_size, window_left=window_left,
                     sm_scale=sm_scale)


class FakeFlashInfer:
    """FlashInfer's public calls the adapter uses, in torch math."""
    __version__ = "0.0-fake"
    BatchPrefillWithPagedKVCacheWrapper = FakePaged
    BatchPrefillWithRaggedKVCacheWrapper = FakeRagged
    BatchDecodeWithPagedKVCacheWrapper = FakeDecode

    @staticmethod
    def single_prefill_with_kv_cache(q, k, v, causal=False, kv_layout="NHD", window_left=-1,
                                     sm_scale=None, backend="auto", return_lse=False):
        o, s = _attend(q, _dense(k, kv_layout), _dense(v, kv_layout), causal, window_left, sm_scale)
        return (o, s) if return_lse else o

    @staticmethod
    def single_decode_with_kv_cache(q, k, v, kv_layout="NHD", window_left=-1, sm_scale=None,
                                    use_tensor_cores=False, return_lse=False):
        o, s = _attend(q.unsqueeze(0), _dense(k, kv_layout), _dense(v, kv_layout), False,
                       window_left, sm_scale)
        return (o[0], s[0]) if return_lse else o[0]

    @staticmethod
    def merge_state(v_a, s_a, v_b, s_b):
        s = torch.logaddexp(s_a / LOG2E, s_b / LOG2E) * LOG2E
        wa = torch.exp2(s_a - s).unsqueeze(-1)
        wb = torch.exp2(s_b - s).unsqueeze(-1)
        return (v_a.float() * wa + v_b.float() * wb).to(v_a.dtype), s

    @classmethod
    def merge_state_in_place(cls, v, s, v_other, s_other):
        mv, ms = cls.merge_state(v, s, v_other, s_other)
        v.copy_(mv)
        s.copy_(ms)


@pytest.fixture(scope="module")
def target():
    return fi_target.FlashInferTarget(FakeFlashInfer(), torch.device("cpu"), fi_target.ROUTES_FA2)


def _sample(route, family="valid", limit=6):
    """A few non-fp32 cases of one route, one per layout / cache form / merge / mask / LSE mix."""
    return sample(route, lambda p: (p.get("layout"), p.get("cache_form"), p.get("merge"),
                                    p["return_lse"], p.get("causal"),
                                    p.get("window_left", -1) >= 0), family=family, limit=limit)


@pytest.mark.parametrize("route", fi_target.ROUTES_FA2)
def test_valid_cases_match_through_the_stand_in(target, route):
    assert_all_match(target, _sample(route), route)


def test_lse_is_converted_from_base_two(target):
    case = next(c for c in _sample("fi_fa2.single_prefill") if c.params["return_lse"])
    result = execute_case(case, target, device="cpu")
    assert result.outcome == "match", result.message
    assert fi_target.natural_lse(torch.tensor([1.0])).item() == pytest.approx(math.log(2.0))


def test_fp32_and_unknown_scenarios_are_skipped(target):
    base = {"head_dim": 64, "num_qo_heads": 2, "qo_lens": [3], "kv_lens": [5]}
    fp32 = Case("fi_fa2.single_prefill", "t", "fp32", {**base, "dtype": "fp32"})
    assert execute_case(fp32, target, device="cpu").outcome == "skipped"
    odd = Case("fi_fa2.paged_prefill", "t", "odd", {**base, "dtype": "bf16", "scenario": "nope"})
    result = execute_case(odd, target, device="cpu")
    assert result.outcome == "skipped" and "nope" in result.message


def test_strided_output_on_a_single_route_is_skipped(target):
    case = next(c for c in families.generate(["strided"], routes=("fi_fa2.single_prefill",))
                if c.params.get("strided") == "out")
    result = execute_case(case, target, device="cpu")
    assert result.outcome == "skipped" and "out" in result.message


def test_make_target_without_a_gpu_names_what_to_install(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="pip install flashinfer-python"):
        fi_target.make_target()


def test_every_family_reaches_flashinfer_routes_by_op_with_the_bundled_seeds(target):
    from harness.model.routes import BUNDLED_ROUTES
    moved = target.cases(["graph_replan", "restaged_indptr", "small_head"])
    assert {c.route for c in moved} >= {"fi_fa2.paged_prefill", "fi_fa2.batch_decode",
                                        "fi_tc.batch_decode"}
    bundled = {c.id.split(".", 1)[1]: c.seed
               for c in families.generate(["graph_replan", "restaged_indptr", "small_head"],
                                          routes=BUNDLED_ROUTES)}
    for case in moved:
        assert case.seed == bundled[case.id.split(".", 1)[1]], case.id


def test_scenarios_run_through_the_stand_in(target):
    chosen = [c for c in target.cases(["restaged_indptr", "graph_replan", "misplanned"])
              if c.expect == "match" and c.route in ("fi_fa2.batch_decode", "fi_fa2.paged_prefill")
              and c.params.get("scenario")]
    assert {c.params["scenario"] for c in chosen} >= {"restaged", "graph_replan",
                                                      "plan_rejected_first"}
    first = {}
    for case in chosen:
        first.setdefault(case.params["scenario"], case)
    for case in first.values():
        result = execute_case(case, target, device="cpu")
        assert result.outcome in ("match", "skipped"), (case.id, result.message)
