"""run() tensors that disagree with plan() in one field (the mis-planned family).

plan() always gets the problem as the case describes it; these functions
bend the tensors handed to run() afterwards. Each field changes exactly one
thing, keeps every other dimension as planned, and keeps the data finite,
so a run that accepts the tensor computes plausible numbers: the harness
must see `silent`, not a NaN that a lucky comparison would flag anyway.

Fields (params["mismatch"] = {"field": f, "value": n}):
  num_qo_heads   q with n heads                       head_dim_qk  q with last dim n
  num_kv_heads   the cache (or ragged k, v) with n heads
  head_dim_vo    v (v_cache, ragged v) with last dim n
  page_size      the same pool viewed as pages of n tokens
  rank           q flattened to [rows, heads * head_dim]
  q_rows         q and out with n rows. n below the plan must be refused (out's canary
                 band is widened to hold the rows a run writes anyway);
                 above it is the padding CUDA-graph callers use, allowed up
                 to capacity: the first planned rows are compared
  kv_rows        ragged k and v with n rows
  dtype          q cast to n ("fp16" | "bf16" | "fp32")

and, in the index tensors plan() reads (index_values):
  query_start_loc  qo_indptr's last entry n (a list n: the whole offsets)
  last_page_len    the last request's last-page length n
  block_table      the last request's first page id n in kv_indices (negative, one past
                   and far past the pool)

A field that moves k and v together (num_kv_heads, kv_rows, page_size) moves one of them alone
when params["mismatch"]["only"] is "k" or "v" (the other keeps the planned shape); dtype with
"only" casts that one of the (k, v) cache or ragged k / v, not q (cases/pair_fields.py).
"""
from __future__ import annotations

import torch

from harness.model.problem import DTYPES
from harness.targets.base import Skip

# What a FlashInfer-shaped plan() fixes and run() must agree with: the metadata contract of
# every target on this core (harness/model/capabilities.py METADATA_FIELDS).
PLAN_METADATA = {f: "plan" for f in ("num_qo_heads", "num_kv_heads", "head_dim_qk",
                                     "head_dim_vo", "page_size", "rank", "q_rows", "kv_rows",
                                     "dtype")}
# The index-tensor fields this core bends too (index_values), for a signature's metadata.
INDEX_FIELDS = {"query_start_loc": "qo_indptr", "last_page_len": "last_page_len",
                "block_table": "kv_indices"}
FIELDS = tuple(PLAN_METADATA) + tuple(INDEX_FIELDS)


