"""Kernel reach: the ci profile holds the cases that take the bundled kernels' rare branches
(results/coverage/coverage.txt lists the rest, each with a comment at its line saying why no
input reaches it). Lists cases only, runs none: removing one of these fails here.

  value conversions   fp16 inf/NaN in and out, bf16 NaN out (values nonfinite_v), an E4M3FN
                      cache's NaN byte 0x7f (nonfinite_v / nan_k on fp8_e4m3), fp16 subnormal
                      rounding ties (subnormal_v, v_scale 0.5, window 0: one key a row)
  NaN rows            a NaN logit (nan_k) unsplit, split, in a graph plan (one NaN partial
                      merged alone), behind a window (the last chunk only), on ll4mi, and a
                      NaN state merged with an empty one (merge_state)
  sizes               a merge over no rows, a split batch without rows, a split batch's
                      masked rows without an lse
  plans               a graph re-plan whose kv outgrows the fixed work items; a caller's
                      max_kv_chunk of 0 and below, refused naming it
"""
from __future__ import annotations

import pytest

from cases import generate
from harness.model.problem import VALUES
from harness.model.routes import BUNDLED_ROUTES, op_of


# The families the tests below look in; each family's cases are its own (generate keeps no
# state between families), so these are exactly the ci profile's cases of them.
FAMILIES = ("values", "edge_rows", "graph_replan", "schedule")


@pytest.fixture(scope="module")
def ci():
    return generate(FAMILIES, BUNDLED_ROUTES, profile="ci")


def _where(ci, family, **want):
    """Cases of the family whose params have every (key, value) of want (a callable: a test)."""
    out = []
    for c in ci:
        if c.family != family:
            continue
        p = c.params
        if all(v(p.get(k)) if callable(v) else p.get(k) == v for k, v in want.items()):
            out.append(c)
    return out


def _ops(cases) -> set:
    return {op_of(c.route) for c in cases}


def test_edge_value_kinds_are_drawn():
    for kind in ("nonfinite_v", "nan_k", "subnormal_v"):
        assert kind in VALUES


def test_nonfinite_v_meets_fp16_and_bf16_on_every_attention_op(ci):
    ops = {"single_prefill", "single_decode", "paged_prefill", "ragged_prefill", "batch_decode",
           "mixed_batch"}
    for dtype in ("fp16", "bf16"):
        got = _where(ci, "values", values="nonfinite_v", dtype=dtype, kv_dtype=None)
        assert _ops(got) >= ops, (dtype, _ops(got))
        assert all(c.expect == "match" for c in got)


def test_fp8_nan_encodings_are_in_a_cache(ci):
    for fmt in ("fp8_e4m3", "fp8_e5m2"):
        got = _where(ci, "values", values="nonfinite_v", kv_dtype=fmt)
        assert got, fmt
        assert all("fp8_kv" in c.requires for c in got)
    assert _where(ci, "values", values="nan_k", kv_dtype="fp8_e4m3")


def test_subnormal_ties_are_one_key_a_row_at_half_scale(ci):
    got = _where(ci, "values", values="subnormal_v", dtype="fp16", v_scale=0.5, window_left=0,
                 causal=True)
    assert got and all("fp8_kv" in c.requires for c in got)


def test_nan_logits_reach_every_merge_path(ci):
    nan = lambda **w: _where(ci, "values", values="nan_k", **w)  # noqa: E731
    assert {"paged_prefill", "ragged_prefill"} <= _ops(nan(max_kv_chunk=8, window_left=-1))
    assert {"paged_prefill", "ragged_prefill"} <= _ops(nan(max_kv_chunk=8, window_left=3))
    graph = nan(use_cuda_graph=True)
    assert {"paged_prefill", "ragged_prefill", "batch_decode"} <= _ops(graph)
    # A graph plan always splits; a request within one chunk leaves its rows one (NaN) partial.
    assert all(any(0 < k <= c.params["max_kv_chunk"] for k in c.params["kv_lens"]) for c in graph)
    assert any(c.route.startswith("ll4mi.") for c in nan(return_lse=False))
    # merge_state: the NaN state (a, over the NaN key) beside an empty one (b), both merges.
    assert {c.params["merge"] for c in nan(merge_empty="b")} == {"out_of_place", "in_place"}


def test_sizes_without_rows(ci):
    merges = _where(ci, "edge_rows", merge=lambda m: m is not None,
                    qo_lens=lambda q: q is not None and sum(q) == 0)
    assert {c.params["merge"] for c in merges} == {"out_of_place", "in_place"}
    split = _where(ci, "edge_rows", max_kv_chunk=lambda m: bool(m),
                   qo_lens=lambda q: q is not None and sum(q) == 0)
    assert {"paged_prefill", "ragged_prefill"} <= _ops(split)
    nolse = [c for c in _where(ci, "edge_rows", max_kv_chunk=4, return_lse=False)
             if c.variant == "batch_split_nolse"]
    assert {"paged_prefill", "ragged_prefill", "batch_decode"} <= _ops(nolse)


def test_graph_replan_outgrows_the_work_items(ci):
    got = [c for c in ci if c.family == "graph_replan" and c.variant == "kv_outgrows_work"]
    assert got and all(c.expect == "match" for c in got)
    for c in got:
        p, cap = c.params, c.params["capacity"]
        chunk, page = p["max_kv_chunk"], p["page_size"]
        items = lambda kv: sum(max(1, -(-k // chunk)) for k in kv)  # noqa: E731
        pages = lambda kv: sum(-(-k // page) for k in kv)  # noqa: E731
        fixed = max(items(cap["kv_lens"]), 4 * len(cap["kv_lens"]))  # _plan.py's work capacity
        assert items(p["kv_lens"]) > fixed and pages(p["kv_lens"]) <= pages(cap["kv_lens"])
        # No prefix state: the paged tail the re-plan splits is the whole kv.
        assert p["qo_lens"] == cap["qo_lens"] and p["prefix_tokens"] == 0


def test_bad_max_kv_chunk_is_refused_by_name(ci):
    got = [c for c in ci if c.family == "schedule" and c.variant.startswith("refuse.max_kv_chunk")]
    assert {c.params["max_kv_chunk"] <= 0 for c in got} == {True}
    assert {0, -16} <= {c.params["max_kv_chunk"] for c in got}
    assert {"paged_prefill", "ragged_prefill", "batch_decode"} <= _ops(got)
    assert all(c.expect == "refuse" and "max_kv_chunk" in c.refuse_words for c in got)


def test_custom_mask_in_graph_mode(ci):
    got = _where(ci, "schedule", custom_mask="random", use_cuda_graph=True)
    assert got and all("graphs" in c.requires for c in got)
