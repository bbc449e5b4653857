"""Hypothesis strategies over the params the case families use, and the one contract rule.

The explorer (harness/tools/explore.py) draws cases from here. Every constant comes from
the family that owns it (dtypes, head dims, GQA ratios, masks, paged forms, value
kinds, strided tensors per op, mismatch fields per op, GQA head counts), so
exploring covers the families' space and its neighbourhood: lengths 0, 1 and off
any tile, odd head dims, head counts that do not divide, any tensor the strided
family names, any field misplanned bends.

Each strategy is a small function; `cases(routes, family)` composes them into
Case records. The expectation of a drawn case is never chosen by the strategy
that drew it: `contract(op, params)` derives it from the params by the families'
one contract (cases/_expect.py), so a drawn case and a family case with the same params
expect the same.

Hypothesis shrinks a strategy's draw toward its first choice: every list below
starts with the family's plainest value, so a shrunk case reads like a family case.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

from hypothesis import strategies as st

from cases import gqa, misplanned, small_head, strided, valid, values
from cases._call_forms import FORMS
from cases._expect import expect
from harness.model import relations
from harness.model.case import Case, dtype_tag
from harness.model.problem import normalize
from harness.model.routes import op_of

FAMILY = "explore"
# The families the explorer mirrors, in the order it takes turns between them.
FAMILIES = ("valid", "strided", "misplanned", "gqa")
OPS = {"valid": valid.OPS, "strided": strided.OPS, "misplanned": misplanned.OPS,
       "gqa": gqa.OPS}

# ---- the families' axes, widened ---------------------------------------------------------------

# Beyond the families' head dims: small odd ones no kernel tiles evenly.
EXTRA_HEAD_DIMS = (24, 8, 3, 1)
HEAD_DIMS = tuple(dict.fromkeys(valid.COMMON_HEAD_DIMS + valid.SWEEP_HEAD_DIMS
                                + small_head.HEAD_SIZES + EXTRA_HEAD_DIMS))
# Divisible head counts: valid's ratios and gqa's odd ones and controls that must match.
DIVISIBLE_HEADS = tuple(dict.fromkeys(
    valid.GQA + tuple((hq, hkv) for hq, hkv, _, expect, _ in gqa.HEADS if expect == "match")))
REFUSED_HEADS = tuple((hq, hkv) for hq, hkv, _, expect, _ in gqa.HEADS if expect == "refuse")
WINDOWS = (-1, 0, 1, 7, 15, 31)
# Tile edges (16, 32, 64, 128) and one past them; the families' unaligned primes come in
# with their length pairs below.
EDGE_LENS = (1, 0, 2, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129)
MAX_QO, MAX_KV, MAX_BATCH = 40, 160, 4
PAGE_SIZES = tuple(dict.fromkeys(ps for ps, _, _ in valid.PAGED_FORMS)) + (4, 2, 8)
MAX_KV_CHUNKS = (16, 32, 4)
SM_SCALES = (0.05, 0.2)
MERGES = ("out_of_place", "in_place")
DTYPE_WORDS = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


def dtypes():
    return st.sampled_from(valid.DTYPES)


def head_dims(odd: bool = True):
    return st.sampled_from(HEAD_DIMS if odd else valid.COMMON_HEAD_DIMS)


def divisible_heads():
    """(num_qo_heads, num_kv_heads) whose GQA group divides: any group of valid's sweep
    over one or two kv heads, small groups over up to four."""
    def heads(t):
        return t[0] * t[1], t[0]
    return st.one_of(st.sampled_from(DIVISIBLE_HEADS),
                     st.tuples(st.integers(1, 4), st.integers(1, 4)).map(heads),
                     st.tuples(st.integers(1, 2), st.sampled_from(valid.GROUP_SIZES)).map(heads))


def refused_heads():
    """Head counts with no GQA group: not a multiple, or no kv heads at all."""
    drawn = st.tuples(st.integers(1, 16), st.integers(0, 8)).filter(
        lambda t: t[1] == 0 or t[0] % t[1] != 0)
    return st.one_of(st.sampled_from(REFUSED_HEADS), drawn)


def call_forms(op: str):
    """The params of a call form (cases/_call_forms.py): as written first, then no LSE
    asked for, the library allocating out, or both. A mixed batch writes into the
    caller's out (vLLM's API) and returns no LSE: only its written form."""
    if op == "mixed_batch":
        return st.just({})
    return st.sampled_from(({},) + tuple(sets for _, sets in FORMS))


def length(most: int, least: int = 0):
    edges = [n for n in EDGE_LENS if least <= n <= most]
    return st.one_of(st.sampled_from(edges), st.integers(least, most))


def masks():
    """(causal, window_left): valid's pairs first, then any pair."""
    return st.one_of(st.sampled_from(valid.MASKS), st.tuples(st.booleans(), st.sampled_from(WINDOWS)))


