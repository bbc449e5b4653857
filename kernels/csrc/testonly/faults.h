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
