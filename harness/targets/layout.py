"""How the bundled adapter lays a logical problem out for the library.

Everything here is pure tensor plumbing, shared by every route: a paged KV
cache (FlashInfer's NHD/HND pages, as a (k, v) tuple or one [pages, 2, ...]
tensor), vLLM's block-table cache for mixed batches, and the per-case
perturbations (a strided or head-sliced view, a non-contiguous or int64
index tensor) that the strided family names in its params.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from harness.model.builders import CANARY_ELEMS, every_other, head_sliced, strided_last_dim
from harness.targets.base import Skip

INDEX_DTYPES = {"int32": torch.int32, "int64": torch.int64}


class Views:
    """Applies the case's `strided` / `index_dtype` params to the tensors it names."""

    def __init__(self, params, buffers):
        self.strided = params.get("strided")
        self.short = params.get("short_output")
        self.index_dtype = params.get("index_dtype") or {}
        self.buffers = buffers
        self.used = set()

    def input(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """An input tensor as the case wants it passed, fingerprinted."""
        if self.strided == name:
            t = strided_last_dim(t)
            self.used.add(name)
        elif self.strided == name + "_far":
            # Rows far apart in a lazily allocated buffer: element offsets past 2^31.
            t = far_rows(t)
            self.used.add(self.strided)
        elif self.strided == name + "_heads":
            # [rows, H, D] cut from [rows, H + 1, D]; a one-token [H, D] from [H, 2, D].
            t = head_sliced(t) if t.dim() == 3 else head_sliced(t.unsqueeze(1)).squeeze(1)
            self.used.add(self.strided)
        self.buffers.watch(t, name)
        return t

    def index(self, name: str, values, device) -> torch.Tensor:
        """An int32 index tensor (or the dtype/view the case names), fingerprinted."""
        dtype = INDEX_DTYPES[self.index_dtype.get(name, "int32")]
        if name in self.index_dtype:
            self.used.add("index_dtype:" + name)
        t = torch.as_tensor(values, dtype=torch.int64).to(dtype).to(device)
        if self.strided == name:
            t = every_other(t)
            self.used.add(name)
        self.buffers.watch(t, name)
        return t

    def output(self, name: str, shape, dtype, canary_elems: int = CANARY_ELEMS) -> torch.Tensor:
        """A canary-banded, NaN-poisoned output; strided when the case names it."""
        shape = tuple(int(n) for n in shape)
        if self.short == name:
            # One row (first dimension) short: between canaries, so a write of the whole
            # answer lands in the band and shows as corrupt.
            self.used.add("short_output:" + name)
            shape = (max(shape[0] - 1, 0), *shape[1:])
        if self.strided == name:
            self.used.add(name)
            # Its gaps are watched: a library that writes it as packed is `corrupt`.
            return self.buffers.strided_output(shape, dtype, name, 2, canary_elems)
        return self.buffers.output(shape, dtype, name, canary_elems)

    def check_used(self) -> None:
        """A case naming a tensor this route never passes cannot be expressed here."""
        wanted = set()
        if self.strided:
            wanted.add(self.strided)
        wanted |= {"index_dtype:" + n for n in self.index_dtype}
        if self.short:
            wanted.add("short_output:" + self.short)
        missing = wanted - self.used
        if missing:
            raise Skip(f"this route passes no tensor named {sorted(missing)}")


def to_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """[tokens, H, D] (NHD) -> HND [H, tokens, D] when asked; always contiguous."""
    if layout == "NHD":
        return t.contiguous()
    if layout == "HND":
        return t.transpose(0, 1).contiguous()
    raise Skip(f"layout must be NHD or HND, got {layout!r}")


@dataclass
class PagedKV:
    k_pages: torch.Tensor      # [num_pages, page_size, Hkv, D] (NHD) or [num_pages, Hkv, page_size, D]
    v_pages: torch.Tensor
    indptr: list[int]          # [batch + 1] into indices
    indices: list[int]         # page ids, request after request
    last_page_len: list[int]   # [batch]
    page_size: int
    layout: str

    def cache(self, form: str):
        """The cache as the library takes it: a (k, v) tuple or one [pages, 2, ...] tensor."""
        if form == "tuple":
            return self.k_pages, self.v_pages
        if form == "single":
            if self.k_pages.shape != self.v_pages.shape:
                raise Skip("a single-tensor cache needs head_dim_vo == head_dim")
            return torch.stack((self.k_pages, self.v_pages), dim=1)
        raise Skip(f"cache_form must be tuple or single, got {form!r}")


def page_ids(num_pages: int, order: str, offset: int, seed: int) -> list[int]:
    ids = list(range(offset, offset + num_pages))
    if order == "shuffled":
        random.Random(seed).shuffle(ids)
    elif order != "sequential":
        raise Skip(f"page_order must be shuffled or sequential, got {order!r}")
    return ids


# Above this many elements a pool is poisoned only around the pages a request owns (and
# the first pages): filling a pool past 2^31 elements with NaN costs seconds and, on the
# host, real memory for pages nothing reads; untouched pages stay unallocated.
FULL_POISON_ELEMS = 1 << 26
_NEIGHBOURS = 2


def _pool(shape, dtype, device, owned) -> torch.Tensor:
    """A page pool, NaN wherever a kernel that misses its own pages is likely to land."""
    numel = 1
    for n in shape:
        numel *= n
    if numel <= FULL_POISON_ELEMS:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    pages = torch.empty(shape, dtype=dtype, device=device)
    near = {p for p in (0, 1) if p < shape[0]}     # a pool of one page has no page 1
    for page in owned:
        near.update(range(max(0, page - _NEIGHBOURS), min(shape[0], page + _NEIGHBOURS + 1)))
    index = torch.tensor(sorted(near), dtype=torch.long, device=device)
    pages.index_fill_(0, index, float("nan"))
    return pages


# far_rows: the token stride that puts the last FAR_ROWS_PAST rows of a tensor past 2^31
# elements (a 32-bit offset wraps there).
FAR_ROWS_PAST = 4


def far_rows(t: torch.Tensor) -> torch.Tensor:
    """A view equal to t [N, ...] whose rows sit a token stride apart in one lazily allocated
    buffer, so that the last FAR_ROWS_PAST rows start past element 2^31: only the rows' pages
    are resident (and the NaN band below row 1, where a kernel that ignores the stride lands)."""
    n, row = t.shape[0], t[0].numel() if t.shape[0] else 0
    if n <= FAR_ROWS_PAST or row == 0:
        raise Skip(f"far rows need more than {FAR_ROWS_PAST} rows, got {n}")
    stride = -(-(1 << 31) // (n - FAR_ROWS_PAST))
    stride = max(stride, row)
    buf = torch.empty(((n - 1) * stride + row,), dtype=t.dtype, device=t.device)
    buf[:min(n * row, stride)].fill_(float("nan"))
    view = buf.as_strided(tuple(t.shape), (stride, *t[0].contiguous().stride()), 0)
    view.copy_(t)
    return view


def build_paged(problem, page_size: int, layout: str = "NHD", order: str = "shuffled",
                offset: int = 0, seed: int = 0) -> PagedKV:
    """A paged cache holding the problem's k/v; every slot no request owns is NaN, and the
    slots past each request's length in its last page hold problem.cache_tail when it is set.

    Pages below `offset` exist but are never referenced, so a 16-bit page id
    (or a 32-bit page * stride product) lands on NaN instead of real data.
    An empty request (kv_len 0) owns no page: its indptr entries are equal and
    its last_page_len is 0, as FlashInfer's callers lay it out.
    """
    if page_size < 1:
        raise Skip(f"page_size must be >= 1, got {page_size}")
    counts = [-(-n // page_size) for n in problem.kv_lens]
    total = sum(counts)
    ids = page_ids(total, order, offset, seed)
    hkv, d, dv = problem.num_kv_heads, problem.head_dim, problem.head_dim_vo
    dev, dt = problem.device, problem.dtype
    pool = max(offset + total, 1)   # a batch of empty requests still passes a (NaN) cache
    k_pages = _pool((pool, page_size, hkv, d), dt, dev, ids)
    v_pages = _pool((pool, page_size, hkv, dv), dt, dev, ids)
    indptr, indices, last = [0], [], []
    for r, (k, v, n, c) in enumerate(zip(problem.k, problem.v, problem.kv_lens, counts)):
        mine = ids[indptr[-1]:indptr[-1] + c]
        for p, page in enumerate(mine):
            lo, hi = p * page_size, min(n, (p + 1) * page_size)
            if hi > lo:
                k_pages[page, :hi - lo] = k[lo:hi]
                v_pages[page, :hi - lo] = v[lo:hi]
        tail = getattr(problem, "cache_tail", None)
        if tail is not None and n % page_size:
            # The slots of its last page no token is written to (params cache_tail).
            k_pages[mine[-1], n % page_size:] = tail
            v_pages[mine[-1], n % page_size:] = tail
        indices.extend(mine)
        indptr.append(indptr[-1] + c)
        last.append(n - (c - 1) * page_size if n else 0)
    if layout == "HND":
        k_pages = k_pages.transpose(1, 2).contiguous()
        v_pages = v_pages.transpose(1, 2).contiguous()
    elif layout != "NHD":
        raise Skip(f"layout must be NHD or HND, got {layout!r}")
    return PagedKV(k_pages, v_pages, indptr, indices, last, page_size, layout)


def block_table(paged: PagedKV, batch: int) -> list[list[int]]:
    """vLLM's [batch, max_blocks] block table; rows padded with the request's last page.

    An empty request's row is all padding: page 0, which holds NaN whenever the
    pages start past it (page_id_offset), so a kernel that reads it shows."""
    rows = [paged.indices[paged.indptr[r]:paged.indptr[r + 1]] for r in range(batch)]
    width = max([1] + [len(r) for r in rows])
    return [r + [r[-1] if r else 0] * (width - len(r)) for r in rows]
