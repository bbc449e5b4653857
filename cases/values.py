"""values: every value kind of harness/model/problem.py on every route (issue 12, generator reach).

valid draws q, k, v from N(0, 1), which keeps every logit and LSE far from
exp()'s overflow, never ties, never sees a subnormal. Here each route runs
the same small problems with params["values"] set to each kind:

  normal        the control: the same shapes with valid's values
  large_logits  logits ~96..192 (LSEs up to ~200) with a spread softmax: exp() without
                a running max, or a merge without subtracting the larger LSE, overflows
  outlier       one key 6x larger in k and v, one q head 2x larger
  ties          repeated query rows, keys repeating with period 2: exact ties
  tiny          q near the dtype's smallest normal (partly subnormal), k scaled up by as much

Each kind meets all three dtypes on every route, and large_logits meets
every split-KV schedule (a chunked plan, a CUDA-graph plan that always
splits, run(partial_state=)), both merges and every decode backend. Decode
backends get what reaches their own kernel: ll4mi runs without LSE at head
dims it serves, aiter without LSE (its kernel) and with LSE (its fa2 shadow
plan, split).

Non-finite and subnormal edges (EDGES below, not crossed with every dtype): the value
conversions of kernels/csrc/dtype.h on inputs and outputs, each where its answer is IEEE's
and so the fp64 reference's, exactly (compare.py demands inf for inf and NaN for NaN):

  nonfinite_v   the first key's v +inf (dim 0) and NaN (dim 1): every row sees it (the
                first key is in every causal row), so o is inf and NaN there; fp16 and
                bf16 in and out, an fp8 cache's NaN encoding (E4M3FN 0x7f; E5M2's through
                the fp16 path)
  nonfinite_v_masked  the same in the last key, which causal hides from every row but the
                last ones: those rows must be finite (a masked key is out of the sum, not
                weighted by 0: 0 * inf is NaN), unsplit and split-KV
  nan_k         the last key's k NaN: a NaN logit, so a NaN LSE and output in the rows that
                see it (every causal row but the last finite), unsplit, split-KV, a graph
                plan whose one-chunk rows merge a single NaN partial, a window whose rows
                see the last chunk only, the ll4mi decode kernel, and merge_state's NaN
                state beside an empty one
  normal_tail_*  finite values, and NaN / inf in the cache slots past each request's
                length in its last page (cache_tail; an fp8 cache's NaN byte): no token is
                there, so the answer is the plain one (a kernel that weights them by 0
                instead of leaving them out of the sum gives NaN)
  subnormal_v   fp16 v deep in the subnormals with v_scale 0.5 and window_left 0 (each row
                one key): outputs v / 2 exactly, half of them rounding ties

An fp16 output of 65520 or more (finite, rounding to inf) needs v_scale > 1 over
|v| near fp16's max; the fp64 reference stays finite there, so compare.py would call the
correct inf wrong: no case sends it (see the comment in dtype.h).
"""
from __future__ import annotations

from typing import Iterator

from cases._call_forms import forms
from cases._expect import of_case
from cases._per_op import per_route
from cases._tags import tag as id_tag
from harness.model.case import Case

FAMILY = "values"
OPS = ("single_prefill", "single_decode", "paged_prefill", "ragged_prefill",
       "batch_decode", "merge_state", "mixed_batch")

KINDS = ("normal", "large_logits", "outlier", "ties", "tiny")
# The non-finite and subnormal kinds: EDGES, on the routes and dtypes that reach their paths.
EDGE_KINDS = ("nonfinite_v", "nonfinite_v_masked", "nan_k", "subnormal_v")
DTYPES = ("fp16", "bf16", "fp32")
# (num_qo_heads, num_kv_heads) by dtype index: GQA 1, 4 and 4 over two kv heads.
HEADS = ((2, 2), (4, 1), (8, 2))
# max_kv_chunk by dtype index: split, unsplit (the default chunk), split.
CHUNKS = (16, None, 32)


