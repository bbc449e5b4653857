"""The features in the harness's model (issue 25): params, problem, fp64 reference, tolerance,
the family and the adapters' mapping.

The reference is checked against a scalar loop written from kernels/README.md's order (soft
cap, ALiBi, masks, sinks), one logit at a time, so an einsum or a broadcast in
reference.py that put a feature in the wrong place or on the wrong head shows.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest
import torch

from cases import generate, load_family
from harness.engine.execute import execute_case
from harness.model.case import Case
from harness.model.params import MUST_READ, SCHEMA, ReadParams
from harness.model.problem import FP8_DTYPES, build_problem, normalize, quantize
from harness.model.reference import attention_baseline, attention_reference, kv_head_map
from harness.model.routes import BUNDLED_ROUTES, op_of
from harness.model.tolerance import output_tolerance
from harness.targets import load_target
from kernels.build import detect

host_only = pytest.mark.skipif(detect()[0] != "host", reason="runs the host library in this process")

FEATURE_KEYS = ("logits_soft_cap", "sinks", "alibi_slopes", "kv_dtype", "k_scale", "v_scale",
                "q_len_per_req", "custom_mask")
BASE = dict(dtype="fp32", head_dim=8, num_qo_heads=4, num_kv_heads=2, qo_lens=[3, 4],
            kv_lens=[5, 2], causal=True)


# ---------------------------------------------------------------- params and problem

def test_every_feature_key_is_documented_problem_and_must_read():
    for key in FEATURE_KEYS:
        assert SCHEMA[key].problem and len(SCHEMA[key].doc) > 30, key
        assert key in MUST_READ, key
    assert "malformed" in SCHEMA and "malformed" in MUST_READ
    read = ReadParams({"sinks": True, "kv_dtype": "fp8_e4m3", "custom_mask": "tree",
                       "q_len_per_req": 2, "malformed": {"field": "sinks", "length": 3}})
    assert read.unread() == ["custom_mask", "kv_dtype", "malformed", "q_len_per_req", "sinks"]
    read.get("sinks")
    assert "sinks" not in read.unread()


def test_feature_values_are_seeded_given_or_absent_and_leave_qkv_alone():
    plain = build_problem(BASE, 7)
    feat = build_problem({**BASE, "sinks": True, "alibi_slopes": True,
                          "custom_mask": "random", "causal": False}, 7)
    for a, b in zip(plain.q + plain.k + plain.v, feat.q + feat.k + feat.v):
        assert torch.equal(a, b)
    again = build_problem({**BASE, "sinks": True, "alibi_slopes": True}, 7)
    other = build_problem({**BASE, "sinks": True, "alibi_slopes": True}, 8)
    assert torch.equal(feat.sinks, again.sinks) and torch.equal(feat.alibi_slopes, again.alibi_slopes)
    assert not torch.equal(feat.sinks, other.sinks)
    assert feat.sinks.dtype == feat.alibi_slopes.dtype == torch.float32
    assert plain.sinks is None and plain.alibi_slopes is None and plain.custom_mask is None
    given = build_problem({**BASE, "sinks": [0.5, -1.0, 2.0, 3.0]}, 7)
    assert given.sinks.tolist() == [0.5, -1.0, 2.0, 3.0]
    # The heads of one GQA group get different slopes: kv-head slopes would differ.
    heads = kv_head_map(4, 2)
    assert not torch.equal(feat.alibi_slopes, feat.alibi_slopes[heads * 2])
    assert [tuple(m.shape) for m in feat.custom_mask] == [(3, 5), (4, 2)]


@pytest.mark.parametrize("bad, word", [
    ({"sinks": [1.0, 2.0]}, "sinks"), ({"alibi_slopes": "yes"}, "alibi_slopes"),
    ({"kv_dtype": "fp4"}, "kv_dtype"), ({"k_scale": 0}, "k_scale"),
    ({"q_len_per_req": 2}, "qo_lens"), ({"q_len_per_req": 3, "qo_lens": [3, 3], "causal": False},
                                        "causal"),
    ({"custom_mask": "diagonal"}, "custom_mask"), ({"logits_soft_cap": -1.0}, "logits_soft_cap"),
    ({"kv_dtype": "fp8_e4m3", "values": "tiny"}, "values"),
])
def test_bad_feature_params_are_refused_naming_the_key(bad, word):
    with pytest.raises(ValueError, match=re.escape(repr(word))):
        normalize({**BASE, **bad})


def test_tree_mask_is_a_prefix_then_ancestors():
    p = build_problem({**BASE, "qo_lens": [6], "kv_lens": [10], "causal": False,
                       "custom_mask": "tree"}, 3)
    m = p.custom_mask[0]
    assert m[:, :4].all()                                  # the prefix every row sees
    tree = m[:, 4:]
    assert tree.diagonal().all() and not tree.triu(1).any()   # itself, ancestors only (below)
    # Ancestry is transitive: a row sees everything its nearest ancestor sees.
    for t in range(1, 6):
        parent = max(j for j in range(t) if tree[t, j])
        assert torch.equal(tree[t, :parent + 1], tree[parent, :parent + 1])


@pytest.mark.parametrize("fmt", sorted(FP8_DTYPES))
def test_fp8_stores_saturated_bytes_and_the_reference_dequantizes_them(fmt):
    top = torch.finfo(FP8_DTYPES[fmt]).max
    params = {**BASE, "head_dim": 32, "kv_lens": [64, 40], "qo_lens": [3, 4],
              "kv_dtype": fmt, "k_scale": 2.0 / top, "v_scale": 3.0 / top}
    p = build_problem(params, 11)
    drawn = build_problem({**params, "kv_dtype": None, "k_scale": 1.0, "v_scale": 1.0}, 11)
    for stored, x, scale in ((p.k, drawn.k, p.k_scale), (p.v, drawn.v, p.v_scale)):
        for s, d in zip(stored, x):
            assert s.dtype == FP8_DTYPES[fmt]
            assert torch.equal(s.view(torch.uint8), quantize(d, scale, s.dtype).view(torch.uint8))
            past = (d / scale).abs() > top
            assert past.any(), "the case must reach past the format's max"
            assert (s.float()[past].abs() == top).all()      # saturated, never inf or NaN
            assert torch.isfinite(s.float()).all()
    ref = attention_reference(p)
    exact = replace(p, k=[s.double() * p.k_scale for s in p.k],
                    v=[s.double() * p.v_scale for s in p.v], k_scale=1.0, v_scale=1.0,
                    kv_dtype=torch.float64)
    want = attention_reference(exact)
    assert torch.allclose(ref["o"], want["o"], rtol=0, atol=1e-12)
    assert torch.allclose(ref["lse"], want["lse"], rtol=0, atol=1e-12)


@pytest.mark.parametrize("fmt", sorted(FP8_DTYPES))
def test_fp8_bound_holds_the_kernel_rounding_but_not_the_quantization(fmt):
    """The bound comes from the baseline over the same stored bytes: it has no fp8 term, so
    an answer from the values before quantization (a cache that was never fp8) fails."""
    params = {**BASE, "dtype": "bf16", "head_dim": 64, "kv_lens": [48, 30], "qo_lens": [5, 3],
              "kv_dtype": fmt, "k_scale": 0.0625, "v_scale": 0.03}
    p = build_problem(params, 5)
    ref, base = attention_reference(p), attention_baseline(p)
    tol, base_err = output_tolerance(ref["o"], base["o"], "bf16", ref["lse"], 64)
    assert (base["o"].double() - ref["o"]).abs().max() <= tol
    unquantized = build_problem({**params, "kv_dtype": None, "k_scale": 1.0, "v_scale": 1.0}, 5)
    drift = (attention_reference(unquantized)["o"] - ref["o"]).abs().max()
    assert drift > 3 * tol, (float(drift), tol, base_err)


# ---------------------------------------------------------------- the reference, one logit at a time

def _scalar_reference(p):
    """o, lse by loops: kernels/README.md's order, written out per (request, row, head, key)."""
    outs, lses = [], []
    heads = kv_head_map(p.num_qo_heads, p.num_kv_heads).tolist()
    masks = p.custom_mask or [None] * p.batch_size
    for q, k, v, lq, lk, cm in zip(p.q, p.k, p.v, p.qo_lens, p.kv_lens, masks):
        o = torch.zeros(lq, p.num_qo_heads, p.head_dim_vo, dtype=torch.float64)
        lse = torch.zeros(lq, p.num_qo_heads, dtype=torch.float64)
        for i in range(lq):
            pos = i + lk - lq
            for h in range(p.num_qo_heads):
                kv = heads[h]
                logits, rows = [], []
                for j in range(lk):
                    if p.causal and j > pos:
                        continue
                    if p.window_left >= 0 and j < pos - p.window_left:
                        continue
                    if cm is not None and not bool(cm[i, j]):
                        continue
                    s = sum(float(q[i, h, d]) * float(k[j, kv, d]) * p.k_scale
                            for d in range(p.head_dim)) * p.sm_scale
                    if p.logits_soft_cap > 0:
                        s = p.logits_soft_cap * math.tanh(s / p.logits_soft_cap)
                    if p.alibi_slopes is not None:
                        s += float(p.alibi_slopes[h]) * (j - pos)
                    logits.append(s)
                    rows.append(v[j, kv].double() * p.v_scale)
                terms = [math.exp(s) for s in logits]
                if p.sinks is not None:
                    denom = sum(terms) + math.exp(float(p.sinks[h]))
                else:
                    denom = sum(terms)
                if denom == 0:
                    lse[i, h] = float("-inf")
                    continue
                lse[i, h] = math.log(denom)
                for w, row in zip(terms, rows):
                    o[i, h] += (w / denom) * row
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


