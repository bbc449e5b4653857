"""Generator reach (issue 12): the values, edge_rows and scale families, what only they expose,
and the library fixes they needed.

  values       every value kind on every route and dtype; large_logits on every split-KV
               schedule, both merges and every decode backend; inputs bit-for-bit from
               (params, seed), normal values unchanged
  edge_rows    rows that see no kv (output 0, LSE -inf), empty requests (no pages), no rows
  scale        8k contexts, 256+ requests, page ids past 65,535 on every paged route;
               profile "full" adds 32k-128k contexts and element offsets past 2^31
  faults       each test-only kernel fault (KERNELS_TESTONLY_FAULT) is caught by the family
               of its axis and by none of valid's normal-values cases (the first of each
               route, variant and dtype)
  plan()       picks a split that fits the float workspace it is given
"""
from __future__ import annotations

import math
import re
from collections import defaultdict

import pytest
import torch

from cases import generate, load_family
from detection_helpers import keep_references
from harness.engine.execute import execute_case
from harness.model.problem import EMIN, build_problem, normalize
from harness.model.reference import attention_reference
from harness.model.routes import BUNDLED_ROUTES, op_of
from harness.targets import load_target
from harness.targets.layout import block_table, build_paged
from kernels.build import detect
from kernels.testonly import KERNEL_FAULT_ENV, KERNEL_FAULTS

NEW = ("values", "edge_rows", "scale")
# route / family.variant / tag
ID = re.compile(r"^[a-z0-9_]+\.[a-z_]+/[a-z_]+\.[a-z0-9_]+/[a-z0-9_.-]+$")
PAGED_ROUTES = [r for r in BUNDLED_ROUTES if op_of(r) in ("paged_prefill", "batch_decode", "mixed_batch")]
SPLIT_ROUTES = [r for r in BUNDLED_ROUTES if op_of(r) in ("paged_prefill", "ragged_prefill", "batch_decode")]
host_only = pytest.mark.skipif(detect()[0] != "host", reason="runs the host library in this process")


@pytest.fixture(scope="module")
def target():
    return load_target("bundled")


@pytest.fixture(scope="module")
def references() -> dict:
    """Each case's reference, computed once for this module's runs of it: the faultless
    run and the fault runs judge the same values and edge_rows cases
    (detection_helpers.keep_references)."""
    return {}


def _by_family(family, **kw):
    module = load_family(family)
    return list(module.cases(BUNDLED_ROUTES, **kw))


# ---------------------------------------------------------------- the families' shape

@pytest.mark.parametrize("family", NEW)
def test_family_ids_params_and_routes(family):
    module = load_family(family)
    cases = _by_family(family)
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids))
    assert all(ID.match(i) and len(i) <= 120 for i in ids), [i for i in ids if not ID.match(i)][:3]
    for c in cases:
        assert c.family == family and c.expect == "match" and op_of(c.route) in module.OPS
        normalize(c.params)
    assert {c.route for c in cases} == set(BUNDLED_ROUTES)


def test_values_cross_every_kind_with_every_route_and_dtype():
    seen = {(c.route, c.params["values"], c.params["dtype"]) for c in _by_family("values")}
    from cases.values import DTYPES, KINDS
    want = {(r, k, d) for r in BUNDLED_ROUTES for k in KINDS for d in DTYPES}
    assert want <= seen, sorted(want - seen)[:5]


def _split(c) -> bool:
    return bool(c.params.get("max_kv_chunk") or c.params.get("use_cuda_graph"))


def test_large_logits_on_every_split_merge_and_decode_route():
    large = [c for c in _by_family("values") if c.params["values"] == "large_logits"]
    split_routes = {c.route for c in large if _split(c)}
    assert set(SPLIT_ROUTES) <= split_routes
    assert {c.params["merge"] for c in large if c.op == "merge_state"} == {"out_of_place", "in_place"}
    assert any(c.params.get("partial_state") for c in large)
    assert any(c.params.get("use_cuda_graph") for c in large if c.op == "ragged_prefill")
    # ll4mi's and aiter's own kernels run without LSE; aiter's split shadow plan with it.
    for backend in ("ll4mi", "aiter"):
        assert any(not c.params["return_lse"] for c in large if c.backend == backend)
    assert any(c.params["return_lse"] and _split(c) for c in large if c.backend == "aiter")


# ---------------------------------------------------------------- values

BASE = dict(head_dim=64, num_qo_heads=4, num_kv_heads=2, qo_lens=[3, 0, 5], kv_lens=[9, 0, 1],
            causal=False)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({torch.float32: torch.int32}.get(t.dtype, torch.int16))


