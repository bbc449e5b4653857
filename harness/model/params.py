"""The case params schema: every key a case may carry, its type and what it means.

Documented once, here. harness/model/problem.py interprets the problem keys (and
checks their values); adapters read the layout and call keys; the explorer
and `shrink` draw and edit params by these names. Case records are checked
against it when they are made, so a misspelt key fails where it is written
instead of being silently ignored by every adapter.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class Param:
    types: tuple            # JSON types the value may have
    doc: str
    problem: bool = False   # interpreted by harness/model/problem.py (else by adapters)


_INT, _BOOL, _STR, _NUM = (int,), (bool,), (str,), (int, float)
_LIST, _DICT = (list,), (dict,)

SCHEMA: dict[str, Param] = {
    # ---- the logical problem (harness/model/problem.py)
    "dtype": Param(_STR, "fp16 | bf16 | fp32: q, k, v and the output", True),
    "head_dim": Param(_INT, "head dimension of q and k", True),
    "head_dim_vo": Param(_INT + (type(None),), "head dimension of v and o [= head_dim]", True),
    "num_qo_heads": Param(_INT, "query heads", True),
    "num_kv_heads": Param(_INT + (type(None),), "key/value heads [= num_qo_heads]; 0 is a case", True),
    "qo_lens": Param(_LIST, "query tokens per request", True),
    "kv_lens": Param(_LIST, "key/value tokens per request", True),
    "causal": Param(_BOOL, "bottom-right aligned causal mask", True),
    "window_left": Param(_INT, "sliding window: keys at most this far left of the diagonal [-1: none]", True),
    "sm_scale": Param(_NUM + (type(None),), "softmax scale [1/sqrt(head_dim)]", True),
    "return_lse": Param(_BOOL, "the case asks for the LSE too", True),
    "short_output": Param(_STR, "out | lse: that caller-given output one row (its first "
                        "dimension) short of the answer; it must be refused"),
    "cache_tail": Param(_STR, "nan | inf: the cache slots past each request's length in its "
                      "last page (written by no token) hold it; the answer is unchanged", True),
    "values": Param(_STR, "how q, k, v are drawn: normal | large_logits | outlier | ties | tiny | nonfinite_v | nonfinite_v_masked | nan_k | subnormal_v", True),
    # ---- features (harness/model/problem.py defines each; reference.py the order they apply in)
    "logits_soft_cap": Param(_NUM, "c > 0: every logit s (q.k * sm_scale) becomes c * tanh(s / c), "
                                   "before ALiBi and before masking [0: off]", True),
    "sinks": Param(_BOOL + _LIST, "attention sinks: one extra logit per q head that joins the "
                                  "softmax denominator only; true: drawn from the seed, a list: "
                                  "those values (fp32, one per q head) [off]", True),
    "alibi_slopes": Param(_BOOL + _LIST, "ALiBi: a slope per q head, logit += slope * (key_pos - "
                                         "query_pos), query_pos bottom-right aligned as causal is; "
                                         "true: drawn from the seed, a list: those values [off]", True),
    "kv_dtype": Param(_STR + (type(None),), "fp8_e4m3 | fp8_e5m2: k and v are stored in that fp8 "
                                            "format (torch.float8_e4m3fn / float8_e5m2), quantized "
                                            "from the drawn values as round(k / k_scale) saturated "
                                            "at the format's max [= dtype]", True),
    "k_scale": Param(_NUM, "per-tensor dequantization scale of the stored k: k = stored * k_scale, "
                           "its fp32 value [1.0]", True),
    "v_scale": Param(_NUM, "per-tensor dequantization scale of the stored v [1.0]", True),
    "q_len_per_req": Param(_INT, "batch decode with n > 1 q rows per request (a speculative "
                                 "verify step): every qo_lens entry is n, causal within the "
                                 "request, bottom-right aligned [1]", True),
    "custom_mask": Param(_STR + (type(None),), "a bool mask per request [qo_len, kv_len], True = "
                                               "attend, drawn from the seed: random (each entry a "
                                               "fair coin) | tree (a prefix every row sees, then a "
                                               "token tree: each row sees its ancestors and "
                                               "itself) | random_empty_row (random, row 0 of every "
                                               "request sees nothing); it replaces causal [none]", True),
    # ---- how an adapter lays the problem out
    "layout": Param(_STR, "NHD | HND: the KV layout of caches and dense k/v"),
    "page_size": Param(_INT, "tokens per page [16]"),
    "cache_form": Param(_STR, "tuple: (k_cache, v_cache) | single: one [pages, 2, ...] tensor"),
    "page_order": Param(_STR, "shuffled | sequential: the order page ids are handed out"),
    "page_id_offset": Param(_INT, "first page id used (lower pages hold NaN, never referenced)"),
    "index_dtype": Param(_DICT, "{index tensor name: int32 | int64}"),
    # ---- how the calls are made
    "max_kv_chunk": Param(_INT + (type(None),), "plan(max_kv_chunk=): split longer KV ranges"),
    "use_cuda_graph": Param(_BOOL, "CUDA-graph mode with caller-owned index buffers"),
    "workspace_bytes": Param(_INT, "plan workspace size [32 MiB]"),
    "partial_state": Param(_BOOL, "paged run(partial_state=) with an empty prior state"),
    "merge": Param(_STR, "merge_state: out_of_place | in_place"),
    "merge_empty": Param(_STR, "merge_state: a | b, that state is over no key of each request "
                               "(the KV cut at 0 or at kv_len: o 0, LSE -inf), the other over "
                               "all of it [cut in halves]"),
    "empty_state_values": Param(_NUM, "merge_state: every empty state (LSE -inf) holds this "
                                      "output value, as an outside caller's may (it carries no "
                                      "weight: the answer is unchanged) [0]"),
    "num_decodes": Param(_INT, "mixed_batch: the first num_decodes requests are decodes"),
    "out_form": Param(_STR, "given: the caller hands out= and lse= | library: the library "
                            "allocates and returns them"),
    # ---- adversarial perturbations
    "strided": Param(_STR, "the one tensor passed as an adversarial view (stride(-1) == 2, NaN in "
                           "the skipped slots; q_heads: head-sliced; an index tensor: every other; "
                           "k_far / v_far: rows a token stride apart, the last past element "
                           "2^31, in a lazily allocated buffer)"),
    "mismatch": Param(_DICT, "{field, value[, only]}: run() gets tensors that disagree with "
                             "plan() there; only k | v: of a field that moves k and v "
                             "together, that one alone"),
    "malformed": Param(_DICT, "one feature argument passed malformed: {field: sinks | alibi_slopes, "
                              "length: n} a per-head vector of n entries; {field: k_scale | "
                              "v_scale, shape: [..]} a scale tensor of that shape; {field: "
                              "custom_mask, delta: n} a mask n elements longer (negative: "
                              "shorter) than the batch needs; {field: q_len_per_req, q_rows: n} "
                              "run() gets n q rows, not a multiple of q_len_per_req"),
    # ---- multi-call scenarios
    "scenario": Param(_STR, "a named script: plan_failed_midway | plan_rejected_first | "
                            "graph_replan | restaged"),
    "replan_max_kv_chunk": Param(_INT, "plan_failed_midway: the second plan's split"),
    "capacity": Param(_DICT, "graph_replan: {qo_lens, kv_lens} of the first (capacity) plan"),
    "prefix_tokens": Param(_INT, "graph_replan: kv tokens held in the partial state"),
    "restage": Param(_LIST, "restaged: the caller tensors rewritten after plan()"),
    "sequence": Param(_STR, "restaged: plan_restage_run | replan_restage_run | run_replan_run"),
    "index_device": Param(_STR, "restaged: cpu (indptr, last_page_len on the CPU) | device "
                                "(every caller index tensor on the device) [cpu]"),
    # ---- the faults target (test use)
    "fault": Param(_STR, "faults target: how the case fails on purpose"),
    "marker_dir": Param(_STR, "faults target: where `flaky` remembers its first attempt"),
}


# Keys that make a case what it is beyond the problem: a perturbation, a mismatch, a scenario
# or a call form. An adapter that never reads one of them (when it is set) ran some other
# case, so the row is a harness_error naming the key, never a pass (engine/execute.py).
MUST_READ = frozenset({
    "strided", "mismatch", "scenario", "replan_max_kv_chunk", "capacity", "restage",
    "sequence", "index_device", "use_cuda_graph", "partial_state", "merge", "merge_empty",
    "empty_state_values",
    "num_decodes",
    "max_kv_chunk", "fault",
    # Features: an adapter that never passed one could still pass where its effect is small
    # (a soft cap far above the logits, a sink far below the LSE, scales of 1, an fp8 cache
    # handed over dequantized, a mask that happens to keep most keys).
    "logits_soft_cap", "sinks", "alibi_slopes", "kv_dtype", "k_scale", "v_scale",
    "q_len_per_req", "custom_mask", "malformed",
})


def must_read(params: Mapping[str, Any]) -> list[str]:
    """The MUST_READ keys this case sets (None, False and "" set nothing)."""
    return sorted(k for k in params if k in MUST_READ and params[k] not in (None, False, ""))


class ReadParams(Mapping):
    """A case's params as the adapter sees them: every key it looks at (get, [], in,
    iteration of values) is recorded, so the engine can tell a case that was performed
    from one whose perturbation was ignored."""

    def __init__(self, params: Mapping[str, Any]):
        self._params = params
        self.read: set[str] = set()

    def __getitem__(self, key):
        self.read.add(key)
        return self._params[key]

    def __contains__(self, key):
        self.read.add(key)
        return key in self._params

    def __iter__(self):
        return iter(self._params)

    def __len__(self):
        return len(self._params)

    def __repr__(self):
        return f"ReadParams({dict(self._params)!r})"

    def unread(self) -> list[str]:
        return [k for k in must_read(self._params) if k not in self.read]


def check(params: Mapping[str, Any]) -> None:
    """ValueError naming the key when a param is unknown or of the wrong JSON type."""
    for key, value in params.items():
        spec = SCHEMA.get(key)
        if spec is None:
            raise ValueError(f"params[{key!r}]: unknown key; known keys: {', '.join(sorted(SCHEMA))}")
        if isinstance(value, bool) and bool not in spec.types:
            raise ValueError(f"params[{key!r}] = {value!r}: must be "
                             f"{' or '.join(t.__name__ for t in spec.types)}")
        if not isinstance(value, spec.types):
            raise ValueError(f"params[{key!r}] = {value!r}: must be "
                             f"{' or '.join(t.__name__ for t in spec.types)}")


