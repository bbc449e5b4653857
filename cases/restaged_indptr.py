"""restaged_indptr: a caller that reuses its CPU index tensors after plan() (seed 002).

The aiter-style decode kernel writes no LSE, so a return_lse=True run goes
through an fa2 shadow plan built lazily at that first run, from index
tensors plan() kept. A CPU tensor's .to("cpu") is the caller's own tensor:
before the fix plan() kept that, and a caller that restaged it for its next
batch got an fa2 plan for the new batch run against the old one (seed 002:
requests of 128/256/512/1024 tokens, page size 16, restaged as 64/32/16/8
pages, same total: 7503 of 8192 output elements wrong). plan() must keep
its own copy: every case expects `match`, the answer of the batch plan()
saw last.

Variants: the indptr (the seed), the page indices, last_page_len, or all
three restaged; two back-to-back plans from the caller's reused tensors
followed by a restage (the second plan's batch must run); a return_lse run
between two plans (the re-plan must drop the first shadow plan).

params["index_device"] = "device" (full profile) holds all three caller tensors on the
GPU instead of indptr and last_page_len on the CPU.

Scenario: params["scenario"] = "restaged" (harness/targets/plan_run/replan_scenarios.py).

The dtype is not the point: bf16 (the seed's) where the target has it, else the first dtype
it declares (cases/_dtypes.py).

A vLLM-shaped target (feature metadata_restage: a metadata call such as vLLM's
get_scheduler_metadata reads the caller's seq_lens and query_start_loc, and the run is
handed the same tensors) gets the same class on its own tensors
(harness/targets/block_table/restage.py): the caller's seq_lens, query_start_loc or block
table, rewritten in place after the metadata call and before the run. The problem is the
batch they describe at the run; before the rewrite they held it regrouped (request order
reversed in that tensor: a plan for kv lengths [300, 50, 100] run with [100, 50, 300]).
These are match_or_refuse: the library must compute the run's batch (plan again, or never
lean on what the metadata call read) or refuse naming the tensor; an answer for neither
batch is wrong.
"""
from __future__ import annotations

from typing import Iterator

from cases._dtypes import own_or_first
from cases._tags import tag as id_tag
from harness.model.case import Case
from harness.model.routes import op_of

FAMILY = "restaged_indptr"
OPS = ("batch_decode",)
REQUIRES = ("plan_run", "restage")

# Seed 002's batch: 8/16/32/64 pages of 16 tokens; 4 x 16 heads x 128 = 8192 outputs.
SEED_KV = [128, 256, 512, 1024]
# Lengths that end mid-page, so reversing last_page_len changes it.
ODD_KV = [100, 250, 509, 1000]

_BASE = {"dtype": "bf16", "head_dim": 128, "num_qo_heads": 16, "num_kv_heads": 2,
         "qo_lens": [1, 1, 1, 1], "causal": False, "window_left": -1, "return_lse": True,
         "page_size": 16, "scenario": "restaged"}

# (variant, kv_lens, restaged tensors, call sequence)
ROWS = (
    ("indptr", SEED_KV, ["indptr"], "plan_restage_run"),
    ("indices", SEED_KV, ["indices"], "plan_restage_run"),
    ("last_page_len", ODD_KV, ["last_page_len"], "plan_restage_run"),
    ("all_three", ODD_KV, ["indptr", "indices", "last_page_len"], "plan_restage_run"),
    ("replan_reused_buffers", SEED_KV, ["indptr", "indices", "last_page_len"],
     "replan_restage_run"),
    ("lse_run_between_plans", SEED_KV, ["indptr", "indices", "last_page_len"],
     "run_replan_run"),
)


# The block-table rows: (op, variant, restaged tensors, the problem). Decode carries the seed's
# lengths; a prefill batch gives query_start_loc something to regroup (causal, and every
# request's kv covers its queries in either order).
_BLOCK_BASE = {"head_dim": 128, "num_qo_heads": 8, "num_kv_heads": 2, "window_left": -1,
               "return_lse": False, "page_size": 16}
_DECODE = {"qo_lens": [1, 1, 1], "kv_lens": [100, 50, 300], "causal": False}
_PREFILL = {"qo_lens": [5, 1, 9], "kv_lens": [40, 60, 20], "causal": True}
BLOCK_ROWS = (
    ("batch_decode", "seq_lens", ["seq_lens"], _DECODE),
    ("batch_decode", "block_table", ["block_table"], _DECODE),
    ("paged_prefill", "seq_lens", ["seq_lens"], _PREFILL),
    ("paged_prefill", "query_start_loc", ["query_start_loc"], _PREFILL),
    ("paged_prefill", "block_table", ["block_table"], _PREFILL),
    ("paged_prefill", "all_three_metadata", ["seq_lens", "query_start_loc", "block_table"],
     _PREFILL),
)
# The metadata field each restaged tensor is (a refusal names it; the vocabulary maps it).
_FIELD = {"seq_lens": "kv_lens", "query_start_loc": "query_start_loc",
          "block_table": "block_table"}


def block_cases(routes, dtype: str) -> Iterator[Case]:
    for route in routes:
        op = op_of(route)
        for row_op, variant, restage, problem in BLOCK_ROWS:
            if op != row_op:
                continue
            params = {**_BLOCK_BASE, **problem, "dtype": dtype, "restage": restage}
            fields = tuple(_FIELD[n] for n in restage)
            tag = id_tag(params, "dims", "page", extra=(f"kv{max(params['kv_lens'])}",))
            yield Case(route=route, family=FAMILY, variant=variant, params=params,
                       expect="match_or_refuse", tag=tag, refuse_words=("|".join(fields),),
                       requires=("metadata_restage",) + tuple(f"metadata.{f}" for f in fields))


def cases(routes, profile: str = "ci", dtypes=None) -> Iterator[Case]:
    # The full profile (the GPU's default) also holds the caller's index tensors on the
    # device: plan() must copy those too. On the host "device" is the CPU (skipped there).
    placements = ("cpu", "device") if profile == "full" else ("cpu",)
    dtype = own_or_first("bf16", dtypes)
    if dtype is None:
        return
    for route in routes:
        if op_of(route) not in OPS:
            continue
        for variant, kv, restage, sequence in ROWS:
            for where in placements:
                params = {**_BASE, "dtype": dtype, "kv_lens": kv, "restage": restage,
                          "sequence": sequence}
                if where != "cpu":
                    params["index_device"] = where
                tag = id_tag(params, "dims", "page",
                             extra=(f"kv{max(kv)}", "" if where == "cpu" else "devidx"))
                yield Case(route=route, family=FAMILY, variant=variant, params=params,
                           expect="match", tag=tag, requires=REQUIRES)
    yield from block_cases(routes, dtype)