def _params(kind: str, i: int, head_dim: int, **extra) -> dict:
    hq, hkv = HEADS[i]
    return {"values": kind, "dtype": DTYPES[i], "head_dim": head_dim, "num_qo_heads": hq,
            "num_kv_heads": hkv, "window_left": -1, **extra}


def _chunked(params: dict, i: int) -> dict:
    if CHUNKS[i] is not None:
        params["max_kv_chunk"] = CHUNKS[i]
    return params


def _tag(params: dict, *extra: str) -> str:
    """dtype/head bits, then what tells two cases of one kind apart."""
    return id_tag(params, "dims", "causal", "window", "page", "chunk", "lse", extra=extra)


# ---------------------------------------------------------------- per op, per (kind, dtype index)

def _single_prefill(kind, i, route):
    lens = (([17], [61], True, -1), ([1], [97], False, -1), ([31], [31], True, 7))[i]
    yield _params(kind, i, (64, 128, 256)[i], qo_lens=lens[0], kv_lens=lens[1], causal=lens[2],
                  window_left=lens[3], return_lse=True, layout=("NHD", "HND", "NHD")[i])


def _single_decode(kind, i, route):
    yield _params(kind, i, (128, 64, 256)[i], qo_lens=[1], kv_lens=[(37, 129, 300)[i]],
                  causal=False, return_lse=i != 1, layout=("HND", "NHD", "NHD")[i])


def _paged_prefill(kind, i, route):
    p = _params(kind, i, (128, 64, 128)[i], qo_lens=[5, 1, 13], kv_lens=[77, 30, 129],
                causal=i != 1, return_lse=True, page_size=(16, 1, 16)[i],
                layout=("NHD", "HND", "NHD")[i], cache_form=("tuple", "single", "tuple")[i])
    yield _chunked(p, i)
    if kind == "large_logits":
        # A CUDA-graph plan always splits; run(partial_state=) merges once more in place.
        yield {**p, "max_kv_chunk": 32, "use_cuda_graph": True}
        yield {**p, "max_kv_chunk": 16, "partial_state": True}


def _ragged_prefill(kind, i, route):
    p = _params(kind, i, (64, 128, 64)[i], qo_lens=[7, 2, 19], kv_lens=[70, 45, 111],
                causal=i != 1, return_lse=True)
    yield _chunked(p, i)
    if kind == "large_logits":
        yield {**p, "max_kv_chunk": 32, "use_cuda_graph": True}


def _batch_decode(kind, i, route):
    # A kernel that writes no LSE is reached only without one; where return_lse runs a
    # (split) shadow plan of its own, the first dtype takes that plan.
    if route.decode_lse:
        lse = i != 1
    else:
        lse = route.lse_shadow_plan and i == 0
    p = _params(kind, i, (128, 64, 256)[i], qo_lens=[1] * 4, kv_lens=[45, 1, 130, 77],
                causal=False, return_lse=lse, page_size=(16, 1, 16)[i],
                layout=("NHD", "HND", "NHD")[i], cache_form=("tuple", "single", "tuple")[i])
    yield _chunked(p, i)
    if kind == "large_logits" and route.graph_split_decode:
        yield {**p, "max_kv_chunk": 16, "use_cuda_graph": True}


def _merge_state(kind, i, route):
    for merge in ("out_of_place", "in_place"):
        yield _params(kind, i, (64, 128, 32)[i], qo_lens=[3, 5], kv_lens=[40, 77], causal=False,
                      return_lse=True, merge=merge)


def _mixed_batch(kind, i, route):
    yield _params(kind, i, (64, 128, 64)[i], qo_lens=[1, 1, 9, 17], kv_lens=[40, 3, 30, 17],
                  causal=True, return_lse=False, page_size=(16, 1, 16)[i], num_decodes=2,
                  window_left=(-1, -1, 11)[i])


