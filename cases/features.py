"""features: the features production kernels ship, each on every route that carries it (issue 25).

  softcap             logits c * tanh(s / c) before masking: c = 2 (masked keys leaking in as
                      -c would be visible), 50 (Gemma's), 30 at large logits (|s| ~ 100-200)
  sinks               a sink logit per q head in the denominator only; edge rows: a fully
                      masked row (o = 0, lse = the sink) and an empty request
  alibi               a slope per q head, bottom-right aligned; GQA groups whose q heads'
                      slopes differ from their kv head's; non-causal rows see positive biases
  fp8_kv              e4m3 / e5m2 caches with per-tensor k_scale / v_scale, the scales such
                      that drawn values land at and past the format's max (saturated), at
                      large logits, split, HND, a single-tensor cache; scales on a 16-bit cache
  multi_token_decode  batch decode with q_len_per_req 2 / 4 (causal within the request), with
                      rows before the first key, a window, a split, fp8, sinks
  custom_mask         random, tree and one-empty-row masks, with a window, a split, sinks

  cover.<feature>     the covering rule: every pair of levels of (feature, split path, head-dim
                      relation, window, custom mask, rows over tiles) an op can express, each
                      met by two rows of different dtypes (COVER_FACTORS, covering_rows)

crossed with dtypes, head sizes and GQA groups by rotation (variant i takes DTYPES[i % 3],
...), so every dtype meets every feature without the full product; the full profile runs
every valid variant in every dtype. Adversarial (refuse):
sinks of the wrong length, slopes per kv head, scales that are not one value, q rows that
q_len_per_req does not divide, a custom mask of the wrong size, causal with a mask. Each
case lists its features in Case.requires, so a target without one skips it by capability.
"""
from __future__ import annotations

import functools
import heapq
import itertools
from typing import Iterator

from cases._tags import tag as id_tag
from harness.model.case import Case
from harness.model.routes import op_of

FAMILY = "features"
OPS = ("single_prefill", "single_decode", "paged_prefill", "ragged_prefill", "batch_decode")

DTYPES = ("bf16", "fp16", "fp32")
HEAD_DIMS = (128, 64, 256)
# (Hq, Hkv): MHA, group 4, group 3 (slopes by kv head differ from q head's in each).
HEADS = ((4, 4), (8, 2), (6, 2))

# One problem shape per op; decode rows see their whole KV.
SHAPES = {
    "single_prefill": dict(qo_lens=[17], kv_lens=[40], causal=True),
    "single_decode": dict(qo_lens=[1], kv_lens=[45], causal=False),
    "paged_prefill": dict(qo_lens=[5, 17, 1], kv_lens=[20, 40, 33], causal=True),
    "ragged_prefill": dict(qo_lens=[5, 17], kv_lens=[20, 40], causal=True),
    "batch_decode": dict(qo_lens=[1, 1, 1], kv_lens=[20, 45, 7], causal=False),
}
BATCH = ("paged_prefill", "ragged_prefill", "batch_decode")
PREFILL = ("single_prefill", "paged_prefill", "ragged_prefill")
# Edge rows per op: leading causal rows that see no key, and an empty request.
EDGE = {
    "single_prefill": dict(qo_lens=[9], kv_lens=[4], causal=True),
    "paged_prefill": dict(qo_lens=[9, 3, 2], kv_lens=[4, 0, 6], causal=True),
    "ragged_prefill": dict(qo_lens=[9, 3], kv_lens=[4, 0], causal=True),
    "batch_decode": dict(qo_lens=[1, 1, 1], kv_lens=[5, 0, 9], causal=False),
    "single_decode": dict(qo_lens=[1], kv_lens=[0], causal=False),
}

# Where each feature is carried (kernels/README.md "Features"; FlashInfer's API alike).
ROUTES_OF = {
    "softcap": OPS, "sinks": OPS, "alibi": OPS,
    "fp8_kv": ("paged_prefill", "batch_decode"),
    "multi_token_decode": ("batch_decode",),
    "custom_mask": ("single_prefill", "paged_prefill"),
}
FP8_MAX = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}


def _base(op: str, i: int, **extra) -> dict:
    hq, hkv = HEADS[i % 3]
    return {"dtype": DTYPES[i % 3], "head_dim": HEAD_DIMS[i % 3], "num_qo_heads": hq,
            "num_kv_heads": hkv, "return_lse": True, **SHAPES[op], **extra}


