"""The tolerance model (harness/model/tolerance.py) separates right answers from real defects.

Each simulated kernel below computes from the problem's own dtype inputs, as a
library would; the judge is the engine's (execute.judge: the baseline-scaled
output bound and the LSE's own bound). Right kernels must match, defects must
be wrong, at sizes where a fixed per-dtype tolerance gets one or the other wrong.
"""
from __future__ import annotations

import math

import pytest
import torch

from harness.model.compare import compare, summarize
from harness.engine.execute import judge
from harness.model.problem import build_problem
from harness.model.reference import attention_baseline, attention_reference, visible_mask
from harness.model.tolerance import K, LSE_ATOL, output_tolerance


def _repeat_kv(t, group):
    return t.float().repeat_interleave(group, 1)


def fused_kernel(p, *, drop_last_visible=False, causal_shift=0, lse_shift=0.0, tile=None):
    """A kernel in fp32 from the dtype's inputs; output rounded to the dtype.

    tile: an online softmax over kv tiles of that size with P rounded to the
    dtype before P @ V (an FA2-style tiled kernel)."""
    g = p.num_qo_heads // p.num_kv_heads
    outs, lses = [], []
    for q, k, v, lq, lk in zip(p.q, p.k, p.v, p.qo_lens, p.kv_lens):
        k, v = _repeat_kv(k, g), _repeat_kv(v, g)
        mask = visible_mask(lq, lk, p.causal, p.window_left)
        if causal_shift:
            i, j = torch.arange(lq).unsqueeze(1), torch.arange(lk).unsqueeze(0)
            mask = j <= i + (lk - lq) + causal_shift
        if drop_last_visible:   # a loop bound one short: each row's last key is skipped
            last = mask.long().cumsum(-1).argmax(-1)
            mask = mask.clone()
            mask[torch.arange(lq), last] = False
        s = (torch.einsum("lhd,khd->hlk", q.float(), k) * p.sm_scale).masked_fill(~mask, -math.inf)
        if tile is None:
            lse = torch.logsumexp(s, -1)
            o = torch.einsum("hlk,khd->lhd", torch.softmax(s, -1), v)
        else:
            o, lse = _tiled(s, v, tile, p.dtype)
        outs.append(o.to(p.dtype))
        lses.append(lse.transpose(0, 1) + lse_shift)
    return {"o": torch.cat(outs), "lse": torch.cat(lses)}


def _tiled(s, v, tile, dtype):
    h, rows, n = s.shape
    m = torch.full((h, rows), -math.inf)
    l = torch.zeros(h, rows)
    acc = torch.zeros(h, rows, v.shape[-1])
    for lo in range(0, n, tile):
        st = s[..., lo:lo + tile]
        m_new = torch.maximum(m, st.max(-1).values)
        alpha = torch.exp(m - m_new)
        pt = torch.exp(st - m_new.unsqueeze(-1))
        l = l * alpha + pt.sum(-1)
        p_low = pt.to(dtype).float()                     # P in the dtype before P @ V
        acc = acc * alpha.unsqueeze(-1) + torch.einsum("hlk,khd->hld", p_low, v[lo:lo + tile])
        m = m_new
    return (acc / l.unsqueeze(-1)).transpose(0, 1), m + torch.log(l)


# id(problem) -> (problem, its reference, its baseline), for the problems several kernels are
# judged against (long_bf16): a function of the problem alone, computed once for all of them.
_KEPT: dict = {}


def references(p):
    kept = _KEPT.get(id(p))
    return kept[1:] if kept else (attention_reference(p), attention_baseline(p))


def verdict(p, got):
    return summarize(judge(got, *references(p), p))


LONG = dict(dtype="bf16", head_dim=64, num_qo_heads=4, num_kv_heads=2, qo_lens=[64],
            kv_lens=[8192], causal=True, return_lse=True)


@pytest.fixture(scope="module", params=[1, 2, 3])
def long_bf16(request):
    p = build_problem(LONG, request.param)
    _KEPT[id(p)] = (p, attention_reference(p), attention_baseline(p))
    yield p
    del _KEPT[id(p)]


def test_right_kernel_matches_at_kv_8192_bf16(long_bf16):
    s = verdict(long_bf16, fused_kernel(long_bf16))
    assert s.ok, s.message
    assert s.error_ratio < 0.5, s     # not a near miss: the bound has room


@pytest.mark.parametrize("defect", [{"drop_last_visible": True}, {"causal_shift": 1}],
                         ids=["dropped_key", "causal_off_by_one"])
def test_small_defects_are_wrong_at_kv_8192_bf16(long_bf16, defect):
    out = fused_kernel(long_bf16, **defect)
    s = verdict(long_bf16, out)
    assert not s.ok and s.first_bad_index[0] == "o", s.message
    # What the previous fixed bf16 tolerance (atol = rtol = 1e-2) let through.
    ref = references(long_bf16)[0]["o"]
    got = out["o"].double()
    assert bool(((got - ref).abs() <= 1e-2 + 1e-2 * ref.abs()).all())