def paged_forms():
    """(page_size, layout, cache_form): valid's covering rows first."""
    return st.one_of(st.sampled_from(valid.PAGED_FORMS),
                     st.tuples(st.sampled_from(PAGE_SIZES), st.sampled_from(("NHD", "HND")),
                               st.sampled_from(("tuple", "single"))))


def maybe(strategy):
    """None (the key stays out of params) or a value."""
    return st.one_of(st.none(), strategy)


# ---- lengths per op ----------------------------------------------------------------------------

def _pairs(least_kv: int = 0):
    return st.lists(st.tuples(length(MAX_QO), length(MAX_KV, least_kv)), min_size=1,
                    max_size=MAX_BATCH)


def _unzip(pairs) -> dict:
    return {"qo_lens": [q for q, _ in pairs], "kv_lens": [k for _, k in pairs]}


@st.composite
def lens(draw, op: str) -> dict:
    """qo_lens / kv_lens (and num_decodes) a route of `op` can take."""
    if op == "single_prefill":
        pair = draw(st.one_of(st.sampled_from(valid.SINGLE_PREFILL_LENS),
                              st.tuples(length(MAX_QO), length(MAX_KV))))
        return _unzip([pair])
    if op == "single_decode":
        kv = draw(st.one_of(st.sampled_from(valid.SINGLE_DECODE_KV), length(MAX_KV)))
        return {"qo_lens": [1], "kv_lens": [kv]}
    if op == "batch_decode":
        kv = draw(st.lists(length(MAX_KV), min_size=1, max_size=MAX_BATCH + 1))
        return {"qo_lens": [1] * len(kv), "kv_lens": kv}
    if op == "merge_state":
        # Each request's kv splits in two non-empty halves (harness/targets/bundled_merge.py).
        return _unzip(draw(_pairs(least_kv=2)))
    if op == "mixed_batch":
        decodes = draw(st.lists(length(MAX_KV), max_size=MAX_BATCH))
        prefills = draw(st.lists(st.tuples(length(MAX_QO), length(MAX_KV)),
                                 min_size=0 if decodes else 1, max_size=2))
        out = _unzip([(1, k) for k in decodes] + prefills)
        out["num_decodes"] = len(decodes)
        return out
    return _unzip(draw(_pairs()))


# ---- one problem ---------------------------------------------------------------------------------

def _put(p: dict, key: str, value) -> None:
    if value is not None:
        p[key] = value