def _common(op: str, feature: dict) -> Iterator[tuple[str, dict]]:
    """The axes every logit feature is crossed with on one op."""
    for i in range(3):
        yield f"basic{i}", _base(op, i, **feature)
    yield "window", _base(op, 1, window_left=6, **feature)
    yield "large_logits", _base(op, 0, values="large_logits", **feature)
    yield "edge_rows", _base(op, 2, **{**EDGE[op], **feature})
    if op in BATCH:
        yield "split", _base(op, 1, max_kv_chunk=8, **feature)
    if op in PREFILL:
        yield "noncausal", _base(op, 0, causal=False, **feature)
    if op in ("paged_prefill", "batch_decode"):
        yield "hnd_small_head", _base(op, 1, head_dim=16, layout="HND", **feature)


def _softcap(op):
    for name, cap in (("cap2", 2.0), ("cap50", 50.0)):
        for variant, params in _common(op, {"logits_soft_cap": cap}):
            if name == "cap50" and variant not in ("basic0", "large_logits"):
                continue
            yield f"{name}_{variant}", params
    yield "cap30_large_logits_fp32", _base(op, 2, values="large_logits", logits_soft_cap=30.0)


def _sinks(op):
    yield from _common(op, {"sinks": True})
    hq = HEADS[0][0]
    yield "given", _base(op, 0, sinks=[-3.0, 0.0, 2.5, 6.0][:hq])


def _alibi(op):
    yield from _common(op, {"alibi_slopes": True})
    yield "with_softcap_sinks", _base(op, 1, alibi_slopes=True, sinks=True, logits_soft_cap=5.0)


def _fp8(op):
    for fmt in ("fp8_e4m3", "fp8_e5m2"):
        top = FP8_MAX[fmt]
        # |k| / k_scale past the max for ~5% of N(0, 1) draws: those entries store +-max.
        sat = {"kv_dtype": fmt, "k_scale": 2.0 / top, "v_scale": 2.0 / top}
        scaled = {"kv_dtype": fmt, "k_scale": 0.0625, "v_scale": 0.03}
        yield f"{fmt}_unscaled", _base(op, 0, kv_dtype=fmt)
        yield f"{fmt}_scaled", _base(op, 1, **scaled)
        yield f"{fmt}_saturated", _base(op, 2, **sat)
        yield f"{fmt}_large_logits", _base(op, 0, values="large_logits", kv_dtype=fmt,
                                           k_scale=1.0 if fmt == "fp8_e5m2" else 0.5)
        yield f"{fmt}_split", _base(op, 1, max_kv_chunk=8, **scaled)
        yield f"{fmt}_window_hnd", _base(op, 2, window_left=5, layout="HND", **scaled)
        yield f"{fmt}_single_cache", _base(op, 0, cache_form="single", **sat)
        yield f"{fmt}_edge_rows", _base(op, 1, **{**EDGE[op], **scaled})
        # Pages of 32: the block size vLLM's CPU backend plans an fp8 cache with (its vec
        # and amx kernels); 16 runs vec16, which takes no fp8 cache.
        yield f"{fmt}_scaled_page32", _base(op, 1, page_size=32, **scaled)
        yield f"{fmt}_saturated_page32", _base(op, 0, page_size=32, **sat)
    yield "scales_16bit_cache", _base(op, 0, k_scale=0.5, v_scale=2.0)


def _multi_token(op):
    def mtd(i, n, kv, **extra):
        return _base(op, i, qo_lens=[n] * len(kv), kv_lens=kv, causal=True,
                     q_len_per_req=n, **extra)
    yield "n2", mtd(0, 2, [20, 45, 7])
    yield "n4", mtd(1, 4, [33, 9, 64])
    yield "n4_fp32", mtd(2, 4, [17, 30])
    yield "n3_window", mtd(0, 3, [30, 12], window_left=4)
    yield "n4_split", mtd(1, 4, [40, 25], max_kv_chunk=8)
    yield "n4_rows_before_keys", mtd(2, 4, [2, 0, 30])
    yield "n2_fp8", mtd(0, 2, [20, 45], kv_dtype="fp8_e4m3", k_scale=0.0625, v_scale=0.03)
    yield "n3_sinks_alibi", mtd(1, 3, [20, 31], sinks=True, alibi_slopes=True)


