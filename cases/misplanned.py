"""misplanned: run() tensors that disagree with plan(), and plans that fail (seed 002).

plan() gets the problem as described; run() gets tensors that disagree with
it in one field (harness/targets/plan_run/mismatch.py lists them). Each must
be refused with a ValueError naming the field. Before the fix these ran
silently (reading past q, a truncated head loop) or killed the process.

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
    ("dtype", "dtype", "fp16", "refuse", "dtype", lambda p: "bfloat16"),
)
# Batch decode plans one query row per request: its row count is the batch size.
WORD_BY_OP = {("batch_decode", "rows"): "batch_size"}
APPLIES = {
    "paged_prefill": {"num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo", "page_size",
                      "rank", "q_rows", "dtype"},
    "ragged_prefill": {"num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo", "rank",
                       "q_rows", "kv_rows", "dtype"},
    "batch_decode": {"num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo", "page_size",
                     "rank", "q_rows", "dtype"},
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


def cases(routes) -> Iterator[Case]:
    for route in routes:
        op = op_of(route)
        if op not in PROBLEMS:
            continue
        base = {**_BASE, **PROBLEMS[op]}
        tag = _tag(base)
        for variant, field, value, expect, word, planned in MISMATCHES:
            if field not in APPLIES[op]:
                continue
            value = value(base) if callable(value) else value
            params = {**base, "mismatch": {"field": field, "value": value}}
            words = ()
            if expect == "refuse":
                given = "float16" if field == "dtype" else value
                words = (WORD_BY_OP.get((op, word), word), str(planned(base)), str(given))
            for form, form_tag in forms(params, tag):
                yield Case(route=route, family=FAMILY, variant=variant, params=form,
                           expect=expect, refuse_words=words, tag=form_tag,
                           requires=("plan_run",))
        for variant, params, expect, words, requires in _scenarios(op, base):
            for form, form_tag in forms(params, tag):
                yield Case(route=route, family=FAMILY, variant=variant, params=form,
                           expect=expect, refuse_words=words, tag=form_tag, requires=requires)
