"""FlagGems' descriptor: one call, flash_attn_varlen_func (vLLM's flash-attn varlen API),
whose metadata (cu_seqlens_q, seqused_k, block_table, max_seqlen_*) describes the batch.
Pure data: no torch, no flag_gems."""
from harness.model.capabilities import Capabilities
from harness.model.signature import Arg, Signature

NAME = "flaggems"
BACKEND = "fg"
OPS = ("single_prefill", "single_decode", "paged_prefill", "ragged_prefill",
       "batch_decode", "mixed_batch")
ROUTES = tuple(f"{BACKEND}.{op}" for op in OPS)
CALL = "flash_attn_varlen_func"
SIGNATURE = Signature(
    args=(
        Arg("q", "q", CALL, layout="[total_q, Hq, D]"),
        Arg("k", "k", CALL, layout="[total_k, Hkv, D] or [num_blocks, block_size, Hkv, D]"),
        Arg("v", "v", CALL, layout="as k"),
        Arg("max_seqlen_q", "max_seqlen_q", CALL),
        Arg("cu_seqlens_q", "qo_offsets", CALL, dtype="int32"),
        Arg("max_seqlen_k", "max_seqlen_k", CALL),
        Arg("cu_seqlens_k", "kv_offsets", CALL, dtype="int32"),
        Arg("seqused_k", "kv_lengths", CALL, dtype="int32"),
        Arg("block_table", "block_table", CALL, dtype="int32"),
        Arg("softmax_scale", "scale", CALL),
        Arg("causal", "causal", CALL),
        Arg("window_size", "window", CALL, encoding="window_pair"),
        Arg("softcap", "soft_cap", CALL),
        Arg("alibi_slopes", "alibi_slopes", CALL, dtype="float32"),
        Arg("return_softmax_lse", "variant_flags", CALL),
        Arg("out", "out", CALL),
        Arg("softmax_lse", "lse", CALL, encoding="transposed"),
    ),
    # The adapter bends the tensors against the metadata (plan_run/mismatch.py's q and
    # ragged perturbations) and the metadata itself (flaggems.py bend_metadata).
    performs=("num_qo_heads", "head_dim_qk", "head_dim_vo", "rank", "q_rows", "kv_rows",
              "dtype", "kv_lens", "block_table", "query_start_loc", "max_seqlen_q",
              "max_seqlen_k"),
)
# fp16/bf16 only (it asserts so); head_size a multiple of 8 up to 256 (it asserts both);
# the caller's out= and the returned LSE; no plan()/run(), no CUDA-graph wrapper, no
# partial-state merge, no caller-set KV split; flash-attn's softcap and alibi_slopes.
CAPABILITIES = Capabilities(
    ops=frozenset(OPS),
    dtypes=frozenset({"fp16", "bf16"}),
    head_dims=frozenset(range(8, 257, 8)),
    layouts=frozenset({"NHD", "HND"}),
    call_forms=frozenset({"out", "lse"}),
    features=frozenset({"softcap", "alibi"}),
    signature=SIGNATURE,
)
