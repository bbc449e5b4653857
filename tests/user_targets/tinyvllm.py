"""A small vLLM-shaped library in pure torch, and its adapter: a signature and one function
per call, nothing else (harness/targets/block_table/declared.py performs every case).

The library: plan(seq_lens, query_start_loc, num_reqs, num_heads, num_kv_heads, head_size,
block_size, causal) -> a plan; run(query, key_cache, value_cache, out, query_start_loc, seq_lens,
block_table, scale, causal, plan) writes out. Caches [num_blocks, block_size, kv heads, D].

It checks what a careful library checks, and carries five planted bugs (BUGS), each off in
make_fixed_target():
  restaged      plan() keeps a reference to the caller's seq_lens and sizes each request's
                block loop from what they held then; run() reads the lengths through that
                reference, so a caller that restages seq_lens gets keys dropped
  negative_block  run() bounds block ids above only: a negative id wraps around (torch
                indexing), reading another block
  more_heads    run() refuses a query with fewer heads than planned, but reads one with more
                through the plan's head stride (the query's storage viewed as the plan's
                heads): misread rows, no error
  planned_causal  run() masks by the causal flag plan() was told, not its own: a caller
                that plans one mask and runs the other gets the planned one, no error
  weights_tail  run() reads its last block whole and masks the slots past the length by a
                -inf logit (weight 0) instead of leaving them out: 0 * a NaN there is NaN
"""
from __future__ import annotations

import torch

from harness.targets import Arg, Capabilities, DeclaredTarget, Signature

BUGS = frozenset({"restaged", "negative_block", "more_heads", "planned_causal", "weights_tail"})


