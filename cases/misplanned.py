"""misplanned: the metadata disagrees with the tensors, and plans that fail (seed 002).

The batch description (plan() where the library has one; the metadata tensors and
arguments of one call where it does not) states the problem; the tensors disagree with it
in one field (harness/model/capabilities.py METADATA_FIELDS names them; each adapter's
mismatch module performs them). Each must be refused naming the field. Before the fix these
ran silently (reading past q, a truncated head loop) or killed the process. A case asks for
its field ("metadata.<field>" in requires), never for plan(), so every target that declares
the field gets it, in every dtype.

k and v each alone: a field that moves both (the cache's kv heads; ragged k and v rows)
is also moved on one side only (mismatch["only"]: "k" | "v", variants *_k / *_v): a check
of one of the pair must not stand in for the other's.

q rows: fewer than planned must be refused; more is what CUDA-graph callers
do (they pad q and out to a fixed capacity), so up to capacity it must run
and the first planned rows must match.

Contracts: every mismatch and the half-failed plan are `refuse`: tensors that
disagree with plan() have no right answer, so any run is `silent` (or worse).
Padded q rows and the plan kept after a rejected re-plan are `match`: that
is the API's promise (CUDA-graph callers pad; a rejected batch must not
cost the caller its previous plan), and a library that refuses them fails on
capability, not correctness.

Scenarios (params["scenario"], harness/targets/plan_run/scenarios.py):
  plan_failed_midway     plan() for the problem, then a second plan() that
                         fails after it began updating the wrapper (its split
                         schedule does not fit the workspace); run() must refuse.
  plan_rejected_first    plan() for the problem, then a second plan() rejected
                         during validation (a malformed batch); the first plan
                         must still be usable: run() matches the problem.
"""
from __future__ import annotations

from typing import Iterator

from cases._call_forms import forms
from harness.model.case import Case
from harness.model.routes import op_of

FAMILY = "misplanned"
OPS = ("paged_prefill", "ragged_prefill", "batch_decode")

DTYPES = ("bf16", "fp16", "fp32")
TORCH_NAME = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
# The dtype a dtype mismatch hands run(): another one of the three.
OTHER_DTYPE = {"bf16": "fp16", "fp16": "bf16", "fp32": "bf16"}
_BASE = {"dtype": "bf16", "head_dim": 128, "num_qo_heads": 8, "num_kv_heads": 2,
         "window_left": -1, "return_lse": True}
PROBLEMS = {
    "paged_prefill": {"qo_lens": [7, 12], "kv_lens": [25, 40], "causal": True,
                      "page_size": 16, "layout": "NHD", "cache_form": "tuple"},
    "ragged_prefill": {"qo_lens": [6, 9], "kv_lens": [21, 30], "causal": True},
    "batch_decode": {"qo_lens": [1, 1, 1], "kv_lens": [33, 8, 50], "causal": False,
                     "page_size": 16, "layout": "NHD", "cache_form": "tuple"},
}

def _rows(p):
    return sum(p["qo_lens"])


# (variant, field, run() value, expect, the word the refusal names, the planned value).
# Values are functions of the problem's params where they depend on it. A refusal must
# name the field, the planned value and the given one.
MISMATCHES = (
    ("num_qo_heads", "num_qo_heads", 4, "refuse", "num_qo_heads", lambda p: p["num_qo_heads"]),
    ("num_kv_heads", "num_kv_heads", 1, "refuse", "num_kv_heads", lambda p: p["num_kv_heads"]),
    ("head_dim_qk", "head_dim_qk", 64, "refuse", "head_dim_qk", lambda p: p["head_dim"]),
    ("head_dim_vo", "head_dim_vo", 64, "refuse", "head_dim_vo", lambda p: p["head_dim"]),
    ("page_size", "page_size", 8, "refuse", "page_size", lambda p: p["page_size"]),
    ("rank", "rank", 2, "refuse", "rank", lambda p: 3),
    ("q_rows_fewer", "q_rows", lambda p: _rows(p) - 1, "refuse", "rows", _rows),
    ("q_rows_padded", "q_rows", lambda p: _rows(p) + 5, "match", "", None),
    ("kv_rows_fewer", "kv_rows", lambda p: sum(p["kv_lens"]) - 1, "refuse", "kv_rows",
     lambda p: sum(p["kv_lens"])),
    # The fields above that move k and v together, each moved alone (ONLY says which).
    ("num_kv_heads_k", "num_kv_heads", 1, "refuse", "num_kv_heads", lambda p: p["num_kv_heads"]),
    ("num_kv_heads_v", "num_kv_heads", 1, "refuse", "num_kv_heads", lambda p: p["num_kv_heads"]),
    ("kv_rows_fewer_k", "kv_rows", lambda p: sum(p["kv_lens"]) - 1, "refuse", "kv_rows",
     lambda p: sum(p["kv_lens"])),
    ("kv_rows_fewer_v", "kv_rows", lambda p: sum(p["kv_lens"]) - 1, "refuse", "kv_rows",
     lambda p: sum(p["kv_lens"])),
    ("dtype", "dtype", lambda p: OTHER_DTYPE[p["dtype"]], "refuse", "dtype",
     lambda p: TORCH_NAME[p["dtype"]]),
    # Fields of a batch described by metadata tensors (a vLLM-shaped call): the count the
    # metadata states against the tensors, each index within what it indexes, each length
    # within what holds it, each offset list consistent with the rows.
    ("batch_size", "batch_size", lambda p: len(p["qo_lens"]) + 1, "refuse", "batch_size",
     lambda p: len(p["qo_lens"])),
    ("kv_lens_past_table", "kv_lens", lambda p: (_blocks_wide(p) + 1) * p["page_size"],
     "refuse", "kv_lens", None),
    ("block_table_past_pool", "block_table", lambda p: _pool_blocks(p) + 7, "refuse",
     "block_table", None),
    ("query_start_loc_short", "query_start_loc", lambda p: _rows(p) - 1, "refuse",
     "query_start_loc", _rows),
)


