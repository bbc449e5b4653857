"""What a target can express, and what a case needs: the engine matches the two.

A target declares its Capabilities once; a case's needs come from its params
(dtype, head_dim, layout, the call forms it asks for) and from Case.requires
(behaviours such as plan()/run() or CUDA-graph mode). A case the target
cannot express becomes a `skipped` row naming the capability it lacks, so no
family needs to know any target's route names.

Features (Case.requires and Capabilities.features):
  plan_run        a plan() that fixes the batch, then run() calls against it
  graphs          CUDA-graph mode: caller-owned index buffers fixed by the first plan()
  partial_state   paged run(partial_state=(v, s)) merging a prior attention state
  split_control   the caller sets the planner's KV split (max_kv_chunk)
  restage         plan() reads caller-owned CPU index tensors the caller may rewrite
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

ALL_DTYPES = frozenset({"fp16", "bf16", "fp32"})
ALL_LAYOUTS = frozenset({"NHD", "HND"})
FEATURES = frozenset({"plan_run", "graphs", "partial_state", "split_control", "restage"})
# "out": the caller hands the output buffer (out=, lse=); "lse": the LSE can be returned.
CALL_FORMS = frozenset({"out", "lse"})

# strided names that are the caller's output buffers (need the "out" form); merge_state's
# in-place merge writes into its "v" and "s", which elsewhere name inputs.
OUTPUT_TENSORS = frozenset({"out", "lse", "partial_state_v", "partial_state_s"})
MERGE_OUTPUTS = frozenset({"v", "s"})


@dataclass(frozen=True)
class Capabilities:
    ops: frozenset
    dtypes: frozenset = ALL_DTYPES
    head_dims: frozenset | None = None          # None: any head_dim
    layouts: frozenset = ALL_LAYOUTS
    call_forms: frozenset = CALL_FORMS
    features: frozenset = field(default_factory=frozenset)

    def __post_init__(self):
        unknown = set(self.features) - FEATURES
        if unknown:
            raise ValueError(f"Capabilities.features: unknown {sorted(unknown)}; known {sorted(FEATURES)}")

    def lacks(self, op: str, params: Mapping, requires=()) -> str | None:
        """The first capability a case on `op` needs that this target lacks, in words."""
        if op not in self.ops:
            return f"op {op}"
        dtype = params.get("dtype", "bf16")
        if dtype not in self.dtypes:
            return f"dtype {dtype}"
        hd = params.get("head_dim")
        if self.head_dims is not None and hd is not None and hd not in self.head_dims:
            return f"head_dim {hd}"
        layout = params.get("layout", "NHD")
        if layout not in self.layouts:
            return f"layout {layout}"
        if params.get("return_lse") and "lse" not in self.call_forms:
            return "call form lse (returning the LSE)"
        outputs = OUTPUT_TENSORS | (MERGE_OUTPUTS if op == "merge_state" else frozenset())
        if params.get("strided") in outputs and "out" not in self.call_forms:
            return "call form out (a caller-given output buffer)"
        for need in requires:
            if need not in self.features:
                return f"feature {need}"
        return None