def _custom_mask(op):
    for i, kind in enumerate(("random", "tree", "random_empty_row")):
        yield kind, _base(op, i, causal=False, custom_mask=kind)
    yield "tree_window", _base(op, 1, causal=False, custom_mask="tree", window_left=6)
    yield "empty_row_sinks", _base(op, 2, causal=False, custom_mask="random_empty_row",
                                   sinks=True)
    yield "tree_qo_past_kv", _base(op, 0, causal=False, custom_mask="tree",
                                   **({"qo_lens": [9], "kv_lens": [4]} if op == "single_prefill"
                                      else {"qo_lens": [9, 3, 6], "kv_lens": [4, 0, 6]}))
    if op == "paged_prefill":
        yield "random_split", _base(op, 1, causal=False, custom_mask="random", max_kv_chunk=8)


VALID = {"softcap": _softcap, "sinks": _sinks, "alibi": _alibi, "fp8_kv": _fp8,
         "multi_token_decode": _multi_token, "custom_mask": _custom_mask}


# ---------------------------------------------------------------- features x schedule paths
#
# A covering rule, not a list: every pair of levels of the factors below that an op can
# express is met by at least two rows of different dtypes. A new feature (or split path)
# added to a factor is crossed with every level of every other factor without a new variant.
COVER_FACTORS = {
    "feature": ("softcap", "sinks", "alibi", "fp8_kv", "softcap_alibi"),
    # none; a caller's max_kv_chunk over several chunks; no chunk and a workspace the
    # default chunk overflows (plan() fits a doubled one); a CUDA-graph plan (always split).
    "split": ("none", "chunk", "fitted", "graph"),
    "dims": ("eq", "vo_lt_qk", "vo_gt_qk"),       # head_dim_vo against head_dim_qk
    "window": ("off", "on"),
    "mask": ("none", "custom"),
    "rows": ("one_tile", "tiles"),                  # a prefill's rows over several tiles
    "dtype": DTYPES,
}
FEATURE_PARAMS = {
    "softcap": {"logits_soft_cap": 2.0},
    "sinks": {"sinks": True},
    "alibi": {"alibi_slopes": True},
    "fp8_kv": {"kv_dtype": "fp8_e4m3", "k_scale": 0.0625, "v_scale": 0.03},
    "softcap_alibi": {"logits_soft_cap": 5.0, "alibi_slopes": True},
}
# What each op can express: the levels it takes of each factor.
COVER_OPS = {
    "single_prefill": {"split": ("none",), "feature": ("softcap", "sinks", "alibi",
                                                      "softcap_alibi")},
    "single_decode": {"split": ("none",), "mask": ("none",), "rows": ("one_tile",),
                      "feature": ("softcap", "sinks", "alibi", "softcap_alibi")},
    "paged_prefill": {},
    "ragged_prefill": {"mask": ("none",), "feature": ("softcap", "sinks", "alibi",
                                                      "softcap_alibi")},
    "batch_decode": {"dims": ("eq",), "mask": ("none",), "rows": ("one_tile",)},
}
# (qo_lens, kv_lens) per op and rows level; "fitted" makes the first request's kv long (past
# twice the default chunk of 512, so the doubled chunk plan() fits still splits it), a few
# rows over it.
COVER_LENS = {
    "single_prefill": {"one_tile": ([13], [40]), "tiles": ([150], [170])},
    "single_decode": {"one_tile": ([1], [45])},
    "paged_prefill": {"one_tile": ([5, 12], [40, 70]), "tiles": ([3, 150], [30, 170])},
    "ragged_prefill": {"one_tile": ([5, 12], [40, 70]), "tiles": ([3, 150], [30, 170])},
    "batch_decode": {"one_tile": ([1, 1, 1], [40, 9, 70])},
}
FITTED_KV = 1100


def _levels(op: str) -> dict:
    return {f: COVER_OPS[op].get(f, levels) for f, levels in COVER_FACTORS.items()}


def _pairs(row: tuple, names: tuple):
    """The (factor, level, factor, level) pairs one row covers (dtype is not a factor of
    its own pairs: it is what a pair must meet twice, differently)."""
    rest = [(n, v) for n, v in zip(names, row) if n != "dtype"]
    for i, a in enumerate(rest):
        for b in rest[i + 1:]:
            yield a + b


