// The test-only library's kernel faults (kernels/testonly.py). Included by hooks.h only when
// KERNELS_TEST_FAULTS is defined: the shipped library never sees this file. One fault is
// active per process, chosen by kernels_testonly_set_kernel_fault; TF_NONE is the fixed code.
#pragma once
#include "../platform.h"

enum {
  TF_NONE = 0,
  TF_MERGE_NO_MAX,     // merges weight each state by exp(lse) without subtracting the larger lse
  TF_SOFTMAX_NO_MAX,   // the online softmax sums exp(logit) without a running max
  TF_EMPTY_SKIPPED,    // a kernel returns early for a request with kv_len 0, writing nothing
  TF_MASKED_ROW_NAN,   // a row that attends to nothing is written as 0 / 0
  // One per feature; each shows only on inputs that use it.
  TF_SOFTCAP_AFTER_MASK,    // masked keys get logit -inf before the soft cap, which makes it -c
  TF_SINK_IN_NUMERATOR,     // the sink's weight is added to the output too (a value row of ones)
  TF_ALIBI_KV_HEAD,         // ALiBi slopes indexed by the kv head instead of the q head
  TF_FP8_SCALE_TWICE,       // an fp8 cache's k_scale / v_scale applied twice
  TF_DECODE_LAST_POSITION,  // multi-token decode: every q row of a request at the last key's position
  TF_MASK_TRANSPOSED,       // the custom mask read as [kv_len, qo_len]
  // One per crossing or boundary of generator reach round three (cases/ names each).
  TF_PAGE_OFFSET_MASK,      // a key's slot in its page by a mask, not a division (right for 2^n only)
  TF_TOKEN_OFFSET_32,       // a ragged or dense k/v element offset wraps at 32 bits (signed)
  TF_WS_WITHOUT_LSE,        // plan() sizes the split's workspace without the partial LSEs
  TF_EMPTY_MERGE_KEEPS_A,   // two empty states merge to state a's values, not 0
  TF_FEATURE_DIMS_QK,       // a sink's / v_scale's rescale of the output covers head_dim_qk dims
  TF_COUNT
};

// Device-global on GPUs (set by hipMemcpyToSymbol), a plain global on the host. Static: the
// kernels and the setter share one translation unit (testonly/api.cpp).
static __device__ int kernels_tf_fault = TF_NONE;
#define TF_ON(f) (kernels_tf_fault == (f))

#define HOOK_ITEM_START(it) \
  if (TF_ON(TF_EMPTY_SKIPPED) && (it).kv_len == 0) return
#define HOOK_MAX_START(m0) (TF_ON(TF_SOFTMAX_NO_MAX) ? 0.f : (m0))
#define HOOK_RAISE_MAX(raise) ((raise) && !TF_ON(TF_SOFTMAX_NO_MAX))
#define HOOK_EMPTY_ROW(empty, direct) ((empty) && !(TF_ON(TF_MASKED_ROW_NAN) && (direct)))
#define HOOK_MERGE_MAX(m) \
  if (TF_ON(TF_MERGE_NO_MAX)) (m) = 0.f
#define HOOK_KV_SCALE(scale) \
  (TF_ON(TF_FP8_SCALE_TWICE) && p.kv_dtype >= DT_E4M3 ? (scale) * (scale) : (scale))
#define HOOK_ALIBI_HEAD(h, kvh) (TF_ON(TF_ALIBI_KV_HEAD) ? (kvh) : (h))
#define HOOK_SINK_VALUE(acc, dvo, e) \
  if (TF_ON(TF_SINK_IN_NUMERATOR))   \
    for (int tf_d = 0; tf_d < (dvo); ++tf_d) (acc)[tf_d] += (e)
// The cap-after-mask fault widens the row to the item's whole range and gives each key that
// causal, window or the custom mask drops the capped -inf, -c, instead of skipping it.
#define HOOK_MASK_BOUNDS(jlo, jhi)                                                  \
  const int tf_jlo = (jlo), tf_jhi = (jhi);                                         \
  const bool tf_cap_after = TF_ON(TF_SOFTCAP_AFTER_MASK) && p.logits_soft_cap > 0.f; \
  if (tf_cap_after) {                                                               \
    jlo = it.lo;                                                                    \
    jhi = it.hi;                                                                    \
  }
#define HOOK_MASK_INDEX(idx, i, j) (TF_ON(TF_MASK_TRANSPOSED) ? (int64_t)(j) * it.qo_len + (i) : (idx))
#define HOOK_SKIP_MASKED(masked) ((masked) && !tf_cap_after)
#define HOOK_MASKED_LOGIT(s, keep, j)                                 \
  (tf_cap_after && (!(keep) || (j) < tf_jlo || (j) >= tf_jhi)         \
       ? p.logits_soft_cap * tanhf(NEG_INF / p.logits_soft_cap) : (s))
#define HOOK_DECODE_DIAG(diag, last) (TF_ON(TF_DECODE_LAST_POSITION) ? (last) : (diag))
// The page by division, the slot in it by a mask: right only for pages of 2^n tokens (a slot
// of a 12-token page comes out j & 11, inside the page, on the wrong token).
#define HOOK_IN_PAGE(j, ps) (TF_ON(TF_PAGE_OFFSET_MASK) ? (j) & ((ps) - 1) : (j) % (ps))
#define HOOK_TOKEN_OFFSET(off) \
  (TF_ON(TF_TOKEN_OFFSET_32) ? (int64_t)(int32_t)(off) : (int64_t)(off))
// Dims past dvo are never read back, so the defect is the rescale stopping at head_dim_qk
// when that is the smaller.
#define HOOK_FEATURE_DIMS(dvo) \
  (TF_ON(TF_FEATURE_DIMS_QK) && p.head_dim_qk < (dvo) ? p.head_dim_qk : (dvo))
#define HOOK_EMPTY_MERGE_VALUE(zero, va, i, dt) (TF_ON(TF_EMPTY_MERGE_KEEPS_A) ? ld_dt(va, i, dt) : (zero))
