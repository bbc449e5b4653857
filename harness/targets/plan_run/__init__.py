"""A neutral core for FlashInfer-shaped APIs: plan()/run() wrappers, single-request
functions, merge_state, a decode-first mixed batch.

Written once against Call (call.py); a target subclasses Call to say what
its library differs in and hands each case to run(). Modules:

  call.py              per-case plumbing and the library hooks
  routes.py            one function per op; batch routes prepared, then planned and run
  scenarios.py         multi-call scripts (a plan that fails, graph re-plans, restaged
                       caller tensors) built on the same prepared calls
  replan.py            the calls graph_replan and restaged scripts share
  mismatch.py          run() tensors that disagree with plan() in one field
  merge.py, mixed.py   the merge_state and mixed_batch routes
"""
from __future__ import annotations


def run(c, own_routes: dict | None = None) -> dict:
    """The case's calls: its scenario's script, or its op's route (a target's own
    function for an op, from own_routes, where its library's call differs)."""
    from harness.targets.plan_run.routes import OPS
    from harness.targets.plan_run.scenarios import run_scenario
    c.check_features()
    if c.params.get("scenario"):
        return run_scenario(c)
    return {**OPS, **(own_routes or {})}[c.case.op](c)