def requires(params: dict) -> tuple[str, ...]:
    """The target features (harness/model/capabilities.py) a case cannot be expressed without. A
    chosen split (max_kv_chunk) is not one: a target that plans its own split still owes the
    same answer. An fp8 cache or a k/v scale needs fp8_kv."""
    needs = [feature for feature, key in (("graphs", "use_cuda_graph"),
                                          ("partial_state", "partial_state"))
             if params.get(key)]
    if params.get("kv_dtype") or "k_scale" in params or "v_scale" in params:
        needs.append("fp8_kv")
    return tuple(needs)


# ---------------------------------------------------------------- non-finite / subnormal edges
#
# Square causal requests (qo_len == kv_len): row i sees keys 0..i, so the first key (the
# nonfinite_v key) is in every row and the last key (nan_k's) is hidden from every row but
# the last.

def _edge(kind: str, dtype: str, head_dim: int, **extra) -> dict:
    hq, hkv = {"fp16": (4, 2), "bf16": (2, 2), "fp32": (8, 2)}[dtype]
    return {"values": kind, "dtype": dtype, "head_dim": head_dim, "num_qo_heads": hq,
            "num_kv_heads": hkv, "window_left": -1, **extra}


def _edges(op: str, route) -> Iterator[tuple[str, dict]]:
    """(variant suffix, params) of every EDGES case of one op."""
    nonfinite = [("fp16", 64), ("bf16", 128)]
    if op in ("single_prefill", "paged_prefill", "ragged_prefill", "mixed_batch"):
        paged = {"page_size": 16} if op in ("paged_prefill", "mixed_batch") else {}
        if op == "single_prefill":
            shape = dict(qo_lens=[40], kv_lens=[40], causal=True, return_lse=True)
        elif op == "mixed_batch":
            shape = dict(qo_lens=[1, 1, 24, 9], kv_lens=[30, 7, 24, 9], causal=True,
                         return_lse=False, num_decodes=2)
        else:
            shape = dict(qo_lens=[24, 9, 1], kv_lens=[24, 9, 40], causal=True, return_lse=True)
        for dtype, d in nonfinite:
            yield dtype, _edge("nonfinite_v", dtype, d, **shape, **paged)
        for dtype, d in (("fp16", 128), ("fp32", 64)):
            yield dtype, _edge("nan_k", dtype, d, **shape, **paged)
        # The last key's non-finite v, hidden by causal from every row but the last ones.
        yield "fp16", _edge("nonfinite_v_masked", "fp16", 64, **shape, **paged)
        if op in ("paged_prefill", "ragged_prefill"):
            # Split: the NaN partial beside finite ones; graph: every row one chunk (a single
            # NaN partial) merged; a window: the last rows see the last chunk only.
            yield "split", _edge("nan_k", "bf16", 64, **shape, **paged, max_kv_chunk=8)
            yield "graph", _edge("nan_k", "fp16", 64, **shape, **paged, max_kv_chunk=64,
                                 use_cuda_graph=True)
            yield "window_split", _edge("nan_k", "bf16", 64, **shape, **paged, window_left=3,
                                        max_kv_chunk=8)
            yield "split", _edge("nonfinite_v", "fp16", 64, **shape, **paged, max_kv_chunk=8)
            yield "split", _edge("nonfinite_v_masked", "bf16", 64, **shape, **paged,
                                 max_kv_chunk=8)
        if op in ("paged_prefill", "mixed_batch"):
            # (an fp8 cache where the op takes one: not a mixed batch)
            yield from _cache_tails(shape, paged, fp8=op == "paged_prefill")
        if op == "paged_prefill":
            for fmt in ("fp8_e4m3", "fp8_e5m2"):
                yield fmt, _edge("nonfinite_v", "bf16", 64, **shape, **paged, kv_dtype=fmt)
            yield "fp8_e4m3", _edge("nan_k", "fp16", 64, **shape, **paged, kv_dtype="fp8_e4m3")
            # window 0: each row's one key, o = v * 0.5 exactly: fp16 subnormal ties.
            yield "ties", _edge("subnormal_v", "fp16", 64, **shape, **paged, window_left=0,
                                v_scale=0.5)
    elif op == "merge_state":
        # State a over the whole kv (its last key's NaN logit: a NaN state), b empty (-inf):
        # the merge must keep the NaN, not take the empty side's -inf as the larger.
        for merge in ("out_of_place", "in_place"):
            yield merge, _edge("nan_k", "fp16", 64, qo_lens=[3, 1], kv_lens=[9, 4], causal=False,
                               return_lse=True, merge=merge, merge_empty="b")
    elif op in ("single_decode", "batch_decode"):
        # A route whose own kernel writes no LSE reaches it only without one.
        lse = route.decode_lse
        if op == "single_decode":
            shape = dict(qo_lens=[1], kv_lens=[37], causal=False, return_lse=True)
        else:
            shape = dict(qo_lens=[1, 1, 1], kv_lens=[30, 1, 77], causal=False, return_lse=lse,
                         page_size=16)
        for dtype, d in nonfinite:
            yield dtype, _edge("nonfinite_v", dtype, d, **shape)
        yield "fp16", _edge("nan_k", "fp16", 128, **shape)
        if op == "batch_decode":
            yield from _cache_tails(shape, {}, fp8=True)
            yield "fp8_e4m3", _edge("nan_k", "bf16", 64, **shape, kv_dtype="fp8_e4m3")
            yield "fp8_e4m3", _edge("nonfinite_v", "fp16", 128, **shape, kv_dtype="fp8_e4m3")
            if route.graph_split_decode:
                yield "graph", _edge("nan_k", "fp16", 64, **shape, max_kv_chunk=64,
                                     use_cuda_graph=True)