@functools.lru_cache(maxsize=None)
def covering_rows(op: str) -> tuple:
    """The op's rows, as dicts of factor -> level: greedy, each row the candidate that meets
    the most pairs still short of two dtypes (ties: the first in the product's order)."""
    levels = _levels(op)
    names = tuple(levels)
    candidates = list(itertools.product(*levels.values()))
    at = names.index("dtype")
    pairs = [tuple(_pairs(row, names)) for row in candidates]
    seen = {pair: set() for row_pairs in pairs for pair in row_pairs}

    def gain(i: int) -> int:
        dtype = candidates[i][at]
        return sum(1 for pr in pairs[i] if len(seen[pr]) < 2 and dtype not in seen[pr])

    # Lazy greedy: a candidate's gain only falls as rows are taken, so a stale gain is an
    # upper bound. The top of the heap, once its fresh gain still tops it, is the max() of
    # the plain greedy, ties to the first candidate: the same rows, without re-scoring all.
    heap = [(-gain(i), i) for i in range(len(candidates))]
    heapq.heapify(heap)
    rows = []
    short = len(seen)   # pairs met in fewer than two dtypes
    while short:
        stale, i = heapq.heappop(heap)
        fresh = gain(i)
        if -stale != fresh:
            heapq.heappush(heap, (-fresh, i))
            continue
        for pr in pairs[i]:
            before = len(seen[pr])
            seen[pr].add(candidates[i][at])
            short -= before < 2 <= len(seen[pr])
        rows.append(dict(zip(names, candidates[i])))
        heapq.heappush(heap, (-gain(i), i))
    return tuple(rows)


def cover_params(op: str, row: dict, n: int) -> dict:
    """The problem of one covering row (n: its index, which picks the shape)."""
    # A long decode (the fitted split) at head_dim 64: ll4mi's emulation recomputes every
    # logit per value slice.
    eq = 64 if op == "batch_decode" and row["split"] == "fitted" else (64, 128)[n % 2]
    qk, vo = {"eq": (eq, eq), "vo_lt_qk": (128, 64), "vo_gt_qk": (64, 128)}[row["dims"]]
    qo, kv = COVER_LENS[op][row["rows"]]
    p = {"dtype": row["dtype"], "head_dim": qk, "num_qo_heads": (8, 6)[n % 2],
         "num_kv_heads": 2, "qo_lens": qo, "kv_lens": kv,
         "causal": op not in ("single_decode", "batch_decode") and row["mask"] == "none",
         "window_left": (-1, 6)[row["window"] == "on"], "return_lse": n % 3 != 2,
         **FEATURE_PARAMS[row["feature"]]}
    if vo != qk:
        p["head_dim_vo"] = vo
    if row["mask"] == "custom":
        p["custom_mask"] = ("random", "tree")[n % 2]
    if row["split"] == "chunk":
        p["max_kv_chunk"] = 16
    elif row["split"] == "graph":
        p["use_cuda_graph"] = True
    elif row["split"] == "fitted":
        p["kv_lens"] = [FITTED_KV, *kv[1:]]
        p["workspace_bytes"] = _ws_between(p["qo_lens"], p["kv_lens"], p["num_qo_heads"], vo)
    if op in ("paged_prefill", "batch_decode"):
        p.update(page_size=16, layout=("NHD", "HND")[n % 2], cache_form="tuple")
    return p


def _ws_between(qo_lens, kv_lens, hq: int, dv: int) -> int:
    """A float workspace the default chunk's split overflows and the doubled one fits."""
    from cases.schedule import DEFAULT_CHUNK, plan_bytes
    need = plan_bytes(qo_lens, kv_lens, hq, dv, DEFAULT_CHUNK)
    return (need + plan_bytes(qo_lens, kv_lens, hq, dv, 2 * DEFAULT_CHUNK)) // 2


def _cover_tag(params: dict, row: dict) -> str:
    bits = [_tag(params), row["split"], row["dims"]]
    if row["window"] == "on":
        bits.append("w6")
    if row["mask"] == "custom":
        bits.append(f"mask_{params['custom_mask']}")
    if row["rows"] == "tiles":
        bits.append("tiles")
    return "-".join(bits + ["lse" if params["return_lse"] else "nolse"])


def covering(op: str) -> Iterator[tuple[str, dict, str]]:
    """(variant, params, tag) of the op's covering rows."""
    for n, row in enumerate(covering_rows(op)):
        params = cover_params(op, row, n)
        yield f"cover.{row['feature']}", params, _cover_tag(params, row)

def requires(params: dict) -> tuple[str, ...]:
    """The capabilities.FEATURES a case's params use (scales count as fp8_kv: the argument
    that carries them is the fp8 cache's)."""
    needs = set()
    if params.get("logits_soft_cap"):
        needs.add("softcap")
    if params.get("sinks") not in (None, False):
        needs.add("sinks")
    if params.get("alibi_slopes") not in (None, False):
        needs.add("alibi")
    if params.get("kv_dtype") or "k_scale" in params or "v_scale" in params:
        needs.add("fp8_kv")
    if params.get("q_len_per_req", 1) > 1:
        needs.add("multi_token_decode")
    if params.get("custom_mask"):
        needs.add("custom_mask")
    return tuple(sorted(needs))


