"""The reference against torch SDPA (math backend) and an independent float64 loop."""
import math

import pytest
import torch
import torch.nn.functional as F

from harness.model.problem import build_problem
from harness.model.reference import NoReference, attention_reference, merge_reference, visible_mask
# torch.testing.assert_close's check without its first call's imports (~0.9 CPU-s a process).
from test_kernels_routes import assert_close

BASE = {"dtype": "fp32", "head_dim": 16, "num_qo_heads": 4}

# (id, params): causal / window / GQA / qo_len < kv_len, as data.
SDPA_CASES = [
    ("plain", {"qo_lens": [5], "kv_lens": [5]}),
    ("causal_square", {"qo_lens": [7], "kv_lens": [7], "causal": True}),
    ("causal_q_shorter", {"qo_lens": [3], "kv_lens": [11], "causal": True}),
    ("window", {"qo_lens": [9], "kv_lens": [9], "window_left": 2}),
    ("causal_window", {"qo_lens": [4], "kv_lens": [13], "causal": True, "window_left": 3}),
    ("gqa4", {"qo_lens": [6], "kv_lens": [10], "num_kv_heads": 1, "causal": True}),
    ("gqa2_batch", {"qo_lens": [1, 6, 3], "kv_lens": [4, 6, 17], "num_kv_heads": 2}),
    ("decode", {"qo_lens": [1, 1], "kv_lens": [9, 33], "window_left": 5}),
    ("head_dim_vo", {"qo_lens": [3], "kv_lens": [5], "head_dim_vo": 8}),
    ("sm_scale", {"qo_lens": [3], "kv_lens": [5], "sm_scale": 0.5}),
]


