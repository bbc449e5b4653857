"""The metadata disagrees with the tensors, for a vLLM-shaped call (the misplanned family).

params["mismatch"] = {"field": f, "value": n}. The metadata tensors and counts describe the
problem; one of them, or one tensor handed with them, is bent so the two disagree in field
f, keeping every other dimension as described and the data finite (a run that accepts it
computes plausible numbers, so the harness sees `silent`, not a lucky NaN):

  num_qo_heads   q with n heads; the metadata call still states the problem's
  num_kv_heads   the metadata call states n kv heads; the cache holds the problem's.
                 With "only": "k" (or "v"), the metadata and the cache keep the problem's
                 count and the key (value) tokens handed to the cache writer have n heads:
                 k and v each disagree alone
  head_dim_qk    q with last dim n; the metadata call states the problem's head_dim
  q_rows         q with n rows; query_start_loc still covers the problem's
  dtype          q cast to n; the metadata call states the problem's dtype (and the cache)
  batch_size     the metadata call states n requests; the tensors describe the problem's
  kv_lens        the last request's seq_len is n, past what its block-table row holds
  block_table    the last request's first block id is n, past the pool of blocks
  query_start_loc  its last entry is n (a list n: the whole offsets, its first entry
                 negative or an entry decreasing)
  causal, window the metadata call is told n (batch.planned); the run the problem's own
  plan_handle    n "other_batch": the metadata call made for the same requests regrouped
                 (the cores make that call); n "truncated" / "zeroed": the handle the
                 metadata call returned, cut to half its entries / zeroed (damaged_handle)

Both directions where one exists (harness/model/relations.py RELATIONS): heads, kv heads
and the batch size stated above and below the tensors'; a block id negative, one past and
far past the pool; a kv length negative and past its block-table row.
"""
from __future__ import annotations

from harness.model.problem import DTYPES
from harness.targets.base import Skip
from harness.targets.block_table.batch import BlockBatch
from harness.targets.plan_run.mismatch import _resize

# Fields whose k and v sides a case may move one at a time (mismatch["only"]: "k" | "v").
APART = ("num_kv_heads",)

# The fields this core performs, for a target's Capabilities.metadata.
FIELDS = ("num_qo_heads", "num_kv_heads", "head_dim_qk", "q_rows", "dtype", "batch_size",
          "kv_lens", "block_table", "query_start_loc", "causal", "window")


# How a case may damage the handle a metadata call returned (relations.py plan_handle_*).
HANDLE_DAMAGE = ("truncated", "zeroed")


def handle_damage(mismatch) -> str | None:
    """"truncated" | "zeroed" when the case damages the plan handle, else None."""
    m = mismatch or {}
    # (the names spelt out: a standalone script carries this function's source alone)
    return m.get("value") if m.get("field") == "plan_handle" and \
        m.get("value") in ("truncated", "zeroed") else None


def damaged_handle(handle, how: str):
    """The handle a metadata call returned, damaged as the case says: its first half along
    its first dimension (a copy), or zeros of its shape. Only a tensor can be damaged so."""
    import torch
    if not isinstance(handle, torch.Tensor) or handle.dim() == 0 or handle.numel() < 2:
        raise Skip(f"the plan handle is {type(handle).__name__}, not a tensor of several "
                   f"entries: it cannot be {how}")
    if how == "truncated":
        return handle[: handle.shape[0] // 2 or 1].clone()
    return torch.zeros_like(handle)


def perturb(batch: BlockBatch, mismatch) -> BlockBatch:
    """The batch with its metadata and tensors disagreeing in the one named field."""
    if not mismatch:
        return batch
    field, n = mismatch["field"], mismatch["value"]
    only = mismatch.get("only")
    if only is not None:
        if field not in APART or only not in ("k", "v"):
            raise Skip(f"mismatch field {field!r} has no {only!r} side in a block-table batch")
        if only == "k":
            batch.key = _resize(batch.key, 1, int(n))
        else:
            batch.value = _resize(batch.value, 1, int(n))
    elif field == "num_qo_heads":
        batch.query = _resize(batch.query, 1, int(n))
    elif field == "num_kv_heads":
        batch.num_kv_heads = int(n)
    elif field == "head_dim_qk":
        batch.query = _resize(batch.query, -1, int(n))
    elif field == "q_rows":
        batch.query = _resize(batch.query, 0, int(n))
    elif field == "dtype":
        batch.query = batch.query.to(DTYPES[n])
    elif field == "batch_size":
        batch.num_reqs = int(n)
    elif field == "kv_lens":
        batch.seq_lens = batch.seq_lens[:-1] + [int(n)]
    elif field == "block_table":
        row = batch.block_table[-1]
        batch.block_table = batch.block_table[:-1] + [[int(n)] + row[1:]]
    elif field == "query_start_loc":
        batch.query_start_loc = ([int(x) for x in n] if isinstance(n, list)
                                 else batch.query_start_loc[:-1] + [int(n)])
    elif field == "causal":
        batch.planned["causal"] = bool(n)
    elif field == "window":
        batch.planned["window"] = int(n)
    else:
        raise Skip(f"mismatch field {field!r} has no analogue in a block-table batch")
    return batch
