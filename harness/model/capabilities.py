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
  metadata_restage  a metadata call reads caller-owned tensors (seq_lens, query_start_loc)
                  the run is handed again: the caller may rewrite them between the two
  softcap         logits_soft_cap: logits c * tanh(s / c) before masking
  sinks           a sink logit per q head in the softmax denominator
  alibi           ALiBi slopes per q head, bottom-right aligned positions
  fp8_kv          fp8 (e4m3 / e5m2) KV caches with per-tensor k_scale / v_scale
  multi_token_decode  batch decode with several q rows per request, causal within it
  custom_mask     a caller's boolean mask per request (True: attend)

Metadata (Capabilities.metadata): the fields the library's batch description carries, each
mapped to the call that consumes it ("plan", "run", "get_scheduler_metadata", ...). The
adversarial families ask for fields, never for plan(): a case that needs the metadata field
F lists "metadata.F" in Case.requires, and reaches every target that declares F, whatever
its API's shape (METADATA_FIELDS says what each field is).

Vocabulary (Capabilities.vocabulary): our field name -> the names the library's messages use
for it, so a refusal is judged in the library's own words (still as whole words, still with
the values).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

ALL_DTYPES = frozenset({"fp16", "bf16", "fp32"})
ALL_LAYOUTS = frozenset({"NHD", "HND"})
FEATURES = frozenset({"plan_run", "graphs", "partial_state", "split_control", "restage",
                      "softcap", "sinks", "alibi", "fp8_kv", "multi_token_decode",
                      "custom_mask", "metadata_restage"})
# The abstract fields a batch description may carry (harness/targets/*/mismatch.py perform
# them): a case about field F runs tensors or metadata that disagree with the rest there.
METADATA_FIELDS = {
    "num_qo_heads": "query heads the description states, against q's",
    "num_kv_heads": "kv heads the description states, against the cache's",
    "head_dim_qk": "q/k head dimension stated, against q's last dim",
    "head_dim_vo": "v head dimension stated, against v's last dim",
    "page_size": "tokens per page (block size) stated, against the cache's",
    "rank": "the rank of q the call reads, against q's",
    "q_rows": "query rows the description covers, against q's rows",
    "kv_rows": "kv rows the description covers, against ragged k/v's rows",
    "dtype": "the dtype planned, against q's",
    "batch_size": "requests the description states, against the per-request tensors",
    "kv_lens": "a request's kv length, against what its block-table row holds",
    "block_table": "a block-table entry, against the pool of blocks it indexes",
    "query_start_loc": "the query offsets' last entry, against q's rows",
    # Added with the call signature (harness/model/signature.py, relations.py).
    "last_page_len": "a request's last-page length, against 1..page_size",
    "max_seqlen_q": "the stated maximum query length, against the longest request",
    "max_seqlen_k": "the stated maximum kv length, against the longest request",
    "plan_handle": "what the metadata call returned, handed to the run of another batch",
    # A scalar both the metadata call and the run read (signature.TWO_CALL_FIELDS).
    "causal": "the causal flag the metadata call was told, against the run's",
    "window": "the sliding window the metadata call was told, against the run's",
}
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
    # {abstract field: the call that consumes it}; {our field: the library's names for it}
    metadata: Mapping = field(default_factory=dict)
    vocabulary: Mapping = field(default_factory=dict)
    # The library's call signature (harness/model/signature.py): metadata and vocabulary are
    # derived from it and merged with any declared beside it.
    signature: object = None

    def __post_init__(self):
        if self.signature is not None:
            from harness.model.signature import Signature, merge_vocabulary
            if not isinstance(self.signature, Signature):
                raise ValueError(f"Capabilities.signature: a harness.model.signature.Signature, "
                                 f"got {type(self.signature).__name__}")
            object.__setattr__(self, "metadata", {**self.signature.metadata(), **self.metadata})
            object.__setattr__(self, "vocabulary", merge_vocabulary(
                self.signature.vocabulary(), self.vocabulary))
        unknown = set(self.features) - FEATURES
        if unknown:
            raise ValueError(f"Capabilities.features: unknown {sorted(unknown)}; known {sorted(FEATURES)}")
        unknown = set(self.metadata) - set(METADATA_FIELDS)
        if unknown:
            raise ValueError(f"Capabilities.metadata: unknown fields {sorted(unknown)}; "
                             f"known {sorted(METADATA_FIELDS)}")
        for ours, theirs in self.vocabulary.items():
            if isinstance(theirs, str) or not all(isinstance(t, str) and t for t in theirs):
                raise ValueError(f"Capabilities.vocabulary[{ours!r}]: a tuple of the names "
                                 f"the library uses, got {theirs!r}")

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
        # A case that asks for the LSE still runs on a target that returns none: its o is
        # compared in full and the row says the LSE was not (not_returned). A case about the
        # LSE buffer itself (strided) has nothing to run there.
        if params.get("strided") == "lse" and "lse" not in self.call_forms:
            return "call form lse (the case strides the LSE buffer, which it never returns)"
        outputs = OUTPUT_TENSORS | (MERGE_OUTPUTS if op == "merge_state" else frozenset())
        if params.get("strided") in outputs and "out" not in self.call_forms:
            return "call form out (a caller-given output buffer)"
        if params.get("short_output") and "out" not in self.call_forms:
            return "call form out (the case hands a caller-given output buffer too short)"
        if params.get("short_output") == "lse" and "lse" not in self.call_forms:
            return "call form lse (the case hands an LSE buffer too short)"
        for need in requires:
            if need.startswith("metadata."):
                if need[len("metadata."):] not in self.metadata:
                    return f"metadata field {need[len('metadata.'):]}"
            elif need not in self.features:
                return f"feature {need}"
        return None

    def not_returned(self, params: Mapping) -> dict:
        """{output: why} for what a case asks for that this target never returns: the row
        names each as not compared, and every other output is judged in full."""
        if params.get("return_lse") and "lse" not in self.call_forms:
            return {"lse": "the target returns no LSE (its call forms: "
                           f"{', '.join(sorted(self.call_forms)) or 'none'})"}
        return {}
