"""A vLLM-shaped decode-first mixed batch: decode tokens first, then prefill requests (seed 000)."""
from __future__ import annotations

import torch

from . import guards
from ._launch import check_device, launch, paged_kv_dims, params


def _int32(t: torch.Tensor, device) -> torch.Tensor:
    return torch.empty(t.shape, dtype=torch.int32, device=device).copy_(t)


def decode_first_attention(query, key_cache, value_cache, query_start_loc, seq_lens, block_table, num_decodes,
                           num_decode_tokens, out, causal=True, window_left=-1, sm_scale=None):
    """query [tokens, Hq, D]; caches [blocks, block_size, Hkv, D]; block_table [seqs, max_blocks];
    seq_lens [seqs] kv lengths; query_start_loc [seqs + 1]. Writes `out`; returns it."""
    where = "decode_first_attention()"
    check_device(where, {"query": query, "key_cache": key_cache, "value_cache": value_cache, "out": out})
    guards.rank_expected(where, {"query": (query, 3), "key_cache": (key_cache, 4), "value_cache": (value_cache, 4),
                                 "block_table": (block_table, 2)})
    t = guards.last_dim_contiguous(where, {"query": query, "key_cache": key_cache, "value_cache": value_cache})
    query, key_cache, value_cache = t["query"], t["key_cache"], t["value_cache"]
    kd, vd = paged_kv_dims(key_cache, "NHD"), paged_kv_dims(value_cache, "NHD")
    hq, dqk, dvo = query.shape[1], query.shape[2], vd["dim"]
    guards.kv_shapes_agree(where, {"head_dim_qk": (dqk, kd["dim"]), "num_kv_heads": (kd["heads"], vd["heads"]),
                                   "block_size": (kd["page_size"], vd["page_size"])})
    guards.gqa_divisible(where, hq, kd["heads"])
    guards.head_dim_supported(where, dqk, dvo)
    guards.out_contiguous(where, {"out": out}, {"out": (query.shape[0], hq, dvo)})
    dev = query.device
    num_seqs = block_table.shape[0]
    table = _int32(block_table, dev).contiguous()
    lens = _int32(seq_lens, dev)
    # Request r's pages are row r of the block table.
    kv_indptr = torch.arange(num_seqs + 1, dtype=torch.int32, device=dev) * table.shape[1]
    common = dict(k=key_cache, v=value_cache, kd=kd, vd=vd, num_qo_heads=hq, num_kv_heads=kd["heads"],
                  head_dim_qk=dqk, head_dim_vo=dvo, window_left=window_left, sm_scale=sm_scale,
                  q_dtype=query.dtype, kv_dtype=key_cache.dtype, o_dtype=out.dtype, page_size=kd["page_size"],
                  kv_indptr=kv_indptr.data_ptr(), kv_indices=table.data_ptr())

    decode_cu = _int32(guards.decode_cu_seqlens_slice(query_start_loc, num_decodes), dev)
    n_dec = decode_cu.numel() - 1
    if n_dec > 0:
        p = params(q=query, o=out, lse=None, causal=causal, qo_indptr=decode_cu.data_ptr(),
                   kv_lens=lens.data_ptr(), num_work=n_dec, **common)
        launch("kernels_decode", p, query)

    n_pre = num_seqs - num_decodes
    if n_pre > 0:
        starts = query_start_loc[num_decodes:]
        prefill_cu = _int32(starts - starts[0], dev)
        q_pre, o_pre = query[num_decode_tokens:], out[num_decode_tokens:]
        p = params(q=q_pre, o=o_pre, lse=None, causal=causal, qo_indptr=prefill_cu.data_ptr(),
                   kv_lens=lens[num_decodes:].data_ptr(), num_work=n_pre,
                   **{**common, "kv_indptr": kv_indptr.data_ptr(),
                      "kv_indices": table[num_decodes:].data_ptr()})
        launch("kernels_prefill", p, query)
    return out
