"""The FlashInfer-shaped plan()/run() signature the bundled library and FlashInfer share
(harness/targets/plan_run/ performs its relations), in FlashInfer's argument names."""
from harness.model.signature import Arg

PAGED_PLAN = "BatchPrefillWithPagedKVCacheWrapper.plan"
RAGGED_PLAN = "BatchPrefillWithRaggedKVCacheWrapper.plan"
DECODE_PLAN = "BatchDecodeWithPagedKVCacheWrapper.plan"
RUN = "run"


def plan_run_args(lse_encoding: str = "") -> tuple:
    """Every argument the three batch wrappers' plan() and run() read."""
    out = []
    for plan in (PAGED_PLAN, RAGGED_PLAN):
        out += [Arg("qo_indptr", "qo_offsets", plan, dtype="int32"),
                Arg("num_qo_heads", "num_qo_heads", plan),
                Arg("num_kv_heads", "num_kv_heads", plan),
                Arg("head_dim_qk", "head_dim_qk", plan),
                Arg("head_dim_vo", "head_dim_vo", plan),
                Arg("causal", "causal", plan),
                Arg("window_left", "window", plan),
                Arg("logits_soft_cap", "soft_cap", plan),
                Arg("sm_scale", "scale", plan),
                Arg("q_data_type", "dtype", plan),
                Arg("kv_data_type", "kv_dtype", plan)]
    out += [Arg("paged_kv_indptr", "kv_offsets", PAGED_PLAN, dtype="int32"),
            Arg("paged_kv_indices", "page_indices", PAGED_PLAN, dtype="int32"),
            Arg("paged_kv_last_page_len", "last_page_lengths", PAGED_PLAN, dtype="int32"),
            Arg("page_size", "block_size", PAGED_PLAN),
            Arg("custom_mask", "custom_mask", PAGED_PLAN),
            Arg("kv_indptr", "kv_offsets", RAGGED_PLAN, dtype="int32"),
            Arg("indptr", "kv_offsets", DECODE_PLAN, dtype="int32"),
            Arg("indices", "page_indices", DECODE_PLAN, dtype="int32"),
            Arg("last_page_len", "last_page_lengths", DECODE_PLAN, dtype="int32"),
            Arg("num_qo_heads", "num_qo_heads", DECODE_PLAN),
            Arg("num_kv_heads", "num_kv_heads", DECODE_PLAN),
            Arg("head_dim", "head_dim_qk", DECODE_PLAN),
            Arg("page_size", "block_size", DECODE_PLAN),
            Arg("q_data_type", "dtype", DECODE_PLAN),
            Arg("q", "q", RUN, layout="[rows, Hq, D]"),
            Arg("paged_kv_cache", "kv_cache", RUN, layout="NHD|HND, (k, v) or [pages, 2, ...]"),
            Arg("k", "k", RUN, layout="[rows, Hkv, D]"),
            Arg("v", "v", RUN, layout="[rows, Hkv, Dv]"),
            Arg("out", "out", RUN),
            Arg("lse", "lse", RUN, encoding=lse_encoding),
            Arg("return_lse", "variant_flags", RUN)]
    return tuple(out)