SCALAR_CASES = {
    "softcap": {"logits_soft_cap": 0.7},
    "alibi": {"alibi_slopes": [0.5, 0.25, 0.125, 1.0]},
    "alibi_noncausal": {"alibi_slopes": True, "causal": False},
    "sinks_masked_rows": {"sinks": [0.3, -1.0, 2.0, 0.0], "qo_lens": [5, 2], "kv_lens": [2, 0]},
    "window_all": {"logits_soft_cap": 1.5, "alibi_slopes": True, "sinks": True,
                   "window_left": 1},
    "custom_mask": {"custom_mask": "random_empty_row", "causal": False, "sinks": True},
    "tree_mask": {"custom_mask": "tree", "causal": False, "alibi_slopes": True},
    "multi_token": {"q_len_per_req": 3, "qo_lens": [3, 3], "kv_lens": [5, 2],
                    "alibi_slopes": True},
    "fp8_scaled": {"kv_dtype": "fp8_e5m2", "k_scale": 0.25, "v_scale": 0.5,
                   "logits_soft_cap": 2.0},
}


@pytest.mark.parametrize("name", SCALAR_CASES)
def test_reference_agrees_with_a_scalar_loop(name):
    p = build_problem({**BASE, **SCALAR_CASES[name]}, 21)
    ref = attention_reference(p)
    o, lse = _scalar_reference(p)
    assert torch.allclose(ref["o"], o, rtol=0, atol=1e-10)
    assert torch.equal(torch.isinf(ref["lse"]), torch.isinf(lse))
    finite = torch.isfinite(lse)
    assert torch.allclose(ref["lse"][finite], lse[finite], rtol=0, atol=1e-10)


