"""vLLM's CPU attention's call signature (the vllm-cpu target): its cache writer, its
metadata call and its run, in vLLM's argument names, performed by the block-table core.
Pure data: no torch, no vLLM. (harness/targets/vllm_cpu.py declares its capabilities; this
signature derives the same metadata fields, tests/test_relations.py checks it.)"""
from harness.model.signature import Arg, Signature

WRITE = "cpu_attn_reshape_and_cache"
META = "get_scheduler_metadata"
RUN = "cpu_attention_with_kv_cache"
SIGNATURE = Signature(core="declared", args=(
    Arg("key", "k", WRITE, layout="[tokens, Hkv, D]"),
    Arg("value", "v", WRITE, layout="[tokens, Hkv, D]"),
    Arg("key_cache", "k_cache", WRITE),
    Arg("value_cache", "v_cache", WRITE),
    Arg("slot_mapping", "slot_mapping", WRITE, dtype="int64"),
    Arg("isa", "variant_flags", WRITE),
    Arg("k_scale", "fp8_scales", WRITE),
    Arg("v_scale", "fp8_scales", WRITE),
    Arg("kv_cache_dtype", "kv_dtype", WRITE),
    Arg("num_req", "batch_size", META),
    Arg("num_heads_q", "num_qo_heads", META),
    Arg("num_heads_kv", "num_kv_heads", META),
    Arg("head_dim", "head_dim_qk", META),
    Arg("seq_lens", "kv_lengths", META, dtype="int32"),
    Arg("dtype", "dtype", META),
    Arg("query_start_loc", "qo_offsets", META, dtype="int32"),
    Arg("casual", "causal", META),
    Arg("window_size", "window", META, encoding="window_plus_1"),
    Arg("isa_hint", "variant_flags", META),
    Arg("enable_kv_split", "variant_flags", META),
    Arg("kv_cache_dtype", "kv_dtype", META),
    Arg("query", "q", RUN, layout="[tokens, Hq, D]"),
    Arg("key_cache", "k_cache", RUN, layout="[blocks, Hkv, block_size, D] (isa-dependent)"),
    Arg("value_cache", "v_cache", RUN),
    Arg("output", "out", RUN),
    Arg("query_start_loc", "qo_offsets", RUN, dtype="int32"),
    Arg("seq_lens", "kv_lengths", RUN, dtype="int32"),
    Arg("scale", "scale", RUN),
    Arg("causal", "causal", RUN),
    Arg("alibi_slopes", "alibi_slopes", RUN, dtype="float32"),
    Arg("sliding_window_size", "window", RUN, encoding="window_plus_1"),
    Arg("block_table", "block_table", RUN, dtype="int32"),
    Arg("softcap", "soft_cap", RUN),
    Arg("scheduler_metadata", "plan_handle", RUN),
    Arg("s_aux", "sinks", RUN, dtype="float32"),
    Arg("k_scale", "fp8_scales", RUN),
    Arg("v_scale", "fp8_scales", RUN),
    Arg("kv_cache_dtype", "kv_dtype", RUN),
))
