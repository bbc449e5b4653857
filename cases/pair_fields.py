"""pair_fields: a k/v pair's fields moved on one tensor alone (generator reach, round three).

run() takes k and v (a (k, v) cache, ragged k and v) that the plan describes together: one
page size and one cache dtype for both. misplanned moves page size by re-viewing both caches
and casts q for its dtype case, so a run() that checks either field on k alone passed them
all. Here each field moves on k alone and on v alone (mismatch["only"]), over two shapes
and several dtypes:

  page_size_k / page_size_v   that cache re-viewed as pages of a quarter or half the planned
                              size (the same storage: a run that ignores it reads plausible,
                              wrong tokens, never past the pool)
  kv_dtype_k / kv_dtype_v     that cache (ragged: that tensor) in another dtype than plan()
                              named, one as wide or wider (a run that reads it as the planned
                              dtype stays inside it)

Every case must be refused naming the field, the planned value and the given one; anything
that runs is `silent`.
"""
from __future__ import annotations

from typing import Iterator

from cases._expect import of_case
from cases._tags import tag as id_tag
from harness.model.case import Case
from harness.model.routes import op_of

FAMILY = "pair_fields"
OPS = ("paged_prefill", "ragged_prefill", "batch_decode")

TORCH_NAME = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
# (planned dtype, the dtype the one tensor has): never narrower than planned.
DTYPE_PAIRS = (("bf16", "fp16"), ("fp16", "bf16"), ("bf16", "fp32"), ("fp16", "fp32"))
# Two shapes: (head_dim, heads, planned page size, the page size the one cache has).
SHAPES = ((128, (8, 2), 16, 8), (64, (4, 1), 12, 4))
LENS = {
    "paged_prefill": {"qo_lens": [7, 12], "kv_lens": [25, 40], "causal": True},
    "ragged_prefill": {"qo_lens": [6, 9], "kv_lens": [21, 30], "causal": True},
    "batch_decode": {"qo_lens": [1, 1, 1], "kv_lens": [33, 8, 50], "causal": False},
}


def _problem(op, dtype, shape, n) -> dict:
    head_dim, heads, page_size, _ = shape
    p = {"dtype": dtype, "head_dim": head_dim, "num_qo_heads": heads[0],
         "num_kv_heads": heads[1], "window_left": -1, "return_lse": n % 2 == 0, **LENS[op]}
    if op != "ragged_prefill":
        p.update(page_size=page_size, layout=("NHD", "HND")[n % 2], cache_form="tuple")
    return p


def _tag(p, side) -> str:
    m = p["mismatch"]
    given = TORCH_NAME[m["value"]] if m["field"] == "dtype" else m["value"]
    # A paged problem names its layout (NHD too).
    bits = ("dims", "page", "layout") if "page_size" in p else ("dims",)
    return id_tag(p, *bits, extra=(f"{side}{given}", "lse" if p["return_lse"] else "nolse"))


def _case(route, variant, p, field, given, side) -> Case:
    p = {**p, "mismatch": {"field": field, "value": given, "only": side}}
    # Refused, naming the field, the planned value and the given one (cases/_expect.py).
    return Case(route=route, family=FAMILY, variant=variant, params=p, tag=_tag(p, side),
                requires=(f"metadata.{field}",), **of_case(op_of(route), p))


def cases(routes) -> Iterator[Case]:
    for route in routes:
        op = op_of(route)
        if op not in LENS:
            continue
        for side in ("k", "v"):
            for n, (planned, given) in enumerate(DTYPE_PAIRS):
                p = _problem(op, planned, SHAPES[n % 2], n)
                yield _case(route, f"kv_dtype_{side}", p, "dtype", given, side)
            if op == "ragged_prefill":
                continue
            for n, dtype in enumerate(("bf16", "fp16", "fp32")):
                for s, shape in enumerate(SHAPES):
                    if (n + s) % 3 == 2:
                        continue      # two shapes over three dtypes: four of the six pairs
                    p = _problem(op, dtype, shape, n + s)
                    yield _case(route, f"page_size_{side}", p, "page_size", shape[3], side)