def _cache_tails(shape: dict, paged: dict, fp8: bool) -> Iterator[tuple[str, dict]]:
    """Finite values, and NaN or inf in the slots past each request's length in its last
    page (cache_tail): no token is there, so the answer is the plain one; a kernel that
    weights those slots by 0 instead of leaving them out of the sum gives NaN. Every
    request's length here leaves its last page part-filled at page 16."""
    for tail, dtype in (("nan", "bf16"), ("inf", "fp16")):
        yield dtype, _edge("normal", dtype, 64, **shape, **paged, cache_tail=tail)
    if fp8:
        yield "fp8_e4m3", _edge("normal", "bf16", 64, **shape, **paged, cache_tail="nan",
                                kv_dtype="fp8_e4m3")


def _variant(params: dict) -> str:
    bits = [params["values"]]
    if params.get("cache_tail"):
        bits.append(f"tail_{params['cache_tail']}")
    if params.get("kv_dtype"):
        bits.append(params["kv_dtype"].replace("fp8_", ""))
    if params.get("use_cuda_graph"):
        bits.append("graph")
    if params.get("partial_state"):
        bits.append("partial")
    if params.get("merge"):
        bits.append(params["merge"])
    return "_".join(bits)


def cases(routes, profile: str = "ci") -> Iterator[Case]:
    for route, op, make, traits in per_route(routes, globals()):
        for kind in KINDS:
            for i in range(len(DTYPES)):
                for params in make(kind, i, traits):
                    tag = _tag(params)
                    for form, form_tag in forms(params, tag, profile == "full"):
                        yield Case(route=route, family=FAMILY, variant=_variant(params),
                                   params=form, tag=form_tag, **of_case(op, params),
                                   requires=requires(params))
        for _, params in _edges(op, traits):
            tag = _tag(params)
            for form, form_tag in forms(params, tag, profile == "full"):
                yield Case(route=route, family=FAMILY, variant=_variant(params), params=form,
                           tag=form_tag, requires=requires(params), **of_case(op, params))
            if profile != "full" and params.get("return_lse") and not params.get("use_cuda_graph"):
                # Without the LSE too (the full profile's forms have it): a library that
                # returns none (vLLM's CPU attention) meets every edge.
                plain = {**params, "return_lse": False}
                yield Case(route=route, family=FAMILY, variant=_variant(plain), params=plain,
                           tag=_tag(plain, "nolse"), **of_case(op, plain),
                           requires=requires(plain))