@st.composite
def problem(draw, op: str, *, odd_dims: bool = True, extras: bool = True,
            heads=None) -> dict:
    """A problem `op` can express. `extras`: the plan knobs (split KV, CUDA-graph mode,
    run(partial_state=), page ids past 64K, explicit scale, head_dim_vo); the adversarial
    families keep them off, as their own modest problems do."""
    p = {"dtype": draw(dtypes()), "head_dim": draw(head_dims(odd_dims))}
    hq, hkv = draw(heads if heads is not None else divisible_heads())
    p.update(num_qo_heads=hq, num_kv_heads=hkv, **draw(lens(op)))
    if op in ("merge_state", "batch_decode"):
        causal, window = False, draw(st.sampled_from(WINDOWS)) if op == "batch_decode" else -1
    elif op == "single_decode":
        causal, window = False, draw(st.sampled_from(WINDOWS))
    elif op == "mixed_batch":
        causal, window = True, draw(st.sampled_from(WINDOWS))
    else:
        causal, window = draw(masks())
    p.update(causal=causal, window_left=window)
    # decode_first_attention returns no LSE.
    p["return_lse"] = False if op == "mixed_batch" else draw(st.booleans())
    kind = draw(st.sampled_from(values.KINDS))
    if kind != "normal":
        p["values"] = kind
    if op in ("single_prefill", "single_decode"):
        p["layout"] = draw(st.sampled_from(("NHD", "HND")))
    if op in ("paged_prefill", "batch_decode"):
        page_size, layout, form = draw(paged_forms())
        p.update(page_size=page_size, layout=layout, cache_form=form)
    if op == "mixed_batch":
        p["page_size"] = draw(st.sampled_from(PAGE_SIZES))
    if op == "merge_state":
        p["merge"] = draw(st.sampled_from(MERGES))
    if extras:
        _extras(draw, op, p)
    return p


def _extras(draw, op: str, p: dict) -> None:
    _put(p, "sm_scale", draw(maybe(st.sampled_from(SM_SCALES))))
    if op in ("paged_prefill", "ragged_prefill", "batch_decode"):
        _put(p, "max_kv_chunk", draw(maybe(st.sampled_from(MAX_KV_CHUNKS))))
        if draw(st.booleans()):
            p["use_cuda_graph"] = True
    if op in ("paged_prefill", "batch_decode", "mixed_batch"):
        if draw(st.booleans()):
            p["page_order"] = "sequential"
        # Pages below the offset are allocated: keep the pool small (valid does the same).
        if p["page_size"] == 1 and p["num_kv_heads"] * p["head_dim"] <= 256 and draw(st.booleans()):
            p["page_id_offset"] = 65536
    if op == "paged_prefill" and draw(st.booleans()):
        p["partial_state"] = True
    if op in ("single_prefill", "paged_prefill", "ragged_prefill") \
            and p.get("cache_form") != "single":
        _put(p, "head_dim_vo", draw(maybe(st.sampled_from(
            tuple(d for d in valid.HEAD_DIMS if d != p["head_dim"])))))
    # Caller-owned buffers by design (CUDA-graph mode, a partial state to merge into, an
    # in-place merge) keep their one call form, as cases/_call_forms.py crosses them.
    if op != "merge_state" and not p.get("use_cuda_graph") and not p.get("partial_state"):
        p.update(draw(call_forms(op)))


# ---- the families' adversarial axes --------------------------------------------------------------

@st.composite
def valid_params(draw, op: str):
    return "drawn", draw(problem(op))


@st.composite
def strided_params(draw, op: str):
    """One tensor as the strided family passes it: stride(-1) == 2, head-sliced,
    every other index, or an int64 index tensor."""
    base = draw(problem(op, odd_dims=False, extras=False))
    # The family's problem decides what the tensor's extras do not: the LSE, and a (k, v)
    # tuple cache, which is where k_cache and v_cache exist.
    family = {**strided._BASE, **strided.PROBLEMS[op]}
    base["return_lse"] = family["return_lse"]
    if "cache_form" in family:
        base["cache_form"] = family["cache_form"]
    index = strided.INDEX.get(op, ())
    choices = [(t, extra, "view") for t, extra in strided.TENSORS[op]]
    choices += [(name, {}, "view") for name in index] + [(name, {}, "int64") for name in index]
    tensor, extra, how = draw(st.sampled_from(choices))
    base.pop("merge", None)        # merge's own strided tensors say which merge they need
    params = {**base, **extra}
    if how == "int64":
        params["index_dtype"] = {tensor: "int64"}
        params.update(draw(call_forms(op)))
        return f"{tensor}_int64", params
    params["strided"] = tensor
    if op != "merge_state" and tensor not in strided.CALLER_BUFFERS:
        params.update(draw(call_forms(op)))   # strided outputs need the caller's buffers
    if tensor in index:
        return f"{tensor}_every_other", params
    return (tensor if tensor == "q_heads" else f"{tensor}_stride2"), params


