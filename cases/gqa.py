"""gqa: head counts the GQA group size cannot divide, next to odd ones it can (seed 002).

12 q heads over 8 kv heads has no group size (before the fix the kernels
ran a truncated group of 1 and answered wrongly); 4 over 8 gives a group
size of 0 (an integer division by it is SIGFPE on the host); 0 kv heads has
no group at all. None of the three has a defined answer (`refuse`: anything
that runs is silent); each must be refused with a catchable exception naming
the head counts and their values as words. 7 over 1 (a group of 7, not a
power of two) and 5 over 5 (plain MHA with an odd count) must match, and so
must 8 over 2 and 6 over 3, where h // group and h % num_kv_heads disagree.

The dtype is not the point: each op's problem keeps its own dtype where the target has
it, else takes the first dtype the target declares (cases/_dtypes.py).
"""
from __future__ import annotations

from typing import Iterator

from cases._call_forms import forms
from cases._dtypes import own_or_first
from cases._expect import expect, heads
from cases._tags import tag as id_tag
from harness.model.case import Case
from harness.model.routes import op_of

FAMILY = "gqa"
OPS = ("single_prefill", "single_decode", "paged_prefill", "ragged_prefill",
       "batch_decode", "merge_state", "mixed_batch")

# (num_qo_heads, num_kv_heads, variant, expect, words the refusal names)
HEADS = (
    (12, 8, "q12_over_kv8", "refuse", ("num_qo_heads", "12", "num_kv_heads", "8")),
    (4, 8, "q4_over_kv8", "refuse", ("num_qo_heads", "4", "num_kv_heads", "8")),
    (8, 0, "kv0", "refuse", ("num_kv_heads", "0")),
    (7, 1, "q7_over_kv1", "match", ()),
    (5, 5, "q5_over_kv5", "match", ()),
    # Controls that tell q head h -> kv head h // group from h % num_kv_heads (the two
    # agree on 7 over 1 and 5 over 5, so those alone cannot catch a wrong mapping).
    (8, 2, "q8_over_kv2", "match", ()),
    (6, 3, "q6_over_kv3", "match", ()),
)

# One problem per op; head_dim 128 keeps ll4mi on its own kernel (not the fa2 fallback).
PROBLEMS = {
    "single_prefill": {"dtype": "bf16", "qo_lens": [11], "kv_lens": [23], "causal": True},
    "single_decode": {"dtype": "fp16", "qo_lens": [1], "kv_lens": [45], "causal": False},
    "paged_prefill": {"dtype": "bf16", "qo_lens": [6, 9], "kv_lens": [20, 35], "causal": True,
                      "page_size": 16, "layout": "NHD", "cache_form": "tuple"},
    "ragged_prefill": {"dtype": "fp16", "qo_lens": [4, 7], "kv_lens": [19, 13], "causal": True},
    "batch_decode": {"dtype": "bf16", "qo_lens": [1, 1, 1], "kv_lens": [30, 7, 52],
                     "causal": False, "page_size": 16, "layout": "NHD", "cache_form": "tuple"},
    "merge_state": {"dtype": "fp16", "qo_lens": [3, 2], "kv_lens": [18, 27], "causal": False},
    "mixed_batch": {"dtype": "bf16", "qo_lens": [1, 1, 8], "kv_lens": [21, 9, 17],
                    "causal": True, "page_size": 16, "num_decodes": 2},
}


def contract(hq: int, hkv: int) -> tuple[str, str, tuple[str, ...]]:
    """(variant, expect, refusal words) of a head count pair: HEADS' rows, by rule, so that
    a shrunk case (other counts) is named and judged as the family would write it."""
    return ("kv0" if hkv == 0 else f"q{hq}_over_kv{hkv}"), *heads(hq, hkv)


def tag_of(params) -> str:
    return id_tag(params, "dims")


def heads_case(route: str, params: dict, tag: str) -> Case:
    variant, _, _ = contract(params["num_qo_heads"], params["num_kv_heads"])
    must, words = expect(op_of(route), params)
    return Case(route=route, family=FAMILY, variant=variant, params=params, expect=must,
                refuse_words=words, tag=tag)


def rebuild(case: Case, params: dict) -> Case:
    """The case this family writes for `params` in `case`'s call form (its tag's suffix)."""
    return heads_case(case.route, params, tag_of(params) + case.tag[len(tag_of(case.params)):])


def cases(routes, dtypes=None) -> Iterator[Case]:
    for route in routes:
        op = op_of(route)
        if op not in PROBLEMS:
            continue
        dtype = own_or_first(PROBLEMS[op]["dtype"], dtypes)
        if dtype is None:
            continue
        base = {"head_dim": 128, "window_left": -1,
                "return_lse": op not in ("mixed_batch",), **PROBLEMS[op], "dtype": dtype}
        for hq, hkv, variant, must, words in HEADS:
            params = {**base, "num_qo_heads": hq, "num_kv_heads": hkv}
            assert contract(hq, hkv) == (variant, must, words), (hq, hkv)
            for form, tag in forms(params, tag_of(params)):
                yield heads_case(route, form, tag)
