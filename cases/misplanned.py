"""misplanned: the metadata disagrees with the tensors, and plans that fail (seed 002).

The relations are derived from the call signature (harness/model/relations.py RELATIONS:
every count planned vs given in both directions, every index within what it indexes, every
length within what holds it, every offset list consistent, every stated maximum against the
lengths), one case per relation and op; a case reaches the targets whose signature carries
its field (harness/model/signature.py). The batch description (plan() where the library has one; the metadata tensors and
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
from cases._expect import of_case
from cases._tags import tag as id_tag
from harness.model import relations
from harness.model.case import Case
from harness.model.routes import op_of

FAMILY = "misplanned"
OPS = ("paged_prefill", "ragged_prefill", "batch_decode")

DTYPES = ("bf16", "fp16", "fp32")
TORCH_NAME = relations.TORCH_NAME
# The dtype a dtype mismatch hands run(): another one of the three.
OTHER_DTYPE = relations.OTHER_DTYPE
_BASE = {"dtype": "bf16", "head_dim": 128, "num_qo_heads": 8, "num_kv_heads": 2,
         "window_left": -1, "return_lse": True}
PROBLEMS = {
    "paged_prefill": {"qo_lens": [7, 12], "kv_lens": [25, 40], "causal": True,
                      "page_size": 16, "layout": "NHD", "cache_form": "tuple"},
    "ragged_prefill": {"qo_lens": [6, 9], "kv_lens": [21, 30], "causal": True},
    "batch_decode": {"qo_lens": [1, 1, 1], "kv_lens": [33, 8, 50], "causal": False,
                     "page_size": 16, "layout": "NHD", "cache_form": "tuple"},
}

_rows = relations.rows
_blocks_wide = relations.blocks_wide
_pool_blocks = relations.pool_blocks

# (variant, field, run() value, expect, the word the refusal names, the planned value): the
# relations the call signature derives (harness/model/relations.py RELATIONS, each with its
# reason), as the rows explore and shrink read. A refusal must name the field, the planned
# value and the given one. `query_start_loc_short` is retired: q with more rows than the
# offsets' last entry is the padding q_rows_padded already asks to match (one input, one
# contract); `query_start_loc_past` is the offsets' last entry past q's rows.
MISMATCHES = tuple((r.variant, r.field, r.value, r.expect, r.word, r.planned)
                   for r in relations.RELATIONS)

# Variants that move one side of a k/v pair alone: mismatch["only"] names it.
ONLY = {r.variant: r.only for r in relations.RELATIONS if r.only}
# Batch decode plans one query row per request: its row count is the batch size (a plan()
# without query offsets says so) or the offsets' rows (a vLLM-shaped call's query_start_loc).
WORD_BY_OP = {("batch_decode", "rows"): "batch_size|rows"}
_PAGED_FIELDS = {"num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo", "page_size",
                 "rank", "q_rows", "dtype", "batch_size", "kv_lens", "block_table",
                 "query_start_loc", "last_page_len", "max_seqlen_q", "max_seqlen_k",
                 "plan_handle", "causal", "window"}
APPLIES = {
    "paged_prefill": _PAGED_FIELDS,
    "ragged_prefill": {"num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo", "rank",
                       "q_rows", "kv_rows", "dtype", "query_start_loc", "max_seqlen_q",
                       "max_seqlen_k"},
    "batch_decode": _PAGED_FIELDS,
}


def applies(op: str, variant: str) -> bool:
    r = relations.BY_VARIANT[variant]
    return r.field in APPLIES[op] and (r.ops is None or op in r.ops)


def relation_of(op: str, params) -> "relations.Relation":
    """The relation a mismatch in params breaks (any value, as explore draws them): its
    field, the direction of its value against the problem, and (for a list) which entry
    breaks. The contract and refusal words of any such params follow from it."""
    mm = params["mismatch"]
    field, value, only = mm["field"], mm["value"], mm.get("only")
    p = params
    if field == "query_start_loc":
        if isinstance(value, list):
            variant = ("query_start_loc_negative" if value and value[0] < 0
                       else "query_start_loc_decreasing")
        else:
            variant = "query_start_loc_past"
    elif field in ("num_kv_heads", "kv_rows") and only:
        variant = {"num_kv_heads": "num_kv_heads", "kv_rows": "kv_rows_fewer"}[field] + "_" + only
    elif field == "num_qo_heads":
        variant = "num_qo_heads_more" if value > p["num_qo_heads"] else "num_qo_heads"
    elif field == "num_kv_heads":
        variant = "num_kv_heads_more" if value > p["num_kv_heads"] else "num_kv_heads"
    elif field == "q_rows":
        variant = "q_rows_padded" if value > _rows(p) else "q_rows_fewer"
    elif field == "batch_size":
        variant = "batch_size_fewer" if value < len(p["qo_lens"]) else "batch_size"
    elif field == "kv_lens":
        variant = "kv_lens_negative" if value < 0 else "kv_lens_past_table"
    elif field == "block_table":
        variant = ("block_table_negative" if value < 0 else "block_table_one_past"
                   if value == _pool_blocks(p) else "block_table_past_pool")
    elif field == "last_page_len":
        variant = "last_page_len_zero" if value <= 0 else "last_page_len_past"
    elif field in ("max_seqlen_q", "max_seqlen_k"):
        lens = p["qo_lens"] if field == "max_seqlen_q" else p["kv_lens"]
        variant = f"{field}_below" if value < max(lens) else f"{field}_above"
    elif field in ("kv_rows",):
        variant = "kv_rows_fewer"
    elif field == "plan_handle":
        variant = f"plan_handle_{value}"
    else:
        variant = field
    if variant not in relations.BY_VARIANT:
        raise ValueError(f"mismatch {mm} on {op}: no relation says what it should do")
    return relations.BY_VARIANT[variant]


def words_of(op: str, r, params) -> tuple:
    """The words a refusal of relation r on params names (the field, planned, given)."""
    words = relations.refuse_words(r, params, params["mismatch"]["value"])
    if words:
        words = (WORD_BY_OP.get((op, words[0]), words[0]),) + words[1:]
    return words


def _tag(p) -> str:
    return id_tag(p, "dims", "page")


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
    r = relations.BY_VARIANT[variant]
    return Case(route=route, family=FAMILY, variant=variant, params=params, tag=tag,
                requires=(f"metadata.{r.field}",), **of_case(op_of(route), params))


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
            for r in relations.RELATIONS:
                if not applies(op, r.variant):
                    continue
                variant = r.variant
                mismatch = {"field": r.field, "value": r.value_for(base)}
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
