"""The families' multi-call scripts, where FlashInfer has an analogue.

Mirrors harness/targets/bundled_scenarios.py and bundled_replan.py (their
docstrings define each scenario); what differs here:

  plan_rejected_first  same script: a second plan() with num_kv_heads=3 (no GQA
                       group); whatever FlashInfer raises is caught, then the
                       first plan's tensors run and must match
  plan_failed_midway   skipped: it forces a split schedule through the bundled
                       planner's max_kv_chunk, which FlashInfer's plan() has not
  graph_replan         CUDA-graph-mode paged prefill whose caller-owned index
                       buffers are sized by params["capacity"], re-planned for
                       the problem, then run. The prefix state (prefix_tokens)
                       has no analogue (no run(partial_state=) in FlashInfer):
                       cases about that merge are skipped, must-refuse re-plans
                       run with the whole KV paged. Fixed-buffer
                       semantics only: the run is not captured in a CUDA graph
  restaged             any batch-decode route (not only aiter): the caller plans
                       from its own CPU index tensors, then rewrites them before
                       run(); plan() must have kept its own copy
"""
from __future__ import annotations

import torch

from harness.targets.base import Skip
from harness.targets.bundled_layout import build_paged


def _int32(values, device) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int32, device=device)


def _prepared(c):
    from harness.targets.flashinfer import PREPARE
    if c.case.op not in PREPARE:
        raise Skip(f"scenario {c.params['scenario']!r} needs a plan()/run() route, "
                   f"not {c.case.op}")
    return PREPARE[c.case.op](c)


def plan_rejected_first(c) -> dict:
    prep = _prepared(c)
    c.ready("plan")
    prep.plan()
    c.buffers.stage("plan")
    try:
        prep.plan(num_kv_heads=3)
    except Exception:  # noqa: BLE001 - the scenario is about what the rejection leaves
        pass
    c.buffers.stage("run")
    prep.run()
    return c.result(prep.out, prep.lse, prep.rows)


def plan_failed_midway(c) -> dict:
    raise Skip("FlashInfer's plan() has no max_kv_chunk to force a split schedule past "
               "the workspace")


# ------------------------------------------------------------------ graph_replan

