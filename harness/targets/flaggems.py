"""flaggems: the adapter for FlagGems' Triton attention (PyPI `flag-gems`).

Every route calls one public function, `flag_gems.flash_attn_varlen_func`
(the one FlagGems exports from flag_gems.ops.attention), which keeps vLLM's
flash-attn varlen API: q [total_q, Hq, D] split by cu_seqlens_q; k/v either
dense [total_k, Hkv, D] split by cu_seqlens_k, or a block-table paged cache
[num_blocks, block_size, Hkv, D] with seqused_k; max_seqlen_q/k, causal,
window_size=(left, right), softmax_scale, return_softmax_lse, out=.

Routes (backend "fg"):

  fg.single_prefill   one request, dense: cu_seqlens_q = [0, L], cu_seqlens_k = [0, S]
  fg.single_decode    the same with one query token (q [1, Hq, D])
  fg.ragged_prefill   packed k/v of every request, cu_seqlens_k = kv_indptr
  fg.paged_prefill    the block-table cache (harness/targets/layout.py build_paged,
                      block_table), seqused_k = kv lengths, cu_seqlens_q = qo_indptr
  fg.batch_decode     the same with one query token per request
  fg.mixed_batch      the decode-first batch in ONE call over the block-table cache, with
                      query_start_loc as cu_seqlens_q and seq_lens as seqused_k, as vLLM's
                      flash-attn backend makes it; num_decodes only orders the requests

Conventions, checked against FlagGems' source:
  causal      bottom-right aligned (its docstring and kernel: the diagonal of row i is
              kv i + S - L), the harness's convention: passed through
  window      window_left w -> window_size=(w, 0) with causal, (w, -1) without: flash-attn's
              (left, right) with -1 meaning unbounded, so a non-causal window bounds only
              the left; no window -> (-1, -1)
  LSE         natural log (the kernel stores max * scale + log(sum)), returned as
              [Hq, total_q]: transposed to [total_q, Hq]. A row that sees no kv gets
              FA2's +inf, which is passed on as returned (the reference says -inf)
  sm_scale    None exercises FlagGems' default (head_dim ** -0.5)
  out         every call gets the caller's canary-banded out=; the rows compared are the
              ones in that buffer, whatever the function returns

Layouts. The function takes one logical shape per tensor and honours strides
only where its kernel reads them, so a layout is passed as a view of storage
in that layout, as vLLM hands a stride-permuted cache to flash-attn:
  dense HND   k/v stored [Hkv, S, D], passed as the [S, Hkv, D] transpose
  paged HND   pages stored [pages, Hkv, page_size, D], passed as the
              [pages, page_size, Hkv, D] transpose
  single      one [pages, 2, ...] cache, passed as its k and v halves (views)
  ragged HND  skipped, as in the bundled adapter (packed k/v are token-major)

Params (harness/model/params.py documents them): layout, page_size, cache_form,
page_order, page_id_offset, strided, index_dtype and mismatch map onto the call;
max_kv_chunk and workspace_bytes tune a planner this API does not have and are
not passed (FlagGems refuses num_splits > 0); use_cuda_graph, partial_state and
scenario have no analogue and are skipped with the reason. Index tensors are
named as the families name them: qo_indptr (cu_seqlens_q), kv_indptr
(cu_seqlens_k), seq_lens (seqused_k), block_table, query_start_loc (the mixed
batch's cu_seqlens_q); kv_indices and last_page_len have no counterpart.

mismatch (a library without plan()): the metadata (cu_seqlens, seqused_k,
max_seqlen_*) describes the problem and the tensors disagree with it in one
field, the same perturbations the bundled adapter applies
(harness/targets/plan_run/mismatch.py): q heads, q/k head_dim, v head_dim,
rank, q rows, ragged kv rows, q dtype; and the metadata itself bent against the
tensors (bend_metadata): seqused_k negative or past its block-table row, a block id
negative or past the cache, cu_seqlens_q's first entry negative, decreasing or its last
past q's rows, max_seqlen_q/k below (and above) the lengths. num_kv_heads and page_size
have no analogue: no argument states either, so a cache with other heads or pages is
another valid problem the call cannot tell apart, and such a case is skipped.

Refusals. FlagGems checks its inputs with `assert`. The engine treats an
AssertionError as an adapter bug (harness/engine/execute.py HARNESS_ERRORS), so one
raised inside the library is re-raised as LibraryAssertionError, a
RuntimeError whose message is the assertion's own text, or, for a bare
assert, the assert statement and its place in FlagGems' source as the
traceback shows them. Every other exception propagates untouched.
"""
from __future__ import annotations