def test_a_masked_row_with_a_sink_has_output_zero_and_the_sink_as_lse():
    p = build_problem({**BASE, "qo_lens": [5], "kv_lens": [2], "sinks": [0.3, -1.0, 2.0, 0.0]}, 1)
    ref = attention_reference(p)
    assert (ref["o"][:3] == 0).all()                       # rows 0..2 see no key
    assert torch.allclose(ref["lse"][:3], p.sinks.double().expand(3, 4))
    assert (ref["o"][3:] != 0).any()


def test_softcap_never_lets_a_masked_key_in():
    """Capping before masking: a masked key has no logit at all, not -cap."""
    p = build_problem({**BASE, "qo_lens": [2], "kv_lens": [6], "logits_soft_cap": 0.5}, 2)
    capped = attention_reference(p)
    first = attention_reference(replace(p, qo_lens=[1], kv_lens=[5], q=[p.q[0][:1]],
                                        k=[p.k[0][:5]], v=[p.v[0][:5]]))
    assert torch.allclose(capped["o"][0], first["o"][0], rtol=0, atol=1e-12)


def test_alibi_reads_the_q_heads_slope_bottom_right():
    slopes = [0.0, 1.0, 0.0, 2.0]
    p = build_problem({**BASE, "qo_lens": [1], "kv_lens": [4], "causal": False,
                       "alibi_slopes": slopes}, 4)
    ref, plain = attention_reference(p), attention_reference(replace(p, alibi_slopes=None))
    # A decode row sits at the last key: slope 0 heads are untouched, the others differ.
    assert torch.allclose(ref["o"][:, 0], plain["o"][:, 0]) and torch.allclose(ref["o"][:, 2], plain["o"][:, 2])
    assert not torch.allclose(ref["o"][:, 1], plain["o"][:, 1])
    # Every bias is <= 0 there, so the LSE can only fall.
    assert (ref["lse"] <= plain["lse"] + 1e-12).all()


# ---------------------------------------------------------------- the family