def test_lse_shifted_by_0_04_is_wrong_whatever_the_output_dtype(long_bf16):
    s = verdict(long_bf16, fused_kernel(long_bf16, lse_shift=0.04))
    assert not s.ok and s.first_bad_index[0] == "lse", s.message
    assert LSE_ATOL < 0.04 / 10


def _split_kv_merge(p):
    """Attention over each half of the kv, in fp32, merged by the standard LSE weighting."""
    q, k, v = p.q[0].float(), p.k[0].float(), p.v[0].float()
    s = torch.einsum("lhd,khd->hlk", q, k) * p.sm_scale
    cut = p.kv_lens[0] // 2
    states = [(torch.einsum("hlk,khd->lhd", torch.softmax(sh, -1), vh), torch.logsumexp(sh, -1).T)
              for sh, vh in ((s[..., :cut], v[:cut]), (s[..., cut:], v[cut:]))]
    (va, sa), (vb, sb) = states
    m = torch.maximum(sa, sb)
    wa, wb = torch.exp(sa - m), torch.exp(sb - m)
    return {"o": (va * wa[..., None] + vb * wb[..., None]) / (wa + wb)[..., None],
            "lse": m + torch.log(wa + wb)}


def test_right_fp32_split_kv_merge_matches_at_sm_scale_20():
    params = dict(dtype="fp32", head_dim=128, num_qo_heads=4, qo_lens=[5], kv_lens=[600],
                  return_lse=True)
    hard = build_problem({**params, "sm_scale": 20.0}, 7)
    assert float(attention_reference(hard)["lse"].max()) > 200   # exp() overflows fp32 past 88
    summary = verdict(hard, _split_kv_merge(hard))
    assert summary.ok, summary.message
    # The bound follows the problem's difficulty: fp32 logits of ~900 are only good to
    # ~1e-4, so the same right merge at the default scale is held far tighter.
    easy = verdict(build_problem(params, 7), _split_kv_merge(build_problem(params, 7)))
    assert easy.ok and summary.tolerance > 50 * easy.tolerance, (summary, easy)


def test_tiled_kernel_with_bf16_p_matches_at_kv_32768():
    p = build_problem(dict(dtype="bf16", head_dim=64, num_qo_heads=2, qo_lens=[4],
                           kv_lens=[32768], causal=True, return_lse=True), 11)
    s = verdict(p, fused_kernel(p, tile=128))
    assert s.ok, s.message


def test_bound_is_k_times_baseline_error_plus_floor():
    ref = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    base = ref + torch.tensor([0.0, 1e-3, 0.0], dtype=torch.float64)
    tol, base_err = output_tolerance(ref, base, "bf16")
    assert base_err == pytest.approx(1e-3)
    floor, none = output_tolerance(ref, None, "bf16")
    assert none is None and tol == pytest.approx(K * 1e-3 + floor)
    # A baseline that overflowed gives no licence: the floor alone applies.
    inf_base = ref.clone()
    inf_base[0] = math.inf
    assert output_tolerance(ref, inf_base, "bf16")[0] == floor
    assert compare(ref + floor * 2, ref, floor).ok is False


def _exp2_kernel(p):
    """An FA-style fp32 kernel: logits pre-scaled by log2(e) and summed over head_dim one
    product after another, so each is off by ~sqrt(D) fp32 ulps of its magnitude (modelled
    as a seeded random relative error of that size), then exp2 of the scaled difference."""
    g = p.num_qo_heads // p.num_kv_heads
    outs = []
    for q, k, v, lq, lk in zip(p.q, p.k, p.v, p.qo_lens, p.kv_lens):
        k, v = _repeat_kv(k, g), _repeat_kv(v, g)
        s2 = torch.einsum("lhd,khd->hlk", q.float(), k) * torch.tensor(p.sm_scale * math.log2(math.e),
                                                                        dtype=torch.float32)
        m2 = s2.max(-1, keepdim=True).values
        jitter = torch.randn(s2.shape, generator=torch.Generator().manual_seed(5))
        s2 = s2 + math.sqrt(p.head_dim) * 2.0 ** -24 * s2.abs() * jitter
        w = torch.exp2(s2 - m2)
        outs.append((torch.einsum("hlk,khd->lhd", w, v) / w.sum(-1).T.unsqueeze(-1)).float())
    return {"o": torch.cat(outs)}


def test_right_exp2_fp32_kernel_matches_at_large_logits():
    p = build_problem(dict(dtype="fp32", head_dim=256, num_qo_heads=8, num_kv_heads=2,
                           qo_lens=[1, 1, 1], kv_lens=[45, 130, 77], values="large_logits"), 3)
    ref = attention_reference(p)
    assert float(ref["lse"].max()) > 80
    got = _exp2_kernel(p)
    s = verdict(p, got)
    assert s.ok, s.message
    # Without the logits' own precision in the bound, this right kernel would fail.
    without, _ = output_tolerance(ref["o"], attention_baseline(p)["o"], "fp32", None, 256)
    assert s.max_abs_diff > without, (s.max_abs_diff, without)