def _adversarial(op: str) -> Iterator[tuple[str, dict, tuple]]:
    """(variant, params, refuse_words): inputs with no defined answer."""
    hq, hkv = HEADS[1]
    if op in ROUTES_OF["sinks"]:
        yield "sinks_too_long", _base(op, 1, sinks=True, malformed={"field": "sinks",
                                                                    "length": hq + 1}), \
            ("sinks", str(hq + 1), str(hq))
        yield "sinks_too_short", _base(op, 1, sinks=True, malformed={"field": "sinks",
                                                                     "length": hq - 1}), \
            ("sinks", str(hq - 1), str(hq))
    if op in ROUTES_OF["alibi"]:
        yield "alibi_per_kv_head", _base(op, 1, alibi_slopes=True, malformed={
            "field": "alibi_slopes", "length": hkv}), ("alibi_slopes", str(hkv), str(hq))
    if op in ROUTES_OF["fp8_kv"]:
        for key in ("k_scale", "v_scale"):
            yield f"{key}_per_head", _base(op, 1, kv_dtype="fp8_e4m3", k_scale=0.0625,
                                           v_scale=0.03, malformed={"field": key,
                                                                    "shape": [hkv]}), \
                (key, str(hkv))
    if op == "batch_decode":
        n, kv = 4, [20, 9, 33]
        rows = n * len(kv) + 1     # past the planned rows: fewer trips the row-count guard first
        yield "q_rows_not_multiple", _base(op, 1, qo_lens=[n] * 3, kv_lens=kv, causal=True,
                                           q_len_per_req=n,
                                           mismatch={"field": "q_rows", "value": rows}), \
            ("q_len_per_req", str(rows), str(n))
    if op in ROUTES_OF["custom_mask"]:
        for name, delta in (("mask_one_short", -1), ("mask_one_long", 1)):
            params = _base(op, 0, causal=False, custom_mask="random",
                           malformed={"field": "custom_mask", "delta": delta})
            need = sum(q * k for q, k in zip(params["qo_lens"], params["kv_lens"]))
            yield name, params, ("custom_mask", str(need + delta))
        yield "mask_with_causal", _base(op, 0, causal=True, custom_mask="tree"), \
            ("causal", "custom_mask")


def _tag(params: dict) -> str:
    return id_tag(params, "dims", "kv_dtype", "hnd")


def _dtypes(params: dict, profile: str) -> Iterator[dict]:
    """ci: the variant's own dtype (the rotation covers all three); full: every dtype."""
    yield params
    if profile == "full":
        for dtype in DTYPES:
            if dtype != params["dtype"]:
                yield {**params, "dtype": dtype}


def cases(routes, profile: str = "ci") -> Iterator[Case]:
    for route in routes:
        op = op_of(route)
        if op not in OPS:
            continue
        for feature, make in VALID.items():
            if op not in ROUTES_OF[feature]:
                continue
            for variant, drawn in make(op):
                for params in _dtypes(drawn, profile):
                    for form, tag in _lse_forms(params):
                        yield Case(route=route, family=FAMILY, variant=f"{feature}.{variant}",
                                   params=form, tag=tag, requires=requires(form))
        for variant, params, tag in covering(op):
            yield Case(route=route, family=FAMILY, variant=variant, params=params, tag=tag,
                       requires=requires(params) + _schedule_needs(params))
        for variant, params, words in _adversarial(op):
            for form, tag in _lse_forms(params):
                yield Case(route=route, family=FAMILY, variant=f"refuse.{variant}", params=form,
                           expect="refuse", refuse_words=words, tag=tag,
                           requires=requires(form) + (("metadata.q_rows",)
                                                      if "mismatch" in form else ()))


def _schedule_needs(params: dict) -> tuple[str, ...]:
    return (("split_control",) if params.get("max_kv_chunk") else ()) + \
        (("plan_run", "graphs") if params.get("use_cuda_graph") else ())


def _lse_forms(params: dict):
    """The case as written (its LSE asked for), then without the LSE: a library that
    returns none (vLLM's CPU attention) is reached by every feature too."""
    yield params, _tag(params)
    if params.get("return_lse"):
        plain = {**params, "return_lse": False}
        yield plain, f"{_tag(plain)}-nolse"