def _relation_values(r, p: dict) -> list:
    """Values that break relation r on problem p and that the cores can lay out: the
    count and shape relations over a range (in r's direction), the index, length, offset
    and maximum relations at the value the family uses (their words name it)."""
    n = normalize(p)
    rows, f = sum(n["qo_lens"]), r.field
    last_kv = n["kv_lens"][-1] if n["kv_lens"] else 0
    if f == "num_qo_heads":
        hq = n["num_qo_heads"]
        more = r.variant.endswith("_more")
        return [h for h in (4, 1, 2, 8, 16, 32) if (h > hq if more else h < hq)]
    if f == "num_kv_heads":
        hkv = n["num_kv_heads"]
        more = r.variant.endswith("_more")
        return [h for h in (1, 2, 4, 8, 16) if (h > hkv if more else 0 < h < hkv)]
    if f in ("head_dim_qk", "head_dim_vo"):
        planned = n["head_dim"] if f == "head_dim_qk" else n["head_dim_vo"]
        return [d for d in (64,) + valid.HEAD_DIMS if d != planned]
    if f == "page_size":
        # The same pool as pages of a divisor: the adapter can always view it so.
        return [d for d in (8, 4, 2, 1) if d < n["page_size"] and n["page_size"] % d == 0]
    if f == "rank":
        return [2]
    if f == "q_rows":
        # Padding repeats q's own rows (plan_run/mismatch.py): none to repeat in an empty q.
        if r.expect == "match":
            return [rows + 5, rows + 1, rows + 8] if rows else []
        return list(range(rows - 1, -1, -1))
    if f == "kv_rows":
        return list(range(sum(n["kv_lens"]) - 1, -1, -1))
    if f == "dtype":
        return [d for d in valid.DTYPES if d != n["dtype"]]
    if f == "batch_size":
        b = len(n["qo_lens"])
        return [b + 1, b + 2] if r.variant == "batch_size" else list(range(b - 1, -1, -1))
    if f in ("block_table", "last_page_len") and last_kv <= 0:
        return []            # the last request holds no block: the bent entry is never read
    if f == "query_start_loc" and r.variant == "query_start_loc_decreasing" \
            and len(n["qo_lens"]) < 2:
        return []
    if f in ("max_seqlen_q", "max_seqlen_k") and r.variant.endswith("_below"):
        lens = n["qo_lens"] if f == "max_seqlen_q" else n["kv_lens"]
        if not lens or max(lens) < 1:
            return []
    if f == "kv_lens" and not n["kv_lens"]:
        return []
    return [r.value_for(n)]


def misplanned_relations(op: str, fields=None) -> list:
    """The relations misplanned derives for op, limited to the fields a target's signature
    reaches (None: every field)."""
    return [r for r in relations.RELATIONS if misplanned.applies(op, r.variant)
            and (fields is None or r.field in fields)]


