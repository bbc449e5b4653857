"""A logical problem as a vLLM-shaped batch: packed q, packed k/v tokens for the library's
own cache writer, and the metadata tensors that describe where each request lives."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.targets.base import Skip
from harness.targets.layout import page_ids


@dataclass
class BlockBatch:
    """What a vLLM-shaped call is handed. The counts (num_reqs, heads, head_dim, block_size)
    are what the metadata *states*; the tensors are what it is handed with. They agree
    unless mismatch.py bent one of them."""
    query: torch.Tensor            # [T, Hq, D] packed in request order
    key: torch.Tensor              # [sum kv, Hkv, D] packed, for the cache writer
    value: torch.Tensor            # [sum kv, Hkv, Dv]
    query_start_loc: list[int]     # [R + 1]
    seq_lens: list[int]            # [R]
    block_table: list[list[int]]   # [R, max_blocks]; a short row is padded with its last id
    slot_mapping: list[int]        # [sum kv]: block * block_size + offset, per key token
    num_blocks: int
    block_size: int
    num_reqs: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    rows: int                      # query rows the metadata covers (query_start_loc[-1])
    # {role: value} the metadata call is told instead of the problem's (a causal flag or a
    # window bent by mismatch.py); the run is handed the problem's own.
    planned: dict = field(default_factory=dict)


def build(problem, block_size: int, order: str = "shuffled", offset: int = 0,
          seed: int = 0) -> BlockBatch:
    """The problem's batch; blocks handed out in `order` from id `offset` (lower blocks
    exist and are never referenced), one spare block past the last so an index one past
    the end lands in the pool rather than past it."""
    if block_size < 1:
        raise Skip(f"block_size must be >= 1, got {block_size}")
    p = problem
    counts = [-(-n // block_size) for n in p.kv_lens]
    ids = page_ids(sum(counts), order, offset, seed)
    table, slots, at = [], [], 0
    for n, c in zip(p.kv_lens, counts):
        mine = ids[at:at + c]
        at += c
        table.append(mine)
        slots.extend(mine[t // block_size] * block_size + t % block_size for t in range(n))
    width = max([1] + counts)
    table = [row + [row[-1] if row else 0] * (width - len(row)) for row in table]
    empty_k = p.q[0].new_zeros((0, p.num_kv_heads, p.head_dim))
    empty_v = p.q[0].new_zeros((0, p.num_kv_heads, p.head_dim_vo))
    return BlockBatch(
        query=p.q_packed(),
        key=torch.cat(p.k) if p.k else empty_k, value=torch.cat(p.v) if p.v else empty_v,
        query_start_loc=[int(x) for x in p.qo_indptr.tolist()],
        seq_lens=[int(n) for n in p.kv_lens], block_table=table, slot_mapping=slots,
        num_blocks=offset + sum(counts) + 1, block_size=block_size, num_reqs=p.batch_size,
        num_qo_heads=p.num_qo_heads, num_kv_heads=p.num_kv_heads, head_dim=p.head_dim,
        rows=sum(p.qo_lens))


# fp8 bytes that are NaN in both e4m3 (S.1111.111) and e5m2 (S.11111.11).
FP8_NAN_BYTE = 0x7F


def owned_blocks(batch: BlockBatch) -> list[int]:
    """The blocks some request's tokens are written to (the slot mapping's blocks)."""
    return sorted({s // batch.block_size for s in batch.slot_mapping})


def block_pool(batch: BlockBatch, shape, dtype, device, fp8: bool = False) -> torch.Tensor:
    """A cache pool [num_blocks, ...] for the library's own writer to fill.

    Every block no request owns is poison (NaN; an fp8 cache's NaN byte): the blocks below
    page_id_offset and the spare one past the last, so a kernel that reads a block its
    table does not name shows it. The blocks requests own start at zero, as vLLM allocates
    its caches; their slots past a request's length stay so, unless the case puts a value
    there (poison_tails)."""
    pool = torch.empty((batch.num_blocks, *shape), dtype=dtype, device=device)
    pool.fill_(FP8_NAN_BYTE if fp8 else float("nan"))
    owned = owned_blocks(batch)
    if owned:
        pool[torch.tensor(owned, dtype=torch.long, device=device)] = 0
    return pool


def poison_tails(batch: BlockBatch, cache: torch.Tensor, tail, token_axis: int,
                 fp8: bool = False) -> None:
    """Put `tail` (params cache_tail: NaN or inf; an fp8 cache's NaN byte) in the slots of
    each request's last block past its length, in place: no token is written there.
    cache: [num_blocks, ...] holding one of K or V (a view writes through), its token slots
    on `token_axis` of a block."""
    if tail is None:
        return
    bs = batch.block_size
    for n, row in zip(batch.seq_lens, batch.block_table):
        if n > 0 and n % bs and (n - 1) // bs < len(row):
            cache[row[(n - 1) // bs]].narrow(token_axis, n % bs, bs - n % bs).fill_(
                FP8_NAN_BYTE if fp8 else tail)