def _capacity_plan(cap_qo, cap_kv, page_size, pool):
    """Index lists of the capacity batch: pages cycling through the pool, never run against."""
    pages = [max(1, -(-n // page_size)) for n in cap_kv]
    indptr, qo_indptr = [0], [0]
    for n in pages:
        indptr.append(indptr[-1] + n)
    for n in cap_qo:
        qo_indptr.append(qo_indptr[-1] + n)
    indices = [i % pool for i in range(indptr[-1])]
    last = [n - (m - 1) * page_size for n, m in zip(cap_kv, pages)]
    return qo_indptr, indptr, indices, last


def _banded(c, shape, dtype, name, capacity_rows):
    """A poisoned output whose canary band after it covers the capacity's rows."""
    per_row = 1
    for n in shape[1:]:
        per_row *= int(n)
    return c.buffers.output(shape, dtype, name, canary_elems=max(512, capacity_rows * per_row))


def graph_replan(c) -> dict:
    p = c.problem
    if c.case.op != "paged_prefill":
        raise Skip("graph_replan scripts the paged prefill wrapper")
    # The prefix state rides in run(partial_state=), which FlashInfer has not. A
    # must-refuse re-plan is decided before any run, so those cases keep the
    # whole KV in the paged cache; the ones about the merge itself are skipped.
    if int(c.params.get("prefix_tokens", 0)) > 0 and (c.case.expect != "refuse"
                                                     or not p.return_lse):
        raise Skip("FlashInfer's paged run() takes no partial_state to merge a prefix into")
    from harness.targets.flashinfer import _backend
    cap = c.params["capacity"]
    cap_qo, cap_kv = list(cap["qo_lens"]), list(cap["kv_lens"])
    page_size = int(c.params.get("page_size", 16))
    paged = build_paged(p, page_size, "NHD", "shuffled", 0, c.case.seed)
    cap_qo_indptr, cap_indptr, cap_indices, cap_last = _capacity_plan(
        cap_qo, cap_kv, page_size, paged.k_pages.shape[0])
    cap_batch, cap_rows = len(cap_qo), cap_qo_indptr[-1]
    dev = c.device
    bufs = dict(qo_indptr_buf=torch.zeros(cap_batch + 1, dtype=torch.int32, device=dev),
                paged_kv_indptr_buf=torch.zeros(cap_batch + 1, dtype=torch.int32, device=dev),
                paged_kv_indices_buf=torch.zeros(len(cap_indices), dtype=torch.int32, device=dev),
                paged_kv_last_page_len_buf=torch.zeros(cap_batch, dtype=torch.int32, device=dev))
    wrapper = c.fi.BatchPrefillWithPagedKVCacheWrapper(
        c.workspace(), kv_layout="NHD", use_cuda_graph=True, backend=_backend(c), **bufs)
    dims = dict(head_dim_vo=p.head_dim_vo, causal=p.causal, window_left=p.window_left,
                sm_scale=c.sm_scale, q_data_type=p.dtype, kv_data_type=p.dtype)
    rows, hq, dv = sum(p.qo_lens), p.num_qo_heads, p.head_dim_vo
    q = c.views.input("q", p.q_packed())
    cache = (c.views.input("k_cache", paged.k_pages), c.views.input("v_cache", paged.v_pages))
    out = _banded(c, (rows, hq, dv), p.dtype, "out", cap_rows)
    lse = _banded(c, (rows, hq), torch.float32, "lse", cap_rows) if p.return_lse else None
    c.ready("plan")
    wrapper.plan(_int32(cap_qo_indptr, "cpu"), _int32(cap_indptr, "cpu"), _int32(cap_indices, dev),
                 _int32(cap_last, "cpu"), p.num_qo_heads, p.num_kv_heads, p.head_dim, page_size,
                 **dims)

    c.buffers.stage("replan")
    wrapper.plan(p.qo_indptr.clone(), _int32(paged.indptr, "cpu"), _int32(paged.indices, dev),
                 _int32(paged.last_page_len, "cpu"), p.num_qo_heads, p.num_kv_heads, p.head_dim,
                 page_size, **dims)
    c.buffers.stage("run")
    wrapper.run(q, cache, out=out, lse=lse, return_lse=p.return_lse)
    return c.result(out, lse, rows)


# ------------------------------------------------------------------ restaged

def _next_batch(paged) -> dict:
    """The same pages regrouped: page counts, indices and last_page_len reversed."""
    counts = [b - a for a, b in zip(paged.indptr, paged.indptr[1:])]
    indptr = [0]
    for n in reversed(counts):
        indptr.append(indptr[-1] + n)
    return {"indptr": indptr, "indices": list(reversed(paged.indices)),
            "last_page_len": list(reversed(paged.last_page_len))}


def restaged(c) -> dict:
    p = c.problem
    if c.case.op != "batch_decode":
        raise Skip("restaged index tensors script a batch-decode wrapper")
    if any(n != 1 for n in p.qo_lens):
        raise Skip("batch decode takes one query token per request")
    page_size = int(c.params.get("page_size", 16))
    paged = build_paged(p, page_size, "NHD", c.params.get("page_order", "shuffled"), 0, c.case.seed)
    this = {"indptr": paged.indptr, "indices": paged.indices, "last_page_len": paged.last_page_len}
    nxt = _next_batch(paged)
    restage = tuple(c.params["restage"])
    unknown = set(restage) - set(this)
    if unknown:
        raise Skip(f"restage names no index tensor {sorted(unknown)}")
    dev = c.device
    where = {"indptr": "cpu", "indices": dev, "last_page_len": "cpu"}
    sequence = c.params.get("sequence", "plan_restage_run")
    first = nxt if sequence in ("replan_restage_run", "run_replan_run") else this
    caller = {name: _int32(first[name], where[name]) for name in this}

    def stage_into(batch, names):
        for name in names:
            caller[name].copy_(_int32(batch[name], where[name]))

    wrapper = c.fi.BatchDecodeWithPagedKVCacheWrapper(
        c.workspace(), kv_layout="NHD", use_tensor_cores=c.case.backend == "fi_tc", backend="fa2")
    q = c.views.input("q", p.q_packed())
    cache = (c.views.input("k_cache", paged.k_pages), c.views.input("v_cache", paged.v_pages))
    rows = p.batch_size
    out, lse = c.out(rows), c.lse(rows)

    def plan():
        wrapper.plan(caller["indptr"], caller["indices"], caller["last_page_len"], p.num_qo_heads,
                     p.num_kv_heads, p.head_dim, page_size, window_left=p.window_left,
                     q_data_type=p.dtype, kv_data_type=p.dtype, sm_scale=c.sm_scale)

    c.ready("plan")
    if sequence == "plan_restage_run":
        plan()
        c.buffers.stage("restage")
        stage_into(nxt, restage)
    elif sequence == "replan_restage_run":
        plan()
        c.buffers.stage("restage")
        stage_into(this, this)
        c.buffers.stage("replan")
        plan()
        c.buffers.stage("restage")
        stage_into(nxt, restage)
    elif sequence == "run_replan_run":
        plan()
        c.buffers.stage("run")
        scratch_o = c.buffers.output((rows, p.num_qo_heads, p.head_dim_vo), p.dtype, "first_out")
        scratch_s = c.buffers.output((rows, p.num_qo_heads), torch.float32, "first_lse")
        wrapper.run(q, cache, out=scratch_o, lse=scratch_s, return_lse=True)
        c.buffers.stage("restage")
        stage_into(this, this)
        c.buffers.stage("replan")
        plan()
    else:
        raise Skip(f"sequence {sequence!r} is not one this script knows")
    for name, t in caller.items():
        c.buffers.watch(t, name)
    c.buffers.stage("run")
    wrapper.run(q, cache, out=out, lse=lse, return_lse=p.return_lse)
    return c.result(out, lse, rows)


SCENARIOS = {
    "plan_rejected_first": plan_rejected_first,
    "plan_failed_midway": plan_failed_midway,
    "graph_replan": graph_replan,
    "restaged": restaged,
}


def run_scenario(c) -> dict:
    name = c.params["scenario"]
    if name not in SCENARIOS:
        raise Skip(f"FlashInfer has no analogue of scenario {name!r}; known: {sorted(SCENARIOS)}")
    return SCENARIOS[name](c)