# Variants that move one side of a k/v pair alone: mismatch["only"] names it.
ONLY = {"num_kv_heads_k": "k", "num_kv_heads_v": "v", "kv_rows_fewer_k": "k",
        "kv_rows_fewer_v": "v"}


def _blocks_wide(p) -> int:
    """The block table's width: the most blocks any request holds."""
    return max(-(-k // p["page_size"]) for k in p["kv_lens"])


def _pool_blocks(p) -> int:
    """Blocks in the pool: every request's, plus the one spare past them."""
    return sum(-(-k // p["page_size"]) for k in p["kv_lens"]) + 1
# Batch decode plans one query row per request: its row count is the batch size.
WORD_BY_OP = {("batch_decode", "rows"): "batch_size"}
APPLIES = {
    "paged_prefill": {"num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo", "page_size",
                      "rank", "q_rows", "dtype", "batch_size", "kv_lens", "block_table",
                      "query_start_loc"},
    "ragged_prefill": {"num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo", "rank",
                       "q_rows", "kv_rows", "dtype"},
    "batch_decode": {"num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo", "page_size",
                     "rank", "q_rows", "dtype", "batch_size", "kv_lens", "block_table",
                     "query_start_loc"},
}


def _tag(p) -> str:
    bits = [p["dtype"], f"d{p['head_dim']}", f"h{p['num_qo_heads']}x{p['num_kv_heads']}"]
    if "page_size" in p:
        bits.append(f"p{p['page_size']}")
    return "-".join(bits)


def _scenarios(op, base):
    # A long request so a small max_kv_chunk needs many partial slots.
    long_kv = dict(base, kv_lens=[k + 200 for k in base["kv_lens"]])
    yield ("plan_failed_midway",
           {**long_kv, "scenario": "plan_failed_midway", "replan_max_kv_chunk": 8,
            "workspace_bytes": 1 << 16},
           "refuse", ("plan()", "failed"), ("plan_run", "split_control"))
    # Without LSE: aiter's return_lse runs through its own shadow plan, not the main one.
    yield ("plan_rejected_first",
           {**base, "scenario": "plan_rejected_first", "return_lse": False}, "match", (),
           ("plan_run",))


def mismatch_case(route: str, variant: str, params: dict, tag: str) -> Case:
    """The case for one mismatch over a problem: its refusal words (the field, the value
    stated and the value given), tag and needs are derived from params alone, so a shrunk
    case gets them rebuilt by the same code."""
    op = op_of(route)
    spec = {v: (f, val, e, w, pl) for v, f, val, e, w, pl in MISMATCHES}[variant]
    field, _, expect, word, planned = spec
    value = params["mismatch"]["value"]
    words = ()
    if expect == "refuse":
        given = TORCH_NAME[value] if field == "dtype" else value
        words = (WORD_BY_OP.get((op, word), word),) + (
            (str(planned(params)),) if planned is not None else ()) + (str(given),)
    return Case(route=route, family=FAMILY, variant=variant, params=params, expect=expect,
                refuse_words=words, tag=tag, requires=(f"metadata.{field}",))


def rebuild(case: Case, params: dict) -> Case:
    """The case this family writes for `params` in `case`'s call form: a mismatch whose
    value follows the problem (a row fewer than planned) is recomputed from it, and so are
    the words naming the planned and given values."""
    tag = _tag(params) + case.tag[len(_tag(case.params)):]
    spec = {v: val for v, _, val, *_ in MISMATCHES}.get(case.variant)
    if spec is None or "mismatch" not in params:
        return Case(route=case.route, family=FAMILY, variant=case.variant, params=params,
                    expect=case.expect, refuse_words=case.refuse_words, tag=tag,
                    requires=case.requires)
    if callable(spec):
        params = {**params, "mismatch": {**params["mismatch"], "value": spec(params)}}
    if case.variant in ONLY:
        params = {**params, "mismatch": {**params["mismatch"], "only": ONLY[case.variant]}}
    return mismatch_case(case.route, case.variant, params, tag)


def cases(routes) -> Iterator[Case]:
    for route in routes:
        op = op_of(route)
        if op not in PROBLEMS:
            continue
        for dtype in DTYPES:
            base = {**_BASE, **PROBLEMS[op], "dtype": dtype}
            tag = _tag(base)
            for variant, field, value, expect, word, planned in MISMATCHES:
                if field not in APPLIES[op]:
                    continue
                value = value(base) if callable(value) else value
                mismatch = {"field": field, "value": value}
                if variant in ONLY:
                    mismatch["only"] = ONLY[variant]
                params = {**base, "mismatch": mismatch}
                for form, form_tag in forms(params, tag):
                    yield mismatch_case(route, variant, form, form_tag)
        base = {**_BASE, **PROBLEMS[op]}
        tag = _tag(base)
        for variant, params, expect, words, requires in _scenarios(op, base):
            for form, form_tag in forms(params, tag):
                yield Case(route=route, family=FAMILY, variant=variant, params=form,
                           expect=expect, refuse_words=words, tag=form_tag, requires=requires)