def sdpa_expected(problem):
    """SDPA per request, with the mask as an explicit bool tensor."""
    group = problem.num_qo_heads // problem.num_kv_heads
    outs = []
    for q, k, v, lq, lk in zip(problem.q, problem.k, problem.v, problem.qo_lens, problem.kv_lens):
        mask = visible_mask(lq, lk, problem.causal, problem.window_left)
        qh = q.double().transpose(0, 1)
        kh = k.double().repeat_interleave(group, 1).transpose(0, 1)
        vh = v.double().repeat_interleave(group, 1).transpose(0, 1)
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=problem.sm_scale)
        outs.append(o.transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize("params", [p for _, p in SDPA_CASES], ids=[i for i, _ in SDPA_CASES])
def test_reference_matches_sdpa(params):
    problem = build_problem({**BASE, **params}, seed=1, device="cpu")
    ref = attention_reference(problem)
    assert ref["o"].dtype == torch.float64
    assert_close(ref["o"], sdpa_expected(problem), rtol=1e-10, atol=1e-10)


def loop_reference(problem):
    """Written from the definition, one scalar at a time."""
    group = problem.num_qo_heads // problem.num_kv_heads
    rows_o, rows_lse = [], []
    for q, k, v, lq, lk in zip(problem.q, problem.k, problem.v, problem.qo_lens, problem.kv_lens):
        for i in range(lq):
            o_row, lse_row = [], []
            for h in range(problem.num_qo_heads):
                kh = h // group
                logits = {}
                for j in range(lk):
                    if problem.causal and j > i + lk - lq:
                        continue
                    if problem.window_left >= 0 and j < i + lk - lq - problem.window_left:
                        continue
                    logits[j] = problem.sm_scale * sum(
                        float(q[i, h, d]) * float(k[j, kh, d]) for d in range(problem.head_dim))
                if not logits:
                    o_row.append([0.0] * problem.head_dim_vo)
                    lse_row.append(-math.inf)
                    continue
                m = max(logits.values())
                z = sum(math.exp(s - m) for s in logits.values())
                o_row.append([sum(math.exp(s - m) / z * float(v[j, kh, d]) for j, s in logits.items())
                              for d in range(problem.head_dim_vo)])
                lse_row.append(m + math.log(z))
            rows_o.append(o_row)
            rows_lse.append(lse_row)
    return torch.tensor(rows_o, dtype=torch.float64), torch.tensor(rows_lse, dtype=torch.float64)


LOOP_CASES = [
    ("causal_gqa", {"qo_lens": [3], "kv_lens": [5], "causal": True, "num_kv_heads": 2}),
    ("window_batch", {"qo_lens": [2, 1], "kv_lens": [6, 3], "window_left": 1}),
    ("bf16_vo", {"dtype": "bf16", "qo_lens": [2], "kv_lens": [4], "head_dim_vo": 3}),
]


@pytest.mark.parametrize("params", [p for _, p in LOOP_CASES], ids=[i for i, _ in LOOP_CASES])
def test_reference_matches_scalar_loop(params):
    problem = build_problem({**BASE, "head_dim": 4, "num_qo_heads": 2, **params}, seed=7, device="cpu")
    ref = attention_reference(problem)
    o, lse = loop_reference(problem)
    assert_close(ref["o"], o, rtol=1e-12, atol=1e-12)
    assert_close(ref["lse"], lse, rtol=1e-12, atol=1e-12)


def test_fully_masked_rows_give_zero_and_minus_inf():
    # qo_len > kv_len with causal: the first rows see no kv at all; kv_len 0 sees nothing.
    problem = build_problem({**BASE, "qo_lens": [4, 2], "kv_lens": [2, 0], "causal": True},
                            seed=3, device="cpu")
    ref = attention_reference(problem)
    masked = [0, 1, 4, 5]     # rows of request 0 with i + 2 - 4 < 0, and all of request 1
    assert torch.all(ref["o"][masked] == 0)
    assert torch.all(ref["lse"][masked] == -math.inf)
    assert torch.isfinite(ref["lse"][[2, 3]]).all()
    assert not torch.isnan(ref["o"]).any()


@pytest.mark.parametrize("hq,hkv", [(12, 8), (4, 8)], ids=["12_over_8", "4_over_8"])
def test_undividable_heads_use_the_spread_mapping(hq, hkv):
    problem = build_problem({**BASE, "num_qo_heads": hq, "num_kv_heads": hkv,
                             "qo_lens": [2], "kv_lens": [3]}, seed=0, device="cpu")
    ref = attention_reference(problem)
    # q head h attends kv head h * hkv // hq: check one head against a dense computation.
    h = hq - 1
    kv = h * hkv // hq
    q, k, v = (t.double() for t in (problem.q[0][:, h], problem.k[0][:, kv], problem.v[0][:, kv]))
    p = torch.softmax(q @ k.T * problem.sm_scale, dim=-1)
    assert_close(ref["o"][:, h], p @ v)


def test_no_kv_heads_build_but_have_no_reference():
    problem = build_problem({**BASE, "num_qo_heads": 4, "num_kv_heads": 0,
                             "qo_lens": [2], "kv_lens": [3]}, seed=0, device="cpu")
    assert problem.k[0].shape == (3, 0, 16)
    with pytest.raises(NoReference, match="num_qo_heads=.*num_kv_heads="):
        attention_reference(problem)
    assert issubclass(NoReference, ValueError)


def test_merge_reference_equals_attention_over_the_union():
    whole = build_problem({**BASE, "qo_lens": [3], "kv_lens": [10]}, seed=5, device="cpu")
    parts = []
    for lo, hi in [(0, 4), (4, 10)]:
        part = build_problem({**BASE, "qo_lens": [3], "kv_lens": [hi - lo]}, seed=5, device="cpu")
        part.q, part.k, part.v = whole.q, [whole.k[0][lo:hi]], [whole.v[0][lo:hi]]
        parts.append(attention_reference(part))
    merged = merge_reference(parts[0]["o"], parts[0]["lse"], parts[1]["o"], parts[1]["lse"])
    ref = attention_reference(whole)
    assert_close(merged["o"], ref["o"])
    assert_close(merged["lse"], ref["lse"])


def test_merge_reference_of_two_empty_states():
    v = torch.randn(2, 3, 4)
    s = torch.full((2, 3), -math.inf)
    merged = merge_reference(v, s, v, s)
    assert torch.all(merged["o"] == 0) and torch.all(merged["lse"] == -math.inf)


# build_problem: the inputs the reference reads.

def test_problem_is_bit_for_bit_from_params_and_seed():
    params = {"dtype": "bf16", "head_dim": 8, "num_qo_heads": 2, "qo_lens": [3, 1], "kv_lens": [4, 5],
              "layout": "HND", "page_size": 16}
    a, b = build_problem(params, 11, "cpu"), build_problem(params, 11, "cpu")
    for x, y in zip(a.q + a.k + a.v, b.q + b.k + b.v):
        assert torch.equal(x.view(torch.int16), y.view(torch.int16))
    assert not torch.equal(a.q[0], build_problem(params, 12, "cpu").q[0])
    assert a.params["layout"] == "HND" and a.params["page_size"] == 16
    assert a.params["num_kv_heads"] == 2 and a.head_dim_vo == 8 and a.sm_scale == pytest.approx(8 ** -0.5)
    assert a.qo_indptr.tolist() == [0, 3, 4] and a.kv_indptr.dtype == torch.int32
    assert a.q_packed().shape == (4, 2, 8) and a.v_packed().shape == (9, 2, 8)


@pytest.mark.parametrize("key,value", [
    ("dtype", "fp8"), ("head_dim", 0), ("num_qo_heads", "4"), ("qo_lens", []),
    ("kv_lens", [1, 2]), ("causal", 1), ("window_left", -2), ("sm_scale", -1.0),
    ("num_kv_heads", -1),
], ids=lambda x: str(x))
def test_bad_params_name_key_and_value(key, value):
    params = {"head_dim": 8, "num_qo_heads": 2, "qo_lens": [3], "kv_lens": [4], key: value}
    with pytest.raises(ValueError, match=key):
        build_problem(params, 0, "cpu")


def test_missing_key_is_named():
    with pytest.raises(ValueError, match="head_dim"):
        build_problem({"num_qo_heads": 2, "qo_lens": [3], "kv_lens": [4]}, 0, "cpu")


def test_long_requests_are_computed_in_row_blocks(monkeypatch):
    import harness.model.reference as reference
    problem = build_problem({**BASE, "qo_lens": [9, 0], "kv_lens": [12, 3], "causal": True,
                             "window_left": 4}, seed=2, device="cpu")
    whole = attention_reference(problem)
    monkeypatch.setattr(reference, "_LOGITS_BUDGET", 2 * 4 * 12)    # two rows per block
    blocked = attention_reference(problem)
    # Blocked matmuls may round differently in the last fp64 bits, nothing more.
    assert_close(blocked["o"], whole["o"], rtol=1e-13, atol=1e-13)
    assert_close(blocked["lse"], whole["lse"], rtol=1e-13, atol=1e-13)
    assert whole["o"].shape == (9, 4, 16)


def test_undividable_group_spreads_q_heads_over_every_kv_head():
    from harness.model.reference import kv_head_map
    assert kv_head_map(12, 8).tolist() == [0, 0, 1, 2, 2, 3, 4, 4, 5, 6, 6, 7]
    assert kv_head_map(8, 2).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    with pytest.raises(ValueError, match="num_kv_heads=0"):
        kv_head_map(8, 0)


def test_a_masked_keys_non_finite_v_does_not_reach_the_rows_that_cannot_see_it():
    # Causal, qo_len == kv_len: row i sees keys 0..i. The last key's v is inf and NaN; only
    # the last row sees it. 0 * inf in P @ V would make every row NaN.
    problem = build_problem({**BASE, "qo_lens": [4], "kv_lens": [4], "causal": True},
                            seed=3, device="cpu")
    v = problem.v[0].clone()
    v[3, :, 0], v[3, :, 1] = float("inf"), float("nan")
    problem.v[0] = v
    o = attention_reference(problem)["o"]
    assert torch.isfinite(o[:3]).all(), o[:3, 0, :2]
    assert torch.isinf(o[3, :, 0]).all() and torch.isnan(o[3, :, 1]).all()
    assert torch.isfinite(o[3, :, 2:]).all()
    # A row that sees a NaN v is NaN there, and the finite dims equal the masked-out sum.
    clean = problem.v[0].clone()
    clean[3] = 0.0
    problem.v[0] = clean
    o_clean = attention_reference(problem)["o"]
    assert torch.equal(o[:3], o_clean[:3])
