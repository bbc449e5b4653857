"""edge_rows: rows that see no kv, requests with nothing in them, single tokens (issue 12).

FlashInfer's conventions (harness/model/reference.py): causal is bottom-right
aligned, so with qo_len L > kv_len K the first L - K rows see no kv; a row
that sees nothing has output 0 and LSE -inf, which the comparison demands
exactly. valid never builds such a row. Here, on every route that can
express it:

  masked_causal   causal, qo_len > kv_len: leading rows see nothing
  masked_window0  the same with window_left 0 (each visible row sees one key)
  kv_empty        a request with kv_len 0 (all its rows see nothing; paged: no pages)
  qo_empty        a request with qo_len 0 (no rows to write)
  single_token    qo_len 1, kv_len 1
  batch           all of the above inside one batch, between ordinary requests,
                  unsplit, split-KV, in CUDA-graph mode, with run(partial_state=) and
                  with window_left 0
  all_empty       a batch in which every request has kv_len 0 (mixed_batch: every decode)
  batch_split_nolse  the batch split-KV without the LSE: masked rows merged with no lse out
  no_rows_split   a split batch whose requests all have qo_len 0 (kv but no rows to merge)

merge_state splits each request's kv in two non-empty halves and takes no
mask, so it gets a qo_len 0 request and single-token queries over the
shortest splittable kv (2), a merge over no rows at all (every request qo_len 0); and each
of its two input states empty on its own
(merge_empty a / b: that state is over no key, o 0 and LSE -inf, the other over
the whole kv, single-key requests included), and both empty (a kv_len 0 request
among them). held_empty_*: the same with every empty state holding values, as an outside
caller's may (empty_state_values): a merge must give it no weight, and two empty states
must still merge to 0 and -inf. mixed_batch gets empty decodes (vLLM pads a graph batch with
seq_len 0), prefills with masked rows and no rows, and a prefill with rows but
no kv among ordinary ones. The poisoned outputs make a row a kernel never
writes `wrong`.
"""
from __future__ import annotations

from typing import Iterator

from cases.values import requires
from cases._call_forms import forms
from cases._expect import of_case
from cases._per_op import per_route
from cases._tags import tag as id_tag
from harness.model.case import Case

FAMILY = "edge_rows"
OPS = ("single_prefill", "single_decode", "paged_prefill", "ragged_prefill",
       "batch_decode", "merge_state", "mixed_batch")

DTYPES = ("fp16", "bf16", "fp32")
HEADS = ((4, 2), (2, 2), (8, 1))

# (variant, qo_lens, kv_lens, causal, window_left) of one request.
SINGLES = (
    ("masked_causal", [9], [4], True, -1),
    ("masked_window0", [9], [4], True, 0),
    ("kv_empty", [3], [0], False, -1),
    ("kv_empty_causal", [3], [0], True, -1),
    ("qo_empty", [0], [5], True, -1),
    ("single_token", [1], [1], True, -1),
)
# One batch holding every edge: masked rows, empty kv, no rows, single token, ordinary.
BATCH_QO = [9, 3, 0, 1, 5, 0, 2, 6]
BATCH_KV = [4, 0, 6, 1, 20, 0, 2, 33]
DECODE_KV = [4, 0, 6, 1, 20, 0, 1, 33]


def _params(i: int, head_dim: int, **extra) -> dict:
    hq, hkv = HEADS[i]
    return {"dtype": DTYPES[i], "head_dim": head_dim, "num_qo_heads": hq, "num_kv_heads": hkv,
            "window_left": -1, **extra}


def _single_prefill(route):
    for i in range(len(DTYPES)):
        for variant, qo, kv, causal, window in SINGLES:
            yield variant, _params(i, (64, 128, 32)[i], qo_lens=qo, kv_lens=kv, causal=causal,
                                   window_left=window, return_lse=i != 1,
                                   layout=("NHD", "HND", "NHD")[i])


def _single_decode(route):
    for i in range(len(DTYPES)):
        for variant, kv in (("kv_empty", 0), ("single_token", 1)):
            yield variant, _params(i, (128, 64, 256)[i], qo_lens=[1], kv_lens=[kv], causal=False,
                                   return_lse=True, layout=("NHD", "HND", "NHD")[i])


# Batch forms: (variant, extra params). Paged forms add page size, layout and cache form.
BATCH_FORMS = (
    ("batch", {}),
    ("batch_split", {"max_kv_chunk": 4}),
    ("batch_graph", {"use_cuda_graph": True}),
)


def _batch_prefill(paged: bool):
    for i in range(len(DTYPES)):
        base = _params(i, (64, 128, 64)[i], qo_lens=BATCH_QO, kv_lens=BATCH_KV, causal=True,
                       return_lse=True)
        if paged:
            base.update(page_size=(16, 1, 4)[i], layout=("NHD", "HND", "NHD")[i],
                        cache_form=("tuple", "single", "tuple")[i])
        for variant, extra in BATCH_FORMS:
            yield variant, {**base, **extra}
        # Split without the LSE: a fully masked row's merge has no lse to write.
        yield "batch_split_nolse", {**base, "max_kv_chunk": 4, "return_lse": False}
        yield "batch_window0", {**base, "window_left": 0}
        yield "all_empty", {**base, "kv_lens": [0] * len(BATCH_KV)}
        if i == 0:
            # No query rows at all, split: work items over every kv chunk and no row to merge.
            yield "no_rows_split", {**base, "qo_lens": [0] * 3, "kv_lens": [4, 9, 20],
                                    "max_kv_chunk": 4}
        if paged:
            yield "batch_partial", {**base, "max_kv_chunk": 4, "partial_state": True}
            yield "batch_partial_unsplit", {**base, "partial_state": True}


