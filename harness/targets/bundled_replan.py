"""Multi-call scripts of the graph_replan and restaged_indptr families (seed 002).

Each scenario is fn(call) -> outputs, with `call` the bundled adapter's Call
(harness/targets/bundled.py): the problem is the batch whose answer is
compared; the scenario performs the plans, restages and runs around it.

graph_replan (fa2.paged_prefill): a CUDA-graph-mode wrapper whose caller-owned
index buffers are sized for a first plan (params["capacity"]: its qo_lens and
kv_lens), re-planned for the problem. With params["prefix_tokens"] = P, each
request's first P kv tokens are not in the paged cache: their attention state
is handed to run(partial_state=(v, s)) and merged in place, so the merge must
be right for the answer to match. P must not exceed kv_len - qo_len, so every
query row sees the whole prefix under a causal mask.
  out and lse sit in canary bands as long as the capacity's rows, so a merge
that runs over the capacity writes canaries (`corrupt`) instead of memory
the process does not own. The partial state is the live rows of a
capacity-sized buffer, as a graph caller holds it; its other rows are NaN,
so what a merge past the live rows writes is never a canary's own bits.

restaged_indptr (aiter.batch_decode): the caller plans from its own index
tensors (indptr and last_page_len on the CPU), then rewrites them in place
with its next batch before the first return_lse=True run, which builds the
lazy fa2 shadow plan. The next batch holds the same pages regrouped: page
counts reversed (seed 002: 8/16/32/64 pages restaged as 64/32/16/8),
indices reversed, last_page_len reversed. params["restage"] names the
tensors rewritten; params["sequence"] the order of calls:
  "plan_restage_run"          plan(problem), restage, run(lse)
  "replan_restage_run"        plan(next) from the caller's tensors, restage them to
                              the problem, plan(problem), restage back to next, run(lse)
  "run_replan_run"            plan(next), run(lse), restage to the problem,
                              plan(problem), run(lse)
The answer compared is always the problem's: what plan() saw last.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from harness.reference import attention_reference
from harness.targets.base import Skip
from harness.targets.bundled_layout import build_paged


def _kernels():
    import kernels
    return kernels


def _int32(values, device) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int32, device=device)


# ------------------------------------------------------------------ graph_replan

def _split_prefix(problem, prefix: int):
    """(prefix problem, paged problem): kv[:prefix] and kv[prefix:] of every request."""
    for lq, lk in zip(problem.qo_lens, problem.kv_lens):
        if prefix > lk - lq:
            raise Skip(f"prefix_tokens {prefix} exceeds kv_len - qo_len ({lk} - {lq}): "
                       f"a causal row would not see the whole prefix")
    head = replace(problem, k=[k[:prefix] for k in problem.k], v=[v[:prefix] for v in problem.v],
                   kv_lens=[prefix] * problem.batch_size, causal=False, window_left=-1)
    tail = replace(problem, k=[k[prefix:] for k in problem.k], v=[v[prefix:] for v in problem.v],
                   kv_lens=[n - prefix for n in problem.kv_lens])
    return head, tail


def _banded(c, shape, dtype, name, capacity_rows):
    """A poisoned output whose canary band after it is at least capacity_rows long."""
    per_row = 1
    for n in shape[1:]:
        per_row *= int(n)
    return c.buffers.output(shape, dtype, name, canary_elems=max(512, capacity_rows * per_row))


def graph_replan(c) -> dict:
    p, k_ = c.problem, _kernels()
    if p.window_left >= 0:
        raise Skip("graph_replan splits KV into a prefix state and a paged tail; a window would not split")
    cap = c.params["capacity"]
    cap_qo, cap_kv = list(cap["qo_lens"]), list(cap["kv_lens"])
    page_size = int(c.params.get("page_size", 16))
    prefix = int(c.params.get("prefix_tokens", 0))
    head, tail = _split_prefix(p, prefix)
    paged = build_paged(tail, page_size, "NHD", "shuffled", 0, c.case.seed)

    # The capacity plan's pages: ids in the pool, never run against.
    cap_pages = [max(1, -(-n // page_size)) for n in cap_kv]
    cap_indptr = [0]
    for n in cap_pages:
        cap_indptr.append(cap_indptr[-1] + n)
    pool = paged.k_pages.shape[0]
    cap_indices = [i % pool for i in range(cap_indptr[-1])]
    cap_last = [n - (m - 1) * page_size for n, m in zip(cap_kv, cap_pages)]
    cap_rows_qo = [0]
    for n in cap_qo:
        cap_rows_qo.append(cap_rows_qo[-1] + n)
    cap_batch, cap_rows = len(cap_qo), cap_rows_qo[-1]

    dev = c.device
    graph_bufs = dict(qo_indptr_buf=torch.zeros(cap_batch + 1, dtype=torch.int32, device=dev),
                      paged_kv_indptr_buf=torch.zeros(cap_batch + 1, dtype=torch.int32, device=dev),
                      paged_kv_indices_buf=torch.zeros(len(cap_indices), dtype=torch.int32, device=dev),
                      paged_kv_last_page_len_buf=torch.zeros(cap_batch, dtype=torch.int32, device=dev))
    wrapper = k_.BatchPrefillWithPagedKVCacheWrapper(c.workspace(), kv_layout="NHD", use_cuda_graph=True,
                                                     **graph_bufs)
    dims = dict(head_dim_vo=p.head_dim_vo, causal=p.causal, window_left=p.window_left,
                sm_scale=c.sm_scale, q_data_type=p.dtype, kv_data_type=p.dtype,
                max_kv_chunk=c.params.get("max_kv_chunk"))
    rows, hq, dv = sum(p.qo_lens), p.num_qo_heads, p.head_dim_vo
    q = c.views.input("q", p.q_packed())
    k_cache = c.views.input("k_cache", paged.k_pages)
    v_cache = c.views.input("v_cache", paged.v_pages)
    out = _banded(c, (rows, hq, dv), p.dtype, "out", cap_rows)
    lse = _banded(c, (rows, hq), torch.float32, "lse", cap_rows) if p.return_lse else None
    partial = None
    if prefix > 0:
        state = attention_reference(head)
        # Held as a graph caller holds it: the live rows of a capacity-sized (poisoned) buffer.
        pv = c.buffers.output((max(cap_rows, rows), hq, dv), p.dtype, "partial_state_v")[:rows]
        ps = c.buffers.output((max(cap_rows, rows), hq), torch.float32, "partial_state_s")[:rows]
        pv.copy_(state["o"])
        ps.copy_(state["lse"])
        c.buffers.watch(pv, "partial_state_v")
        c.buffers.watch(ps, "partial_state_s")
        partial = (pv, ps)
    c.ready("plan")
    wrapper.plan(_int32(cap_rows_qo, "cpu"), _int32(cap_indptr, "cpu"), _int32(cap_indices, dev),
                 _int32(cap_last, "cpu"), p.num_qo_heads, p.num_kv_heads, p.head_dim, page_size, **dims)
    c.buffers.stage("replan")
    wrapper.plan(p.qo_indptr.clone(), _int32(paged.indptr, "cpu"), _int32(paged.indices, dev),
                 _int32(paged.last_page_len, "cpu"), p.num_qo_heads, p.num_kv_heads, p.head_dim,
                 page_size, **dims)
    c.buffers.stage("run")
    kw = {"partial_state": partial} if partial is not None else {}
    wrapper.run(q, (k_cache, v_cache), out=out, lse=lse, return_lse=p.return_lse, **kw)
    return c.result(out, lse, rows)


# ------------------------------------------------------------------ restaged_indptr

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
    if c.case.backend != "aiter":
        raise Skip("restaged index tensors matter to the aiter route's lazy shadow plan")
    if any(n != 1 for n in p.qo_lens):
        raise Skip("batch decode takes one query token per request")
    if not p.return_lse:
        raise Skip("the restaged tensors matter to the return_lse run's shadow plan")
    page_size = int(c.params.get("page_size", 16))
    paged = build_paged(p, page_size, "NHD", c.params.get("page_order", "shuffled"), 0, c.case.seed)
    this = {"indptr": paged.indptr, "indices": paged.indices, "last_page_len": paged.last_page_len}
    nxt = _next_batch(paged)
    restage = tuple(c.params["restage"])
    unknown = set(restage) - set(this)
    if unknown:
        raise Skip(f"restage names no index tensor {sorted(unknown)}")
    dev = c.device
    # The caller's own tensors: indptr and last_page_len on the CPU, indices where the cache is.
    where = {"indptr": "cpu", "indices": dev, "last_page_len": "cpu"}
    sequence = c.params.get("sequence", "plan_restage_run")
    first = nxt if sequence in ("replan_restage_run", "run_replan_run") else this
    caller = {name: _int32(first[name], where[name]) for name in this}

    def stage_into(batch, names):
        for name in names:
            caller[name].copy_(_int32(batch[name], where[name]))

    wrapper = _kernels().BatchDecodeWithPagedKVCacheWrapper(c.workspace(), kv_layout="NHD", backend="aiter")
    q = c.views.input("q", p.q_packed())
    cache = (c.views.input("k_cache", paged.k_pages), c.views.input("v_cache", paged.v_pages))
    rows = p.batch_size
    out, lse = c.out(rows), c.lse(rows)

    def plan():
        wrapper.plan(caller["indptr"], caller["indices"], caller["last_page_len"], p.num_qo_heads,
                     p.num_kv_heads, p.head_dim, page_size, window_left=p.window_left,
                     q_data_type=p.dtype, kv_data_type=p.dtype, sm_scale=c.sm_scale,
                     max_kv_chunk=c.params.get("max_kv_chunk"))

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
    # From here on the caller leaves its tensors alone: the library must too.
    for name, t in caller.items():
        c.buffers.watch(t, name)
    c.buffers.stage("run")
    wrapper.run(q, cache, out=out, lse=lse, return_lse=True)
    return c.result(out, lse, rows)


SCENARIOS = {
    "graph_replan": graph_replan,
    "restaged": restaged,
}
