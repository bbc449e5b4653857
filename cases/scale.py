"""scale: long contexts, big batches, page ids past 65,535 (issue 12, generator reach).

valid stays small because the host kernels are CPU loops. Here, still a few
seconds each on the host ("ci" profile):

  long_kv        kv up to 8k tokens with few query rows, planned with the library's own
                 chunk (long requests split, short ones not)
  batch_many     256+ short requests in one batch
  page_ids_64k   every paged route (paged prefill, batch decode on every backend, with
                 and without LSE so a decode kernel that writes none is reached, the mixed
                 batch) with every page id past 65,535 and pages of several tokens

  offset_past_2_31_host  every paged route with page ids whose element offset passes 2^31,
                 in lazily allocated pools (one kv head, a few short requests); not on a
                 route that declares eager pools (harness/model/routes.py)

  rows_past_2_31_k / _v  ragged prefill and the single routes with k (or v) passed as a view
                 whose token stride puts its last rows past element 2^31, over a lazily
                 allocated buffer (harness/targets/layout.py far_rows: strided "k_far" /
                 "v_far"), so a 32-bit token offset wraps on the host in seconds

profile="full" adds what only a GPU runs in reasonable time and memory:
kv of 32k to 128k tokens (prefill with thousands of query rows, on the
default workspace, which the planner must fit) and page ids whose element
offset (page id x page stride) passes 2^31.
"""
from __future__ import annotations

from typing import Iterator

from cases._expect import of_case
from cases._per_op import per_route
from cases._tags import tag as id_tag
from harness.model.case import Case

FAMILY = "scale"
OPS = ("single_prefill", "single_decode", "paged_prefill", "ragged_prefill",
       "batch_decode", "merge_state", "mixed_batch")
PROFILES = ("ci", "full")

PAGE_ID_OFFSET = 65536
# With 8 kv heads of head_dim 128 a page of 16 tokens is 2^14 elements, so page ids past 2^17
# put element offsets past 2^31 (a 32-bit page * stride product wraps).
PAST_2_31 = {"page_size": 16, "page_id_offset": (1 << 17) + 4096}
# The ci profile's: one kv head of head_dim 64, so a page of 16 tokens is 2^10 elements and
# page ids past 2^21 put element offsets past 2^31 with the fewest elements per request. The
# pools (4 GiB each, 16-bit) are allocated lazily and snapshotted sparsely
# (harness/model/builders.py): only the requests' pages and their neighbours are resident.
PAST_2_31_HOST = {"page_size": 16, "page_id_offset": (1 << 21) + 4096}


def element_offset(params: dict) -> int:
    """The element offset of the first page a request can own: page id x page stride."""
    return params["page_id_offset"] * params["page_size"] * params["num_kv_heads"] * \
        params["head_dim"]


def _params(dtype: str, head_dim: int, heads: tuple, **extra) -> dict:
    return {"dtype": dtype, "head_dim": head_dim, "num_qo_heads": heads[0],
            "num_kv_heads": heads[1], "window_left": -1, **extra}


def _short_lens(n: int, decode: bool) -> tuple[list[int], list[int]]:
    """n short requests, lengths 1..40 spread without a pattern a tile size would hide."""
    kv = [1 + (r * 37) % 40 for r in range(n)]
    qo = [1 if decode else 1 + (r * 13) % min(k, 7) for r, k in enumerate(kv)]
    return qo, kv


# ---------------------------------------------------------------- ci