def _paged_prefill(route):
    yield from _batch_prefill(paged=True)


def _ragged_prefill(route):
    yield from _batch_prefill(paged=False)


def _batch_decode(route):
    for i in range(len(DTYPES)):
        # A route whose own kernel writes no LSE reaches it only without one.
        lse = route.decode_lse or i == 0
        base = _params(i, (128, 64, 256)[i], qo_lens=[1] * len(DECODE_KV), kv_lens=DECODE_KV,
                       causal=False, return_lse=lse, page_size=(16, 1, 4)[i],
                       layout=("NHD", "HND", "NHD")[i], cache_form=("tuple", "single", "tuple")[i])
        for variant, extra in BATCH_FORMS:
            yield variant, {**base, **extra}
        if lse:
            yield "batch_split_nolse", {**base, "max_kv_chunk": 4, "return_lse": False}
        yield "all_empty", {**base, "kv_lens": [0] * len(DECODE_KV)}


def _merge_state(route):
    for i in range(len(DTYPES)):
        for merge in ("out_of_place", "in_place"):
            yield f"qo_empty_{merge}", _params(i, (64, 128, 32)[i], qo_lens=[3, 0, 1, 1],
                                              kv_lens=[4, 5, 2, 9], causal=False,
                                              return_lse=True, merge=merge)
            # Each state empty on its own (the other over the whole kv, one key included).
            for side in ("a", "b"):
                yield f"state_{side}_empty_{merge}", _params(
                    i, (64, 128, 32)[i], qo_lens=[3, 2, 1, 4], kv_lens=[4, 1, 7, 30],
                    causal=False, return_lse=True, merge=merge, merge_empty=side)
            # No rows at all: every request qo_len 0, a merge over zero rows.
            yield f"no_rows_{merge}", _params(i, (64, 128, 32)[i], qo_lens=[0, 0], kv_lens=[4, 9],
                                             causal=False, return_lse=True, merge=merge)
            # Both empty: requests of kv_len 0 between ordinary ones.
            yield f"states_both_empty_{merge}", _params(
                i, (64, 128, 32)[i], qo_lens=[2, 3, 1], kv_lens=[0, 9, 0], causal=False,
                return_lse=True, merge=merge, merge_empty="a")
            # An outside caller's empty states hold values (only the LSE says empty): state a
            # or b empty alone beside the other over the whole kv, and both empty on a kv_len
            # 0 request; the answer is the one above (0 and -inf where both are empty).
            for n, (side, qo, kv) in enumerate((("a", [2, 3, 1, 2], [0, 9, 1, 0]),
                                                ("b", [2, 3, 1], [0, 9, 1]),
                                                ("both", [2, 3, 1], [0, 9, 0]))):
                yield f"held_empty_{side}_{merge}", _params(
                    i, (32, 64, 128)[(i + n) % 3], qo_lens=qo, kv_lens=kv, causal=False,
                    return_lse=True, merge=merge, merge_empty="b" if side == "b" else "a",
                    empty_state_values=(3.5, -7.0, 1e3)[i])


def _mixed_batch(route):
    # Decodes first: two of the four are empty; then a prefill with masked rows, one with
    # no rows, one single token, one ordinary.
    qo = [1, 1, 1, 1, 9, 0, 1, 4]
    kv = [0, 5, 0, 1, 4, 3, 1, 10]
    for i in range(len(DTYPES)):
        base = _params(i, (64, 128, 64)[i], qo_lens=qo, kv_lens=kv, causal=True,
                       return_lse=False, page_size=(16, 1, 4)[i], num_decodes=4)
        yield "batch", base
        yield "all_decodes_empty", {**base, "qo_lens": [1] * 4, "kv_lens": [0] * 4}
        yield "batch_window0", {**base, "window_left": 0}
        # A prefill with rows and no kv (its rows see nothing) among ordinary requests.
        yield "prefill_kv_empty", {**base, "qo_lens": [1, 1, 5, 3], "kv_lens": [6, 2, 0, 8],
                                   "num_decodes": 2}


def _tag(params: dict) -> str:
    return id_tag(params, "dims", "batch", "page", "hnd", "lse")


def cases(routes, profile: str = "ci") -> Iterator[Case]:
    for route, op, make, traits in per_route(routes, globals()):
        for variant, params in make(traits):
            for form, tag in forms(params, _tag(params), profile == "full"):
                yield Case(route=route, family=FAMILY, variant=variant, params=form,
                           tag=tag, requires=requires(params), **of_case(op, params))
