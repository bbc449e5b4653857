"""The routes of a FlashInfer-shaped API, written once against Call.

  single_prefill    single_prefill_with_kv_cache(q, k, v, out=, lse=)
  single_decode     single_decode_with_kv_cache (q [Hq, D])
  paged_prefill     BatchPrefillWithPagedKVCacheWrapper.plan/run
  ragged_prefill    BatchPrefillWithRaggedKVCacheWrapper.plan/run
  batch_decode      BatchDecodeWithPagedKVCacheWrapper.plan/run (Call.decode_backend)
  merge_state       each request's KV split in two and merged back (merge.py)
  mixed_batch       decode_first_attention over a block-table cache (mixed.py)

A case naming a tensor the route never passes is skipped, not silently ignored.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from harness.targets.base import Skip
from harness.targets.layout import build_paged, to_layout
from harness.targets.plan_run.call import Call
from harness.targets.plan_run.merge import merge_state
from harness.targets.plan_run.mismatch import (check_index_field, index_values, perturb,
                                               perturb_ragged, planned_rows)
from harness.targets.plan_run.mixed import mixed_batch


# ------------------------------------------------------------------ single routes

def single_prefill(c: Call) -> dict:
    p, k_ = c.problem, c.lib
    if p.batch_size != 1:
        raise Skip("single prefill takes one request")
    q = c.views.input("q", p.q[0].contiguous())
    k = c.views.input("k", to_layout(p.k[0], c.layout))
    v = c.views.input("v", to_layout(p.v[0], c.layout))
    out, lse = c.out(p.qo_lens[0]), c.lse(p.qo_lens[0])
    feats = c.call_features_kw(mask=True)
    c.ready("run")
    returned = k_.single_prefill_with_kv_cache(
        q, k, v, causal=p.causal, kv_layout=c.layout, window_left=p.window_left,
        sm_scale=c.sm_scale, return_lse=p.return_lse, out=out, lse=lse, **feats)
    return c.result(*c.outputs(returned, out, lse))


def single_decode(c: Call) -> dict:
    p, k_ = c.problem, c.lib
    if p.batch_size != 1 or p.qo_lens[0] != 1:
        raise Skip("single decode takes one request with one query token")
    q = c.views.input("q", p.q[0][0].contiguous())
    k = c.views.input("k", to_layout(p.k[0], c.layout))
    v = c.views.input("v", to_layout(p.v[0], c.layout))
    out = lse = None
    if c.caller_outputs:
        out = c.views.output("out", (p.num_qo_heads, p.head_dim_vo), p.dtype)
        lse = c.views.output("lse", (p.num_qo_heads,), torch.float32) if p.return_lse else None
    feats = c.call_features_kw(mask=False)
    c.ready("run")
    returned = k_.single_decode_with_kv_cache(
        q, k, v, kv_layout=c.layout, window_left=p.window_left, sm_scale=c.sm_scale,
        return_lse=p.return_lse, use_tensor_cores=False, out=out, lse=lse, **feats)
    out, lse = c.outputs(returned, out, lse)
    res = {"o": out.unsqueeze(0)}
    if p.return_lse:
        res["lse"] = lse.unsqueeze(0)
    return res


# ------------------------------------------------------------------ batch routes

def paged_inputs(c: Call):
    """Plan-side index tensors and the run-side cache of a paged route (its pages in the
    problem's stored kv dtype: an fp8 cache holds the fp8 bytes, NaN where no request is)."""
    p = c.problem
    stored = replace(p, dtype=p.kv_dtype) if p.kv_dtype != p.dtype else p
    paged = build_paged(stored, int(c.params.get("page_size", 16)), c.layout,
                        c.params.get("page_order", "shuffled"),
                        int(c.params.get("page_id_offset", 0)), c.case.seed)
    check_index_field(c, c.case.op)
    indices = index_values(c, "kv_indices", paged.indices, paged.indptr)
    last = index_values(c, "last_page_len", paged.last_page_len)
    idx = {
        "kv_indptr": c.views.index("kv_indptr", paged.indptr, "cpu"),
        "kv_indices": c.views.index("kv_indices", indices, c.device),
        "last_page_len": c.views.index("last_page_len", last, "cpu"),
    }
    return paged, idx


def cache_input(c: Call, paged):
    """The paged cache in the case's form: (k_cache, v_cache) or one kv_cache tensor."""
    form = c.params.get("cache_form", "tuple")
    cache = paged.cache(form)
    if form == "single":
        return c.views.input("kv_cache", cache)
    return (c.views.input("k_cache", cache[0]), c.views.input("v_cache", cache[1]))


def graph_buffers(c: Call, n_indices: int, names: tuple) -> dict:
    """Caller-owned capacity buffers of a CUDA-graph-mode wrapper, sized to this batch.

    names: the wrapper's keyword names for (qo_indptr, kv_indptr, kv_indices, last_page_len)
    buffers, None where it takes none.
    """
    if not c.params.get("use_cuda_graph"):
        return {}
    b = c.problem.batch_size
    sizes = (b + 1, b + 1, max(1, n_indices), b)
    return {name: torch.empty(n, dtype=torch.int32, device=c.device)
            for name, n in zip(names, sizes) if name}


PAGED_PREFILL_BUFS = ("qo_indptr_buf", "paged_kv_indptr_buf", "paged_kv_indices_buf",
                      "paged_kv_last_page_len_buf")
RAGGED_BUFS = ("qo_indptr_buf", "kv_indptr_buf", None, None)
DECODE_BUFS = (None, "paged_kv_indptr_buffer", "paged_kv_indices_buffer",
               "paged_kv_last_page_len_buffer")


@dataclass
class Prepared:
    """A batch route's calls, built but not made: scenarios re-plan before running."""
    wrapper: Any
    plan_kw: dict
    run_args: tuple
    run_kw: dict
    out: torch.Tensor
    lse: torch.Tensor | None
    rows: int

    def plan(self, **override) -> None:
        self.wrapper.plan(**{**self.plan_kw, **override})

    def run(self):
        return self.wrapper.run(*self.run_args, **self.run_kw)

    def result(self, c: Call, returned) -> dict:
        return c.result(*c.outputs(returned, self.out, self.lse), self.rows)


def plan_and_run(c: Call, prep: Prepared) -> dict:
    c.ready("plan")
    prep.plan()
    c.buffers.stage("run")
    return prep.result(c, prep.run())


def _dims(c: Call) -> dict:
    """plan() keywords every batch wrapper takes alike (the soft cap only when the case has
    one: a call without features is the call it always was)."""
    p = c.problem
    return dict(num_qo_heads=p.num_qo_heads, num_kv_heads=p.num_kv_heads,
                window_left=p.window_left, sm_scale=c.sm_scale, q_data_type=p.dtype,
                kv_data_type=c.kv_data_type(), **c.plan_extra(), **c.soft_cap_kw())


def _prepared(c: Call, wrapper, plan_kw: dict, run_args: tuple, out_rows: int,
              rows: int) -> Prepared:
    out, lse = c.out(out_rows), c.lse(out_rows)
    run_kw = dict(out=out, lse=lse, return_lse=c.problem.return_lse, **c.run_features_kw())
    return Prepared(wrapper, plan_kw, run_args, run_kw, out, lse, rows)


def prepare_paged_prefill(c: Call) -> Prepared:
    p = c.problem
    paged, idx = paged_inputs(c)
    qo_indptr = c.views.index("qo_indptr", index_values(c, "qo_indptr", p.qo_indptr.tolist()),
                              "cpu")
    wrapper = c.construct(
        c.lib.BatchPrefillWithPagedKVCacheWrapper, c.workspace(), kv_layout=c.layout,
        use_cuda_graph=bool(c.params.get("use_cuda_graph")),
        **c.prefill_backend(), **graph_buffers(c, len(paged.indices), PAGED_PREFILL_BUFS))
    q, cache = perturb(c, p.q_packed(), cache_input(c, paged))
    q = c.views.input("q", q)
    out_rows, rows = planned_rows(c)
    out, lse = c.out(out_rows), c.lse(out_rows)
    partial = c.partial_state(out_rows)
    plan_kw = dict(qo_indptr=qo_indptr, paged_kv_indptr=idx["kv_indptr"],
                   paged_kv_indices=idx["kv_indices"], paged_kv_last_page_len=idx["last_page_len"],
                   head_dim_qk=p.head_dim, page_size=paged.page_size, head_dim_vo=p.head_dim_vo,
                   causal=p.causal, **_dims(c))
    mask = c.custom_mask_arg(flat=True)
    if mask is not None:
        plan_kw["custom_mask"] = mask
    run_kw = dict(out=out, lse=lse, return_lse=p.return_lse, **c.run_features_kw())
    if partial is not None:
        run_kw["partial_state"] = partial
    return Prepared(wrapper, plan_kw, (q, cache), run_kw, out, lse, rows)


def prepare_ragged_prefill(c: Call) -> Prepared:
    p = c.problem
    if c.layout != "NHD":
        raise Skip("ragged k/v are token-major (NHD) only")
    check_index_field(c, "ragged_prefill")
    qo_indptr = c.views.index("qo_indptr", index_values(c, "qo_indptr", p.qo_indptr.tolist()),
                              "cpu")
    kv_indptr = c.views.index("kv_indptr", p.kv_indptr.tolist(), "cpu")
    wrapper = c.construct(
        c.lib.BatchPrefillWithRaggedKVCacheWrapper, c.workspace(), kv_layout="NHD",
        use_cuda_graph=bool(c.params.get("use_cuda_graph")),
        **c.prefill_backend(), **graph_buffers(c, 0, RAGGED_BUFS))
    q, k, v = perturb_ragged(c, p.q_packed(), p.k_packed(), p.v_packed())
    q, k, v = c.views.input("q", q), c.views.input("k", k), c.views.input("v", v)
    plan_kw = dict(qo_indptr=qo_indptr, kv_indptr=kv_indptr, head_dim_qk=p.head_dim,
                   head_dim_vo=p.head_dim_vo, causal=p.causal, **_dims(c))
    return _prepared(c, wrapper, plan_kw, (q, k, v), *planned_rows(c))


def prepare_batch_decode(c: Call) -> Prepared:
    p = c.problem
    n = int(c.params.get("q_len_per_req", 1))
    if n > 1:
        # Multi-token decode: causal within the request is what q_len_per_req means (the
        # problem's qo_lens are all n and causal is set: problem.normalize checks both).
        pass
    elif any(lq != 1 for lq in p.qo_lens):
        raise Skip("batch decode takes one query token per request")
    elif p.causal:
        raise Skip("batch decode has no causal flag (one query token sees its whole KV)")
    if p.head_dim_vo != p.head_dim:
        raise Skip("batch decode plans one head_dim for k and v")
    paged, idx = paged_inputs(c)
    wrapper = c.decode_wrapper(**graph_buffers(c, len(paged.indices), DECODE_BUFS))
    q, cache = perturb(c, p.q_packed(), cache_input(c, paged))
    q = c.views.input("q", q)
    plan_kw = dict(indptr=idx["kv_indptr"], indices=idx["kv_indices"],
                   last_page_len=idx["last_page_len"], head_dim=p.head_dim,
                   page_size=paged.page_size, **_dims(c))
    if n > 1:
        plan_kw["q_len_per_req"] = n
    return _prepared(c, wrapper, plan_kw, (q, cache), *planned_rows(c))


PREPARE = {
    "paged_prefill": prepare_paged_prefill,
    "ragged_prefill": prepare_ragged_prefill,
    "batch_decode": prepare_batch_decode,
}


def run_batch(c: Call) -> dict:
    """A batch route as a plain case makes it: plan, then run."""
    return plan_and_run(c, PREPARE[c.case.op](c))


OPS = {
    "single_prefill": single_prefill,
    "single_decode": single_decode,
    **{op: run_batch for op in PREPARE},
    "merge_state": merge_state,
    "mixed_batch": mixed_batch,
}