import traceback
from typing import Any, Mapping

import torch

from harness.model.builders import CANARY_ELEMS
from harness.targets.base import Skip, Target, device_platform
from harness.targets.case_calls import CaseCalls, first_rows
from harness.targets.descriptors import flaggems as descriptor
from harness.targets.layout import block_table, build_paged, to_layout
from harness.targets.plan_run.mixed import decode_first
from harness.targets.plan_run.mismatch import perturb, perturb_ragged, planned_rows, short_rows

BACKEND = descriptor.BACKEND
OPS = descriptor.OPS
ROUTES = descriptor.ROUTES
# The descriptor (harness/targets/descriptors/flaggems.py) declares the signature: q/k/v,
# cu_seqlens_q/k, seqused_k, block_table, max_seqlen_q/k; num_kv_heads and page_size have
# no argument that states them (see _MISMATCH_NO_ANALOGUE).
CAPABILITIES = descriptor.CAPABILITIES

# Params with no analogue in flash_attn_varlen_func.
_NO_ANALOGUE = {
    "scenario": "flash_attn_varlen_func has no plan()/run(): the bundled library's scenarios "
                "script a wrapper's calls",
    "use_cuda_graph": "flash_attn_varlen_func has no CUDA-graph wrapper with caller-owned "
                      "index buffers",
    "partial_state": "flash_attn_varlen_func takes no partial_state to merge into",
    "merge": "FlagGems has no merge_state",
}
_MISMATCH_NO_ANALOGUE = {
    "num_kv_heads": "no argument of flash_attn_varlen_func states the kv head count: a cache "
                    "with other heads is another valid GQA problem, not a disagreement",
    "page_size": "no argument of flash_attn_varlen_func states the page size (the cache's "
                 "shape is it): a cache viewed as other pages is another valid cache",
}

INSTALL_HINT = ("the flaggems target needs FlagGems and a GPU its Triton kernels run on: "
                "`pip install flag-gems` (it imports sqlalchemy and greenlet) on a machine "
                "with a CUDA GPU and Triton")


class LibraryAssertionError(RuntimeError):
    """An `assert` inside FlagGems: its refusal of an input, as a catchable RuntimeError."""

    @classmethod
    def from_assert(cls, error: AssertionError) -> "LibraryAssertionError":
        said = str(error).strip()
        where, statement = _assert_site(error)
        # The library's words are the assertion's message only; the statement and its place
        # are ours, shown beside the message and never judged (classify.CONTEXT_ATTR).
        made = cls(f"AssertionError: {said}" if said else "AssertionError (bare assert)")
        context = " ".join(p for p in (f"`{statement}`" if statement else "",
                                       f"at {where}" if where else "") if p)
        if context:
            made.adapter_context = context
        return made


def _assert_site(error: BaseException) -> tuple[str, str]:
    """('file:line', source line) of the frame that raised, as a traceback prints them."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "", ""
    last = frames[-1]
    path = last.filename
    cut = path.rfind("flag_gems")
    short = path[cut:] if cut >= 0 else path.rsplit("/", 1)[-1]
    return f"{short}:{last.lineno}", (last.line or "").strip()


def bend_metadata(c, name: str, values):
    """The metadata argument `name` ("cu_seqlens_q", "seqused_k", "block_table",
    "max_seqlen_q", "max_seqlen_k") as the case hands it: the problem's, bent where the
    case's mismatch field lives in it (harness/model/relations.py)."""
    mm = c.mismatch or {}
    field, n = mm.get("field"), mm.get("value")
    if field is None or _BENDS.get(field) != name:
        return values
    if name in ("max_seqlen_q", "max_seqlen_k"):
        return int(n)
    if name == "cu_seqlens_q" and isinstance(n, list):
        return [int(x) for x in n]
    if name == "block_table":
        row = values[-1]
        return values[:-1] + [[int(n)] + row[1:]]
    return values[:-1] + [int(n)]