@pytest.mark.parametrize("kind", ["normal", "large_logits", "outlier", "ties", "tiny"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_values_are_bit_for_bit_from_params_and_seed(kind, dtype):
    a = build_problem({**BASE, "dtype": dtype, "values": kind}, 7)
    b = build_problem({**BASE, "dtype": dtype, "values": kind}, 7)
    c = build_problem({**BASE, "dtype": dtype, "values": kind}, 8)
    for x, y in zip(a.q + a.k + a.v, b.q + b.k + b.v):
        assert torch.equal(_bits(x), _bits(y))
    assert not torch.equal(a.q[0], c.q[0])


def test_normal_values_are_the_plain_draws():
    p = build_problem({**BASE, "dtype": "bf16"}, 11)
    gen = torch.Generator().manual_seed(11)
    for q, k, v in zip(p.q, p.k, p.v):
        for t in (q, k, v):
            want = torch.randn(tuple(t.shape), generator=gen, dtype=torch.float32).to(torch.bfloat16)
            assert torch.equal(_bits(t), _bits(want))


def _logits(p):
    q, k = p.q[0].double(), p.k[0].double()
    group = p.num_qo_heads // p.num_kv_heads
    k = k.repeat_interleave(group, 1)
    return torch.einsum("lhd,khd->hlk", q, k) * p.sm_scale


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_large_logits_overflow_exp_without_a_max(dtype):
    p = build_problem({**BASE, "dtype": dtype, "values": "large_logits", "qo_lens": [6, 2],
                       "kv_lens": [40, 3000]}, 3)
    lse = attention_reference(p)["lse"]
    assert 90 <= float(lse.min()) and float(lse.max()) <= 210
    assert float(_logits(p).min()) > math.log(torch.finfo(torch.float32).max)
    spread = _logits(p).std(dim=-1)
    assert float(spread.min()) > 0.5      # not one-hot: the softmax still averages values


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_tiny_q_straddles_the_smallest_normal(dtype):
    p = build_problem({**BASE, "dtype": dtype, "values": "tiny"}, 5)
    q = p.q[0].double().abs()
    smallest = 2.0 ** EMIN[dtype]
    assert bool(((q > 0) & (q < smallest)).any()) and bool((q >= smallest).any())
    assert float(q.max()) < 64 * smallest
    spread = _logits(p).std()
    assert 0.3 < float(spread) < 3     # the softmax is as for normal values


def test_ties_and_outlier_shapes():
    p = build_problem({**BASE, "dtype": "fp16", "values": "ties"}, 2)
    q, k = p.q[0], p.k[0]
    assert all(torch.equal(q[i], q[0]) for i in range(q.shape[0]))
    assert all(torch.equal(k[j], k[j % 2]) for j in range(k.shape[0]))
    n = build_problem({**BASE, "dtype": "fp32"}, 2)
    o = build_problem({**BASE, "dtype": "fp32", "values": "outlier"}, 2)
    mid = n.k[0].shape[0] // 2
    assert torch.equal(o.k[0][mid], n.k[0][mid] * 6) and torch.equal(o.v[0][mid], n.v[0][mid] * 6)
    assert torch.equal(o.q[0][:, -1], n.q[0][:, -1] * 2)


def test_unknown_values_kind_is_a_params_error():
    with pytest.raises(ValueError, match="values"):
        normalize({**BASE, "values": "huge"})


# ---------------------------------------------------------------- edge rows

def test_edge_rows_reach_masked_rows_and_empty_requests():
    by_route = defaultdict(set)
    for c in _by_family("edge_rows"):
        p = build_problem(c.params, c.seed)
        if torch.isinf(attention_reference(p)["lse"]).any():
            by_route[c.route].add("masked")
        if 0 in p.kv_lens and len(p.kv_lens) > 1:
            by_route[c.route].add("empty_in_batch")
        if 0 in p.qo_lens:
            by_route[c.route].add("no_rows")
        if 1 in p.qo_lens and 1 in p.kv_lens:
            by_route[c.route].add("single_token")
    for route in BUNDLED_ROUTES:
        want = {"no_rows"} if op_of(route) == "merge_state" else {"masked"}
        if op_of(route) not in ("single_prefill", "single_decode", "merge_state"):
            want |= {"empty_in_batch", "single_token"}
        assert want <= by_route[route], (route, by_route[route])


def test_an_empty_request_gets_no_pages():
    p = build_problem({**BASE, "dtype": "fp16", "kv_lens": [9, 0, 17]}, 1)
    paged = build_paged(p, 4, offset=70000)
    assert paged.indptr == [0, 3, 3, 8] and paged.last_page_len == [1, 0, 1]
    table = block_table(paged, 3)
    assert table[1] == [0] * 5    # all padding, a NaN page below the offset


# ---------------------------------------------------------------- scale

def _element_offset(p) -> int:
    page = p.get("page_size", 16) * p["num_kv_heads"] * p["head_dim"]
    return (p.get("page_id_offset", 0) + 1) * page


def test_scale_reach():
    ci = _by_family("scale")
    assert {c.route for c in ci if c.params.get("page_id_offset", 0) >= 65536} == set(PAGED_ROUTES)
    assert any(not c.params["return_lse"] and c.params.get("page_id_offset") for c in ci
               if c.backend == "ll4mi")
    assert max(len(c.params["qo_lens"]) for c in ci) >= 256
    assert max(max(c.params["kv_lens"]) for c in ci) >= 8192
    assert max(max(c.params["kv_lens"]) for c in ci) <= 8192    # the host runs ci in seconds
    full = _by_family("scale", profile="full")
    extra = {c.id for c in full} - {c.id for c in ci}
    assert extra and {c.id for c in ci} <= {c.id for c in full}
    assert max(max(c.params["kv_lens"]) for c in full) >= 131072
    past = {c.route for c in full if _element_offset(c.params) > 2 ** 31}
    assert past == set(PAGED_ROUTES)
    with pytest.raises(ValueError, match="profile"):
        _by_family("scale", profile="nightly")


# ---------------------------------------------------------------- the families pass
#
# Judged in this process as a worker judges them (execute_case), with the xdist worker's one
# OpenMP thread (conftest.py): the cases are the subject, not the process that runs them.
# `harness check` on the bundled families, its pytest child and rows, is exercised by
# test_features_detection's check-child test and the system tier.

@host_only
def test_new_families_pass_with_guards_on(target, monkeypatch, references):
    for k in ("KERNELS_DISABLE_GUARDS", KERNEL_FAULT_ENV, "KERNELS_TESTONLY"):
        monkeypatch.delenv(k, raising=False)
    keep_references(references, monkeypatch)
    cases = generate(NEW)
    assert cases
    results = [(c, execute_case(c, target, "cpu")) for c in cases]
    not_matched = [(c.id, r.outcome, r.message[:80]) for c, r in results if r.outcome != "match"]
    assert not not_matched, not_matched[:5]


# ---------------------------------------------------------------- what only one axis exposes

# fault -> (the family that must catch it, a predicate on the params of the cases that may
#           fail, the routes on which some case must fail)
MERGING = {"fa2.paged_prefill", "fa2.ragged_prefill", "fa2.batch_decode", "fa2_tc.batch_decode",
           "aiter.batch_decode", "fa2.merge_state"}
EXPOSED_BY = {
    "merge_no_max": ("values", lambda p: p["values"] == "large_logits", MERGING),
    "softmax_no_max": ("values", lambda p: p["values"] == "large_logits", set(BUNDLED_ROUTES)),
    # merge_state too: edge_rows' merge_empty states are over no key (their rows see nothing).
    "empty_skipped": ("edge_rows", lambda p: 0 in p["kv_lens"] or bool(p.get("merge_empty")),
                      set(BUNDLED_ROUTES)),
    "masked_row_nan": ("edge_rows", lambda p: True, set(BUNDLED_ROUTES)),
}


def test_every_kernel_fault_has_an_axis():
    assert set(EXPOSED_BY) == set(KERNEL_FAULTS)


def _first_of_each_route_variant_and_dtype(cases) -> list:
    """The first case (generation order) of each (route, variant, dtype)."""
    kept: dict = {}
    for c in cases:
        kept.setdefault((c.route, c.variant, c.params["dtype"]), c)
    return list(kept.values())


def _rows_under_fault(family, fault, target, monkeypatch, references) -> list[dict]:
    """Each case's row fields, judged here as a worker would (execute_case) with the
    test-only library's `fault` active in this process (testonly.fault_library): no check
    child per fault. That a check child picks a fault up from its environment is
    test_features_detection's test_a_check_child_with_the_fault_in_its_environment_... .

    Every case of `family` runs: its cases are the detection, and those the fault must not
    reach are its controls. Of valid, the first case of each route, variant and dtype
    (about half of them): they show normal values miss the fault on every route, in every
    dtype, for every kind of valid case. What is left out is most of valid's grid, more
    lengths and head dims of the same normal values on the two single routes; values' own
    normal cases, run in full, cross every route with every dtype."""
    from kernels import testonly
    for k in ("KERNELS_DISABLE_GUARDS", KERNEL_FAULT_ENV):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("KERNELS_TESTONLY", "1")
    keep_references(references, monkeypatch)
    cases = _first_of_each_route_variant_and_dtype(generate(("valid",))) + generate((family,))
    with testonly.fault_library(fault):
        results = [(c, execute_case(c, target, "cpu")) for c in cases]
    return [{"case_id": c.id, "family": c.family, "route": c.route, "params": c.params,
             "pass": r.passed, "outcome": r.outcome} for c, r in results]


@host_only
@pytest.mark.parametrize("fault", KERNEL_FAULTS)
def test_fault_is_caught_by_its_family_and_missed_by_normal_values(fault, target, monkeypatch,
                                                                   references):
    family, may_fail, routes = EXPOSED_BY[fault]
    rows = _rows_under_fault(family, fault, target, monkeypatch, references)
    failing = [r for r in rows if not r["pass"]]
    assert failing
    # every route's valid cases ran beside the family's
    assert {r["route"] for r in rows if r["family"] == "valid"} == set(BUNDLED_ROUTES)
    missed = [r["case_id"] for r in failing if r["family"] == "valid"]
    assert not missed, missed[:5]     # valid's N(0, 1), non-empty rows never reach the fault
    assert {r["route"] for r in failing} == routes
    assert all(may_fail(r["params"]) for r in failing), [r["case_id"] for r in failing][:5]
    assert {r["outcome"] for r in failing} <= {"wrong", "crash"}


@host_only
def test_a_bad_fault_setting_is_refused_naming_it(monkeypatch):
    from kernels import testonly
    monkeypatch.delenv("KERNELS_TESTONLY", raising=False)
    with pytest.raises(ValueError, match="KERNELS_TESTONLY=1"):
        testonly.use_fault_library("merge_no_max")
    monkeypatch.setenv("KERNELS_TESTONLY", "1")
    with pytest.raises(ValueError, match="unknown"):
        testonly.use_fault_library("no_such")


# ---------------------------------------------------------------- plan() fits the workspace

def _paged(kv_lens, page_size=16):
    pages = [-(-n // page_size) for n in kv_lens]
    indptr = [0]
    for n in pages:
        indptr.append(indptr[-1] + n)
    last = [n - (c - 1) * page_size if c else 0 for n, c in zip(kv_lens, pages)]
    return (torch.tensor(indptr, dtype=torch.int32), torch.arange(indptr[-1], dtype=torch.int32),
            torch.tensor(last, dtype=torch.int32))


def _plan(wrapper, qo_lens, kv_lens, **kw):
    qo = torch.tensor([0, *torch.tensor(qo_lens).cumsum(0).tolist()], dtype=torch.int32)
    wrapper.plan(qo, *_paged(kv_lens), 32, 8, 128, 16, causal=True, q_data_type=torch.bfloat16, **kw)
    return wrapper.plan_info


@host_only
def test_plan_fits_a_32k_prefill_into_the_default_workspace():
    import kernels
    from harness.targets.plan_run.call import WORKSPACE_BYTES
    ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8)
    w = kernels.BatchPrefillWithPagedKVCacheWrapper(ws)
    assert _plan(w, [32768], [32768]).split is False    # before: refused (34,628,173,824 bytes)
    info = _plan(w, [64, 7], [32768, 900])
    assert info.split and info.chunk > 512                  # as fine a split as fits
    # A caller's max_kv_chunk is kept, and refused when its schedule cannot fit.
    with pytest.raises(ValueError, match=r"workspace_buffer is 33554432 bytes but the schedule needs \d+"):
        _plan(w, [32768], [32768], max_kv_chunk=512)
    # A CUDA-graph plan always splits: refused only when even one chunk per request cannot fit.
    g = kernels.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8),
                                                    use_cuda_graph=True)
    with pytest.raises(ValueError, match="schedule needs 541065216"):
        _plan(g, [32768], [32768])


@host_only
def test_a_fitted_split_computes_the_same_answer(target, monkeypatch):
    import kernels
    from harness.model.case import Case
    monkeypatch.delenv(KERNEL_FAULT_ENV, raising=False)
    params = dict(dtype="fp16", head_dim=64, num_qo_heads=4, num_kv_heads=2, qo_lens=[8, 3],
                  kv_lens=[3000, 700], causal=True, return_lse=True, page_size=16)
    # 32 KiB holds 31 partial rows of 4 heads x 65 floats: the default chunk (512) needs 54,
    # 1024 needs 27, so plan() splits at 1024.
    ws = 32 << 10
    w = kernels.BatchPrefillWithPagedKVCacheWrapper(torch.empty(ws, dtype=torch.uint8))
    qo = torch.tensor([0, 8, 11], dtype=torch.int32)
    w.plan(qo, *_paged(params["kv_lens"]), 4, 2, 64, 16, causal=True)
    assert (w.plan_info.split, w.plan_info.chunk) == (True, 1024)
    case = Case(route="fa2.paged_prefill", family="scale", variant="fit", tag="t",
                params={**params, "workspace_bytes": ws})
    r = execute_case(case, target, "cpu")
    assert r.outcome == "match", r.message
