"""mixed_batch: decode-first mixed batches split by query_start_loc (seed 000's review).

A vLLM-style batch puts its num_decodes one-token requests first and the
prefill requests after. The decode part's cu_seqlens_q must be
query_start_loc[:num_decodes + 1]; the reviewed code sliced
[:num_decodes], one entry short, so the last decode request (the only one
when num_decodes is 1) is never computed and its rows keep what the output
buffer held (NaN here). Every case must match.

Batches: 1, 3 and 8 decodes followed by prefills, one batch of decodes only,
causal throughout (the prefills' masks align to the end of their KV); some
with a sliding window.
"""
from __future__ import annotations

from typing import Iterator

from cases._expect import of_case
from cases._tags import tag as id_tag
from harness.model.case import Case
from harness.model.routes import op_of

FAMILY = "mixed_batch"
OPS = ("mixed_batch",)

# (variant, num_decodes, prefill (qo_len, kv_len) pairs, decode kv_lens, window_left, dtype)
BATCHES = (
    ("decodes1", 1, ((9, 30),), (41,), -1, "bf16"),
    ("decodes1_window", 1, ((6, 20), (13, 13)), (52,), 15, "fp16"),
    ("decodes3", 3, ((5, 17), (11, 40)), (7, 33, 64), -1, "bf16"),
    ("decodes3_window", 3, ((8, 29),), (19, 48, 3), 7, "bf16"),
    ("decodes8", 8, ((12, 35),), (5, 17, 1, 40, 23, 16, 31, 9), -1, "fp16"),
    ("decodes8_window", 8, ((4, 26), (7, 7)), (44, 2, 18, 33, 15, 60, 27, 11), 10, "bf16"),
    ("decodes_only4", 4, (), (13, 37, 8, 25), -1, "bf16"),
)


def _params(nd, prefills, decode_kv, window, dtype) -> dict:
    return {"dtype": dtype, "head_dim": 64, "num_qo_heads": 4, "num_kv_heads": 2,
            "qo_lens": [1] * nd + [q for q, _ in prefills],
            "kv_lens": list(decode_kv) + [k for _, k in prefills],
            "causal": True, "window_left": window, "return_lse": False,
            "page_size": 16, "num_decodes": nd}


def cases(routes) -> Iterator[Case]:
    for route in routes:
        if op_of(route) not in OPS:
            continue
        for variant, nd, prefills, decode_kv, window, dtype in BATCHES:
            params = _params(nd, prefills, decode_kv, window, dtype)
            tag = id_tag(params, "dims", "page", "batch")
            yield Case(route=route, family=FAMILY, variant=variant, params=params,
                       tag=tag, **of_case(op_of(route), params))