def _resize(t: torch.Tensor, dim: int, n: int) -> torch.Tensor:
    """t with size n along dim: cut, or grown by repeating its own slices."""
    size = t.shape[dim]
    if n <= size:
        return t.narrow(dim, 0, n).contiguous()
    if size == 0:
        raise Skip("cannot grow an empty dimension")
    reps = -(-n // size)
    return torch.cat([t] * reps, dim=dim).narrow(dim, 0, n).contiguous()


def _field(c):
    mm = c.mismatch
    if not mm:
        return None, None
    return mm["field"], mm["value"]


def _only(c) -> tuple[bool, bool]:
    """(k moves, v moves) for a field that moves both: mismatch["only"] picks one."""
    only = (c.mismatch or {}).get("only")
    if only not in (None, "k", "v"):
        raise Skip(f"mismatch only must be k or v, got {only!r}")
    return only != "v", only != "k"


def _q(c, q: torch.Tensor, field, n):
    if field == "num_qo_heads":
        return _resize(q, 1, n)
    if field == "head_dim_qk":
        return _resize(q, -1, n)
    if field == "rank":
        return q.flatten(1)
    if field == "q_rows":
        return _resize(q, 0, n)
    if field == "dtype":
        return q.to(DTYPES[n])
    return None


def index_values(c, name: str, values, indptr=None) -> list:
    """The values of index tensor `name` ("qo_indptr", "last_page_len", "kv_indices") plan()
    is handed: the case's, bent where the mismatch's field lives in this tensor. indptr: a
    paged route's kv_indptr (where the last request's pages start in kv_indices)."""
    field, n = _field(c)
    if INDEX_FIELDS.get(field) != name:
        return values                 # untouched (a large pool stays as the layout made it)
    values = [int(x) for x in values]
    if isinstance(n, list):
        return [int(x) for x in n]
    if not values:
        raise Skip(f"mismatch field {field!r}: {name} is empty here")
    if name == "kv_indices":
        at = int(indptr[-2]) if indptr is not None and len(indptr) > 1 else 0
        if at >= len(values):
            raise Skip("the last request holds no page to bend")
        return values[:at] + [int(n)] + values[at + 1:]
    return values[:-1] + [int(n)]


def check_index_field(c, op: str) -> None:
    """Skip a field whose index tensor this op's plan() does not take."""
    field, _ = _field(c)
    takes = {"paged_prefill": {"qo_indptr", "last_page_len", "kv_indices"},
             "ragged_prefill": {"qo_indptr"},
             "batch_decode": {"last_page_len", "kv_indices"}}.get(op, set())
    if field in INDEX_FIELDS and INDEX_FIELDS[field] not in takes:
        raise Skip(f"mismatch field {field!r}: {op}'s plan() takes no {INDEX_FIELDS[field]}")


def planned_rows(c):
    """(rows out has, rows to compare): out follows q's rows, as a caller's would."""
    field, n = _field(c)
    planned = sum(c.problem.qo_lens)
    if field == "q_rows":
        return n, planned
    return planned, planned


def short_rows(c) -> int:
    """Planned rows a short q leaves out without: a run that writes them anyway lands in
    out's canary band, sized to hold them, so the harness sees `corrupt`, not a heap
    overrun that kills the process at some later free()."""
    field, n = _field(c)
    planned = sum(c.problem.qo_lens)
    return max(0, planned - n) if field == "q_rows" else 0


def _head_axis(c, form: str) -> int:
    axis = 2 if c.layout == "NHD" else 1           # [pages, ps, H, D] / [pages, H, ps, D]
    return axis + (1 if form == "single" else 0)   # [pages, 2, ...]


def _page_axis(c, form: str) -> int:
    axis = 1 if c.layout == "NHD" else 2
    return axis + (1 if form == "single" else 0)


def _repage(t: torch.Tensor, axis: int, n: int) -> torch.Tensor:
    """The same storage viewed as pages of n tokens (page axis `axis`)."""
    total = t.numel()
    per_token = total // (t.shape[0] * t.shape[axis])
    tokens = t.shape[0] * t.shape[axis]
    if tokens % n:
        raise Skip(f"the pool of {tokens} tokens does not split into pages of {n}")
    shape = list(t.shape)
    shape[0], shape[axis] = tokens // n, n
    assert per_token * tokens == total
    return t.contiguous().reshape(shape)


def perturb(c, q: torch.Tensor, cache):
    """(q, cache) for a paged route's run()."""
    field, n = _field(c)
    if field is None:
        return q, cache
    form = c.params.get("cache_form", "tuple")
    if field == "dtype" and (c.mismatch or {}).get("only"):
        if form != "tuple":
            raise Skip("k and v take different dtypes only in a (k, v) tuple cache")
        mk, mv = _only(c)
        return q, tuple(t.to(DTYPES[n]) if m else t for t, m in zip(cache, (mk, mv)))
    new_q = _q(c, q, field, n)
    if new_q is not None:
        return new_q, cache
    if field in INDEX_FIELDS:
        return q, cache            # bent in plan()'s index tensors (index_values)
    parts = list(cache) if isinstance(cache, tuple) else [cache]
    if field == "num_kv_heads":
        moves = _only(c)
        if form != "tuple" and not all(moves):
            raise Skip("k and v move apart only in a (k, v) tuple cache")
        parts = [_resize(t, _head_axis(c, form), n) if m else t for t, m in zip(parts, moves)]
    elif field == "head_dim_vo":
        if form != "tuple":
            raise Skip("head_dim_vo differs from head_dim_qk only in a (k, v) tuple cache")
        parts[1] = _resize(parts[1], -1, n)
    elif field == "page_size":
        moves = _only(c)
        if form != "tuple" and not all(moves):
            raise Skip("k and v take different page sizes only in a (k, v) tuple cache")
        parts = [_repage(t, _page_axis(c, form), n) if m else t for t, m in zip(parts, moves)]
    else:
        raise Skip(f"mismatch field {field!r} does not apply to a paged route")
    return q, (tuple(parts) if isinstance(cache, tuple) else parts[0])


def perturb_ragged(c, q, k, v):
    """(q, k, v) for ragged prefill's run()."""
    field, n = _field(c)
    if field is None:
        return q, k, v
    mk, mv = _only(c)
    if field == "dtype" and (c.mismatch or {}).get("only"):
        return q, k.to(DTYPES[n]) if mk else k, v.to(DTYPES[n]) if mv else v
    new_q = _q(c, q, field, n)
    if new_q is not None:
        return new_q, k, v
    if field == "num_kv_heads":
        return q, _resize(k, 1, n) if mk else k, _resize(v, 1, n) if mv else v
    if field == "head_dim_vo":
        return q, k, _resize(v, -1, n)
    if field == "kv_rows":
        return q, _resize(k, 0, n) if mk else k, _resize(v, 0, n) if mv else v
    if field in INDEX_FIELDS:
        return q, k, v             # bent in plan()'s index tensors (index_values)
    raise Skip(f"mismatch field {field!r} does not apply to ragged prefill")
