"""Multi-call scripts of the graph_replan and restaged_indptr families (seed 002).

Each scenario is fn(call) -> outputs, with `call` a target's Call
(harness/targets/plan_run/call.py): the problem is the batch whose answer is
compared; the scenario performs the plans, restages and runs around it.

graph_replan (any paged prefill route): a CUDA-graph-mode wrapper whose caller-owned
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
  A library without run(partial_state=) (no "partial_state" feature) keeps
the whole KV paged; its cases about the merge itself need that feature and
are skipped by capability before they get here.

restaged_indptr (any batch-decode route): the caller plans from its own index
tensors (indptr and last_page_len on the CPU), then rewrites them in place
with its next batch before the first return_lse=True run (on the aiter route,
the run that builds the lazy fa2 shadow plan; on any route, a plan() that
kept the caller's tensor instead of its own copy reads the next batch). The next batch holds the same pages regrouped: page
counts reversed (seed 002: 8/16/32/64 pages restaged as 64/32/16/8),
indices reversed, last_page_len reversed. params["restage"] names the
tensors rewritten; params["sequence"] the order of calls:
  "plan_restage_run"          plan(problem), restage, run(lse)
  "replan_restage_run"        plan(next) from the caller's tensors, restage them to
                              the problem, plan(problem), restage back to next, run(lse)
  "run_replan_run"            plan(next), run(lse), restage to the problem,
                              plan(problem), run(lse)
The answer compared is always the problem's: what plan() saw last.
The calls both scripts make live in harness/targets/plan_run/replan.py.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from harness.model.reference import attention_reference
from harness.targets.base import Skip
from harness.targets.layout import build_paged
from harness.targets.plan_run.replan import capacity, graph_io, replan_and_run
from harness.targets.plan_run.replan import restaged as run_restaged

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


def _prefix_state(c, head, cap_rows: int):
    """The prefix's attention state, held as a graph caller holds it: a capacity-sized
    (poisoned) buffer whose live rows hold the state. ((v, s) whole, (v, s) live rows)."""
    p = c.problem
    rows, hq, dv = sum(p.qo_lens), p.num_qo_heads, p.head_dim_vo
    state = attention_reference(head)
    whole_v = c.buffers.output((max(cap_rows, rows), hq, dv), p.dtype, "partial_state_v")
    whole_s = c.buffers.output((max(cap_rows, rows), hq), torch.float32, "partial_state_s")
    pv, ps = whole_v[:rows], whole_s[:rows]
    pv.copy_(state["o"])
    ps.copy_(state["lse"])
    # The whole buffers are the caller's: a merge may read past the live rows (NaN there),
    # never write.
    c.buffers.watch(whole_v, "partial_state_v")
    c.buffers.watch(whole_s, "partial_state_s")
    return (whole_v, whole_s), (pv, ps)


def graph_replan(c) -> dict:
    p = c.problem
    if p.window_left >= 0:
        raise Skip("graph_replan splits KV into a prefix state and a paged tail; a window would not split")
    page_size = int(c.params.get("page_size", 16))
    prefix = int(c.params.get("prefix_tokens", 0)) if c.has_partial_state else 0
    head, tail = _split_prefix(p, prefix)
    paged = build_paged(tail, page_size, "NHD", "shuffled", 0, c.case.seed)
    cap = capacity(c, paged.k_pages.shape[0])
    wrapper = c.construct(
        c.lib.BatchPrefillWithPagedKVCacheWrapper, c.workspace(), kv_layout="NHD",
        use_cuda_graph=True, **c.prefill_backend(), **cap.graph_buffers(c.device))
    dims = dict(head_dim_vo=p.head_dim_vo, causal=p.causal, window_left=p.window_left,
                sm_scale=c.sm_scale, q_data_type=p.dtype, kv_data_type=p.dtype,
                **c.plan_extra())
    q, cache, out, lse = graph_io(c, paged, cap)
    state = _prefix_state(c, head, cap.rows) if prefix > 0 else None
    return replan_and_run(c, wrapper, cap, paged, dims, q, cache, out, lse, state)


# ------------------------------------------------------------------ restaged_indptr

def restaged(c) -> dict:
    p = c.problem
    if c.case.op != "batch_decode":
        raise Skip("restaged index tensors script a batch-decode wrapper")
    if any(n != 1 for n in p.qo_lens):
        raise Skip("batch decode takes one query token per request")
    if not p.return_lse:
        raise Skip("the restaged tensors matter to the return_lse run's shadow plan")
    paged = build_paged(p, int(c.params.get("page_size", 16)), "NHD",
                        c.params.get("page_order", "shuffled"), 0, c.case.seed)
    return run_restaged(c, paged, c.decode_wrapper, **c.plan_extra())


SCENARIOS = {
    "graph_replan": graph_replan,
    "restaged": restaged,
}
