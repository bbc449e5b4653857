"""strided: tensors whose memory layout is legal torch but not what a kernel assumes (seed 002).

Each case passes one tensor as an adversarial view (harness/targets/bundled.py,
params["strided"]): a float tensor with stride(-1) == 2 and NaN in the
skipped slots, a head-sliced q (rows strided, last dim packed), or an index
tensor that is non-contiguous along dim 0; or one index tensor as int64 next
to int32 ones (params["index_dtype"]).

Expectations (the same for every library): every case here has a defined
answer, and a library may legitimately not support the layout, so each is
match_or_refuse: computing the right answer passes, and so does a refusal
that names the tensor as a word; a wrong answer (the view read as packed)
fails. The bundled library refuses a kernel tensor with stride(-1) == 2
(a silent copy of a KV cache would be a hidden cost per call, and an
output cannot be copied back for free), copies single decode's one-token q,
reads a head-sliced q through its strides, and accepts strided or int64
index tensors.
"""
from __future__ import annotations

from typing import Iterator

from cases._call_forms import forms
from cases._expect import expect
from cases._tags import tag as id_tag
from harness.model.case import Case
from harness.model.routes import op_of

FAMILY = "strided"
OPS = ("single_prefill", "single_decode", "paged_prefill", "ragged_prefill",
       "batch_decode", "merge_state", "mixed_batch")

# One modest problem per op: heads 4 over 2 (a real GQA group), tile-unaligned lengths.
_BASE = {"num_qo_heads": 4, "num_kv_heads": 2, "window_left": -1, "return_lse": True}
PROBLEMS = {
    "single_prefill": {"dtype": "bf16", "head_dim": 128, "qo_lens": [13], "kv_lens": [29],
                       "causal": True, "layout": "NHD"},
    "single_decode": {"dtype": "fp16", "head_dim": 64, "qo_lens": [1], "kv_lens": [37],
                      "causal": False, "layout": "NHD"},
    "paged_prefill": {"dtype": "bf16", "head_dim": 128, "qo_lens": [5, 11], "kv_lens": [21, 40],
                      "causal": True, "page_size": 16, "layout": "NHD", "cache_form": "tuple"},
    "ragged_prefill": {"dtype": "fp16", "head_dim": 64, "qo_lens": [7, 3], "kv_lens": [19, 26],
                       "causal": True},
    "batch_decode": {"dtype": "bf16", "head_dim": 128, "qo_lens": [1, 1, 1],
                     "kv_lens": [17, 40, 5], "causal": False, "page_size": 16, "layout": "NHD",
                     "cache_form": "tuple"},
    "merge_state": {"dtype": "fp16", "head_dim": 64, "qo_lens": [3, 5], "kv_lens": [20, 33],
                    "causal": False},
    "mixed_batch": {"dtype": "bf16", "head_dim": 128, "qo_lens": [1, 1, 9],
                    "kv_lens": [17, 30, 21], "causal": True, "page_size": 16,
                    "num_decodes": 2, "return_lse": False},
}

# (tensor, extra params) per op. A refusal must name the tensor.
_OUT = (("out", {}), ("lse", {}))
_Q = (("q", {}), ("q_heads", {}))
_PAGED_CACHE = (("k_cache", {}), ("v_cache", {}), ("kv_cache", {"cache_form": "single"}))
_PAGED_INDEX = ("kv_indptr", "kv_indices", "last_page_len")
TENSORS = {
    "single_prefill": _Q + (("k", {}), ("v", {}), ("k", {"layout": "HND"})) + _OUT,
    "single_decode": _Q + (("k", {}), ("v", {}), ("v", {"layout": "HND"})) + _OUT,
    "paged_prefill": _Q + _PAGED_CACHE + (("k_cache", {"layout": "HND"}),) + _OUT + (
        ("partial_state_v", {"partial_state": True}),
        ("partial_state_s", {"partial_state": True, "max_kv_chunk": 16})),
    "ragged_prefill": _Q + (("k", {}), ("v", {})) + _OUT,
    "batch_decode": _Q + _PAGED_CACHE + (("v_cache", {"layout": "HND"}),) + _OUT,
    "merge_state": (("v_a", {}), ("s_b", {}), ("v", {"merge": "in_place"}),
                    ("s", {"merge": "in_place"}), ("v_other", {"merge": "in_place"})),
    "mixed_batch": (("q", {}), ("q_heads", {}), ("k_cache", {}), ("v_cache", {}), ("out", {})),
}
INDEX = {
    "paged_prefill": ("qo_indptr",) + _PAGED_INDEX,
    "ragged_prefill": ("qo_indptr", "kv_indptr"),
    "batch_decode": _PAGED_INDEX,
    "mixed_batch": ("query_start_loc", "seq_lens", "block_table"),
}
# The words a refusal names: the tensor's argument name, as a whole word, under any name
# the field goes by (a single-tensor cache may be refused as the k or v half it splits
# into; a partial state as the tuple or its half; vLLM's names on the mixed batch).
WORDS = {"kv_cache": ("kv_cache|paged_kv_cache|k_cache|v_cache",),
         "partial_state_v": ("partial_state|partial_state_v",),
         "partial_state_s": ("partial_state|partial_state_s",)}
WORDS_BY_OP = {"mixed_batch": {"q": ("query",), "k_cache": ("key_cache",),
                               "v_cache": ("value_cache",)}}


def _tag(params) -> str:
    return id_tag(params, "dims", "page", "layout", "single", "in_place", "chunk")


def _cases_for(op: str):
    base = {**_BASE, **PROBLEMS[op]}
    for tensor, extra in TENSORS[op]:
        params = {**base, **extra, "strided": tensor}
        variant = tensor if tensor == "q_heads" else f"{tensor}_stride2"
        yield variant, params
    for name in INDEX.get(op, ()):
        yield f"{name}_every_other", {**base, "strided": name}
        yield f"{name}_int64", {**base, "index_dtype": {name: "int64"}}


# Strided outputs need the caller's buffers; every other view is crossed with the
# call forms (cases/_call_forms.py).
CALLER_BUFFERS = {"out", "lse", "partial_state_v", "partial_state_s", "v", "s", "v_other"}


def cases(routes) -> Iterator[Case]:
    for route in routes:
        op = op_of(route)
        if op not in PROBLEMS:
            continue
        for variant, params in _cases_for(op):
            # Match or a refusal naming the tensor (cases/_expect.py), in every call form.
            must, words = expect(op, params)
            tensor = params.get("strided")
            crossed = op != "merge_state" and tensor not in CALLER_BUFFERS
            for form, tag in (forms(params, _tag(params)) if crossed else
                              [(params, _tag(params))]):
                yield Case(route=route, family=FAMILY, variant=variant, params=form,
                           expect=must, refuse_words=words, tag=tag)


def rebuild(case: Case, params: dict) -> Case:
    """The case this family writes for `params` in `case`'s call form: the words name the
    tensor (not a value), so only the tag follows the params."""
    return Case(route=case.route, family=FAMILY, variant=case.variant, params=params,
                expect=case.expect, refuse_words=case.refuse_words,
                tag=_tag(params) + case.tag[len(_tag(case.params)):])
