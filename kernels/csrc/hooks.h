// Points in the kernels where the test-only library (csrc/testonly/, built with
// -DKERNELS_TEST_FAULTS into libkernels_testonly.so) puts a known class of bug, so the
// harness's tests can show which generated inputs catch it. In the shipped build every hook
// is the identity or nothing: no branch, no state, no environment read.
#pragma once

#if defined(KERNELS_TEST_FAULTS)
#include "testonly/faults.h"
#else
// A work item starts (a statement; the test-only build may return early).
#define HOOK_ITEM_START(it)
// The online softmax's running max: its start and whether a logit raises it.
#define HOOK_MAX_START(m0) (m0)
#define HOOK_RAISE_MAX(raise) (raise)
// Whether a row that attended to nothing is written as the empty row; direct: not a partial.
#define HOOK_EMPTY_ROW(empty, direct) (empty)
// The larger lse of a merge, before the weights exp(lse - max) (a statement on max).
#define HOOK_MERGE_MAX(m)
// A dequantization scale (k_scale, v_scale) as the kernels apply it.
#define HOOK_KV_SCALE(scale) (scale)
// The q head whose ALiBi slope a logit takes (kvh: its kv head).
#define HOOK_ALIBI_HEAD(h, kvh) (h)
// The sink's weight e, after the denominator took it (a statement on the output acc[0, dvo)).
#define HOOK_SINK_VALUE(acc, dvo, e)
// The key range a row attends, after causal and window (a statement on jlo, jhi).
#define HOOK_MASK_BOUNDS(jlo, jhi)
// The custom mask's element of (row i, key j): row-major [qo_len, kv_len].
#define HOOK_MASK_INDEX(idx, i, j) (idx)
// Whether a key the custom mask drops is skipped; and a kept key's final logit.
#define HOOK_SKIP_MASKED(masked) (masked)
#define HOOK_MASKED_LOGIT(s, keep, j) (s)
// A decode row's key position (bottom-right aligned; last: the request's last key).
#define HOOK_DECODE_DIAG(diag, last) (diag)
// Key j's slot in its page (its page is j / ps).
#define HOOK_IN_PAGE(j, ps) ((j) % (ps))
// A ragged or dense k/v element offset (64-bit: a large token stride passes 2^31).
#define HOOK_TOKEN_OFFSET(off) (off)
// How many output dims a feature's rescale of the accumulator covers (a sink, v_scale): dvo.
#define HOOK_FEATURE_DIMS(dvo) (dvo)
// What a merge of two empty states writes (zero), given state a's element at i.
#define HOOK_EMPTY_MERGE_VALUE(zero, va, i, dt) (zero)
#endif