# Which argument each metadata field the descriptor performs lives in.
_BENDS = {"query_start_loc": "cu_seqlens_q", "kv_lens": "seqused_k",
          "block_table": "block_table", "max_seqlen_q": "max_seqlen_q",
          "max_seqlen_k": "max_seqlen_k"}


def window_size(causal: bool, window_left: int) -> tuple[int, int]:
    """The harness's (causal, window_left) as flash-attn's (left, right); -1 is unbounded."""
    if window_left < 0:
        return (-1, -1)
    return (window_left, 0 if causal else -1)


class FgCall(CaseCalls):
    """One case's call to flash_attn_varlen_func."""

    def __init__(self, case, problem, buffers, fn):
        super().__init__(case, problem, buffers)
        self.fn = fn

    def out(self, rows: int) -> torch.Tensor:
        p = self.problem
        per_row = p.num_qo_heads * p.head_dim_vo
        return self.views.output("out", (rows, p.num_qo_heads, p.head_dim_vo), p.dtype,
                                 CANARY_ELEMS + short_rows(self) * per_row)

    def index(self, name: str, values) -> torch.Tensor:
        return self.views.index(name, values, self.device)

    def features_kw(self) -> dict:
        """softcap= and alibi_slopes= where the case has them (a call without features
        stays the call it was)."""
        p, kw = self.problem, {}
        # The split is the planner's, which this API lacks: the answer is owed all the same
        # (module docstring), so a split case is this case here, unsplit.
        self.params.get("max_kv_chunk")
        if self.params.get("logits_soft_cap"):
            kw["softcap"] = p.logits_soft_cap
        if self.params.get("alibi_slopes") not in (None, False):
            if not p.causal and max(p.qo_lens) > 1:
                # flash-attn's ALiBi without causal is -slope * |j - pos|: keys right of a
                # row's position get a penalty, not kernels/README.md's bonus. Another
                # problem, not a defect; causal rows and decode rows see no such key.
                raise Skip("flash_attn_varlen_func's non-causal ALiBi uses |key_pos - "
                           "query_pos|, another convention")
            slopes = p.alibi_slopes
            bad = self.params.get("malformed") or {}
            if bad.get("field") == "alibi_slopes":
                n = int(bad["length"])
                slopes = torch.cat([slopes, slopes[-1:].repeat(max(0, n - slopes.numel()))])[:n]
            kw["alibi_slopes"] = self.views.input("alibi_slopes",
                                                  slopes.contiguous().to(self.device))
        return kw

    def call(self, q, k, v, cu_seqlens_q, *, cu_seqlens_k=None, seqused_k=None, table=None):
        """flash_attn_varlen_func over the planned problem; the logical outputs."""
        p = self.problem
        out_rows, rows = planned_rows(self)
        out = self.out(out_rows)
        feats = self.features_kw()
        self.views.check_used()
        self.buffers.stage("run")
        try:
            res = self.fn(
                q, k, v, bend_metadata(self, "max_seqlen_q", max(p.qo_lens)), cu_seqlens_q,
                bend_metadata(self, "max_seqlen_k", max(p.kv_lens)),
                cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k, block_table=table,
                softmax_scale=self.sm_scale, causal=p.causal,
                window_size=window_size(p.causal, p.window_left),
                return_softmax_lse=p.return_lse, out=out, **feats)
        except AssertionError as error:
            raise LibraryAssertionError.from_assert(error).with_traceback(
                error.__traceback__) from None
        result = {"o": first_rows(out, rows)}
        if p.return_lse:
            lse = res[1]
            want = (p.num_qo_heads, out_rows)
            if tuple(lse.shape) == want:
                lse = lse.transpose(0, 1)
            else:
                # Not the documented (nheads, total_q): nothing to read a row from.
                lse = torch.full(want[::-1], float("nan"), device=out.device)
            result["lse"] = first_rows(lse.float(), rows)
        return result


