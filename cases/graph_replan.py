"""graph_replan: a CUDA-graph-mode paged prefill re-planned for a smaller batch (seed 002).

A graph-mode wrapper's first plan() fixes its capacity (batch size, q rows,
page indices) and its caller-owned index buffers; later plans refill them in
place, and the graph path always splits KV. Seed 002: planned for 16 rows,
re-planned for 8, run with partial_state: the in-place merge ran over the
16-row capacity, so rows 8-15 of the buffer behind an 8-row out were
overwritten. The merge must stop at the live rows: the canaries behind out,
lse and the partial state stay intact and the answer matches.

partial_state here is the attention state of each request's first
prefix_tokens kv tokens (a shared prefix, computed by the reference); the
paged cache holds the rest, so only a correct merge gives the right answer.

Contracts:
  - partial_state on a split plan without an lse: the answer is defined (a
    library may compute the lse it needs itself), so match_or_refuse; the
    bundled merge reads the lse, so it refuses, naming it;
  - a re-plan for a smaller batch: the answer is defined, but a captured
    graph is fixed to its batch: match_or_refuse;
  - a re-plan that needs a larger batch, more q rows or more page indices
    than the first plan fixed: there is nowhere to put them (a replay past
    the capacity), so `refuse`, naming the field;
  - a re-plan of the same batch whose kv splits into more work items than the
    first plan fixed (the same pages, a finer max_kv_chunk than the pages): the
    planner coarsens the chunk until the items fit the fixed grid (kernels_plan's
    work_limit loop), so `match` (kv_outgrows_work).

Scenario: params["scenario"] = "graph_replan" (harness/targets/plan_run/replan_scenarios.py);
params["capacity"] is the first plan's batch. Where the device has graphs
(CUDA, and HIP through torch's API) run() is warmed up on scratch outputs, captured in
a torch.cuda.CUDAGraph at the capacity plan over capacity-sized q, out, lse and partial
state (out's rows past the problem's are its canary band), the problem is re-planned,
its q loaded and the graph replayed. On the host the graph mode is the same
fixed-buffer semantics without capture. Every row's message says which ran.
"""
from __future__ import annotations

from typing import Iterator

from cases._tags import tag as id_tag
from harness.model.case import Case
from harness.model.routes import op_of

FAMILY = "graph_replan"
OPS = ("paged_prefill",)
# CUDA-graph mode is a plan()/run() wrapper's; the prefix merge needs run(partial_state=).
REQUIRES = ("plan_run", "graphs")

_BASE = {"dtype": "bf16", "head_dim": 64, "num_qo_heads": 4, "num_kv_heads": 2,
         "causal": True, "window_left": -1, "page_size": 16, "max_kv_chunk": 16,
         "scenario": "graph_replan"}

# (variant, problem qo_lens, kv_lens, capacity qo_lens, kv_lens, prefix_tokens, return_lse,
#  expect, refuse words)
ROWS = (
    ("rows16_to_8_partial_state", [4, 4], [45, 70], [8, 8], [45, 70], 8, True, "match", ()),
    ("rows16_to_8_uneven", [3, 5], [30, 61], [10, 6], [40, 61], 12, True, "match", ()),
    ("rows16_to_8_no_partial_state", [4, 4], [45, 70], [8, 8], [45, 70], 0, True, "match", ()),
    ("rows16_to_16_partial_state", [8, 8], [45, 70], [8, 8], [45, 70], 8, True, "match", ()),
    ("partial_state_without_lse", [4, 4], [45, 70], [8, 8], [45, 70], 8, False,
     "match_or_refuse", ("lse",)),
    ("batch_shrinks", [4, 4], [45, 70], [6, 5, 5], [45, 70, 20], 8, True, "match_or_refuse",
     ("batch_size",)),
    ("batch_grows", [3, 3, 2], [45, 70, 20], [8, 8], [45, 70], 8, True, "refuse",
     ("batch_size",)),
    ("rows_outgrow", [12, 8], [45, 70], [4, 4], [45, 70], 8, True, "refuse",
     ("total_num_rows",)),
    ("pages_outgrow", [4, 4], [90, 140], [8, 8], [45, 70], 8, True, "refuse", ("indices",)),
)


# The same batch, rows and pages; max_kv_chunk 8 under 16-token pages: the first plan fixes
# 6 + 9 = 15 work items, the re-plan's kv (48, 80) needs 6 + 10 = 16 at chunk 8, so the
# planner doubles the chunk (3 + 5 items). No prefix state: the paged tail is the whole kv.
# (variant, qo, kv, capacity qo, kv, chunk, prefix_tokens)
REPLAN_CHUNK = (
    ("kv_outgrows_work", [4, 4], [48, 80], [4, 4], [45, 70], 8, 0),
)


def cases(routes) -> Iterator[Case]:
    yield from _rows(routes)
    for route in routes:
        if op_of(route) not in OPS:
            continue
        for variant, qo, kv, cap_qo, cap_kv, chunk, prefix in REPLAN_CHUNK:
            params = {**_BASE, "qo_lens": qo, "kv_lens": kv, "return_lse": True,
                      "max_kv_chunk": chunk, "capacity": {"qo_lens": cap_qo, "kv_lens": cap_kv},
                      "prefix_tokens": prefix}
            tag = id_tag(params, "dims", "page", "chunk", extra=(f"r{sum(cap_qo)}to{sum(qo)}",))
            yield Case(route=route, family=FAMILY, variant=variant, params=params,
                       expect="match", tag=tag,
                       requires=REQUIRES + (("partial_state",) if prefix else ()))


def _rows(routes) -> Iterator[Case]:
    for route in routes:
        if op_of(route) not in OPS:
            continue
        for variant, qo, kv, cap_qo, cap_kv, prefix, lse, expect, words in ROWS:
            params = {**_BASE, "qo_lens": qo, "kv_lens": kv, "return_lse": lse,
                      "capacity": {"qo_lens": cap_qo, "kv_lens": cap_kv},
                      "prefix_tokens": prefix}
            tag = id_tag(params, "dims", "page", extra=(f"r{sum(cap_qo)}to{sum(qo)}",))
            yield Case(route=route, family=FAMILY, variant=variant, params=params,
                       expect=expect, refuse_words=words, tag=tag,
                       requires=REQUIRES + (("partial_state",) if prefix else ()))
