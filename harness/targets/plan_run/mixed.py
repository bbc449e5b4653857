"""mixed_batch: decode_first_attention over a vLLM-shaped block-table cache.

The first params["num_decodes"] requests are decodes (qo_len 1), split from
the prefills after them by query_start_loc.
"""
from __future__ import annotations

from harness.targets.base import Skip
from harness.targets.layout import block_table, build_paged


def decode_first(c) -> int:
    """num_decodes, once the batch is one a decode-first block-table call can take."""
    p = c.problem
    nd = int(c.params.get("num_decodes", 0))
    if any(n != 1 for n in p.qo_lens[:nd]):
        raise Skip("a decode-first batch needs qo_len 1 for its first num_decodes requests")
    if p.head_dim_vo != p.head_dim:
        raise Skip("the block-table cache holds one head_dim for k and v")
    return nd


def mixed_batch(c) -> dict:
    """decode_first_attention: decodes first, split from prefills by query_start_loc."""
    p = c.problem
    nd = decode_first(c)
    paged = build_paged(p, int(c.params.get("page_size", 16)), "NHD",
                        c.params.get("page_order", "shuffled"),
                        int(c.params.get("page_id_offset", 0)), c.case.seed)
    qsl = c.views.index("query_start_loc", p.qo_indptr.tolist(), c.device)
    seq_lens = c.views.index("seq_lens", p.kv_lens, c.device)
    table = c.views.index("block_table", block_table(paged, p.batch_size), c.device)
    query = c.views.input("q", p.q_packed())
    key_cache = c.views.input("k_cache", paged.k_pages)
    value_cache = c.views.input("v_cache", paged.v_pages)
    if p.return_lse:
        raise Skip("decode_first_attention returns no LSE")
    if not c.caller_outputs:
        raise Skip("decode_first_attention writes into the caller's out (vLLM's API); "
                   "it allocates none")
    rows = sum(p.qo_lens)
    out = c.out(rows)
    c.ready("run")
    c.lib.decode_first_attention(
        query, key_cache, value_cache, qsl, seq_lens, table, num_decodes=nd,
        num_decode_tokens=nd, out=out, causal=p.causal, window_left=p.window_left,
        sm_scale=c.sm_scale)
    return {"o": out}
