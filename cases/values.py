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
"""
from __future__ import annotations

from typing import Iterator

from cases._call_forms import forms
from harness.model.case import Case, dtype_tag
from harness.model.routes import op_of

FAMILY = "values"
OPS = ("single_prefill", "single_decode", "paged_prefill", "ragged_prefill",
       "batch_decode", "merge_state", "mixed_batch")

KINDS = ("normal", "large_logits", "outlier", "ties", "tiny")
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


def _bits(params: dict) -> list[str]:
    """The id tail beyond dtype/head bits: what tells two cases of one kind apart."""
    bits = []
    if params.get("causal"):
        bits.append("causal")
    if params.get("window_left", -1) >= 0:
        bits.append(f"w{params['window_left']}")
    if "page_size" in params:
        bits.append(f"p{params['page_size']}")
    if "max_kv_chunk" in params:
        bits.append(f"chunk{params['max_kv_chunk']}")
    if params.get("return_lse"):
        bits.append("lse")
    return bits


# ---------------------------------------------------------------- per op, per (kind, dtype index)

def _single_prefill(kind, i, backend):
    lens = (([17], [61], True, -1), ([1], [97], False, -1), ([31], [31], True, 7))[i]
    yield _params(kind, i, (64, 128, 256)[i], qo_lens=lens[0], kv_lens=lens[1], causal=lens[2],
                  window_left=lens[3], return_lse=True, layout=("NHD", "HND", "NHD")[i])


def _single_decode(kind, i, backend):
    yield _params(kind, i, (128, 64, 256)[i], qo_lens=[1], kv_lens=[(37, 129, 300)[i]],
                  causal=False, return_lse=i != 1, layout=("HND", "NHD", "NHD")[i])


def _paged_prefill(kind, i, backend):
    p = _params(kind, i, (128, 64, 128)[i], qo_lens=[5, 1, 13], kv_lens=[77, 30, 129],
                causal=i != 1, return_lse=True, page_size=(16, 1, 16)[i],
                layout=("NHD", "HND", "NHD")[i], cache_form=("tuple", "single", "tuple")[i])
    yield _chunked(p, i)
    if kind == "large_logits":
        # A CUDA-graph plan always splits; run(partial_state=) merges once more in place.
        yield {**p, "max_kv_chunk": 32, "use_cuda_graph": True}
        yield {**p, "max_kv_chunk": 16, "partial_state": True}


def _ragged_prefill(kind, i, backend):
    p = _params(kind, i, (64, 128, 64)[i], qo_lens=[7, 2, 19], kv_lens=[70, 45, 111],
                causal=i != 1, return_lse=True)
    yield _chunked(p, i)
    if kind == "large_logits":
        yield {**p, "max_kv_chunk": 32, "use_cuda_graph": True}


def _batch_decode(kind, i, backend):
    # ll4mi's own kernel: no LSE, head_dim a multiple of 64, no window. aiter's own kernel: no
    # LSE; with LSE it runs its (split) fa2 shadow plan.
    lse = {"ll4mi": False, "aiter": i == 0}.get(backend, i != 1)
    p = _params(kind, i, (128, 64, 256)[i], qo_lens=[1] * 4, kv_lens=[45, 1, 130, 77],
                causal=False, return_lse=lse, page_size=(16, 1, 16)[i],
                layout=("NHD", "HND", "NHD")[i], cache_form=("tuple", "single", "tuple")[i])
    yield _chunked(p, i)
    if kind == "large_logits" and backend in ("fa2", "fa2_tc"):
        yield {**p, "max_kv_chunk": 16, "use_cuda_graph": True}


def _merge_state(kind, i, backend):
    for merge in ("out_of_place", "in_place"):
        yield _params(kind, i, (64, 128, 32)[i], qo_lens=[3, 5], kv_lens=[40, 77], causal=False,
                      return_lse=True, merge=merge)


def _mixed_batch(kind, i, backend):
    yield _params(kind, i, (64, 128, 64)[i], qo_lens=[1, 1, 9, 17], kv_lens=[40, 3, 30, 17],
                  causal=True, return_lse=False, page_size=(16, 1, 16)[i], num_decodes=2,
                  window_left=(-1, -1, 11)[i])


_BY_OP = {
    "single_prefill": _single_prefill, "single_decode": _single_decode,
    "paged_prefill": _paged_prefill, "ragged_prefill": _ragged_prefill,
    "batch_decode": _batch_decode, "merge_state": _merge_state, "mixed_batch": _mixed_batch,
}


def requires(params: dict) -> tuple[str, ...]:
    """The target features (harness/model/capabilities.py) a case cannot be expressed without. A
    chosen split (max_kv_chunk) is not one: a target that plans its own split still owes the
    same answer."""
    return tuple(feature for feature, key in (("graphs", "use_cuda_graph"),
                                              ("partial_state", "partial_state"))
                 if params.get(key))


def _variant(params: dict) -> str:
    bits = [params["values"]]
    if params.get("use_cuda_graph"):
        bits.append("graph")
    if params.get("partial_state"):
        bits.append("partial")
    if params.get("merge"):
        bits.append(params["merge"])
    return "_".join(bits)


def cases(routes, profile: str = "ci") -> Iterator[Case]:
    for route in routes:
        op = op_of(route)
        if op not in _BY_OP:
            continue
        backend = route.split(".", 1)[0]
        for kind in KINDS:
            for i in range(len(DTYPES)):
                for params in _BY_OP[op](kind, i, backend):
                    tag = "-".join([dtype_tag(params), *_bits(params)])
                    for form, form_tag in forms(params, tag, profile == "full"):
                        yield Case(route=route, family=FAMILY, variant=_variant(params),
                                   params=form, expect="match", tag=form_tag,
                                   requires=requires(params))
