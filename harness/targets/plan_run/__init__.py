"""A neutral core for FlashInfer-shaped APIs: plan()/run() wrappers, single-request
functions, merge_state, a decode-first mixed batch.

Written once against Call (call.py); a target subclasses Call to say what
its library differs in and hands each case to dispatch.run(). This file imports
nothing, so no module of the core reaches itself through the package. Modules:

  dispatch.py          run(): the case's scenario script or its op's route

  call.py              per-case plumbing and the library hooks
  routes.py            one function per op; batch routes prepared, then planned and run
  scenarios.py         multi-call scripts (a plan that fails, graph re-plans, restaged
                       caller tensors) built on the same prepared calls
  replan.py            the calls graph_replan and restaged scripts share
  mismatch.py          run() tensors that disagree with plan() in one field
  merge.py, mixed.py   the merge_state and mixed_batch routes
"""
from __future__ import annotations
