"""schedule: the sizes a route's schedule switches on, on every route that takes them.

kernels/_plan.py and kernels/csrc/plan.cpp schedule a batch; kernels/csrc/api.cpp launches
the prefill grid in tiles of TILE_ROWS query rows. Each size below is where a schedule takes
another path, so a kernel that only ever saw one side of it would pass everything else:

  tiles               query rows over several tiles (> 2 * TILE_ROWS), one just past a tile
                      (TILE_ROWS + 1), with a window, on every prefill route, the mixed
                      batch's prefill part and merge_state's halves (single prefills)
  tiles_split         the same rows with a caller's max_kv_chunk: the split's partial slots
                      of rows in different tiles
  ws_fit_split        no max_kv_chunk and a float workspace too small for the default
                      chunk's partial rows: plan() doubles the chunk until they fit
                      (kernels/_plan.py fit_chunk) and the schedule still splits
  vo_dim*             head_dim_vo != head_dim_qk (both ways), with tiles and splits, on every
                      route whose API takes two head sizes (single prefill and decode, paged
                      and ragged prefill, merge_state's states); batch decode and the mixed
                      batch plan one head_dim for k and v (their adapters skip it)

  ws_edge_*           a float workspace at the byte boundary of a fit: one byte short of the
                      need and exactly the need, at the default chunk (one short: plan()
                      must fit the doubled chunk) and at a caller's max_kv_chunk (one short:
                      match_or_refuse, a refusal naming float_workspace_buffer and both
                      sizes), in two shapes on every route a plan splits; a workspace sized
                      without one term (the partial LSEs) takes the short one as a fit
  mask_graph          a custom mask in CUDA-graph mode: staged into the plan's one fixed
                      buffer, over a schedule that always splits
  refuse.max_kv_chunk_*  a caller's max_kv_chunk of 0 or below: no split has that chunk, so
                      plan() must refuse it, naming max_kv_chunk and the value (the bundled
                      guard max_kv_chunk_positive; kernels_plan would otherwise see it)

Each case that asks for the LSE is also run without it (tag -nolse), so a library that
returns none gets every size. All stay small enough for the host ("ci"): a few hundred rows
and keys at most.
tests/test_case_reach.py checks that each reaches its path (the plan splits at the chunk
it fits, the rows span the tiles).
"""
from __future__ import annotations

from typing import Iterator

from cases._per_op import per_route
from cases._tags import tag as id_tag
from harness.model.case import Case

FAMILY = "schedule"
OPS = ("single_prefill", "single_decode", "paged_prefill", "ragged_prefill",
       "batch_decode", "merge_state", "mixed_batch")

# Query rows per prefill tile (kernels/csrc/api.cpp kernels_prefill) and the chunk plan()
# starts from without a caller's max_kv_chunk (kernels/_plan.py DEFAULT_MAX_KV_CHUNK).
TILE_ROWS = 64
DEFAULT_CHUNK = 512