def test_family_reaches_every_feature_on_every_route_that_carries_it():
    from cases.features import ROUTES_OF
    cases = list(load_family("features").cases(BUNDLED_ROUTES))
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids))
    assert all(len(i) <= 120 for i in ids)
    for feature, ops in ROUTES_OF.items():
        routes = {c.route for c in cases if feature in c.requires and c.expect == "match"}
        assert routes == {r for r in BUNDLED_ROUTES if op_of(r) in ops}, feature
        dtypes = {c.params["dtype"] for c in cases if feature in c.requires}
        assert dtypes == {"fp16", "bf16", "fp32"}, feature
    for c in cases:
        normalize(c.params)
        used = build_problem(c.params, c.seed).features()
        # requires also names what the call needs (a caller's split), not only the problem's
        # features: only the production features must be the problem's own.
        calls = {r for r in c.requires if r.startswith("metadata.")} | {"split_control", "plan_run", "graphs", "partial_state", "restage"}
        assert used == set(c.requires) - calls, c.id
    alibi_gqa = [c for c in cases if "alibi" in c.requires
                 and c.params["num_qo_heads"] != c.params["num_kv_heads"]]
    assert alibi_gqa
    sat = [c for c in cases if "saturated" in c.variant]
    assert {c.params["kv_dtype"] for c in sat} == set(FP8_DTYPES)


def test_adversarial_variants_name_the_field_and_the_values():
    refuse = [c for c in generate(["features"]) if c.expect == "refuse"]
    variants = {c.variant for c in refuse}
    assert {"refuse.sinks_too_long", "refuse.sinks_too_short", "refuse.alibi_per_kv_head",
            "refuse.k_scale_per_head", "refuse.v_scale_per_head", "refuse.q_rows_not_multiple",
            "refuse.mask_one_short", "refuse.mask_one_long", "refuse.mask_with_causal"} <= variants
    for c in refuse:
        assert len(c.refuse_words) >= 2, c.id
        field = c.refuse_words[0]
        assert field in c.params or field == (c.params.get("malformed") or {}).get("field"), c.id


def test_ci_profile_stays_small_and_full_runs_every_variant_in_every_dtype():
    ci = generate(["features"], profile="ci")
    full = generate(["features"], profile="full")
    # each variant with and without the LSE, plus the feature x split covering set
    # (features.cover.*: 286 cases)
    assert len(ci) <= 1200
    assert {c.id for c in ci} <= {c.id for c in full}
    dtypes = {}
    for c in full:
        # the covering set picks its dtypes per pair (each pair in two dtypes), by design
        if c.expect == "match" and not c.variant.startswith("cover."):
            dtypes.setdefault((c.route, c.variant), set()).add(c.params["dtype"])
    assert all(d == {"fp16", "bf16", "fp32"} for d in dtypes.values())


# ---------------------------------------------------------------- adapters

@host_only
def test_a_feature_a_route_lacks_is_skipped_unless_a_refusal_is_expected():
    target = load_target("bundled")
    params = {**BASE, "dtype": "bf16", "head_dim": 64, "kv_dtype": "fp8_e4m3"}
    valid = Case("fa2.ragged_prefill", "t", "fp8", params)
    res = execute_case(valid, target, "cpu")
    assert res.outcome == "skipped" and "fp8_kv" in res.message and "ragged_prefill" in res.message
    refused = Case("fa2.ragged_prefill", "t", "fp8", params, expect="refuse",
                   refuse_words=("float8_e4m3fn",))
    res = execute_case(refused, target, "cpu")
    assert res.outcome == "refused" and res.passed, res.message
    no_arg = Case("fa2.batch_decode", "t", "mask",
                  {**params, "kv_dtype": None, "qo_lens": [1, 1], "causal": False,
                   "custom_mask": "random"}, expect="refuse", refuse_words=("custom_mask",))
    res = execute_case(no_arg, target, "cpu")
    assert res.outcome == "skipped" and "custom_mask" in res.message


def test_a_target_without_the_feature_skips_it_by_capability():
    sdpa = load_target("torch-sdpa")
    case = Case("sdpa_math.single_prefill", "t", "sinks",
                {**BASE, "qo_lens": [3], "kv_lens": [5], "sinks": True}, requires=("sinks",))
    res = execute_case(case, sdpa, "cpu")
    assert res.outcome == "skipped" and "feature sinks" in res.message


