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
"""
from __future__ import annotations

from typing import Iterator

from cases._dtypes import own_or_first
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
                tag = f"{dtype}-d128-h16x2-p16-kv{max(kv)}" + ("" if where == "cpu" else "-devidx")
                yield Case(route=route, family=FAMILY, variant=variant, params=params,
                           expect="match", tag=tag, requires=REQUIRES)