def _dense_kv(c: FgCall, t: torch.Tensor, name: str) -> torch.Tensor:
    """One request's dense k or v [S, Hkv, D] in the case's layout, fingerprinted."""
    stored = c.views.input(name, to_layout(t, c.layout))
    return stored if c.layout == "NHD" else stored.transpose(0, 1)


def _check_head_dims(c: FgCall) -> None:
    """Its envelope: one head_dim for k and v. A case that must match is skipped; a
    case that may or must be refused reaches the library."""
    p = c.problem
    if p.head_dim_vo != p.head_dim and c.case.expect == "match":
        raise Skip("flash_attn_varlen_func takes one head_dim for q, k and v "
                   "(it asserts k.size() == v.size())")


def single(c: FgCall, decode: bool) -> dict:
    p = c.problem
    if p.batch_size != 1:
        raise Skip("a single route takes one request")
    if decode and p.qo_lens[0] != 1:
        raise Skip("single decode takes one query token")
    _check_head_dims(c)
    if decode:
        q = c.views.input("q", p.q[0][0].contiguous()).unsqueeze(0)    # [1, Hq, D]
    else:
        q = c.views.input("q", p.q[0].contiguous())
    k = _dense_kv(c, p.k[0], "k")
    v = _dense_kv(c, p.v[0], "v")
    cu_q = c.index("qo_indptr", [0, p.qo_lens[0]])
    cu_k = c.index("kv_indptr", [0, p.kv_lens[0]])
    return c.call(q, k, v, cu_q, cu_seqlens_k=cu_k)


def ragged_prefill(c: FgCall) -> dict:
    p = c.problem
    if c.layout != "NHD":
        raise Skip("ragged k/v are token-major (NHD) only")
    _check_head_dims(c)
    q, k, v = p.q_packed(), p.k_packed(), p.v_packed()
    if _BENDS.get((c.mismatch or {}).get("field")) is None:
        q, k, v = perturb_ragged(c, q, k, v)
    q, k, v = c.views.input("q", q), c.views.input("k", k), c.views.input("v", v)
    _no_table(c)
    cu_q = c.index("qo_indptr", bend_metadata(c, "cu_seqlens_q", p.qo_indptr.tolist()))
    cu_k = c.index("kv_indptr", p.kv_indptr.tolist())
    return c.call(q, k, v, cu_q, cu_seqlens_k=cu_k)


def _no_table(c: FgCall) -> None:
    """A dense (ragged) call has no seqused_k or block_table to bend."""
    field = (c.mismatch or {}).get("field")
    if _BENDS.get(field) in ("seqused_k", "block_table"):
        raise Skip(f"mismatch field {field!r}: a dense call passes no {_BENDS[field]}")


def _cache_views(c: FgCall, cache, form: str):
    """(k, v) as the function takes them, [pages, page_size, Hkv, D], from the case's cache."""
    if form == "single":
        t = c.views.input("kv_cache", cache)
        k, v = t[:, 0], t[:, 1]
    else:
        k, v = c.views.input("k_cache", cache[0]), c.views.input("v_cache", cache[1])
    if c.layout == "HND":
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    return k, v


def paged(c: FgCall, decode: bool) -> dict:
    p = c.problem
    if decode and any(n != 1 for n in p.qo_lens):
        raise Skip("batch decode takes one query token per request")
    _check_head_dims(c)
    form = c.params.get("cache_form", "tuple")
    kv = build_paged(p, int(c.params.get("page_size", 16)), c.layout,
                     c.params.get("page_order", "shuffled"),
                     int(c.params.get("page_id_offset", 0)), c.case.seed)
    q, cache = p.q_packed(), kv.cache(form)
    if _BENDS.get((c.mismatch or {}).get("field")) is None:
        q, cache = perturb(c, q, cache)
    q = c.views.input("q", q)
    k, v = _cache_views(c, cache, form)
    cu_q = c.index("qo_indptr", bend_metadata(c, "cu_seqlens_q", p.qo_indptr.tolist()))
    seqused = c.index("seq_lens", bend_metadata(c, "seqused_k", list(p.kv_lens)))
    table = c.index("block_table", bend_metadata(c, "block_table",
                                                 block_table(kv, p.batch_size)))
    return c.call(q, k, v, cu_q, seqused_k=seqused, table=table)