# (k or v far, dtype, head_dim, heads, qo_lens, kv_lens): each route's rows past 2^31, 16-bit
# only (an fp32 buffer past 2^31 elements is twice the address space for nothing more).
FAR_ROWS = {
    "ragged_prefill": (("k", "fp16", 64, (4, 1), [5, 2], [40, 17]),
                       ("v", "bf16", 64, (4, 2), [3, 6], [25, 30]),
                       ("k", "bf16", 128, (2, 1), [4, 1], [33, 8]),
                       ("v", "fp16", 128, (4, 4), [2, 7], [9, 44]),
                       ("k", "fp16", 32, (8, 2), [6], [21]),
                       ("v", "bf16", 32, (2, 2), [1, 3, 2], [12, 7, 19])),
    "single_prefill": (("k", "fp16", 64, (4, 1), [5], [40]),
                       ("v", "bf16", 128, (4, 2), [9], [23]),
                       ("v", "fp16", 32, (2, 2), [3], [31])),
    "single_decode": (("k", "bf16", 64, (8, 2), [1], [45]),
                      ("v", "fp16", 128, (4, 1), [1], [20]),
                      ("k", "fp16", 32, (2, 2), [1], [13])),
}


def _far_rows(op):
    for n, (side, dtype, d, heads, qo, kv) in enumerate(FAR_ROWS[op]):
        yield f"rows_past_2_31_{side}", _params(dtype, d, heads, qo_lens=qo, kv_lens=kv,
                                                causal=op != "single_decode" and n % 2 == 0,
                                                return_lse=n % 3 != 2, layout="NHD",
                                                strided=f"{side}_far")


def _single_prefill(route, full):
    yield "long_kv", _params("bf16", 128, (2, 1), qo_lens=[8], kv_lens=[8192], causal=True,
                             return_lse=True)
    yield from _far_rows("single_prefill")
    if full:
        yield "long_kv_full", _params("bf16", 128, (8, 2), qo_lens=[4096], kv_lens=[65536],
                                      causal=True, return_lse=True)


def _single_decode(route, full):
    yield "long_kv", _params("fp16", 128, (8, 1), qo_lens=[1], kv_lens=[8192], causal=False,
                             return_lse=True)
    yield from _far_rows("single_decode")
    if full:
        yield "long_kv_full", _params("fp16", 128, (32, 8), qo_lens=[1], kv_lens=[131072],
                                      causal=False, return_lse=True)


def _paged_prefill(route, full):
    yield "long_kv", _params("fp16", 128, (2, 1), qo_lens=[8, 3, 1], kv_lens=[8192, 700, 5],
                             causal=True, return_lse=True, page_size=16, cache_form="tuple")
    qo, kv = _short_lens(260, decode=False)
    yield "batch_many", _params("bf16", 64, (4, 1), qo_lens=qo, kv_lens=kv, causal=True,
                                return_lse=True, page_size=16)
    yield "page_ids_64k", _params("bf16", 64, (4, 1), qo_lens=[7, 1, 12], kv_lens=[50, 9, 31],
                                  causal=True, return_lse=True, page_size=2, layout="HND",
                                  page_id_offset=PAGE_ID_OFFSET)
    for lse in (True, False):       # without the LSE too: vLLM's CPU attention returns none
        yield "offset_past_2_31_host", _params("fp16", 64, (4, 1), qo_lens=[5, 2],
                                               kv_lens=[40, 17], causal=True, return_lse=lse,
                                               **PAST_2_31_HOST)
    if full:
        yield "long_kv_full", _params("bf16", 128, (32, 8), qo_lens=[2048, 16],
                                      kv_lens=[32768, 131072], causal=True, return_lse=True,
                                      page_size=16)
        yield "offset_past_2_31", _params("bf16", 128, (16, 8), qo_lens=[9, 3],
                                          kv_lens=[300, 1000], causal=True, return_lse=True,
                                          **PAST_2_31)


def _ragged_prefill(route, full):
    yield "long_kv", _params("bf16", 64, (4, 4), qo_lens=[8, 2], kv_lens=[6000, 100],
                             causal=True, return_lse=True)
    qo, kv = _short_lens(260, decode=False)
    yield "batch_many", _params("fp16", 64, (2, 1), qo_lens=qo, kv_lens=kv, causal=True,
                                return_lse=True)
    yield from _far_rows("ragged_prefill")
    if full:
        yield "long_kv_full", _params("bf16", 128, (32, 8), qo_lens=[4096, 1],
                                      kv_lens=[32768, 65536], causal=True, return_lse=True)