def plan_bytes(qo_lens, kv_lens, num_qo_heads: int, head_dim_vo: int, chunk: int) -> int:
    """The float workspace plan.cpp's schedule needs at `chunk` (0 when nothing splits)."""
    chunks = [max(1, -(-k // chunk)) for k in kv_lens]
    if all(c == 1 for c in chunks):
        return 0
    slots = sum(q * c for q, c in zip(qo_lens, chunks))
    return slots * num_qo_heads * (head_dim_vo + 1) * 4


def fitted_chunk(qo_lens, kv_lens, num_qo_heads: int, head_dim_vo: int, ws_bytes: int) -> int:
    """The chunk fit_chunk picks: the first of 512, 1024, ... whose schedule fits."""
    chunk, longest = DEFAULT_CHUNK, max([1, *kv_lens])
    while plan_bytes(qo_lens, kv_lens, num_qo_heads, head_dim_vo, chunk) > ws_bytes \
            and chunk < longest:
        chunk = min(chunk * 2, longest)
    return chunk


def _ws_between(qo_lens, kv_lens, hq: int, dv: int) -> int:
    """A workspace the default chunk's schedule overflows and the doubled one fits."""
    need = plan_bytes(qo_lens, kv_lens, hq, dv, DEFAULT_CHUNK)
    fits = plan_bytes(qo_lens, kv_lens, hq, dv, 2 * DEFAULT_CHUNK)
    assert 0 < fits < need, (fits, need)
    return (need + fits) // 2


def _p(dtype, head_dim, heads, **extra) -> dict:
    return {"dtype": dtype, "head_dim": head_dim, "num_qo_heads": heads[0],
            "num_kv_heads": heads[1], "window_left": -1, **extra}


def _ws_fit(dtype, head_dim, heads, qo, kv, **extra) -> dict:
    dv = extra.get("head_dim_vo", head_dim)
    return _p(dtype, head_dim, heads, qo_lens=qo, kv_lens=kv,
              workspace_bytes=_ws_between(qo, kv, heads[0], dv), **extra)


ROWS = 2 * TILE_ROWS + 22          # three tiles, the last one partial


def _single_prefill(route):
    yield "tiles", _p("bf16", 64, (4, 2), qo_lens=[ROWS], kv_lens=[ROWS + 20], causal=True,
                      return_lse=True)
    yield "tiles_one_past", _p("fp16", 128, (2, 1), qo_lens=[TILE_ROWS + 1],
                               kv_lens=[TILE_ROWS + 1], causal=False, return_lse=True,
                               layout="HND")
    yield "tiles_window", _p("fp32", 64, (4, 1), qo_lens=[ROWS + 50], kv_lens=[ROWS + 50],
                             causal=True, window_left=37, return_lse=False)
    yield "vo_dim_tiles", _p("fp16", 64, (4, 2), head_dim_vo=128, qo_lens=[ROWS],
                             kv_lens=[ROWS + 7], causal=True, return_lse=True)


def _single_decode(route):
    yield "vo_dim", _p("bf16", 128, (8, 2), head_dim_vo=64, qo_lens=[1], kv_lens=[300],
                       causal=False, return_lse=True)
    yield "vo_dim_wide", _p("fp16", 64, (4, 4), head_dim_vo=128, qo_lens=[1], kv_lens=[77],
                            causal=False, return_lse=True, layout="HND")


def _batch_prefill(paged: bool):
    def pg(page_size=16, layout="NHD"):
        return {"page_size": page_size, "layout": layout, "cache_form": "tuple"} if paged else {}
    qo, kv = [ROWS, 3, TILE_ROWS + 6], [ROWS + 10, 30, 200]
    yield "tiles", _p("bf16", 64, (4, 2), qo_lens=qo, kv_lens=kv, causal=True,
                      return_lse=True, **pg())
    yield "tiles_split", _p("fp16", 64, (4, 1), qo_lens=qo, kv_lens=kv, causal=True,
                            return_lse=True, max_kv_chunk=48, **pg(1, "HND"))
    yield "ws_fit_split", _ws_fit("bf16", 64, (4, 2), [TILE_ROWS + 6, 3], [1300, 40],
                                  causal=True, return_lse=True, **pg())
    yield "ws_fit_split_vo_dim", _ws_fit("fp16", 128, (2, 1), [9, 1], [1100, 600],
                                         head_dim_vo=64, causal=False, return_lse=True,
                                         **pg(16, "HND"))
    yield "vo_dim_tiles", _p("fp32", 64, (4, 2), head_dim_vo=128, qo_lens=[ROWS, 5],
                             kv_lens=[ROWS, 50], causal=True, return_lse=True, **pg())
    yield "vo_dim_split", _p("bf16", 128, (8, 2), head_dim_vo=64, qo_lens=[7, 12, 1],
                             kv_lens=[90, 33, 140], causal=True, return_lse=True,
                             max_kv_chunk=16, **pg())


def _paged_prefill(route):
    yield from _batch_prefill(paged=True)
    # A CUDA-graph plan (always split) stages the custom mask into its one fixed buffer.
    yield "mask_graph", _p("fp32", 64, (4, 2), qo_lens=[5, 17, 1], kv_lens=[20, 40, 33],
                           causal=False, custom_mask="random", use_cuda_graph=True,
                           return_lse=True, page_size=16, cache_form="tuple")


def _ragged_prefill(route):
    yield from _batch_prefill(paged=False)


def _batch_decode(route):
    # A route whose own kernel writes no LSE reaches it only without one.
    lse = route.decode_lse
    yield "ws_fit_split", _ws_fit("bf16", 64, (8, 2), [1, 1, 1], [1300, 40, 700],
                                  causal=False, return_lse=lse, page_size=16,
                                  cache_form="tuple")
    yield "ws_fit_split_hnd", _ws_fit("fp16", 128, (4, 4), [1, 1], [1030, 520],
                                      causal=False, return_lse=lse, page_size=16,
                                      layout="HND", cache_form="single")


def _merge_state(route):
    for merge in ("out_of_place", "in_place"):
        yield f"tiles_{merge}", _p("bf16", 64, (4, 2), qo_lens=[ROWS, 2], kv_lens=[300, 9],
                                   causal=False, return_lse=True, merge=merge)
        yield f"vo_dim_{merge}", _p("fp16", 128, (4, 1), head_dim_vo=64, qo_lens=[5, 1],
                                    kv_lens=[40, 17], causal=False, return_lse=True,
                                    merge=merge)


def _mixed_batch(route):
    yield "prefill_tiles", _p("bf16", 64, (4, 2), qo_lens=[1, 1, ROWS, TILE_ROWS + 6],
                              kv_lens=[40, 9, ROWS + 20, 80], causal=True, return_lse=False,
                              page_size=16, num_decodes=2)
    yield "prefill_tiles_window", _p("fp16", 128, (2, 1), qo_lens=[1, ROWS + 50],
                                     kv_lens=[70, ROWS + 50], causal=True, window_left=29,
                                     return_lse=False, page_size=1, num_decodes=1)


def _tag(params: dict) -> str:
    return id_tag(params, "dims", "batch", "q_max", "kv_max", "page", "hnd", "chunk_set",
                  "workspace", "lse")


# Two shapes for the workspace edges: (dtype, head_dim, heads, head_dim_vo, prefill (qo, kv),
# decode kv); the caller's chunk of the *_chunk edges.
WS_EDGE_SHAPES = (("bf16", 64, (4, 2), 64, ([5, 3], [600, 40]), [600, 40, 530]),
                  ("fp16", 128, (4, 1), 64, ([9, 1], [560, 300]), [530, 60]))
WS_EDGE_CHUNK = 64


def ws_edges(op: str, route):
    """(variant, params, expect, refuse words) at the workspace boundary of a fit."""
    for n, (dtype, d, heads, dv, (qo, kv), dec_kv) in enumerate(WS_EDGE_SHAPES):
        if op == "batch_decode":
            qo, kv, dv = [1] * len(dec_kv), dec_kv, d     # one head_dim for k and v
            extra = {"causal": False, "page_size": 16, "cache_form": "tuple",
                     "return_lse": route.decode_lse}
        else:
            extra = {"causal": n == 0, "return_lse": True, "head_dim_vo": dv}
            if op == "paged_prefill":
                extra.update(page_size=16, cache_form="tuple", layout=("NHD", "HND")[n])
        for chunk in (None, WS_EDGE_CHUNK):
            need = plan_bytes(qo, kv, heads[0], dv, chunk or DEFAULT_CHUNK)
            assert need > 0
            tail = "_chunk" if chunk else ""
            base = _p(dtype, d, heads, qo_lens=qo, kv_lens=kv, **extra,
                      **({"max_kv_chunk": chunk} if chunk else {}))
            yield f"ws_edge_exact{tail}", {**base, "workspace_bytes": need}, "match", ()
            short = {**base, "workspace_bytes": need - 1}
            if chunk:
                yield f"ws_edge_short{tail}", short, "match_or_refuse", \
                    ("float_workspace_buffer", str(need - 1), str(need))
            else:
                yield f"ws_edge_short{tail}", short, "match", ()


# Caller chunks no split has: (variant, max_kv_chunk) on every route a caller splits.
BAD_CHUNKS = (("max_kv_chunk_zero", 0), ("max_kv_chunk_negative", -16))
SPLIT_OPS = ("paged_prefill", "ragged_prefill", "batch_decode")


def _bad_chunk(op: str, chunk: int) -> dict:
    extra = {"page_size": 16, "cache_form": "tuple"} if op != "ragged_prefill" else {}
    qo = [1, 1] if op == "batch_decode" else [5, 3]
    return _p("bf16", 64, (4, 2), qo_lens=qo, kv_lens=[40, 21], causal=op != "batch_decode",
              return_lse=False, max_kv_chunk=chunk, **extra)


def cases(routes) -> Iterator[Case]:
    for route, op, make, traits in per_route(routes, globals()):
        if op in SPLIT_OPS:
            for variant, chunk in BAD_CHUNKS:
                params = _bad_chunk(op, chunk)
                yield Case(route=route, family=FAMILY, variant=f"refuse.{variant}", params=params,
                           expect="refuse", refuse_words=("max_kv_chunk", str(abs(chunk))),
                           tag=_tag(params), requires=("split_control",))
        if op in SPLIT_OPS:
            for variant, params, expect, words in ws_edges(op, traits):
                needs = _requires(params) + (("split_control",) if params.get("max_kv_chunk")
                                             else ())
                yield Case(route=route, family=FAMILY, variant=variant, params=params,
                           expect=expect, refuse_words=words, tag=_tag(params), requires=needs)
        for variant, params in make(traits):
            needs = _requires(params)
            yield Case(route=route, family=FAMILY, variant=variant, params=params,
                       expect="match", tag=_tag(params), requires=needs)
            if params.get("return_lse"):
                # Without the LSE too: a library that returns none (vLLM's CPU attention)
                # reaches every size as well.
                plain = {**params, "return_lse": False}
                yield Case(route=route, family=FAMILY, variant=variant, params=plain,
                           expect="match", tag=f"{_tag(plain)}-nolse", requires=needs)


def _requires(params: dict) -> tuple[str, ...]:
    return (("custom_mask",) if params.get("custom_mask") else ()) + \
        (("plan_run", "graphs") if params.get("use_cuda_graph") else ())