class Plan:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class TinyVllm:
    def __init__(self, bugs=BUGS):
        self.bugs = frozenset(bugs)

    def plan(self, seq_lens, query_start_loc, num_reqs, num_heads, num_kv_heads, head_size,
             block_size, causal):
        if seq_lens.numel() != num_reqs:
            raise ValueError(f"num_reqs is {num_reqs} but seq_lens has {seq_lens.numel()} entries")
        if query_start_loc.numel() != num_reqs + 1:
            raise ValueError(f"num_reqs is {num_reqs} but query_start_loc has "
                             f"{query_start_loc.numel()} entries")
        if num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads "
                             f"{num_kv_heads}")
        lens = seq_lens.tolist()
        kept = seq_lens if "restaged" in self.bugs else seq_lens.clone()
        return Plan(seq_lens=kept, blocks=[-(-max(n, 0) // block_size) for n in lens],
                    num_reqs=num_reqs, num_heads=num_heads, num_kv_heads=num_kv_heads,
                    head_size=head_size, block_size=block_size, causal=bool(causal))

    def run(self, query, key_cache, value_cache, out, query_start_loc, seq_lens, block_table,
            scale, causal, plan):
        bs, hkv, d = plan.block_size, plan.num_kv_heads, plan.head_size
        if query.dim() != 3:
            raise ValueError(f"query has {query.dim()} dims, not 3")
        if query.shape[1] < plan.num_heads or (query.shape[1] != plan.num_heads
                                               and "more_heads" not in self.bugs):
            raise ValueError(f"num_heads: planned {plan.num_heads}, query has {query.shape[1]}")
        if query.shape[-1] != d:
            raise ValueError(f"head_size: planned {d}, query has {query.shape[-1]}")
        if key_cache.shape[2] != hkv or value_cache.shape[2] != hkv:
            raise ValueError(f"num_kv_heads: planned {hkv}, the cache has {key_cache.shape[2]}")
        if query.dtype != key_cache.dtype:
            name = lambda t: str(t).replace("torch.", "")   # noqa: E731
            raise ValueError(f"dtype: the cache is {name(key_cache.dtype)} but the query "
                             f"{name(query.dtype)}")
        qsl = query_start_loc.tolist()
        if qsl[0] < 0:
            raise ValueError(f"query_start_loc: first entry {qsl[0]}, must be 0")
        for a, b in zip(qsl, qsl[1:]):
            if b < a:
                raise ValueError(f"query_start_loc decreases: {a} then {b}")
        if qsl[-1] > query.shape[0]:
            raise ValueError(f"query_start_loc: last entry {qsl[-1]} past the query's "
                             f"{query.shape[0]} rows")
        if "restaged" in self.bugs:
            lens, blocks = plan.seq_lens.tolist(), plan.blocks
        else:
            lens = seq_lens.tolist()
            blocks = [-(-max(n, 0) // bs) for n in lens]
        table = block_table.long()
        pool = key_cache.shape[0]
        if "more_heads" in self.bugs:
            # the plan's head stride over the query's storage
            query = query.contiguous().view(-1)[:query.shape[0] * plan.num_heads * d]
            query = query.view(-1, plan.num_heads, d)
        group = plan.num_heads // hkv
        if "planned_causal" in self.bugs:
            causal = plan.causal
        for r in range(plan.num_reqs):
            n = lens[r]
            if n < 0:
                raise ValueError(f"seq_lens: {n} is negative")
            if n > table.shape[1] * bs:
                raise ValueError(f"seq_lens: {n} past the {table.shape[1]} blocks of "
                                 f"block_table row {r}")
            ids = table[r, :blocks[r]]
            bad = [int(i) for i in ids if i >= pool or (i < 0 and "negative_block" not in self.bugs)]
            if bad:
                raise ValueError(f"block_table: block id {bad[0]} outside the cache's {pool} "
                                 f"blocks")
            held = len(ids) * bs if "weights_tail" in self.bugs else n
            k = key_cache[ids].reshape(-1, hkv, d)[:held].float().repeat_interleave(group, 1)
            v = value_cache[ids].reshape(-1, hkv, value_cache.shape[-1])[:held].float()
            v = v.repeat_interleave(group, 1)
            q = query[qsl[r]:qsl[r + 1], :plan.num_heads].float()
            s = torch.einsum("lhd,shd->hls", q, k) * scale
            s[..., n:] = float("-inf")          # (nothing past n unless weights_tail)
            if causal:
                i = torch.arange(q.shape[0]).unsqueeze(1) + (n - q.shape[0])
                s = s.masked_fill(torch.arange(k.shape[0]).unsqueeze(0) > i, float("-inf"))
            w = torch.softmax(s, -1).nan_to_num(0.0)
            out[qsl[r]:qsl[r + 1]] = torch.einsum("hls,shd->lhd", w, v).to(out.dtype)


PLAN, RUN = "plan", "run"
SIGNATURE = Signature(args=(
    Arg("seq_lens", "kv_lengths", PLAN, dtype="int32"),
    Arg("query_start_loc", "qo_offsets", PLAN, dtype="int32"),
    Arg("num_reqs", "batch_size", PLAN),
    Arg("num_heads", "num_qo_heads", PLAN),
    Arg("num_kv_heads", "num_kv_heads", PLAN),
    Arg("head_size", "head_dim_qk", PLAN),
    Arg("block_size", "block_size", PLAN),
    Arg("causal", "causal", PLAN),
    Arg("query", "q", RUN, layout="[rows, Hq, D]"),
    Arg("key_cache", "k_cache", RUN, layout="[blocks, block_size, Hkv, D]"),
    Arg("value_cache", "v_cache", RUN, layout="[blocks, block_size, Hkv, D]"),
    Arg("out", "out", RUN),
    Arg("query_start_loc", "qo_offsets", RUN, dtype="int32"),
    Arg("seq_lens", "kv_lengths", RUN, dtype="int32"),
    Arg("block_table", "block_table", RUN, dtype="int32"),
    Arg("scale", "scale", RUN),
    Arg("causal", "causal", RUN),
    Arg("plan", "plan_handle", RUN),
), core="declared")


class TinyVllmTarget(DeclaredTarget):
    name = "tinyvllm"
    routes = ("tiny.paged_prefill", "tiny.batch_decode")
    signature = SIGNATURE
    capabilities = Capabilities(ops=frozenset({"paged_prefill", "batch_decode"}),
                                layouts=frozenset({"NHD"}), call_forms=frozenset({"out"}),
                                features=frozenset({"metadata_restage"}), signature=SIGNATURE)

    def __init__(self, bugs=BUGS):
        self.lib = TinyVllm(bugs)

    def functions(self):
        return {PLAN: self.lib.plan, RUN: self.lib.run}


def make_target():
    return TinyVllmTarget()


def make_fixed_target():
    return TinyVllmTarget(bugs=())