def mixed_batch(c: FgCall) -> dict:
    """The decode-first batch in one call, as vLLM's flash-attn backend makes it."""
    p = c.problem
    decode_first(c)   # the one call takes decodes and prefills alike, split by query_start_loc
    if c.layout != "NHD":
        raise Skip("the mixed batch's block-table cache is NHD, as vLLM lays it out")
    kv = build_paged(p, int(c.params.get("page_size", 16)), "NHD",
                     c.params.get("page_order", "shuffled"),
                     int(c.params.get("page_id_offset", 0)), c.case.seed)
    qsl = c.index("query_start_loc", p.qo_indptr.tolist())
    seq_lens = c.index("seq_lens", p.kv_lens)
    table = c.index("block_table", block_table(kv, p.batch_size))
    q = c.views.input("q", p.q_packed())
    k = c.views.input("k_cache", kv.k_pages)
    v = c.views.input("v_cache", kv.v_pages)
    return c.call(q, k, v, qsl, seqused_k=seq_lens, table=table)


ROUTE_FNS = {
    "single_prefill": lambda c: single(c, decode=False),
    "single_decode": lambda c: single(c, decode=True),
    "ragged_prefill": ragged_prefill,
    "paged_prefill": lambda c: paged(c, decode=False),
    "batch_decode": lambda c: paged(c, decode=True),
    "mixed_batch": mixed_batch,
}


class FlagGemsTarget(Target):
    name = "flaggems"
    routes = ROUTES
    capabilities = CAPABILITIES

    def __init__(self, module: Any, fn, device: torch.device | str, where: str = ""):
        self.module = module
        self.fn = fn
        self.device = torch.device(device)
        self.where = where          # the import path of fn, for the setup log

    def version(self) -> str:
        return str(getattr(self.module, "__version__", "?"))

    def platform(self) -> str:
        return device_platform(self.device)

    def run(self, case, problem, buffers) -> Mapping[str, torch.Tensor]:
        if case.route not in self.routes:
            raise Skip(f"flaggems has no route {case.route!r} (routes: {', '.join(self.routes)})")
        params = case.params
        for key, why in _NO_ANALOGUE.items():
            if params.get(key):
                raise Skip(why)
        if params.get("strided") == "lse":
            raise Skip("flash_attn_varlen_func allocates the LSE itself (no lse= buffer)")
        field = (params.get("mismatch") or {}).get("field")
        if field in _MISMATCH_NO_ANALOGUE:
            raise Skip(_MISMATCH_NO_ANALOGUE[field])
        bad = (params.get("malformed") or {}).get("field")
        if bad not in (None, "alibi_slopes"):
            raise Skip(f"flash_attn_varlen_func takes no {bad}")
        c = FgCall(case, problem, buffers, self.fn)
        return ROUTE_FNS[case.op](c)


def _import_flaggems():
    try:
        import flag_gems
    except ImportError as error:
        raise RuntimeError(f"flaggems target: cannot import flag_gems ({error}); "
                           f"{INSTALL_HINT}") from error
    fn = getattr(flag_gems, "flash_attn_varlen_func", None)
    if fn is not None:
        return flag_gems, fn, "flag_gems.flash_attn_varlen_func"
    from flag_gems.ops import flash_attn_varlen_func as fn
    return flag_gems, fn, "flag_gems.ops.flash_attn_varlen_func"


def make_target(module: Any = None, device: torch.device | str | None = None) -> FlagGemsTarget:
    """The flaggems target over the installed package (or `module`, a stand-in with its API)."""
    if module is None:
        if not torch.cuda.is_available():
            raise RuntimeError(f"flaggems target: no GPU visible to torch; {INSTALL_HINT}")
        module, fn, where = _import_flaggems()
    else:
        fn, where = module.flash_attn_varlen_func, f"{type(module).__name__}.flash_attn_varlen_func"
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    return FlagGemsTarget(module, fn, device, where)