def test_torch_sdpa_alibi_is_the_reference_through_a_float_mask():
    sdpa = load_target("torch-sdpa")
    for causal, qo in ((True, 5), (False, 3), (True, 4)):
        case = Case("sdpa_math.single_prefill", "t", f"alibi{causal}{qo}",
                    {**BASE, "qo_lens": [qo], "kv_lens": [4 if qo == 4 else 7], "causal": causal,
                     "alibi_slopes": True, "head_dim": 16}, requires=("alibi",))
        res = execute_case(case, sdpa, "cpu")
        assert res.outcome == "match", res.message
    half = Case("sdpa_math.single_prefill", "t", "alibi_bf16",
                {**BASE, "dtype": "bf16", "qo_lens": [3], "kv_lens": [7], "alibi_slopes": True},
                requires=("alibi",))
    res = execute_case(half, sdpa, "cpu")
    assert res.outcome == "skipped" and "rounds the bias" in res.message


@host_only
def test_an_adapter_that_drops_a_feature_is_a_harness_error():
    """A target whose calls never pass the sinks (and never read the key) ran another case."""
    from harness.targets.bundled import BundledCall, BundledTarget
    from harness.targets.plan_run import dispatch

    class DropsSinks(BundledCall):
        def run_features_kw(self):
            return {}

        def call_features_kw(self, mask):
            return {}

    class Target(BundledTarget):
        def run(self, case, problem, buffers):
            return dispatch.run(DropsSinks(case, problem, buffers, self.capabilities.features))

    case = Case("fa2.single_prefill", "t", "sinks",
                {**BASE, "dtype": "bf16", "head_dim": 64, "qo_lens": [3], "kv_lens": [9],
                 "values": "large_logits", "sinks": True}, requires=("sinks",))
    res = execute_case(case, Target(), "cpu")
    assert res.outcome == "harness_error" and "sinks" in res.message


def test_flaggems_passes_softcap_and_q_head_slopes_and_skips_another_alibi_convention():
    from harness.targets import flaggems as fg_target

    class Recording:
        __version__ = "0.0-rec"

        def __init__(self):
            self.kw = []

        def flash_attn_varlen_func(self, q, k, v, *args, out=None, return_softmax_lse=False,
                                   **kw):
            self.kw.append(kw)
            out.zero_()
            return (out, torch.zeros(q.shape[1], q.shape[0])) if return_softmax_lse else out

    rec = Recording()
    target = fg_target.make_target(rec, device="cpu")
    params = {**BASE, "dtype": "bf16", "head_dim": 64, "qo_lens": [3], "kv_lens": [9],
              "logits_soft_cap": 2.0, "alibi_slopes": True}
    execute_case(Case("fg.single_prefill", "t", "both", params,
                      requires=("alibi", "softcap")), target, "cpu")
    (kw,) = rec.kw
    p = build_problem(params, Case("fg.single_prefill", "t", "both", params).seed)
    assert kw["softcap"] == 2.0 and torch.equal(kw["alibi_slopes"], p.alibi_slopes)
    plain = {k: v for k, v in params.items() if k not in ("logits_soft_cap", "alibi_slopes")}
    execute_case(Case("fg.single_prefill", "t", "plain", plain), target, "cpu")
    assert "softcap" not in rec.kw[-1] and "alibi_slopes" not in rec.kw[-1]
    res = execute_case(Case("fg.single_prefill", "t", "noncausal", {**params, "causal": False},
                            requires=("alibi", "softcap")), target, "cpu")
    assert res.outcome == "skipped" and "convention" in res.message and len(rec.kw) == 2


def _plain_greedy(op: str) -> tuple:
    """The covering rows as the plain greedy picks them: every candidate re-scored per row."""
    import itertools
    from cases import features
    levels = features._levels(op)
    names = tuple(levels)
    candidates = list(itertools.product(*levels.values()))
    at = names.index("dtype")
    seen = {pr: set() for row in candidates for pr in features._pairs(row, names)}
    rows = []
    while any(len(d) < 2 for d in seen.values()):
        best = max(candidates, key=lambda row: sum(
            1 for pr in features._pairs(row, names) if len(seen[pr]) < 2 and row[at] not in seen[pr]))
        for pr in features._pairs(best, names):
            seen[pr].add(best[at])
        rows.append(dict(zip(names, best)))
    return tuple(rows)


@pytest.mark.parametrize("op", ["single_prefill", "batch_decode"])
def test_the_lazy_covering_picks_the_plain_greedys_rows(op):
    # Case ids name the rows' order: the faster pick must be the same pick.
    from cases import features
    assert features.covering_rows(op) == _plain_greedy(op)
