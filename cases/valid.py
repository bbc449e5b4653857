"""valid: inputs every route must compute correctly.

Not the full cross product. Each op gets a covering design: a short list of
rows in which every level of every factor appears, and the pairs of the
factors that interact (dtype x head_dim x GQA ratio, causal x window, page
size x layout x cache form) all appear. Lengths include 1 and primes that
are a multiple of no tile size; a few rows are big (batch 64, split KV,
page ids past 65,535); the rest stay small because the host kernels are
CPU loops. Every paged op also gets pages of 3, 12 and 24 tokens (page_size_odd): each
other page size is a power of two, where an in-page slot by mask equals the division's.
"""
from __future__ import annotations

from typing import Iterator

from cases._expect import expect
from cases._per_op import per_route
from cases._tags import tag as id_tag
from harness.model.case import Case

FAMILY = "valid"
OPS = ("single_prefill", "single_decode", "paged_prefill", "ragged_prefill",
       "batch_decode", "merge_state", "mixed_batch")

DTYPES = ("fp16", "bf16", "fp32")
HEAD_DIMS = (32, 64, 128, 256)
# (num_qo_heads, num_kv_heads) for GQA ratios 1, 4, 8; kv heads alternate 1 and 2
# so the head mapping is exercised with more than one group.
GQA = ((2, 2), (4, 1), (16, 2))
# (causal, window_left): every pair of causal x window.
MASKS = ((False, -1), (True, -1), (False, 7), (True, 31))


def _core_rows():
    """dtype x head_dim x GQA, all pairs in 12 rows (ratio = (i + j) mod 3)."""
    for i, dtype in enumerate(DTYPES):
        for j, head_dim in enumerate(HEAD_DIMS):
            yield dtype, head_dim, GQA[(i + j) % 3], i * len(HEAD_DIMS) + j


def _base(dtype, head_dim, heads, **extra):
    params = {"dtype": dtype, "head_dim": head_dim,
              "num_qo_heads": heads[0], "num_kv_heads": heads[1]}
    params.update(extra)
    return params


def _mask_tag(causal, window_left):
    bits = ["causal" if causal else "full"]
    if window_left >= 0:
        bits.append(f"w{window_left}")
    return "-".join(bits)


def _tag(params, *bits):
    return id_tag(params, "dims_vo", extra=bits)


# ---------------------------------------------------------------- single prefill

# (qo_len, kv_len): 1, tile-unaligned primes, qo == kv, qo < kv.
SINGLE_PREFILL_LENS = ((1, 1), (1, 37), (17, 17), (13, 61), (31, 97), (7, 129))


