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

from harness.targets import replan
from harness.targets.base import Skip
from harness.targets.bundled_layout import build_paged


def _prepared(c):
    from harness.targets.bundled import PREPARE
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
    paged = build_paged(p, int(c.params.get("page_size", 16)), "NHD", "shuffled", 0, c.case.seed)
    cap = replan.capacity(c, paged.k_pages.shape[0])
    wrapper = c.fi.BatchPrefillWithPagedKVCacheWrapper(
        c.workspace(), kv_layout="NHD", use_cuda_graph=True, backend=_backend(c),
        **cap.graph_buffers(c.device))
    dims = dict(head_dim_vo=p.head_dim_vo, causal=p.causal, window_left=p.window_left,
                sm_scale=c.sm_scale, q_data_type=p.dtype, kv_data_type=p.dtype)
    q, cache, out, lse = replan.graph_io(c, paged, cap)
    return replan.replan_and_run(c, wrapper, cap, paged, dims, q, cache, out, lse)


# ------------------------------------------------------------------ restaged

def restaged(c) -> dict:
    p = c.problem
    if c.case.op != "batch_decode":
        raise Skip("restaged index tensors script a batch-decode wrapper")
    if any(n != 1 for n in p.qo_lens):
        raise Skip("batch decode takes one query token per request")
    paged = build_paged(p, int(c.params.get("page_size", 16)), "NHD",
                        c.params.get("page_order", "shuffled"), 0, c.case.seed)
    return replan.restaged(c, paged, lambda: c.fi.BatchDecodeWithPagedKVCacheWrapper(
        c.workspace(), kv_layout="NHD", use_tensor_cores=c.case.backend == "fi_tc",
        backend="fa2"))


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