def _batch_decode(route, full):
    # A route whose own kernel writes no LSE reaches it only without one. head_dim 64: an
    # emulated decode kernel that recomputes every logit per value slice is the slowest here.
    lse = route.decode_lse
    yield "long_kv", _params("bf16", 64, (4, 1), qo_lens=[1] * 3, kv_lens=[8192, 1000, 5],
                             causal=False, return_lse=lse, page_size=16)
    _, kv = _short_lens(300, decode=True)
    yield "batch_many", _params("fp16", 64, (2, 1), qo_lens=[1] * 300, kv_lens=kv,
                                causal=False, return_lse=lse, page_size=16)
    yield "page_ids_64k", _params("fp16", 64, (4, 1), qo_lens=[1] * 3, kv_lens=[70, 3, 33],
                                  causal=False, return_lse=lse, page_size=2,
                                  page_id_offset=PAGE_ID_OFFSET)
    for with_lse in sorted({lse, False}, reverse=True):
        yield "offset_past_2_31_host", _params("bf16", 64, (4, 1), qo_lens=[1] * 3,
                                               kv_lens=[33, 5, 20], causal=False,
                                               return_lse=with_lse, **PAST_2_31_HOST)
    if full:
        yield "long_kv_full", _params("bf16", 128, (32, 8), qo_lens=[1] * 4,
                                      kv_lens=[32768, 65536, 131072, 7], causal=False,
                                      return_lse=lse, page_size=16)
        yield "offset_past_2_31", _params("fp16", 128, (16, 8), qo_lens=[1] * 3,
                                          kv_lens=[1000, 17, 300], causal=False,
                                          return_lse=lse, **PAST_2_31)


def _merge_state(route, full):
    yield "long_kv", _params("fp16", 64, (4, 2), qo_lens=[4, 1], kv_lens=[8192, 3000],
                             causal=False, return_lse=True)


def _mixed_batch(route, full):
    yield "long_kv", _params("bf16", 128, (2, 1), qo_lens=[1, 1, 8], kv_lens=[8000, 3000, 4096],
                             causal=True, return_lse=False, page_size=16, num_decodes=2)
    _, kv = _short_lens(256, decode=True)
    qo = [1] * 256 + [5, 9]
    yield "batch_many", _params("fp16", 64, (4, 1), qo_lens=qo, kv_lens=kv + [20, 31],
                                causal=True, return_lse=False, page_size=16, num_decodes=256)
    yield "page_ids_64k", _params("fp16", 64, (4, 1), qo_lens=[1, 1, 6], kv_lens=[40, 9, 21],
                                  causal=True, return_lse=False, page_size=2, num_decodes=2,
                                  page_id_offset=PAGE_ID_OFFSET)
    yield "offset_past_2_31_host", _params("fp16", 64, (4, 1), qo_lens=[1, 1, 6],
                                           kv_lens=[25, 3, 30], causal=True, return_lse=False,
                                           num_decodes=2, **PAST_2_31_HOST)
    if full:
        yield "offset_past_2_31", _params("bf16", 128, (16, 8), qo_lens=[1, 1, 7],
                                          kv_lens=[500, 70, 300], causal=True, return_lse=False,
                                          num_decodes=2, **PAST_2_31)


def _tag(params: dict) -> str:
    return id_tag(params, "dims", "batch", "kv_kilo", "page", "page_ids", "lse")


def cases(routes, profile: str = "ci") -> Iterator[Case]:
    if profile not in PROFILES:
        raise ValueError(f"scale: profile {profile!r} is not one of {PROFILES}")
    for route, op, make, traits in per_route(routes, globals()):
        for variant, params in make(traits, profile == "full"):
            # A route whose adapter fills its pools eagerly would hold them resident.
            if variant == "offset_past_2_31_host" and traits.eager_pools:
                continue
            yield Case(route=route, family=FAMILY, variant=variant, params=params,
                       tag=_tag(params), **of_case(op, params))