def _single_prefill():
    # The full cross product dtype x head_dim x GQA ratio x (causal, window): single
    # routes are cheap, so nothing is left to a covering design; lengths and layouts
    # cycle through it so each appears with every dtype and head_dim.
    k = 0
    for dtype in DTYPES:
        for head_dim in HEAD_DIMS:
            for heads in GQA:
                for causal, window in MASKS:
                    qo, kv = SINGLE_PREFILL_LENS[k % len(SINGLE_PREFILL_LENS)]
                    layout = ("NHD", "HND")[(k // 5) % 2]
                    p = _base(dtype, head_dim, heads, qo_lens=[qo], kv_lens=[kv], causal=causal,
                              window_left=window, return_lse=k % 3 != 1, layout=layout)
                    yield "grid", p, _tag(p, f"q{qo}k{kv}", _mask_tag(causal, window),
                                          layout.lower())
                    k += 1
    # Explicit scale and a longer causal square.
    p = _base("bf16", 128, (8, 2), qo_lens=[67], kv_lens=[67], causal=True, window_left=-1,
              sm_scale=0.05, return_lse=True, layout="NHD")
    yield "sm_scale", p, _tag(p, "q67k67", "s0.05")
    p = _base("fp16", 64, (4, 4), qo_lens=[40], kv_lens=[40], causal=False, window_left=0,
              return_lse=True, layout="NHD")
    yield "window0", p, _tag(p, "q40k40")
    p = _base("bf16", 128, (4, 2), head_dim_vo=64, qo_lens=[19], kv_lens=[53], causal=True,
              window_left=-1, return_lse=True, layout="HND")
    yield "vo_dim", p, _tag(p, "q19k53", "hnd")


# ---------------------------------------------------------------- single decode

SINGLE_DECODE_KV = (1, 17, 100, 257)


def _single_decode():
    # dtype x head_dim x GQA ratio x window in full (a decode row has no causal choice).
    k = 0
    for dtype in DTYPES:
        for head_dim in HEAD_DIMS:
            for heads in GQA:
                for window in (-1, 15):
                    kv = SINGLE_DECODE_KV[k % len(SINGLE_DECODE_KV)]
                    layout = ("NHD", "HND")[(k // 3) % 2]
                    p = _base(dtype, head_dim, heads, qo_lens=[1], kv_lens=[kv], causal=False,
                              window_left=window, return_lse=k % 2 == 0, layout=layout)
                    yield "grid", p, _tag(p, f"k{kv}", _mask_tag(False, window), layout.lower())
                    k += 1
    p = _base("fp16", 128, (8, 1), qo_lens=[1], kv_lens=[64], causal=False, window_left=-1,
              sm_scale=0.2, return_lse=True, layout="NHD")
    yield "sm_scale", p, _tag(p, "k64", "s0.2")


# ---------------------------------------------------------------- paged / ragged prefill

def _batch_lens(batch, k, decode=False):
    """Deterministic, tile-unaligned per-request lengths: (qo_lens, kv_lens)."""
    qo, kv = [], []
    for r in range(batch):
        kvl = 1 + (r * 37 + k * 11) % (23 if batch > 8 else 71)
        q = 1 if decode else 1 + (r * 13 + k * 5) % min(kvl, 19)
        qo.append(q)
        kv.append(kvl)
    return qo, kv


# Page size x layout x cache form: all pairs in four rows.
PAGED_FORMS = ((1, "NHD", "tuple"), (1, "HND", "single"), (16, "NHD", "single"),
               (16, "HND", "tuple"))


def _paged_prefill():
    for dtype, head_dim, heads, k in _core_rows():
        causal, window = MASKS[k % 4]
        page_size, layout, form = PAGED_FORMS[(k + k // 4) % 4]
        batch = (1, 7)[k % 2]
        qo, kv = _batch_lens(batch, k)
        p = _base(dtype, head_dim, heads, qo_lens=qo, kv_lens=kv, causal=causal,
                  window_left=window, return_lse=k % 3 != 2, layout=layout,
                  page_size=page_size, cache_form=form,
                  page_order=("shuffled", "sequential")[k % 3 == 0])
        yield "grid", p, _tag(p, f"p{page_size}", layout.lower(), form, f"b{batch}",
                              _mask_tag(causal, window))
    yield from _batch_prefill_extras(paged=True)


def _ragged_prefill():
    for dtype, head_dim, heads, k in _core_rows():
        causal, window = MASKS[(k + 1) % 4]
        batch = (7, 1)[k % 2]
        qo, kv = _batch_lens(batch, k + 3)
        p = _base(dtype, head_dim, heads, qo_lens=qo, kv_lens=kv, causal=causal,
                  window_left=window, return_lse=k % 2 == 0)
        yield "grid", p, _tag(p, f"b{batch}", _mask_tag(causal, window))
    yield from _batch_prefill_extras(paged=False)


def _batch_prefill_extras(paged):
    """Rows shared by paged and ragged prefill: big batch, split KV, vo != qk dims."""
    def paged_bits(page_size, layout="NHD", form="tuple", order="shuffled"):
        if not paged:
            return {}, []
        return ({"page_size": page_size, "layout": layout, "cache_form": form,
                 "page_order": order}, [f"p{page_size}", layout.lower(), form])

    extra, bits = paged_bits(16, "HND", "single")
    qo, kv = _batch_lens(64, 1)
    p = _base("bf16", 64, (4, 1), qo_lens=qo, kv_lens=kv, causal=True, window_left=-1,
              return_lse=True, **extra)
    yield "batch64", p, _tag(p, *bits, "b64", "causal")

    # KV ranges that span several splits.
    extra, bits = paged_bits(16, "NHD", "tuple")
    p = _base("fp16", 128, (8, 2), qo_lens=[5, 1, 19], kv_lens=[211, 97, 150], causal=True,
              window_left=-1, return_lse=True, max_kv_chunk=32, **extra)
    yield "split_kv", p, _tag(p, *bits, "b3", "chunk32", "causal")
    extra, bits = paged_bits(1, "HND", "single")
    p = _base("fp32", 32, (2, 2), qo_lens=[3, 11], kv_lens=[130, 64], causal=False,
              window_left=40, return_lse=True, max_kv_chunk=16, **extra)
    yield "split_kv", p, _tag(p, *bits, "b2", "chunk16", "w40")

    # head_dim_vo != head_dim_qk.
    for dtype, qk, vo, causal in (("bf16", 128, 64, True), ("fp16", 64, 128, False)):
        extra, bits = paged_bits(16)
        qo, kv = _batch_lens(3, qk)
        p = _base(dtype, qk, (4, 2), head_dim_vo=vo, qo_lens=qo, kv_lens=kv, causal=causal,
                  window_left=-1, return_lse=True, **extra)
        yield "vo_dim", p, _tag(p, *bits, "b3", _mask_tag(causal, -1))

    # CUDA-graph mode: fixed caller-owned index buffers, always split KV.
    extra, bits = paged_bits(16, "NHD", "tuple")
    p = _base("bf16", 64, (8, 2), qo_lens=[6, 13, 2], kv_lens=[45, 90, 17], causal=True,
              window_left=-1, return_lse=True, use_cuda_graph=True, **extra)
    yield "cuda_graph", p, _tag(p, *bits, "b3", "causal")

    if paged:
        # Page ids past 65,535: a 16-bit page id would wrap. Page size 1 keeps the pool small.
        p = _base("fp16", 64, (4, 1), qo_lens=[3, 9], kv_lens=[40, 25], causal=True,
                  window_left=-1, return_lse=True, page_size=1, layout="NHD",
                  cache_form="tuple", page_order="shuffled", page_id_offset=65536)
        yield "page_ids_past_64k", p, _tag(p, "p1", "b2")
        # run(partial_state=) with an empty state on a split plan: the merge must be a no-op.
        p = _base("fp16", 64, (4, 2), qo_lens=[9, 4], kv_lens=[77, 30], causal=True,
                  window_left=-1, return_lse=True, page_size=16, layout="NHD",
                  cache_form="tuple", page_order="shuffled", max_kv_chunk=16,
                  partial_state=True)
        yield "partial_state_empty", p, _tag(p, "p16", "b2", "chunk16")
        # Sequential pages with a last page that is exactly full.
        p = _base("bf16", 128, (2, 1), qo_lens=[16, 4], kv_lens=[32, 48], causal=True,
                  window_left=-1, return_lse=False, page_size=16, layout="NHD",
                  cache_form="single", page_order="sequential")
        yield "full_last_page", p, _tag(p, "p16", "b2")


# ---------------------------------------------------------------- pages of 2^n + m tokens

# Every other page size is a power of two, where a key's page and in-page slot by shift and
# mask equal the division's: 12 and 24 are not (3 for a page far smaller than a tile). Each
# (size, dtype, layout, form) on every paged op, requests over several pages with a partial
# last one (lengths not multiples of the size), and one an exact multiple.
ODD_PAGE_SIZES = ((12, "fp16", "NHD", "tuple"), (24, "bf16", "HND", "single"),
                  (3, "fp32", "NHD", "single"), (12, "bf16", "HND", "tuple"))


def odd_pages(op: str):
    """(variant, params, tag) for the paged ops: every page size of ODD_PAGE_SIZES."""
    for n, (page_size, dtype, layout, form) in enumerate(ODD_PAGE_SIZES):
        kv = [5 * page_size + 7 % page_size, page_size * 2, 1 + (n * 13) % page_size]
        if op == "batch_decode":
            qo, causal, extra = [1] * 3, False, {}
        elif op == "mixed_batch":
            qo, causal, extra = [1, 1, 1], True, {"num_decodes": 2}
            qo[2] = min(kv[2], 5)
        else:
            qo, causal, extra = [9, 4, min(kv[2], 3)], True, {}
        heads = ((8, 2), (4, 1))[n % 2]
        # Without the LSE on odd rows: ll4mi and aiter reach their own kernels then.
        p = _base(dtype, (64, 128)[n % 2], heads, qo_lens=qo, kv_lens=kv, causal=causal,
                  window_left=-1, return_lse=op != "mixed_batch" and n % 2 == 0, layout=layout,
                  page_size=page_size, cache_form=form, page_order="shuffled", **extra)
        if op == "mixed_batch":
            p.pop("layout"), p.pop("cache_form")
        yield "page_size_odd", p, _tag(p, f"p{page_size}", layout.lower(), form, f"b{len(kv)}")


# ---------------------------------------------------------------- batch decode

def _batch_decode():
    for dtype, head_dim, heads, k in _core_rows():
        window = (-1, -1, 20)[k % 3]
        page_size, layout, form = PAGED_FORMS[(k // 2 + k) % 4]
        batch = (1, 7)[k % 2]
        _, kv = _batch_lens(batch, k, decode=True)
        p = _base(dtype, head_dim, heads, qo_lens=[1] * batch, kv_lens=kv, causal=False,
                  window_left=window, return_lse=k % 2 == 0, layout=layout,
                  page_size=page_size, cache_form=form,
                  page_order=("shuffled", "sequential")[k % 4 == 3])
        yield "grid", p, _tag(p, f"p{page_size}", layout.lower(), form, f"b{batch}",
                              _mask_tag(False, window))
    _, kv = _batch_lens(64, 2, decode=True)
    p = _base("bf16", 128, (8, 1), qo_lens=[1] * 64, kv_lens=kv, causal=False, window_left=-1,
              return_lse=True, layout="NHD", page_size=16, cache_form="tuple",
              page_order="shuffled")
    yield "batch64", p, _tag(p, "p16", "b64")
    p = _base("fp16", 64, (4, 2), qo_lens=[1] * 3, kv_lens=[300, 1, 129], causal=False,
              window_left=-1, return_lse=True, layout="HND", page_size=16, cache_form="single",
              page_order="shuffled", max_kv_chunk=32)
    yield "split_kv", p, _tag(p, "p16", "b3", "chunk32")
    p = _base("fp32", 128, (4, 1), qo_lens=[1] * 2, kv_lens=[40, 33], causal=False,
              window_left=-1, return_lse=True, layout="NHD", page_size=1, cache_form="tuple",
              page_order="shuffled", page_id_offset=65536)
    yield "page_ids_past_64k", p, _tag(p, "p1", "b2")
    p = _base("fp16", 128, (8, 2), qo_lens=[1] * 5, kv_lens=[33, 70, 1, 16, 129], causal=False,
              window_left=-1, return_lse=True, layout="NHD", page_size=16, cache_form="tuple",
              page_order="shuffled", use_cuda_graph=True)
    yield "cuda_graph", p, _tag(p, "p16", "b5")


# ---------------------------------------------------------------- merge state

def _merge_state():
    # Non-causal, no window: each request's KV is split in two halves whose states merge
    # back into the whole; kv_len >= 2 keeps both halves non-empty.
    for i, (dtype, head_dim, heads, k) in enumerate(_core_rows()):
        if i % 2:
            continue
        batch = (1, 3)[k % 2 == 0]
        qo = [1 + (r * 7 + k) % 9 for r in range(batch)]
        kv = [2 + (r * 29 + k * 5) % 61 for r in range(batch)]
        for merge in ("out_of_place", "in_place"):
            p = _base(dtype, head_dim, heads, qo_lens=qo, kv_lens=kv, causal=False,
                      window_left=-1, return_lse=True, merge=merge)
            yield merge, p, _tag(p, f"b{batch}")


# ---------------------------------------------------------------- mixed batch

def _mixed_batch():
    # Decode-first: qo_lens = [1] * num_decodes + prefill lengths.
    shapes = (
        (1, [5]), (3, [17, 1 + 8]), (4, []), (0, [13, 2]), (7, [31]),
    )
    for n, (dtype, head_dim, heads, k) in enumerate(_core_rows()):
        num_decodes, prefill = shapes[n % len(shapes)]
        batch = num_decodes + len(prefill)
        qo = [1] * num_decodes + list(prefill)
        kv = [q + (r * 19 + k * 3) % 40 for r, q in enumerate(qo)]
        window = (-1, -1, 24)[k % 3]
        page_size = (16, 1)[k % 2]
        p = _base(dtype, head_dim, heads, qo_lens=qo, kv_lens=kv, causal=True,
                  window_left=window, return_lse=False, page_size=page_size,
                  num_decodes=num_decodes, page_order=("shuffled", "sequential")[k % 3 == 1])
        yield "grid", p, _tag(p, f"p{page_size}", f"dec{num_decodes}of{batch}",
                              _mask_tag(True, window))


# ---------------------------------------------------------------- sweeps, every op

# Group sizes 1..16 over 2 kv heads: q head h reads kv head h // g, which no other
# mapping (h % 2, h * 2 // Hq with a rounding slip) matches for every g.
GROUP_SIZES = tuple(range(1, 17))
# Head sizes a route's selector may switch on (the ll4mi kernel's minimum is 64; 192
# and 256 are where tile shapes change) and odd ones. The common sizes must match;
# the others a library may legitimately not serve.
COMMON_HEAD_DIMS = (32, 64, 128, 256)
SWEEP_HEAD_DIMS = (16, 48, 64, 80, 96, 192, 256)
_SWEEP_SHAPE = {
    "single_prefill": dict(qo_lens=[5], kv_lens=[23], causal=True),
    "single_decode": dict(qo_lens=[1], kv_lens=[29], causal=False),
    "paged_prefill": dict(qo_lens=[3, 4], kv_lens=[19, 30], causal=True),
    "ragged_prefill": dict(qo_lens=[3, 4], kv_lens=[19, 30], causal=True),
    "batch_decode": dict(qo_lens=[1, 1, 1], kv_lens=[17, 40, 9], causal=False),
    "merge_state": dict(qo_lens=[3], kv_lens=[20], causal=False),
    "mixed_batch": dict(qo_lens=[1, 4], kv_lens=[12, 20], causal=True, num_decodes=1),
}


def sweeps(op: str, dtypes=("bf16", "fp16")):
    """(variant, params, tag): group sizes (in dtypes[0]) and head sizes (in dtypes[1]) on
    one op; the full profile passes every dtype for both. The common head sizes must match,
    the others may be refused (cases/_expect.py)."""
    shape = dict(_SWEEP_SHAPE[op], window_left=-1, return_lse=op != "mixed_batch")
    for dtype in dtypes[:1] if len(dtypes) == 2 else dtypes:
        for g in GROUP_SIZES:
            p = _base(dtype, 64, (2 * g, 2), **shape)
            yield f"group{g}", p, _tag(p)
    for dtype in dtypes[1:] if len(dtypes) == 2 else dtypes:
        for d in SWEEP_HEAD_DIMS:
            p = _base(dtype, d, (4, 2), **shape)
            yield f"head_dim{d}", p, _tag(p)


def _case(route: str, op: str, variant: str, params: dict, tag: str) -> Case:
    must, words = expect(op, params)
    return Case(route=route, family=FAMILY, variant=variant, params=params, expect=must,
                refuse_words=words, tag=tag)


def cases(routes, profile: str = "ci") -> Iterator[Case]:
    dtypes = ("bf16", "fp16", "fp32") if profile == "full" else ("bf16", "fp16")
    for route, op, make, _ in per_route(routes, globals()):
        for variant, params, tag in make():
            yield _case(route, op, variant, params, tag)
        if op in ("paged_prefill", "batch_decode", "mixed_batch"):
            for variant, params, tag in odd_pages(op):
                yield _case(route, op, variant, params, tag)
        for variant, params, tag in sweeps(op, dtypes):
            yield _case(route, op, variant, params, tag)
