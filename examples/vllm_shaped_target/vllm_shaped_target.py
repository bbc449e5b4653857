"""A complete vLLM-shaped target adapter: a metadata call, then a paged run over a block
table. docs/targets.md ("A vLLM-shaped adapter") is the contract.

The library here is a small one in torch (`build_metadata` and `paged_attention`), standing
in for yours. The adapter is its signature, its capabilities and one function per call:
harness.targets.DeclaredTarget lays each case out as a block-table batch, bends it where the
case says (a seq_len past its block-table row, a negative block id, more heads than the
metadata states...), fills the caches, and hands every call its arguments by role.

Installed by entry point (pyproject.toml beside this file) it is `example-vllm-shaped`; or
pass `--target path/to/vllm_shaped_target.py`.
"""
from __future__ import annotations

import torch

from harness.targets import Arg, Capabilities, DeclaredTarget, Signature


# ---- the library under test (yours) ---------------------------------------------------------

def build_metadata(seq_lens, query_start_loc, num_seqs, num_heads, num_kv_heads, head_size):
    """The metadata call: checks the batch and copies what it keeps."""
    if seq_lens.numel() != num_seqs or query_start_loc.numel() != num_seqs + 1:
        raise ValueError(f"num_seqs is {num_seqs} but seq_lens has {seq_lens.numel()} and "
                         f"query_start_loc {query_start_loc.numel()} entries")
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    return {"num_heads": num_heads, "num_kv_heads": num_kv_heads, "head_size": head_size}


def paged_attention(query, key_cache, value_cache, out, query_start_loc, seq_lens,
                    block_table, scale, causal, metadata):
    """The run: caches [num_blocks, block_size, kv heads, head_size]; writes out."""
    heads, hkv, d = metadata["num_heads"], metadata["num_kv_heads"], metadata["head_size"]
    if tuple(query.shape[1:]) != (heads, d):
        raise ValueError(f"query is {tuple(query.shape)}; num_heads {heads}, head_size {d}")
    if key_cache.shape[2] != hkv:
        raise ValueError(f"num_kv_heads is {hkv} but key_cache has {key_cache.shape[2]}")
    if query.dtype != key_cache.dtype:
        name = lambda t: str(t).replace("torch.", "")  # noqa: E731
        raise ValueError(f"dtype: key_cache is {name(key_cache.dtype)}, query {name(query.dtype)}")
    qsl, lens = query_start_loc.tolist(), seq_lens.tolist()
    if qsl[0] != 0 or any(b < a for a, b in zip(qsl, qsl[1:])) or qsl[-1] > query.shape[0]:
        raise ValueError(f"query_start_loc {qsl} is not offsets into {query.shape[0]} rows")
    bs, pool = key_cache.shape[1], key_cache.shape[0]
    for r, n in enumerate(lens):
        blocks = block_table[r, :-(-n // bs)].long() if n > 0 else block_table[r, :0].long()
        if n < 0 or n > block_table.shape[1] * bs:
            raise ValueError(f"seq_lens[{r}] is {n}; block_table holds {block_table.shape[1] * bs}")
        bad = [int(b) for b in blocks if not 0 <= b < pool]
        if bad:
            raise ValueError(f"block_table: block id {bad[0]} (row {r}) outside 0..{pool - 1}")
        k = key_cache[blocks].reshape(-1, hkv, d)[:n].float().repeat_interleave(heads // hkv, 1)
        v = value_cache[blocks].reshape(-1, hkv, d)[:n].float().repeat_interleave(heads // hkv, 1)
        q = query[qsl[r]:qsl[r + 1]].float()
        s = torch.einsum("lhd,shd->hls", q, k) * scale
        if causal:
            row = torch.arange(q.shape[0]).unsqueeze(1) + (n - q.shape[0])
            s = s.masked_fill(torch.arange(n).unsqueeze(0) > row, float("-inf"))
        w = torch.softmax(s, -1).nan_to_num(0.0)
        out[qsl[r]:qsl[r + 1]] = torch.einsum("hls,shd->lhd", w, v).to(out.dtype)


# ---- the adapter ------------------------------------------------------------------------------

META, RUN = "build_metadata", "paged_attention"
SIGNATURE = Signature(core="declared", args=(
    Arg("seq_lens", "kv_lengths", META, dtype="int32"),
    Arg("query_start_loc", "qo_offsets", META, dtype="int32"),
    Arg("num_seqs", "batch_size", META),
    Arg("num_heads", "num_qo_heads", META),
    Arg("num_kv_heads", "num_kv_heads", META),
    Arg("head_size", "head_dim_qk", META),
    Arg("query", "q", RUN, layout="[tokens, num_heads, head_size]"),
    Arg("key_cache", "k_cache", RUN, layout="[num_blocks, block_size, num_kv_heads, head_size]"),
    Arg("value_cache", "v_cache", RUN, layout="[num_blocks, block_size, num_kv_heads, head_size]"),
    Arg("out", "out", RUN),
    Arg("query_start_loc", "qo_offsets", RUN, dtype="int32"),
    Arg("seq_lens", "kv_lengths", RUN, dtype="int32"),
    Arg("block_table", "block_table", RUN, dtype="int32"),
    Arg("scale", "scale", RUN),
    Arg("causal", "causal", RUN),
    Arg("metadata", "plan_handle", RUN),
))


class VllmShapedTarget(DeclaredTarget):
    name = "example-vllm-shaped"
    routes = ("vs.paged_prefill", "vs.batch_decode")
    signature = SIGNATURE
    capabilities = Capabilities(ops=frozenset({"paged_prefill", "batch_decode"}),
                                layouts=frozenset({"NHD"}), call_forms=frozenset({"out"}),
                                features=frozenset({"metadata_restage"}), signature=SIGNATURE)

    def version(self) -> str:
        return "0.1.0"

    def functions(self):
        return {META: build_metadata, RUN: paged_attention}


def make_target():
    return VllmShapedTarget()