@st.composite
def misplanned_params(draw, op: str, fields=None):
    """The problem as the description states it, and arguments that break one relation the
    target's signature carries (harness/model/relations.py), in either direction."""
    base = draw(problem(op, odd_dims=False, extras=False))
    if op in ("paged_prefill", "batch_decode"):
        base["page_id_offset"] = 0     # the pool's size is the relations' (pool_blocks)
    usable = [r for r in misplanned_relations(op, fields) if _relation_values(r, base)]
    if not usable:
        raise ValueError(f"no relation the target's signature carries applies to {op}")
    r = draw(st.sampled_from(usable))
    if r.field == "head_dim_vo" and "cache_form" in base:
        base["cache_form"] = "tuple"   # only a (k, v) tuple holds two head dims
    value = draw(st.sampled_from(_relation_values(r, base)))
    mismatch = {"field": r.field, "value": value}
    if r.only:
        mismatch["only"] = r.only
    params = {**base, **draw(call_forms(op)), "mismatch": mismatch}
    return r.variant, params


@st.composite
def gqa_params(draw, op: str):
    base = draw(problem(op, odd_dims=False, extras=False, heads=refused_heads()))
    base.pop("merge", None)            # gqa merges out of place, in every call form
    base.update(draw(call_forms(op)))
    hq, hkv = base["num_qo_heads"], base["num_kv_heads"]
    return ("kv0" if hkv == 0 else f"q{hq}_over_kv{hkv}"), base


AXES = {"valid": valid_params, "strided": strided_params, "misplanned": misplanned_params,
        "gqa": gqa_params}


# ---- the contract ------------------------------------------------------------------------------

def _mismatch_row(op: str, params: Mapping[str, Any]):
    """(variant, expect, words) of the relation a drawn mismatch breaks."""
    r = misplanned.relation_of(op, params)
    return r.variant, r.expect, misplanned.words_of(op, r, params)


def contract(op: str, params: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
    """(expect, refuse_words) of a case on `op` with these params: the families' one
    contract (cases/_expect.py), on params checked first (a drawn value outside the model
    raises ValueError naming it)."""
    if not params.get("mismatch"):
        normalize(params)
    return expect(op, params)


def requires(params: Mapping[str, Any]) -> tuple[str, ...]:
    """The target features (harness/model/capabilities.py) a drawn case needs beyond its op, as
    the families say: misplanned's metadata field, and values' graphs and partial state."""
    mismatch = params.get("mismatch")
    return ((f"metadata.{mismatch['field']}",) if mismatch else ()) + values.requires(dict(params))


def make_case(route: str, family: str, detail: str, params: dict, seed: int) -> Case:
    """The drawn case: family `explore`, variant `<family>.<detail>`, a tag that tells any
    two drawn params apart, and the contract of its params."""
    expect, words = contract(op_of(route), params)
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:8]
    tag = f"{dtype_tag(params)}-b{len(params['qo_lens'])}-{digest}"
    return Case(route=route, family=FAMILY, variant=f"{family}.{detail}", params=params,
                expect=expect, refuse_words=words, seed=seed, tag=tag,
                requires=requires(params))


def routes_for(family: str, routes, fields=None) -> list[str]:
    """The routes whose op the family covers (misplanned: with a relation on one of the
    fields the target's signature carries, when `fields` is given)."""
    out = [r for r in routes if op_of(r) in OPS[family]]
    if family == "misplanned" and fields is not None:
        out = [r for r in out if misplanned_relations(op_of(r), fields)]
    return out


def cases(routes, family: str, fields=None):
    """Cases of one family's axis on the given routes (those whose op it covers).

    fields: the metadata fields the target's signature reaches (Capabilities.metadata);
    misplanned draws only relations on them, so every drawn case reaches the target."""
    routes = routes_for(family, routes, fields)
    if not routes:
        raise ValueError(f"family {family!r} covers none of the routes {list(routes)}"
                         + (" with a field the target's signature carries"
                            if family == "misplanned" and fields is not None else ""))
    axis = AXES[family]

    @st.composite
    def draw_case(draw):
        route = draw(st.sampled_from(routes))
        if family == "misplanned":
            detail, params = draw(axis(op_of(route), fields))
        else:
            detail, params = draw(axis(op_of(route)))
        seed = draw(st.integers(0, 2**31 - 1))
        return make_case(route, family, detail, params, seed)
    return draw_case()
